package rank

// Tests of the whole base to the clear copy's holder in diff mode under
// erasure coding: what the owner counts the holder as holding after it.

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
