package keeper

// Tests of the whole base to the clear copy's holder in diff mode under
// erasure coding: what the owner counts the holder as holding after it,
// and when the base goes whole rather than after baseH.

import (
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
)

// damageData returns bufs (a request's frame: its head, then data) with
// the first byte of its first data buffer flipped.
func damageData(bufs net.Buffers) net.Buffers {
	out := slices.Clone(bufs)
	d := slices.Clone(bufs[1])
	d[0] ^= 0xff
	out[1] = d
	return out
}

// TestECDiffWholeBaseAfterAllAcked: base b's refresh cannot go in
// chunks to rank o's clear copy's holder (every chunk is damaged), and
// its whole base (kind 5) is damaged too until the holder acknowledged
// the newest step, top, and every holder did, so that the owner's queue
// of differentials is empty. Then the whole base goes through: the holder
// grafts it onto its store, which keeps steps b..top, and the owner
// counts the holder as holding b (what it acknowledged before may have
// gone with a replaced store). Before the fix the owner then had nothing
// to probe the holder with (no differential after b is queued), sent
// nothing, and Replicated stayed b for good: Stage(top+1) waited for G
// top for ever (the review's scratch test: B 3, top 4; B 6, top 9). The
// holder is asked whether it holds top, and the job goes on past later
// bases, every step up to G recoverable.
func TestECDiffWholeBaseAfterAllAcked(t *testing.T) {
	for _, every := range []int64{3, 6} {
		t.Run(fmt.Sprintf("B%d", every), func(t *testing.T) {
			top := every + every/2 // G may reach b + σ - 1 before b is coded
			var owner, holder atomic.Int64
			owner.Store(-1)
			var armed atomic.Bool
			armed.Store(true)
			var damagedWhole, wholeOK atomic.Int32
			testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
				if int64(h.owner) != owner.Load() || int64(h.holder) != holder.Load() || h.step != every || len(bufs) < 2 || len(bufs[1]) == 0 {
					return bufs
				}
				switch {
				case h.kind == kindBaseChunk:
					return damageData(bufs)
				case h.kind == kindBase && armed.Load():
					damagedWhole.Add(1)
					return damageData(bufs)
				case h.kind == kindBase:
					wholeOK.Add(1)
				}
				return bufs
			}
			t.Cleanup(func() { testHookLinkFrame = nil })
			dj := newECDiffJob(t, 2, 1, 2, int(every), nil)
			o, hr := dj.clearOwner()
			owner.Store(int64(o))
			holder.Store(int64(hr))
			stop := dj.stoppable(nil)
			defer stop()
			what := fmt.Sprintf("rank %d's base %d goes whole after every holder acknowledged %d", o, every, top)
			for s := int64(0); s <= top; s++ {
				dj.stepIn(s, what)
			}
			s := dj.j.c.hosts[dj.j.c.hostOf[o]].svc(o)
			k := holderKey{rank: hr, host: dj.j.c.hostOf[hr]}
			dj.j.c.waitFor(fmt.Sprintf("the holder acknowledged %d, the queue is empty, and base %d waits to go whole", top, every), func() bool {
				s.rep.mu.Lock()
				defer s.rep.mu.Unlock()
				pr := s.rep.refProg[k]
				return s.rep.acked[k] == top && len(s.rep.dq) == 0 && s.rep.ref != nil && s.rep.ref.step == every &&
					pr != nil && pr.asBase && !pr.in && damagedWhole.Load() > 0
			})
			armed.Store(false)
			s.rep.poke()
			last := 3*every + 1
			for s := top + 1; s <= last; s++ {
				dj.stepIn(s, what)
			}
			dj.j.c.waitFor(fmt.Sprintf("G %d and H %d", last, 3*every), func() bool {
				dj.mu.Lock()
				defer dj.mu.Unlock()
				return dj.g == last && dj.hb == 3*every
			})
			stop()
			if wholeOK.Load() == 0 {
				t.Fatalf("rank %d's base %d never went whole undamaged", o, every)
			}
			dj.mu.Lock()
			defer dj.mu.Unlock()
			dj.checkRecoverable()
		})
	}
}

