package keeper

import (
	"net"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
)

// ---- The owner's side ---------------------------------------------------

// ownerDiff is one committed step's differential, as the owner sends it.
// Immutable once built, but for rec's count.
type ownerDiff struct {
	step  int64
	table []tableEntry // every replicated region, with its CRC32C committed at step
	opt   int          // the optimizer region's index in table
	d     diffstore.Diff
	bytes int64        // on the wire after the table
	ref   *diffRefInfo // the rank declared a reduced gradient: what a differential by reference carries
	// rec is d.Record's buffer (from the service's pool) and its
	// references: the replicator's queue, and each send in flight
	// (planDiffLocked takes one for its round). At the last release the
	// buffer goes back to the pool, to be overwritten by a later step's
	// record: no one may read d.Record without a reference.
	rec refBuf
}

// frame returns the request's bytes for holder h.
func (od *ownerDiff) frame(h linkHdr) net.Buffers {
	b := frameHead(h, od.table, uint64(od.bytes), nil)
	b = appendDiffDesc(b, od)
	bufs := net.Buffers{b, od.d.Record}
	for i, e := range od.table {
		if i != od.opt && e.size > 0 {
			bufs = append(bufs, od.d.Other[e.name])
		}
	}
	return bufs
}

// refresh is a base refresh the owner sends, in chunks: a snapshot of
// the replicated regions at step.
type refresh struct {
	step  int64
	table []tableEntry // with the CRC32Cs committed at step
	buf   []byte       // the regions, concatenated in table order
	offs  []int64      // each region's offset in buf
	// budget is the bytes sent per holder after each differential.
	budget int64
	// rb is buf's buffer (from the replicator's refPool) and its
	// references: the replicator's (r.ref), and each send in flight (as
	// ownerDiff.rec). At the last release the next refresh may take it.
	rb refBuf
	// Diff mode under EC (ecdiff_owner.go): the restart generation and
	// label (the slot's epoch) of the base's shares; whether every parity
	// row has its share (rows), the data host its bytes (data), and
	// whether the base counts as coded (Base_r) already. r.mu guards the
	// flags.
	gen, epoch        uint64
	rows, data, coded bool
	// pace paces both sends of the base, its shares and the clear
	// copy's refresh (nil: unpaced), decided when the first of them
	// starts (refPaceLocked: paced says it was). r.mu guards them.
	pace  *sharePace
	paced bool
}

// refProg is one holder's progress through the current refresh: only the
// goroutine sending to that holder touches it during a round.
type refProg struct {
	off     int64 // bytes of buf sent
	done    bool  // committed, or given up (the next refresh will do)
	retries int
	// in: the holder committed the refresh, or got a base at its step
	// (diff mode under EC: the data host holds the base). hSent: baseH
	// went before the first chunk.
	in, hSent bool
	// asBase: send the refresh whole as a base (kind 5) from the
	// snapshot, not in chunks (diff mode under EC, once chunks cannot
	// do: the holder has no base, a newer one, or refused the commit
	// twice as damaged).
	asBase bool
}

// diffAct is what one holder gets in a round.
type diffAct struct {
	k holderKey
	// logAt ≥ -1 with logBegin: anchor log-only holder k's log there;
	// lost: because it lacks steps older than the queue (a failure: the
	// round backs off).
	logBegin, lost bool
	logAt          int64
	logEpoch       uint64     // the epoch the rank last resumed under (ecBase.resumedEpoch): the logBegin carries it
	has            bool       // ask whether it holds base first
	base           int64      // ≥ 0: send it a base at this step
	d              *ownerDiff // else: this differential
	ref            *refresh   // then chunks of this refresh (prog)
	prog           *refProg
	limit          int64 // the most bytes of ref's chunks sent in the round
	// noSlotBase (diff mode under EC, the clear copy's holder): with has,
	// no base follows if it does not hold base: it is probed next
	// (needProbe). top: base is the newest committed step, asked because
	// no differential after what the holder acknowledged is queued
	// (planClearLocked); a refusal is a failure of the round, which backs
	// off before it asks again.
	noSlotBase, top bool
}

// diffRes is the outcome of one holder's round.
type diffRes struct {
	acked   int64 // the step acknowledged, or -1
	next    int64 // the step it takes next, when setNext
	setNext bool
	forget  bool // it needs to be asked (has) or sent a base
	// reanchored: a log-only holder's log holds nothing up to the step
	// it was anchored at; none of its acknowledgements before count.
	reanchored bool
	damaged    bool  // it refused a differential as damaged
	base       int64 // the step of a base it got, or -1
	err        error
	baseB      int64 // bytes of bases and chunks sent
	diffB      int64 // bytes of differentials sent
	// rebased: it got the base whole (diff mode under EC): acked is the
	// base's step, the most the owner knows it holds (what it
	// acknowledged before may have gone with the store it replaced).
	rebased bool
}

type diffPlan struct {
	acts []diffAct
	ver  uint64
}

