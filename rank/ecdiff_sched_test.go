package rank

// Tests of diff mode under erasure coding: the base schedule starts at
// the first committed step, and an empty holder takes baseH.

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clearOwner returns an owner of dj that has a clear copy's holder, and
// that holder's rank.
func (dj *ecDiffJob) clearOwner() (owner, holder int) {
	dj.t.Helper()
	for r, hs := range dj.j.holders {
		if len(hs) > 0 {
			return r, hs[0]
		}
	}
	dj.t.Fatal("no rank has a clear copy's holder")
	return -1, -1
}

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

// TestECDiffBaseHToEmptyHolder: a clear copy's holder that holds nothing
// of the owner (a spare that took a lost host's place, before it has any
// base) takes baseH: there is no base of its own to keep. Before the fix
// it refused it ("this holder holds up to step -1"), and the owner, which
// sends baseH before the base, asked again for ever.
func TestECDiffBaseHToEmptyHolder(t *testing.T) {
	dj := newECDiffJob(t, 2, 1, 2, 3, nil)
	o, hr := dj.clearOwner()
	h := dj.j.c.hosts[dj.j.c.hostOf[o]]
	hdr := linkHdr{kind: kindBaseH, owner: o, holder: hr, step: 5, gen: h.Gen()}
	if err := h.links.call(context.Background(), dj.j.c.hostOf[hr], hdr, net.Buffers{frameHead(hdr, nil, 0, nil)}); err != nil {
		t.Fatalf("baseH 5 of rank %d to its clear copy's holder rank %d, which holds nothing of it: %v", o, hr, err)
	}
}

// TestECDiffBaseHRefusedGoesWhole: the clear copy's holder refuses every
// baseH of one owner (here its step is made one the holder does not
// hold). Before the fix the owner asked again after each backoff, for
// ever: the base never went, Base stayed at b_0 and G stalled at the cap.
// A refused baseH is not asked again: the base goes whole, and the job
// goes on past later bases.
func TestECDiffBaseHRefusedGoesWhole(t *testing.T) {
	const every = 3
	var owner atomic.Int64
	owner.Store(-1)
	var refused atomic.Int32
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if h.kind == kindBaseH && int64(h.owner) == owner.Load() {
			refused.Add(1)
			h.step = 1 << 40
			return net.Buffers{frameHead(h, nil, 0, nil)}
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	dj := newECDiffJob(t, 2, 1, 2, every, nil)
	o, _ := dj.clearOwner()
	owner.Store(int64(o))
	stop := dj.stoppable(nil)
	defer stop()
	const last = 13
	for s := int64(0); s <= last; s++ {
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
				dj.mu.Lock()
				g, hb := dj.g, dj.hb
				dj.mu.Unlock()
				t.Fatalf("rank %d step %d (G %d, H %d; rank %d's baseH refused %d times): %v", i, s, g, hb, o, refused.Load(), err)
			}
		}
	}
	dj.j.c.waitFor("G 13 and H 12", func() bool {
		dj.mu.Lock()
		defer dj.mu.Unlock()
		return dj.g == last && dj.hb == 12
	})
	stop()
	if refused.Load() == 0 {
		t.Fatal("no baseH was sent")
	}
	dj.mu.Lock()
	defer dj.mu.Unlock()
	dj.checkRecoverable()
}
