package keeper

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/gorun/gorun/topology"
)

// TestECRollbackToDisk is a roll-back to the durable tier under erasure
// coding (2+2, two ranks per host) at the level of the rank services:
// the ranks ran to step 4 (G = 4), then three hosts are lost, more
// than M (a data host and both parity hosts; both data hosts and a
// parity host, whose surviving parity host holds rows of steps 3 and 4
// of the abandoned trajectory), and the job rolls back to T = 2, a step
// the durable tier holds: the lost hosts' places go to spares, every
// host restarts at T (its slots, clear copies and parity rows keep
// nothing after T) and rebuilds its ranks' states at T (Reload, here
// from the ranks' known bytes, as cascade.Load would from disk), and the
// ranks restore T from their own slots. Then every parity row of every
// stripe at T is the codec's parity of the members' shards at T
// (encoded again from the reloaded slots), and a further loss within M,
// a data host, is restored from memory by decode, bitwise.
//
// (This is the rank layer as it was: the roll-back under EC needed the
// launcher's decision, hotswap.canRollback, not a change here.)
func TestECRollbackToDisk(t *testing.T) {
	for _, tc := range []struct {
		name string
		lost func(g topology.ECGroup) []int // to spares 4, 5, 6
		more func(g topology.ECGroup) int   // then to spare 7
	}{
		{"data and both parity hosts", func(g topology.ECGroup) []int { return []int{g.Data[0], g.Parity[0], g.Parity[1]} },
			func(g topology.ECGroup) int { return g.Data[1] }},
		{"both data hosts and a parity host", func(g topology.ECGroup) []int { return []int{g.Data[0], g.Data[1], g.Parity[0]} },
			func(topology.ECGroup) int { return 4 }},
	} {
		t.Run(tc.name, func(t *testing.T) { ecRollbackToDisk(t, tc.lost, tc.more) })
	}
}

func ecRollbackToDisk(t *testing.T, lostOf func(topology.ECGroup) []int, moreOf func(topology.ECGroup) int) {
	const k, m, T = 2, 2, int64(2)
	j := newECRecJob(t, k, m, 2, 4) // G = 2
	for _, s := range []int64{3, 4} {
		for _, er := range j.ranks {
			er.protect(s)
		}
		j.c.waitFor(fmt.Sprintf("step %d replicated", s), func() bool {
			for r := range j.hostOf {
				if j.c.progress(r).Replicated < s {
					return false
				}
			}
			return true
		})
		if g := j.c.publishG(); g != s {
			t.Fatalf("G = %d after step %d", g, s)
		}
	}
	g0 := j.groups[0]
	lost := lostOf(g0)
	sw := swapHosts(j.groups, j.hostOf, j.holders, lost, []int{4, 5, 6}, func(int) int { return 0 })
	for _, h := range lost {
		if err := j.c.hosts[h].Close(); err != nil {
			t.Fatal(err)
		}
	}
	var live []int
	for h := range j.work + 3 {
		if !slices.Contains(lost, h) {
			live = append(live, h)
		}
	}
	// The roll-back's epoch: every rank from its own slot, G = T.
	for _, h := range live {
		p := sw.placement(h, 1, T)
		p.Sources = nil
		if err := j.c.hosts[h].SetPlacement(p); err != nil {
			t.Fatalf("host %d: %v", h, err)
		}
	}
	j.c.mu.Lock()
	copy(j.c.hostOf, sw.hostOf)
	j.c.mu.Unlock()
	// Every live host restarts in the roll-back's generation, the idle
	// spare too: it takes ranks in that generation later.
	for _, h := range append(slices.Clone(live), 7) {
		if err := j.c.hosts[h].Restart(1, T); err != nil {
			t.Fatalf("host %d: Restart: %v", h, err)
		}
	}
	for r, h := range sw.hostOf {
		regions := ecRecRegions(r)
		fill := func(views [][]byte) (int, error) {
			for i, reg := range regions {
				copy(views[i], ecRecState(r, T, reg))
			}
			return 0, nil
		}
		if _, err := j.c.hosts[h].Reload(r, regions, T, fill); err != nil {
			t.Fatalf("rank %d on host %d: Reload: %v", r, h, err)
		}
	}
	for r, h := range sw.hostOf {
		got := j.connect(r).restore()
		if got.Err != "" || got.Step != T {
			t.Fatalf("rank %d: restore %+v; want step %d", r, got, T)
		}
		if err := j.checkRestored(j.c.hosts[h], r, T); err != nil {
			t.Fatal(err)
		}
	}
	// Every row of T: the codec's parity of the members' shards at T.
	rowsOfT := func() error {
		for row, ph := range sw.groups[0].Parity {
			for i := range len(sw.groups[0].DataGroups[0]) {
				members := stripeMembers(sw.groups[0], i)
				want := wantRecRow(t, k, m, members, T)[row]
				got := make([]byte, len(want))
				ms, err := j.c.hosts[ph].parity.read(0, i, row, T, 0, got)
				if err != nil {
					return fmt.Errorf("host %d's row %d of stripe %d at T: %w", ph, row, i, err)
				}
				if !bytes.Equal(got, want) {
					return fmt.Errorf("host %d's row %d of stripe %d at T differs from the codec's parity", ph, row, i)
				}
				for x, mb := range ms {
					if mb.rank != members[x] {
						return fmt.Errorf("row %d of stripe %d: member %d is rank %d, want %d", row, i, x, mb.rank, members[x])
					}
				}
			}
		}
		return nil
	}
	var last error
	j.c.waitFor("the rows of T encoded again", func() bool { last = rowsOfT(); return last == nil })
	j.c.waitFor("T replicated in the roll-back's placement", func() bool {
		for r := range sw.hostOf {
			if p := j.c.progress(r); p.Replicated != T {
				return false
			}
		}
		return true
	})

	// One more loss, within M: the surviving data host's ranks that run
	// there have no clear copy and are decoded at T from the rows.
	more := moreOf(g0)
	sw2 := swapHosts(sw.groups, sw.hostOf, sw.holders, []int{more}, []int{7}, func(r int) int {
		return slices.IndexFunc(sw.hostOf, func(h int) bool { return h != more })
	})
	if err := j.c.hosts[more].Close(); err != nil {
		t.Fatal(err)
	}
	decoded := 0
	for _, r := range sw2.lost {
		if sw2.sources[r].Decode {
			decoded++
		}
	}
	if decoded == 0 {
		t.Fatalf("no rank of host %d decodes: the test's loss is wrong (sources %v)", more, sw2.sources)
	}
	for _, h := range append(slices.Clone(live), 7) {
		if h == more {
			continue
		}
		if err := j.c.hosts[h].SetPlacement(sw2.placement(h, 2, T)); err != nil {
			t.Fatalf("host %d: %v", h, err)
		}
	}
	j.c.mu.Lock()
	copy(j.c.hostOf, sw2.hostOf)
	j.c.mu.Unlock()
	for _, r := range sw2.lost {
		got := j.connect(r).restore()
		if got.Err != "" || got.Step != T {
			t.Fatalf("rank %d (source %+v): restore %+v; want step %d", r, sw2.sources[r], got, T)
		}
		if err := j.checkRestored(j.c.hosts[7], r, T); err != nil {
			t.Fatal(err)
		}
	}
}