// release gives back the round's references to the differentials and
// refreshes it sent: every send of the round has returned.
func (p *diffPlan) release() {
	for _, a := range p.acts {
		if a.d != nil {
			a.d.rec.release()
		}
		if a.ref != nil {
			a.ref.rb.release()
		}
	}
}

// committed hands the replicator step, just committed in generation gen,
// and its differential od (diff mode; nil in full mode), unless a restart
// began since (the host's generation is no longer gen): truncateDiffs,
// which a restart's truncate runs after the generation changed, takes the
// same lock, so a step of an older generation is either queued before it
// and dropped by it, or not queued at all.
func (r *replicator) committed(gen uint64, od *ownerDiff, step int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.s.h.Gen() != gen {
		if od != nil {
			od.rec.release()
		}
		return
	}
	if od != nil {
		r.pushDiffLocked(od)
	}
	r.firstCommitLocked(gen, step) // diff mode under EC: the schedule's anchor
	r.pacedCommitLocked(step)      // and the pacing of its bases' shares
	if r.stopped || r.failed {
		return
	}
	r.wantS = max(r.wantS, step)
	r.startLocked()
}

// pushDiffLocked queues the differential of a step just committed (r.mu
// is held), taking over the caller's reference to it. The queue holds
// consecutive steps (a step that does not follow, after a restore,
// starts it anew) and keeps at most the steps some holder may still need:
// trimLocked drops those every holder acknowledged; beyond 4 steps and
// twice the base's bytes the oldest go (a holder that needed them gets a
// base). A differential dropped while a send still writes it keeps its
// buffer until that send's round releases it.
func (r *replicator) pushDiffLocked(od *ownerDiff) {
	if n := len(r.dq); n > 0 && r.dq[n-1].step+1 != od.step {
		r.dropDiffsLocked(0, n)
	}
	r.dq = append(r.dq, od)
	r.dqBytes += od.bytes
	limit := 2 * int64(tableBytes(od.table))
	for len(r.dq) > 4 && r.dqBytes > limit {
		r.dropDiffsLocked(0, 1)
	}
}

// dropDiffsLocked drops r.dq[i:j] (i == 0 or j == len(r.dq)) from the
// queue and releases the queue's references to them. r.mu is held.
func (r *replicator) dropDiffsLocked(i, j int) {
	for k := i; k < j; k++ {
		r.dqBytes -= r.dq[k].bytes
		r.dq[k].rec.release()
		r.dq[k] = nil
	}
	if i == 0 {
		r.dq = r.dq[j:]
	} else {
		r.dq = r.dq[:i]
	}
}

// diffAt returns the queued differential of step, or nil. r.mu is held.
func (r *replicator) diffAt(step int64) *ownerDiff {
	if len(r.dq) == 0 || step < r.dq[0].step || step > r.dq[len(r.dq)-1].step {
		return nil
	}
	return r.dq[step-r.dq[0].step]
}

// trimLocked drops the differentials every current holder acknowledged.
func (r *replicator) trimLocked() {
	ts := r.s.h.place().diffTargets(r.s.rank)
	m := int64(protect.MaxStep)
	for _, k := range ts {
		a, ok := r.acked[k]
		if !ok {
			a = noStep
		}
		m = min(m, a)
	}
	i := 0
	for i < len(r.dq) && r.dq[i].step <= m {
		i++
	}
	r.dropDiffsLocked(0, i)
}

// truncateDiffs drops what the replicator keeps of the steps after g (a
// restart or a restore resumes from g). It is not running.
func (r *replicator) truncateDiffs(g int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := len(r.dq)
	for k > 0 && r.dq[k-1].step > g {
		k--
	}
	if k < len(r.dq) {
		r.dropDiffsLocked(k, len(r.dq))
	}
	if r.ref != nil && r.ref.step > g {
		r.dropRefLocked()
	}
	if r.refStep > g {
		r.refStep = max(g, noStep)
	}
	clear(r.refProg)
	// The rank resumes from g under the host's placement: the logs it
	// anchors from now on are of that placement's trajectory (logBegin
	// carries its epoch; the holders fence no log anchored under it).
	r.ecb.resumedEpoch = r.s.h.place().epoch
	// A snapshot refused before is asked for anew: the wait for room
	// starts again (ecdiff_mem.go).
	r.ecb.noRoom = 0
	r.stopSnapRetryLocked()
	r.stopPacedRetryLocked()
	// Diff mode under EC: the bases after g are of an abandoned
	// trajectory; the schedule goes on from the next base after what is
	// left.
	r.dropRetainedAfterLocked(g)
	if b := &r.ecb; b.set {
		b.next = b.anchor
		if n := b.base(); n >= b.anchor {
			b.next = n + r.every()
		}
		if r.ref != nil {
			b.next = max(b.next, r.ref.step+r.every())
		}
	}
}

