package keeper

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFlipReplicaRestore: a byte flipped in the replicas a holder keeps
// for rank 0 (Keeper.FlipReplicas, the chaos suite's replica-flip) is
// found by the restore's CRC32C check once rank 0's host is lost: with a
// second holder the restore takes its good copy, with the flipped copy
// the only one it is refused, naming the mismatch; never a restore of
// the flipped bytes. A refusal leaves the holder whose copy failed its
// CRC32C for the agent to report with the rank's exit
// (Keeper.TakeCorruptCopies), once; a restore from a good copy leaves
// nothing (the launcher must not count lost a copy no restore needed).
func TestFlipReplicaRestore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holders [][]int // host 1's rank 1 first: the flipped copy is tried first
		wantErr bool
	}{
		{"two copies, one flipped", [][]int{{1, 2}, {2, 0}, {0, 1}}, false},
		{"one copy, flipped", [][]int{{1}, {2}, {0}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peers := func(int) []int { return []int{0, 1, 2} }
			c := newCluster(t, [][]int{{0}, {1}, {2}}, tc.holders, peers)
			rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
			protectReplicated(c, rs, 2) // G = 1
			protectFrom(c, rs, 2, 3)    // G = 2

			flipped, busy, err := c.hosts[1].FlipReplicas(context.Background())
			if err != nil || len(busy) > 0 {
				t.Fatalf("FlipReplicas: busy %v, %v", busy, err)
			}
			if !slices.ContainsFunc(flipped, func(f FlippedReplica) bool { return f.Owner == 0 && f.Step == 2 }) {
				t.Fatalf("host 1 flipped %+v, not rank 0's step 2", flipped)
			}

			replaceHost(t, c, 0, []int{0}, peers, 1, 2)
			r0 := newSessRank(t, c.hosts[0], 0)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res := r0.restore(ctx)
			step, hs, ok := c.hosts[0].TakeCorruptCopies(0)
			if ok != tc.wantErr || ok && (step != 2 || !slices.Equal(hs, []int{1})) {
				t.Errorf("TakeCorruptCopies(0) = %d %v %t, want step 2 holders [1]: %t", step, hs, ok, tc.wantErr)
			}
			if _, _, ok := c.hosts[0].TakeCorruptCopies(0); ok {
				t.Error("TakeCorruptCopies(0) reported the same restore twice")
			}
			if tc.wantErr {
				if res.Err == "" {
					t.Fatalf("rank 0 restored step %d (tier %d) from its only replica, which was flipped", res.Step, res.Tier)
				}
				if !strings.Contains(res.Err, "CRC32C") {
					t.Errorf("the refusal does not name the CRC32C mismatch: %s", res.Err)
				}
				return
			}
			if res.Err != "" || res.Step != 2 || res.Tier != 2 {
				t.Fatalf("rank 0's restore of step 2 from its good copy: %+v", res)
			}
			want := propState(0, 2)
			for i, reg := range propRegions {
				if !bytes.Equal(r0.views[res.Slot][i], want[reg.Name]) {
					t.Errorf("region %s restored with other bytes than rank 0's step 2", reg.Name)
				}
			}
		})
	}
}

// TestHasChecksHeldData: after a restart, a rank's replicator asks its
// holders whether they hold its newest step (kindHas) before it sends
// it. A holder whose copy of that step was flipped since its put must
// refuse (its bytes no longer match the owner's CRC32C), so that the
// owner sends it again: acknowledged on its table alone, the rotten
// copy counted towards G until the owner's next two steps replaced it.
func TestHasChecksHeldData(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, nil)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2) // G = 1
	flipped, busy, err := c.hosts[1].FlipReplicas(context.Background())
	if err != nil || len(busy) > 0 || !slices.ContainsFunc(flipped, func(f FlippedReplica) bool { return f.Owner == 0 && f.Step == 1 }) {
		t.Fatalf("FlipReplicas on host 1: %+v, busy %v, %v", flipped, busy, err)
	}
	for _, h := range c.hosts {
		if err := h.Restart(1, 1); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r, h := range c.hosts {
		rs[r] = newSessRank(t, h, r)
		checkRestored(t, rs[r], rs[r].restore(ctx), 1, 1)
	}
	// Rank 0's replicator asks host 1 for step 1 once rank 0 restored;
	// a refused has is followed by a put of the step.
	want := propState(0, 1)
	// The holder keeps the copy before it acknowledges it: rank 0 counts
	// it replicated a moment later.
	c.waitFor("host 1's copy of rank 0's step 1 sent again (a has acknowledging the flipped copy leaves it flipped), and rank 0 replicated to 1", func() bool {
		got := replicaRegions(c.hosts[1], 0, 1)
		for name, b := range got {
			if !bytes.Equal(b, want[name]) {
				return false
			}
		}
		return len(got) > 0 && c.progress(0).Replicated == 1
	})
}

// TestFlipReplicasBusyLock: FlipReplicas does not wait on an owner's lock
// held past its ctx: that owner is returned busy, untouched, and the
// others are flipped.
func TestFlipReplicasBusyLock(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}, {2}}, [][]int{{2}, {2}, {0}}, nil)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
	protectReplicated(c, rs, 2) // host 2 holds ranks 0's and 1's steps 0 and 1
	h2 := c.hosts[2]
	h2.store.mu.Lock()
	o := h2.store.owners[0]
	h2.store.mu.Unlock()
	before := replicaRegions(h2, 0, 1)
	o.mu.Lock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // ended: a held lock is not waited for at all
	flipped, busy, err := h2.FlipReplicas(ctx)
	o.mu.Unlock()
	if err != nil || !slices.Equal(busy, []int{0}) {
		t.Fatalf("FlipReplicas with rank 0's lock held: busy %v, %v; want [0]", busy, err)
	}
	if slices.ContainsFunc(flipped, func(f FlippedReplica) bool { return f.Owner == 0 }) || !slices.ContainsFunc(flipped, func(f FlippedReplica) bool { return f.Owner == 1 }) {
		t.Errorf("flipped %+v: want rank 1's replicas, not rank 0's", flipped)
	}
	for name, b := range replicaRegions(h2, 0, 1) {
		if !bytes.Equal(b, before[name]) {
			t.Errorf("rank 0's region %s changed while its owner was busy", name)
		}
	}
}
