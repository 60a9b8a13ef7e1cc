package rank

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFlipReplicaRestore: a byte flipped in the replicas a holder keeps
// for rank 0 (Host.FlipReplicas, the chaos suite's replica-flip) is
// found by the restore's CRC32C check once rank 0's host is lost: with a
// second holder the restore takes its good copy, with the flipped copy
// the only one it is refused, naming the mismatch; never a restore of
// the flipped bytes. A refusal leaves the holder whose copy failed its
// CRC32C for the agent to report with the rank's exit
// (Host.TakeCorruptCopies), once; a restore from a good copy leaves
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

			flipped, err := c.hosts[1].FlipReplicas()
			if err != nil {
				t.Fatal(err)
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