// planDiffLocked returns the next round: for every holder with something
// to get, what. The round holds a reference to each differential and
// refresh it sends (diffPlan.release gives them back). r.mu is held.
func (r *replicator) planDiffLocked() diffPlan {
	s := r.s
	pl := s.h.place()
	ecDiff := pl.ecDiff()
	ts := pl.diffTargets(s.rank)
	g := s.h.G()
	s.mu.Lock()
	steps := s.slotStep
	s.mu.Unlock()
	// next: the oldest step in a slot after after that G may come to name
	// (planLocked's): a base there keeps every such step at the holder.
	next := func(after int64) int64 {
		n := int64(noStep)
		for _, st := range steps {
			if st > after && st >= g && st <= r.wantS && (n < 0 || st < n) {
				n = st
			}
		}
		return n
	}
	p := diffPlan{ver: r.ver}
	for _, k := range ts {
		a, ok := r.acked[k]
		if !ok {
			a = noStep
		}
		act := diffAct{k: k, base: noStep}
		n, known := r.dnext[k]
		if k.log {
			if r.planLogLocked(&act, a, n, known) {
				p.acts = append(p.acts, act)
			}
			continue
		}
		if ecDiff {
			if r.planClearLocked(&act, a, n, known, next) {
				p.acts = append(p.acts, act)
			}
			continue
		}
		switch {
		case !known:
			if act.base = next(a); act.base < 0 {
				continue
			}
			act.has = true
		case n == needBase:
			if act.base = next(a); act.base < 0 {
				continue
			}
		case n <= r.wantS:
			if act.d = r.diffAt(n); act.d == nil {
				if act.base = next(a); act.base < 0 {
					continue
				}
			}
		case a < r.wantS && a+1 < n:
			// Sent and never acknowledged (lost on the way, or taken but
			// not restorable yet): again from the first step it lacks. A
			// holder takes a step it holds as a no-op, and acknowledges.
			if act.d = r.diffAt(a + 1); act.d == nil {
				if act.base = next(a); act.base < 0 {
					continue
				}
			}
		default:
			continue
		}
		if act.d != nil {
			act.d.rec.retain()
		}
		if act.d != nil && r.ref != nil {
			pr := r.refProg[k]
			if pr == nil {
				pr = &refProg{}
				r.refProg[k] = pr
			}
			if !pr.done {
				act.ref, act.prog, act.limit = r.ref, pr, r.ref.budget
				act.ref.rb.retain()
			}
		}
		p.acts = append(p.acts, act)
	}
	return p
}

// applyLocked records a round's outcome. r.mu is held.
func (r *replicator) applyLocked(p diffPlan, res []diffRes) {
	for i, a := range p.acts {
		x, k := res[i], a.k
		if x.reanchored {
			delete(r.acked, k) // it holds none of the steps it acknowledged
		}
		switch {
		case x.rebased:
			r.acked[k] = x.acked
		case x.acked >= 0:
			if v, ok := r.acked[k]; !ok || x.acked > v {
				r.acked[k] = x.acked
			}
		}
		switch {
		case x.forget:
			delete(r.dnext, k)
		case x.setNext:
			r.dnext[k] = x.next
		}
		if x.damaged {
			if r.dfails[k]++; r.dfails[k] >= 2 {
				// Sent twice and refused twice: a base, checked against
				// the slot's CRC32Cs, replaces the differential.
				delete(r.dnext, k)
				delete(r.dfails, k)
			}
		} else if x.err == nil {
			delete(r.dfails, k)
		}
		if x.base >= 0 && r.ref != nil && x.base >= r.ref.step {
			pr := r.refProg[k]
			if pr == nil {
				pr = &refProg{}
				r.refProg[k] = pr
			}
			if x.base == r.ref.step {
				pr.done, pr.in = true, true
			} else if !r.s.h.place().ecDiff() {
				pr.done = true // a newer base will do
			}
			// Diff mode under EC: a newer base does not hold the
			// scheduled base; the refresh still goes (its chunks are
			// refused as stale, and it goes whole: sendChunks).
		}
	}
}

// releaseRefLocked lets go of the refresh being sent (its snapshot
// buffer, the size of the replicated regions) once every current holder
// has it: committed, given up, or a base at its step or later; in diff
// mode under EC once it is coded (committed or a base at exactly its
// step, and every parity row's share). r.mu is held.
func (r *replicator) releaseRefLocked() {
	if r.ref == nil {
		return
	}
	p := r.s.h.place()
	for _, k := range p.targets(r.s.rank) {
		if pr := r.refProg[k]; pr == nil || !pr.done {
			return
		}
	}
	if p.ecDiff() {
		// Diff mode under EC: also once every parity row has its share
		// (a retained snapshot keeps its own reference).
		// A base is never let go before it is coded: the next one's
		// gate waits for H to reach it (a holder that cannot take its
		// chunks gets it whole, sendChunks).
		r.ecDataLocked(p)
		if !r.ref.rows || !r.ref.coded {
			return
		}
	}
	r.ref.rb.release()
	r.ref = nil
	clear(r.refProg)
}
