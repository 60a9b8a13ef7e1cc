package keeper

// Tests of diff mode under erasure coding that the clear copy's holder
// only ever holds bases of the schedule, that Replicated counts only
// what a holder can restore from such a base, that the schedule starts
// at the first committed step, and that an empty holder takes baseH.

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

// damageDiff returns bufs (a differential's frame) with a byte of its
// record flipped.
func damageDiff(bufs net.Buffers) net.Buffers {
	d := slices.Clone(bufs[1])
	d[len(d)/2] ^= 0xff
	out := slices.Clone(bufs)
	out[1] = d
	return out
}

// stepIn runs step s on every rank side by side, each within 5 s: a job
// that stalls fails the test (naming G, H and what the test did) instead
// of hanging.
func (dj *ecDiffJob) stepIn(s int64, what string) {
	dj.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := make([]error, len(dj.rs))
	var wg sync.WaitGroup
	for i, dr := range dj.rs {
		wg.Go(func() { errs[i] = dr.step(ctx, s) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			dj.mu.Lock()
			g, hb := dj.g, dj.hb
			dj.mu.Unlock()
			dj.t.Fatalf("rank %d step %d (G %d, H %d; %s): %v", i, s, g, hb, what, err)
		}
	}
}

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

// TestECDiffClearHolderBaseOnSchedule: the clear copy's holder refuses a
// differential that is not a base step twice as damaged; the owner then
// forgets what it takes next. Before the fix it asked whether the holder
// held the oldest slot step after what it acknowledged (it did not) and
// sent it a base of that slot: a base at step 4, off the schedule (0, 3,
// 6, ...), which the holder's store then kept in place of the coded
// base a decode at H reads. Every base (kind 5) the holder gets must be
// at a step of the schedule, and the job goes on with every step up to G
// recoverable.
func TestECDiffClearHolderBaseOnSchedule(t *testing.T) {
	const every = 3
	var owner, holder atomic.Int64
	owner.Store(-1)
	var damaged atomic.Int32
	var mu sync.Mutex
	var bases []int64 // steps of the bases (kind 5) sent to the holder
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if int64(h.owner) != owner.Load() || int64(h.holder) != holder.Load() {
			return bufs
		}
		switch {
		case h.kind == kindBase:
			mu.Lock()
			bases = append(bases, h.step)
			mu.Unlock()
		case h.kind == kindDiff && h.step == 4 && len(bufs) > 1 && len(bufs[1]) > 0 && damaged.Add(1) <= 2:
			return damageDiff(bufs)
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	dj := newECDiffJob(t, 2, 1, 2, every, nil)
	o, hr := dj.clearOwner()
	owner.Store(int64(o))
	holder.Store(int64(hr))
	stop := dj.stoppable(nil)
	defer stop()
	const last = 13
	for s := int64(0); s <= last; s++ {
		dj.step(context.Background(), s)
	}
	dj.j.c.waitFor("G 13 and H 12", func() bool {
		dj.mu.Lock()
		defer dj.mu.Unlock()
		return dj.g == last && dj.hb == 12
	})
	stop()
	if damaged.Load() < 2 {
		t.Fatalf("the differential of step 4 was damaged %d times", damaged.Load())
	}
	mu.Lock()
	for _, b := range bases {
		if b%every != 0 {
			t.Errorf("rank %d's clear copy's holder rank %d got a base of step %d, off the schedule (every %d from 0); bases sent: %v", o, hr, b, every, bases)
			break
		}
	}
	mu.Unlock()
	dj.mu.Lock()
	defer dj.mu.Unlock()
	dj.checkRecoverable()
}

// TestECDiffAckedHeldByClearHolder: the clear copy's holder refuses
// every chunk of base 3's refresh as damaged, so the owner sends base 3
// whole (kind 5, from the snapshot) after it acknowledged steps past 3.
// Before the fix the holder made a new store of the base alone (the
// steps after 3 it acknowledged stayed in the store it replaced, which
// goes once H reaches 3) and the owner went on counting them: Replicated
// said steps the holder could not restore from its base. Whenever the
// owner sends the holder a request, what the owner counts it as holding
// must be in the range of the holder's current store; and the job goes
// on past later bases.
func TestECDiffAckedHeldByClearHolder(t *testing.T) {
	const every = 3
	var owner, holder atomic.Int64
	owner.Store(-1)
	var dj *ecDiffJob
	var bad atomic.Value
	var whole atomic.Bool
	check := func(h linkHdr) {
		s := dj.j.c.hosts[dj.j.c.hostOf[h.owner]].svc(h.owner)
		k := holderKey{rank: h.holder, host: dj.j.c.hostOf[h.holder]}
		s.rep.mu.Lock()
		a, ok := s.rep.acked[k]
		s.rep.mu.Unlock()
		if !ok || a < 0 {
			return
		}
		o := copyOf(dj.j.c.hosts[k.host], h.owner)
		first, last, held := int64(-1), int64(-1), false
		if o != nil {
			o.mu.Lock()
			if o.cur != nil {
				first, last, held = o.cur.Range()
			}
			o.mu.Unlock()
		}
		if !held || a < first || a > last {
			bad.CompareAndSwap(nil, fmt.Sprintf("before a request of kind %d step %d: rank %d counts its clear copy's holder rank %d as holding step %d; the holder's store holds %d..%d (%v)", h.kind, h.step, h.owner, h.holder, a, first, last, held))
		}
	}
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if int64(h.owner) != owner.Load() || int64(h.holder) != holder.Load() {
			return bufs
		}
		check(h)
		switch {
		case h.kind == kindBase && h.step == every:
			whole.Store(true)
		case h.kind == kindBaseChunk && h.step == every && len(bufs) > 1 && len(bufs[1]) > 0:
			d := slices.Clone(bufs[1])
			d[0] ^= 0xff
			return net.Buffers{bufs[0], d}
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	dj = newECDiffJob(t, 2, 1, 2, every, nil)
	o, hr := dj.clearOwner()
	owner.Store(int64(o))
	holder.Store(int64(hr))
	stop := dj.stoppable(nil)
	defer stop()
	const last = 13
	for s := int64(0); s <= last; s++ {
		dj.stepIn(s, fmt.Sprintf("rank %d's refresh of 3 always damaged", o))
	}
	dj.j.c.waitFor("G 13 and H 12", func() bool {
		dj.mu.Lock()
		defer dj.mu.Unlock()
		return dj.g == last && dj.hb == 12
	})
	stop()
	if !whole.Load() {
		t.Fatalf("rank %d never sent base 3 whole", o)
	}
	if msg, _ := bad.Load().(string); msg != "" {
		t.Error(msg)
	}
	dj.mu.Lock()
	defer dj.mu.Unlock()
	dj.checkRecoverable()
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
				dj.stepIn(s, fmt.Sprintf("first step %d", first))
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
// hold: failBehindH). Before the fix the owner asked again after each
// backoff, for ever: the base never went, Base stayed at b_0 and G
// stalled at the cap. A baseH refused for that reason is not asked
// again: the base goes whole, and the job goes on past later bases
// (TestECDiffBaseHTransientRefusal has the other reasons).
func TestECDiffBaseHRefusedGoesWhole(t *testing.T) {
	const every = 3
	var owner, holder atomic.Int64
	owner.Store(-1)
	var refused, wholes atomic.Int32
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		switch {
		case h.kind == kindBaseH && int64(h.owner) == owner.Load():
			refused.Add(1)
			h.step = 1 << 40
			return net.Buffers{frameHead(h, nil, 0, nil)}
		case h.kind == kindBase && int64(h.owner) == owner.Load() && int64(h.holder) == holder.Load() && h.step >= every:
			wholes.Add(1)
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	dj := newECDiffJob(t, 2, 1, 2, every, nil)
	o, hr := dj.clearOwner()
	holder.Store(int64(hr))
	owner.Store(int64(o))
	stop := dj.stoppable(nil)
	defer stop()
	const last = 13
	for s := int64(0); s <= last; s++ {
		dj.stepIn(s, fmt.Sprintf("rank %d's baseH refused", o))
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
	if wholes.Load() == 0 {
		t.Fatalf("rank %d's holder refused baseH (it holds no step up to H: failBehindH), and no base went whole", o)
	}
	dj.mu.Lock()
	defer dj.mu.Unlock()
	dj.checkRecoverable()
}