// TestECDiffBaseHTransientRefusal: rank o's clear copy's holder refuses
// baseH before base 6 for a passing reason (here: the holder rank is not
// on the host asked, as while a placement switches), twice. The holder's
// host learns H late (it is told H 0 while the job's H is 3), so its
// store keeps o's verified refresh of 3 waiting for H: a decode at H 3
// reads it there. Before the fix the owner took any refusal of baseH for
// "the holder holds no step up to H" and sent base 6 whole without it;
// the holder grafted it (BeginBase(6)), which dropped the verified
// refresh of 3, and the data host held no shard of o at H. A refusal for
// any other reason than failBehindH is retried (after a backoff): baseH
// reaches the holder, the refresh of 3 installs, and base 6 goes in
// chunks. (TestECDiffBaseHRefusedGoesWhole has the other reason: the
// base goes whole.)
func TestECDiffBaseHTransientRefusal(t *testing.T) {
	const every = 3
	const refusals = 2
	var owner, holder atomic.Int64
	owner.Store(-1)
	var refused, baseHs, wholes atomic.Int32
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if int64(h.owner) != owner.Load() || int64(h.holder) != holder.Load() || h.step < every {
			return bufs
		}
		switch h.kind {
		case kindBaseH:
			baseHs.Add(1)
			if refused.Add(1) <= refusals {
				h.holder = h.owner // not a rank of the holder's host
				return net.Buffers{frameHead(h, nil, 0, nil)}
			}
		case kindBase:
			wholes.Add(1)
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	dj := newECDiffJob(t, 2, 1, 2, every, nil)
	o, hr := dj.clearOwner()
	hh := dj.j.c.hostOf[hr]
	var late atomic.Bool // the holder's host is told H 0 at most
	late.Store(true)
	stop := dj.stoppable(func(i int, hb int64) int64 {
		if i == hh && late.Load() {
			return min(hb, 0)
		}
		return hb
	})
	defer stop()
	what := fmt.Sprintf("rank %d's baseH refused twice by its holder rank %d", o, hr)
	for s := int64(0); s <= 5; s++ {
		dj.stepIn(s, what)
	}
	dj.j.c.waitFor("H 3", func() bool { dj.mu.Lock(); defer dj.mu.Unlock(); return dj.hb == every })
	if !baseAt(dj.j.c.hosts[hh], o, every) {
		t.Fatalf("host %d holds no base of rank %d at H %d before base 6", hh, o, every)
	}
	owner.Store(int64(o))
	holder.Store(int64(hr))
	dj.stepIn(6, what)
	s := dj.j.c.hosts[dj.j.c.hostOf[o]].svc(o)
	// Seen in the holder's store, not in the owner's refProg: that is
	// its sending goroutine's alone during a round (reading it raced).
	dj.j.c.waitFor("rank o's base 6 in its clear copy's holder", func() bool {
		s.rep.mu.Lock()
		coded := slices.Contains(s.rep.ecb.coded, 2*every)
		s.rep.mu.Unlock()
		return coded || baseAt(dj.j.c.hosts[hh], o, 2*every)
	})
	dj.mu.Lock()
	hb := dj.hb
	dj.mu.Unlock()
	if hb != every {
		t.Fatalf("H moved to %d while host %d was told H 0", hb, hh)
	}
	if !baseAt(dj.j.c.hosts[hh], o, every) {
		t.Errorf("with H %d, host %d (rank %d's data host) holds no base of rank %d at H: its verified refresh of %d was dropped", hb, hh, hr, o, every)
	}
	if n := wholes.Load(); n != 0 {
		t.Errorf("rank %d sent its holder %d whole bases after baseH was refused for a passing reason", o, n)
	}
	if n := baseHs.Load(); n <= refusals {
		t.Errorf("rank %d sent baseH %d times, the first %d refused: not asked again", o, n, refusals)
	}
	late.Store(false)
	const last = 13
	for s := int64(7); s <= last; s++ {
		dj.stepIn(s, what)
	}
	dj.j.c.waitFor("G 13 and H 12", func() bool {
		dj.mu.Lock()
		defer dj.mu.Unlock()
		return dj.g == last && dj.hb == 12
	})
	stop()
	dj.mu.Lock()
	defer dj.mu.Unlock()
	dj.checkRecoverable()
}
