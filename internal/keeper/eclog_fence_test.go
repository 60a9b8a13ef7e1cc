package keeper

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/gorun/gorun/protect"
)

// TestECDiffLogReanchoredBeforeHolder: diff mode under 2+2, B = 3. At G
// = H = 12 a new placement (epoch 2, which differs only by a Source row
// for an unrelated rank) is taken and every rank restores in place at
// 12; H is then held while the ranks run to G = 16; then rank 0's own
// data host (host 0) and the host of one of its two log-only holders are
// lost, and rank 0 (and the others lost) restore on spares by decode at
// H and the replay of (12, 16] from the surviving log holder's host (B).
// In either order of the placement's taking, owner's host first (its
// logBegin at 12 reaches B while B has the old placement, and B takes
// the placement only then) or B first, every lost rank restores at 16.
// Without the epoch a logBegin carries, B fences rank 0's log at 12 when
// it takes the placement after the owner re-anchored it, the owner never
// anchors it again, and the restore fails (ErrUnrecoverable) with two
// hosts lost of a 2+2 group.
func TestECDiffLogReanchoredBeforeHolder(t *testing.T) {
	for _, ownerFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("ownerFirst=%v", ownerFirst), func(t *testing.T) {
			const T = int64(12)
			j := newECDiffRecJob(t, 2, 2, 3, 2)
			j.run(0, T)
			j.waitH(T)
			if g, hb := j.published(); g != T || hb != T {
				t.Fatalf("G %d, H %d: want both %d", g, hb, T)
			}
			const owner = 0
			var logHosts []int
			for _, lr := range j.logs[owner] {
				if h := j.hostOf[lr]; !slices.Contains(logHosts, h) {
					logHosts = append(logHosts, h)
				}
			}
			if own := j.hostOf[owner]; len(logHosts) != 2 || slices.Contains(logHosts, own) || j.groups[0].Data[0] != own && j.groups[0].Data[1] != own {
				t.Fatalf("rank %d on host %d (data hosts %v) has log holders on hosts %v: want it on its data host, with two log holders elsewhere", owner, own, j.groups[0].Data, logHosts)
			}
			hostB, lostLog := logHosts[0], logHosts[1]
			// Epoch 2: the same layout but for a Source row of a rank on
			// neither host 0 nor B (a new placement everywhere).
			other := -1
			for r, h := range j.hostOf {
				if h != j.hostOf[owner] && h != hostB {
					other = r
					break
				}
			}
			take := func(h int) {
				var ranks []int
				for r, x := range j.hostOf {
					if x == h {
						ranks = append(ranks, r)
					}
				}
				p := Placement{Ranks: ranks, HostOf: j.hostOf, Holders: j.holders, EC: j.groups, Epoch: 2, G: T, Logs: j.logs, H: T,
					Sources: map[int]Source{other: {Opt: other, Params: other}}}
				if err := j.c.hosts[h].SetPlacement(p); err != nil {
					t.Fatalf("host %d: %v", h, err)
				}
				for _, r := range ranks {
					if res, err := j.rs[r].restore(context.Background()); err != nil || res.Step != T {
						t.Fatalf("rank %d: in-place restore %+v, %v", r, res, err)
					}
				}
			}
			order := []int{}
			for h := range j.work {
				if h != j.hostOf[owner] && h != hostB {
					order = append(order, h)
				}
			}
			if ownerFirst {
				order = append([]int{j.hostOf[owner]}, append(order, hostB)...)
			} else {
				order = append([]int{hostB}, append(order, j.hostOf[owner])...)
			}
			for i, h := range order {
				take(h)
				if i == 0 && ownerFirst {
					// The owner's logBegin at 12, carrying epoch 2, has
					// reached B, which has the old placement yet.
					j.c.waitFor(fmt.Sprintf("rank %d's log on host %d anchored by its owner under epoch 2", owner, hostB), func() bool {
						st := j.c.hosts[hostB].store
						st.mu.Lock()
						o := st.owners[owner]
						st.mu.Unlock()
						if o == nil {
							return false
						}
						o.mu.Lock()
						defer o.mu.Unlock()
						return o.logEpoch == 2
					})
					if e := j.c.hosts[hostB].place().epoch; e != 1 {
						t.Fatalf("host %d took epoch %d before the owner's logBegin", hostB, e)
					}
				}
			}
			j.mu.Lock()
			j.freezeH = true
			j.mu.Unlock()
			const end = int64(16)
			j.run(T+1, end)
			g, hb := j.published()
			if g != end || hb != T {
				t.Fatalf("G %d, H %d: want G %d, H %d", g, hb, end, T)
			}
			lost := []int{j.hostOf[owner], lostLog}
			sw, res, errs := j.swapRestore(lost, 3)
			if !sw.sources[owner].Decode {
				t.Fatalf("rank %d restores from %+v: want by decode", owner, sw.sources[owner])
			}
			for _, r := range sw.lost {
				if got := res[r]; errs[r] != nil || got.Step != g || got.Tier != 2 {
					t.Errorf("lost hosts %v of a 2+2 group: rank %d (source %+v): %+v, %v; want tier 2 at %d", lost, r, sw.sources[r], got, errs[r], g)
				}
			}
		})
	}
}

// swapRestore has the spares (j.work on) take the places of the hosts
// lost (whose addresses they do not know: every read of them fails at
// once), under a placement of epoch at the published G and H, and
// restores every lost rank there at once (the other hosts keep their
// placement). It returns the swap and each lost rank's restore.
func (j *ecDiffRecJob) swapRestore(lost []int, epoch uint64) (ecSwap, map[int]*protect.Restorable, map[int]error) {
	t := j.t
	t.Helper()
	g, hb := j.published()
	spares := make([]int, len(lost))
	for i := range spares {
		spares[i] = j.work + i
	}
	sw := swapHosts(j.groups, j.hostOf, j.holders, lost, spares, func(int) int {
		for r, h := range j.hostOf {
			if !slices.Contains(lost, h) {
				return r
			}
		}
		return 0
	})
	for _, r := range sw.lost {
		sw.holders[r] = nil // as everySubset: no rebase of the survivors
	}
	addrs := make([]string, len(j.c.hosts))
	for h, x := range j.c.hosts {
		addrs[h] = x.cfg.Listener.Addr().String()
	}
	for _, h := range lost {
		addrs[h] = ""
	}
	for _, sp := range spares {
		j.c.hosts[sp].SetAddrs(addrs)
		p := sw.placement(sp, epoch, g)
		p.H = hb
		if err := j.c.hosts[sp].SetPlacement(p); err != nil {
			t.Fatalf("spare %d: %v", sp, err)
		}
	}
	var mu sync.Mutex
	res, errs := map[int]*protect.Restorable{}, map[int]error{}
	var wg sync.WaitGroup
	for _, r := range sw.lost {
		wg.Go(func() {
			var got *protect.Restorable
			dr, err := newDiffRank(t, j.c.hosts[sw.hostOf[r]], r, 11, j.rs[r].committedStates())
			if err == nil {
				defer dr.close()
				got, err = dr.restore(context.Background())
			}
			if got == nil {
				got = &protect.Restorable{Step: noStep}
			}
			mu.Lock()
			res[r], errs[r] = got, err
			mu.Unlock()
		})
	}
	wg.Wait()
	return sw, res, errs
}
