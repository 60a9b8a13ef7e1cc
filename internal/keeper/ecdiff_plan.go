package keeper

import ()

// ecDataLocked records, after a round, whether the clear copy's holder
// holds the current base (it committed the refresh, or got a base at its
// step). r.mu is held.
func (r *replicator) ecDataLocked(p *placement) {
	ref := r.ref
	if ref == nil || ref.data {
		return
	}
	ts := p.targets(r.s.rank)
	for _, k := range ts {
		if pr := r.refProg[k]; pr == nil || !pr.in {
			return
		}
	}
	ref.data = true
	r.advanceLocked()
}

// planClearLocked plans the part of a round of act.k, the clear copy's
// holder, into act (a is what it acknowledged, n its Next if known):
// true if it has one. Its store holds the schedule's bases (a decode at
// H reads the base at exactly H there), so it never gets a base of a
// slot at whatever step the slot holds, as in plain diff mode
// (planDiffLocked): a holder whose step is not known is asked whether it
// holds the oldest step in a slot that G may come to name; if not, it is
// sent the differential after what it acknowledged, else the oldest
// queued one, whose answer (an acknowledgement, or a gap with the step
// it takes next) says where it stands (needProbe). One that cannot
// follow the queue (it has no base, or
// lacks steps the queue no longer has) gets the schedule's base from its
// snapshot, whole (refBaseLocked). next is planDiffLocked's. r.mu is
// held.
func (r *replicator) planClearLocked(act *diffAct, a, n int64, known bool, next func(int64) int64) bool {
	k := act.k
	switch {
	case !known:
		if act.base = next(a); act.base < 0 {
			return false
		}
		act.has, act.noSlotBase = true, true
		return true
	case n == needProbe:
		// It holds what it acknowledged, perhaps more: the step after
		// it, else the oldest queued one.
		if act.d = r.diffAt(a + 1); act.d == nil && len(r.dq) > 0 && r.dq[0].step > a+1 {
			act.d = r.dq[0]
		}
		if act.d == nil && a < r.wantS {
			if r.refBaseLocked(act) {
				return true
			}
			// No differential after a is queued: every target
			// acknowledged up to wantS (the queue was trimmed) before a
			// whole base lowered a to its step. The holder grafted that
			// base onto the store that held them, so it may hold wantS
			// still: it is asked (kindHas, with wantS's committed
			// CRC32Cs). A refusal backs the round off, and it is asked
			// again (sendTo).
			act.base, act.has, act.noSlotBase, act.top = r.wantS, true, true, true
			return true
		}
	case n == needBase:
		return r.refBaseLocked(act)
	case n <= r.wantS:
		if act.d = r.diffAt(n); act.d == nil {
			return r.refBaseLocked(act)
		}
	case a < r.wantS && a+1 < n:
		// Sent and never acknowledged: again from the first step it
		// lacks (see planDiffLocked).
		if act.d = r.diffAt(a + 1); act.d == nil {
			return r.refBaseLocked(act)
		}
	}
	if act.d == nil {
		// Nothing to send but the base: it goes whole (the rank may be
		// waiting for it at the overwrite rule).
		if r.ref == nil || !r.gateOpen(r.ref) {
			return false
		}
		if pr := r.refProg[k]; pr != nil && pr.done {
			return false
		}
	} else {
		act.d.rec.retain()
	}
	if r.ref != nil && r.gateOpen(r.ref) {
		pr := r.refProg[k]
		if pr == nil {
			pr = &refProg{}
			r.refProg[k] = pr
		}
		if !pr.done {
			act.ref, act.prog = r.ref, pr
			act.ref.rb.retain()
		}
	}
	return true
}

// refBaseLocked plans the schedule's base for act.k, the clear copy's
// holder, which cannot follow the queued differentials: the base being
// sent (r.ref, the snapshot of a base step), whole, past the gate. A
// holder that has it already, or a base that waits at the gate, gets
// nothing: the next base will do. r.mu is held.
func (r *replicator) refBaseLocked(act *diffAct) bool {
	ref := r.ref
	if ref == nil || !r.gateOpen(ref) {
		return false
	}
	pr := r.refProg[act.k]
	if pr == nil {
		pr = &refProg{}
		r.refProg[act.k] = pr
	}
	if pr.in {
		return false
	}
	pr.asBase, pr.done = true, false
	act.ref, act.prog = ref, pr
	ref.rb.retain()
	return true
}
