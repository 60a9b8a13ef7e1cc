package keeper

import "time"

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
		// Nothing to send but the base: as much of it as its pacing
		// allows now (the rank may be waiting for it at the overwrite
		// rule: a pause in its commits counts as a step), whole when
		// it is not paced.
		if r.ref == nil || !r.gateOpen(r.ref) {
			return false
		}
		if pr := r.refProg[k]; pr != nil && pr.done {
			return false
		}
		if r.clearLimitLocked(r.ref, r.refProg[k]) == 0 {
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
			act.ref, act.prog, act.limit = r.ref, pr, r.clearLimitLocked(r.ref, pr)
			act.ref.rb.retain()
		}
	}
	return true
}

// clearLimitLocked returns the bytes of base ref's refresh the clear
// copy's holder, at progress pr (nil: none yet), may be sent in a round
// planned now: what the base's pacing allows beyond what went, every
// byte left when it is not paced. The refresh is paced as the base's
// shares are, by the same sharePace (refPaceLocked): by the time the rank
// commits base+i at most budget·(i+1) bytes went, every byte from
// base+σ-1 on, a pause in the commits counting as a step, and every byte
// once the base is the schedule's anchor (lift). A refresh whose bytes
// all went but not its commit is not held (-1: its commit goes), nor one
// that goes whole as a base (asBase: a holder that cannot take chunks;
// it is one message). While it is held, the loop is run again when a
// pause would allow more (pacedRetryLocked). The gate is open. r.mu is
// held.
func (r *replicator) clearLimitLocked(ref *refresh, pr *refProg) int64 {
	total := int64(len(ref.buf))
	var off int64
	if pr != nil {
		off = pr.off
		if pr.asBase {
			return total
		}
	}
	if off >= total {
		return -1
	}
	p := r.refPaceLocked(ref)
	if p == nil {
		return total - off
	}
	p.mu.Lock()
	allowed, next := p.allowedLocked(time.Now())
	p.mu.Unlock()
	if allowed <= off {
		r.pacedRetryLocked(next)
		return 0
	}
	return allowed - off
}

// pacedRetryLocked has the loop run again in d (a clear copy's refresh
// held by its pacing until a pause in the commits allows more: a commit
// runs it anyway). r.mu is held.
func (r *replicator) pacedRetryLocked(d time.Duration) {
	b := &r.ecb
	if b.paceRetry != nil || r.stopped || r.failed {
		return
	}
	r.loopAfterLocked(&b.paceRetry, d, r.poke) // its next round plans again (and holds it again, if need be)
}

// loopAfterLocked arms *slot to run the replicator's loop in d, unless it
// stopped or failed meanwhile: while a round runs, with whileRunning
// (which has the round's end plan again), else by starting it. A timer
// stopped or replaced in *slot before its function took r.mu does
// nothing (its Stop may come too late to keep the function from
// running). r.mu is held.
func (r *replicator) loopAfterLocked(slot **time.Timer, d time.Duration, whileRunning func()) {
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if *slot != t {
			return
		}
		*slot = nil
		switch {
		case r.stopped || r.failed:
		case r.running:
			whileRunning()
		default:
			r.startLocked()
		}
	})
	*slot = t
}

// stopPacedRetryLocked stops pacedRetryLocked's timer. r.mu is held.
func (r *replicator) stopPacedRetryLocked() {
	if t := r.ecb.paceRetry; t != nil {
		t.Stop()
		r.ecb.paceRetry = nil
	}
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
