package rank

// Tests of diff mode under erasure coding: the base schedule starts at
// the first committed step.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestECDiffFirstStepIsB0: a trainer whose first step is not a multiple
// of B. Before the fix b_0 was the first step rounded up to a multiple of
// B, and Replicated said up to b_0 - 1 before any base was coded: G
// passed steps that no coded base covered (G 2 with H -1 for a first
// step 1 and B 3), a decode had nothing to start from, and the launcher
// and hotswap took them as recoverable. b_0 is the first committed step
// (PROTOCOL.md), so G >= 0 always comes with H >= 0, every base coded is
// b_0 + k·B, and after every step every rank survives any M lost hosts.
func TestECDiffFirstStepIsB0(t *testing.T) {
	const every = 3
	for _, first := range []int64{1, 2, 4} {
		t.Run(fmt.Sprintf("from %d", first), func(t *testing.T) {
			dj := newECDiffJob(t, 2, 1, 2, every, nil)
			dj.check = func(g, hb int64) {
				if g >= 0 && (hb < 0 || hb > g) {
					t.Errorf("published G %d with H %d: no coded base covers G", g, hb)
				}
			}
			stop := dj.stoppable(nil)
			defer stop()
			last := first + 3*every
			for s := first; s <= last; s++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				errs := make([]error, len(dj.rs))
				var wg sync.WaitGroup
				for i, dr := range dj.rs {
					wg.Go(func() { errs[i] = dr.step(ctx, s) })
				}
				wg.Wait()
				cancel()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("rank %d step %d: %v", i, s, err)
					}
				}
				dj.mu.Lock()
				dj.checkRecoverable()
				dj.mu.Unlock()
			}
			dj.j.c.waitFor(fmt.Sprintf("G %d and H %d", last, last), func() bool {
				dj.mu.Lock()
				defer dj.mu.Unlock()
				return dj.g == last && dj.hb == last
			})
			stop()
			for r := range dj.rs {
				s := dj.j.c.hosts[dj.j.c.hostOf[r]].svc(r)
				s.rep.mu.Lock()
				coded := slices.Clone(s.rep.ecb.coded)
				s.rep.mu.Unlock()
				for _, b := range coded {
					if (b-first)%every != 0 {
						t.Errorf("rank %d coded base %d, off the schedule %d + k·%d (coded %v)", r, b, first, every, coded)
					}
				}
			}
		})
	}
}
