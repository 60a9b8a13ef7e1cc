package keeper

// Differential protection (Config.Mode ModeDiff, gorun --protect-mode
// diff; TierCheck §3.2-§3.3). The owner's replicator sends each holder
// a base once (the committed slot's replicated regions at a step b, as
// full mode sends a step), then every committed step's differential in
// order: the step's gradient as a replay record, its Adam
// hyper-parameters, and the bytes of the replicated regions other than
// the optimizer's. The holder keeps them in a diffstore.Store and
// rebuilds any step of its range by a fused replay; every
// DiffConfig.BaseEvery steps the owner sends a fresh base in chunks paced
// over the next steps, after each step's differential, so that they never
// delay one.
//
// The frames (replica.go's header and table, then):
//
//	base       kind 5: table = the replicated regions with the owner's CRC32Cs at step;
//	           optDesc data (length = 40 + the regions' bytes)
//	diff       kind 6: table = the replicated regions with the owner's CRC32Cs at step;
//	           diffDesc record other (length = 48 + the record's + the other regions' bytes,
//	           the others in table order, the optimizer's left out)
//	baseChunk  kind 7: table = one region (its whole size, CRC 0); offset(8) bytes
//	           (length = 8 + the bytes), of the refresh at step
//	baseCommit kind 8: table = the replicated regions with the CRC32Cs of the refresh at step
//	optDesc    = optimizer's table index(4) reserved(4) N(8) W(8) M(8) V(8)
//	diffDesc   = optimizer's table index(4) diffstore sum(4) T(8) record length(8)
//	             lr beta1 beta2 eps weight_decay (float32 bits, 4 each) reserved(4)
//
// A holder acknowledges a differential only when its store can restore
// the step (diffstore.Store.Held): then, as in full mode, the owner counts
// it (acked → Replicated → G). It refuses a differential that does not
// verify (fail, why failCRC: the owner sends it again, then a base), that
// does not follow what it holds (failGap, with the step it takes next in
// the answer's gen field, -1 if it needs a base: the owner resends from
// there or sends a base), and answers failPending for one it took whose
// step it cannot restore yet. Every restore from the store is checked
// against the owner's committed CRC32Cs of the step, which every frame
// carries: a replay that differs is an error, never served.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

const (
	kindBase       = 5
	kindDiff       = 6
	kindBaseChunk  = 7
	kindBaseCommit = 8

	// Why a diff-mode holder refused (a fail answer's reserved word).
	failGap     = 3 // the differential does not follow what the holder has: gen = its Next (-1: send a base)
	failPending = 4 // the differential was taken, its step is not restorable yet
	// failDiverged: the holder's replay of the owner's differentials up to
	// step gen differs from the owner's commit (ErrReplayDiffers): the
	// owner's rank fails.
	failDiverged = 7

	// needBase in replicator.dnext: the holder cannot take the
	// differentials that follow what it holds (they do not follow, or it
	// has no base): it gets a base, without being asked kindHas first.
	needBase = -2
	// needProbe in replicator.dnext (diff mode under EC, the clear copy's
	// holder): where the holder stands is not known (it got a base whole,
	// or said it does not hold the step it was asked about): it is sent
	// the differential after what it acknowledged, else the oldest queued
	// one, and its answer (an acknowledgement, or a gap with the step it
	// takes next) says.
	needProbe = -3

	optDescSize  = 40
	diffDescSize = 48
	// maxBaseChunk is the most bytes one base refresh frame carries.
	maxBaseChunk = 4 << 20
	// maxRecordSlack bounds a differential's record beyond its optimizer
	// region's size (headers, descriptors, codec overhead), before the
	// holder's store says more (maxRecordLen).
	maxRecordSlack = 1 << 20
	// recordHeaderSlack bounds a record of one tensor beyond its payload:
	// its header, descriptor, padding and CRC (about a hundred bytes).
	recordHeaderSlack = 4 << 10
)

var (
	// errHolderGap: the holder lacks the steps before a differential.
	errHolderGap = errors.New("the holder lacks the steps before this differential")
	// errDiffPending: the holder took a differential whose step it
	// cannot restore yet.
	errDiffPending = errors.New("the holder took the differential but cannot restore its step yet")
)

// testHookLinkFrame, if set (by tests), may replace a diff-mode request's
// bytes just before they are written (to damage them on the wire).
var testHookLinkFrame func(h linkHdr, bufs net.Buffers) net.Buffers

// testHookDropDiff, if set (by tests), says whether the owner's
// differential of step to holder is lost on the way: it is not sent, and
// the owner goes on as if it had been (a link that lost it).
var testHookDropDiff func(owner, holder int, step int64) bool

// ---- Frames -------------------------------------------------------------

// frameHead returns a request's header (with t's count and length) and
// table, followed by pre.
func frameHead(h linkHdr, t []tableEntry, length uint64, pre []byte) []byte {
	h.count, h.length = len(t), length
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45+len(pre))
	h.put(b)
	b = appendTable(b, t)
	return append(b, pre...)
}

func appendOptDesc(b []byte, idx int, o *protect.Optimizer) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(idx))
	b = binary.BigEndian.AppendUint32(b, 0)
	for _, v := range []int64{o.N, o.W, o.M, o.V} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

func appendDiffDesc(b []byte, od *ownerDiff) []byte {
	h := od.d.Hyper
	b = binary.BigEndian.AppendUint32(b, uint32(od.opt))
	b = binary.BigEndian.AppendUint32(b, od.d.Sum)
	b = binary.BigEndian.AppendUint64(b, uint64(int64(h.T)))
	b = binary.BigEndian.AppendUint64(b, uint64(len(od.d.Record)))
	for _, f := range []float32{h.LR, h.Beta1, h.Beta2, h.Eps, h.WeightDecay} {
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(f))
	}
	return binary.BigEndian.AppendUint32(b, 0)
}

// diffDesc is a differential frame's descriptor.
type diffDesc struct {
	opt    int
	sum    uint32
	hyper  replay.Hyper
	recLen uint64
}

func parseDiffDesc(b []byte) diffDesc {
	u32 := func(i int) uint32 { return binary.BigEndian.Uint32(b[i:]) }
	f32 := func(i int) float32 { return math.Float32frombits(u32(i)) }
	t := int64(binary.BigEndian.Uint64(b[8:]))
	if t < 0 || t > math.MaxInt32 {
		t = 0 // refused by Hyper.Validate
	}
	return diffDesc{
		opt: int(u32(0)), sum: u32(4), recLen: binary.BigEndian.Uint64(b[16:]),
		hyper: replay.Hyper{LR: f32(24), Beta1: f32(28), Beta2: f32(32), Eps: f32(36), WeightDecay: f32(40), T: int(t)},
	}
}

// call sends a diff-mode request (its bytes bufs) to host on the owner's
// link and waits for its acknowledgement.
func (p *linkPool) call(ctx context.Context, host int, h linkHdr, bufs net.Buffers) error {
	return p.do(ctx, host, h.owner, func(c net.Conn) error {
		if testHookLinkFrame != nil {
			bufs = testHookLinkFrame(h, bufs)
		}
		if _, err := bufs.WriteTo(c); err != nil {
			return err
		}
		return readAck(c, h)
	})
}

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
	has            bool       // ask whether it holds base first
	base           int64      // ≥ 0: send it a base at this step
	d              *ownerDiff // else: this differential
	ref            *refresh   // then chunks of this refresh (prog)
	prog           *refProg
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
				act.ref, act.prog = r.ref, pr
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

// loopDiff is loop in diff mode: rounds in which every holder gets what
// it lacks next (a base, or the next differential and chunks of the base
// refresh in progress), until every holder has the newest committed step.
func (r *replicator) loopDiff(ctx context.Context, cancel func(), done chan struct{}) {
	defer close(done)
	defer cancel()
	s := r.s
	var rt roundRetry
	for {
		ecDiff := s.h.place().ecDiff()
		if ecDiff {
			// A base whose shares went in the background since the last
			// round may be coded, and done with.
			r.mu.Lock()
			r.ecDataLocked(s.h.place())
			r.releaseRefLocked()
			r.mu.Unlock()
		}
		if ctx.Err() == nil {
			if ecDiff {
				r.snapshotDueEC()
			} else {
				r.snapshotDue()
			}
		}
		r.mu.Lock()
		if ecDiff {
			r.startSharesLocked()
		}
		var p diffPlan
		if ctx.Err() == nil && !r.failed {
			p = r.planDiffLocked()
		}
		if len(p.acts) == 0 || ctx.Err() != nil || r.failed {
			r.running, r.cancel = false, nil
			r.mu.Unlock()
			p.release() // cancelled since it was planned: nothing sent
			return
		}
		r.mu.Unlock()
		gen, res, err := r.sendDiffs(ctx, p)
		p.release()
		r.mu.Lock()
		if r.ver == p.ver {
			r.applyLocked(p, res)
		}
		if ecDiff {
			r.ecDataLocked(s.h.place())
		}
		r.trimLocked()
		r.releaseRefLocked()
		r.mu.Unlock()
		s.h.cfg.Changed()
		r.afterRound(ctx, gen, err, &rt)
	}
}

// sendDiffs runs a round: each holder's part side by side. It returns
// the generation it sent in, each holder's outcome, and the join of their
// errors (a *CorruptError among them if a base was refused as damaged and
// the slot no longer matches its commit).
func (r *replicator) sendDiffs(ctx context.Context, p diffPlan) (uint64, []diffRes, error) {
	s := r.s
	gen := s.h.Gen() // before any slot is read: see send
	res := make([]diffRes, len(p.acts))
	start := time.Now()
	var wg sync.WaitGroup
	for i, a := range p.acts {
		wg.Go(func() { res[i] = r.sendTo(ctx, gen, a) })
	}
	wg.Wait()
	var errs []error
	var baseB, diffB int64
	sentDiff := false
	for _, x := range res {
		errs = append(errs, x.err)
		baseB += x.baseB
		diffB += x.diffB
		sentDiff = sentDiff || x.diffB > 0
	}
	s.addReplBytes(baseB, diffB)
	if sentDiff {
		s.replSteps.Add(1)
		s.replNS.Add(int64(time.Since(start)))
	}
	if ctx.Err() != nil {
		return gen, res, ctx.Err()
	}
	return gen, res, errors.Join(errs...)
}

// sendTo runs holder a.k's part of a round.
func (r *replicator) sendTo(ctx context.Context, gen uint64, a diffAct) diffRes {
	s := r.s
	res := diffRes{acked: noStep, base: noStep}
	hdr := linkHdr{owner: s.rank, holder: a.k.rank, gen: gen}
	linkFailed := func(err error) {
		if le, ok := errors.AsType[*linkError](err); ok && ctx.Err() == nil {
			s.h.linkFailed(a.k.host, le)
		}
	}
	if a.logBegin {
		return r.logBeginTo(ctx, hdr, a, linkFailed)
	}
	if a.base >= 0 {
		if a.has {
			var err error
			if t := r.slotTable(a.base); t != nil {
				hdr.kind, hdr.step = kindHas, a.base
				if err = s.h.links.has(ctx, a.k.host, hdr, t); err == nil {
					res.acked, res.next, res.setNext = a.base, a.base+1, true
					return res
				}
			}
			if a.noSlotBase {
				// Diff mode under EC: no base from a slot (off the
				// schedule); where the holder stands is asked next.
				if _, ok := errors.AsType[*remoteError](err); err != nil && !ok {
					res.err = fmt.Errorf("has step %d to rank %d: %w", a.base, a.k.rank, err)
					linkFailed(err)
					return res
				}
				res.next, res.setNext = needProbe, true
				if a.top {
					// Nothing else can tell where it stands: asked again
					// after a backoff, not at once.
					if err == nil {
						err = fmt.Errorf("step %d is no longer in a slot", a.base)
					}
					res.err = fmt.Errorf("has step %d, the newest committed, to rank %d (no differential after what it acknowledged is queued): %w", a.base, a.k.rank, err)
				}
				return res
			}
		}
		n, err := r.sendBase(ctx, hdr, a.k.host, a.base)
		res.baseB += n
		if err != nil {
			res.err = fmt.Errorf("base of step %d to rank %d: %w", a.base, a.k.rank, err)
			linkFailed(err)
			return res
		}
		res.acked, res.next, res.setNext, res.base = a.base, a.base+1, true, a.base
		return res
	}
	od := a.d
	if od == nil {
		// Only the base (diff mode under EC): whole.
		if a.ref != nil {
			r.sendChunks(ctx, hdr, a.k, a.ref, a.prog, true, &res)
			linkFailed(res.err)
		}
		return res
	}
	hdr.kind, hdr.step = kindDiff, od.step
	var err error
	switch {
	case testHookDropDiff != nil && testHookDropDiff(s.rank, a.k.rank, od.step):
		err = errDiffPending // lost: the owner believes it went
	case a.k.log:
		// A log-only holder: always with the record.
		err = s.h.links.call(ctx, a.k.host, hdr, od.frame(hdr))
		res.diffB += od.bytes
	default:
		var n int64
		n, err = r.sendDiff(ctx, a.k, hdr, od) // localpeer.go: by reference where it can
		res.diffB += n
	}
	var re *remoteError
	switch {
	case err == nil:
		res.acked, res.next, res.setNext = od.step, od.step+1, true
	case errors.Is(err, errDiffPending):
		// Not acknowledged: resent (planDiffLocked) after a backoff.
		res.next, res.setNext = od.step+1, true
		res.err = fmt.Errorf("differential of step %d to rank %d: %w", od.step, a.k.rank, err)
	case errors.As(err, &re) && re.why == failGap:
		// The holder's Next: the owner resends from there, or sends a
		// base when it takes none (it has no base, or what it holds
		// cannot be followed by the owner's steps: another optimizer
		// step count after a restore, a step it holds with other
		// CRC32Cs at its base). Never the same differential again.
		res.next, res.setNext = re.next, true
		if re.next < 0 {
			res.next = needBase
		}
		return res
	case errors.As(err, &re) && re.why == failDiverged:
		// The holder's replay of this rank's differentials does not give
		// its commits: no resend can help (the trainer breaks the
		// optimizer contract); the rank fails.
		res.err = &CorruptError{Rank: s.rank, Step: re.next, Replay: true, Detail: fmt.Sprintf("holder rank %d on host %d: %s", a.k.rank, a.k.host, re.msg)}
		return res
	case errors.Is(err, errPutDamaged):
		res.damaged = true
		res.err = fmt.Errorf("differential of step %d to rank %d: %w", od.step, a.k.rank, err)
		return res
	default:
		res.err = fmt.Errorf("differential of step %d to rank %d: %w", od.step, a.k.rank, err)
		linkFailed(err)
		return res
	}
	if a.ref != nil {
		r.sendChunks(ctx, hdr, a.k, a.ref, a.prog, false, &res)
		linkFailed(res.err)
	}
	return res
}

// slotTable returns the replicated regions of the slot holding step with
// their committed CRC32Cs, or nil if no slot holds it.
func (r *replicator) slotTable(step int64) []tableEntry {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for slot, st := range s.slotStep {
		if st == step {
			var t []tableEntry
			for _, i := range s.repl {
				t = append(t, tableEntry{name: s.regions[i].Name, size: s.regions[i].Size, sum: s.sums[slot][i]})
			}
			return t
		}
	}
	return nil
}

// sendBase sends holder host a base at step from the slot holding it
// (safe to read: see planDiffLocked's next and replicator.send), and
// returns the bytes sent. A holder that finds the bytes damaged has the
// slot verified: a *CorruptError if it changed since its commit.
func (r *replicator) sendBase(ctx context.Context, hdr linkHdr, host int, step int64) (int64, error) {
	s := r.s
	s.mu.Lock()
	slot := slices.Index(s.slotStep[:], step)
	if slot < 0 || s.opt == nil {
		s.mu.Unlock()
		return 0, fmt.Errorf("step %d is no longer in a slot", step)
	}
	var t []tableEntry
	var data [][]byte
	opt := -1
	for _, i := range s.repl {
		if s.regions[i].Name == s.opt.Region {
			opt = len(t)
		}
		t = append(t, tableEntry{name: s.regions[i].Name, size: s.regions[i].Size, sum: s.sums[slot][i]})
		data = append(data, s.views[slot][i])
	}
	o := *s.opt
	s.mu.Unlock()
	hdr.kind, hdr.step = kindBase, step
	total := tableBytes(t)
	b := frameHead(hdr, t, optDescSize+total, nil)
	b = appendOptDesc(b, opt, &o)
	bufs := net.Buffers{b}
	for _, d := range data {
		if len(d) > 0 {
			bufs = append(bufs, d)
		}
	}
	err := s.h.links.call(ctx, host, hdr, bufs)
	if errors.Is(err, errPutDamaged) {
		if ce := s.verifySlot(slot, step); ce != nil {
			return int64(total), ce
		}
		err = fmt.Errorf("%w (rank %d's slot of step %d still matches its commit: damaged in transit)", err, s.rank, step)
	}
	return int64(total), err
}

// sendChunks sends holder k the next chunks of refresh ref, up to its
// per-step budget, and its commit once every byte went, into res: the
// bytes sent (baseB) and the failure (err), which the round backs off
// after (a link's failure is the caller's to report). whole sends every
// chunk left, not the per-step budget. Failures leave prog where it was:
// the refresh goes on in a later round.
//
// A holder that cannot take the refresh in chunks (it has no base, or a
// newer one) or refuses its commit twice as damaged gets no more of it
// in plain diff mode (prog.done: the next refresh will do). In diff mode
// under EC the refresh is the scheduled base b_k, which the clear copy's
// holder must hold (Base_r and every later base's gate wait for it), so
// it is never given up: it goes whole as a base of exactly its step,
// from the snapshot (sendRefBase), and again after a backoff until the
// holder takes it. baseH (the H known here) goes before the first chunk,
// or the base whole; a holder that refuses it because it holds no step
// up to H (failBehindH) gets the base whole without it, one that refuses
// it otherwise is asked again.
func (r *replicator) sendChunks(ctx context.Context, hdr linkHdr, k holderKey, ref *refresh, prog *refProg, whole bool, res *diffRes) {
	s := r.s
	hdr.step = ref.step
	total := int64(len(ref.buf))
	ecDiff := s.h.place().ecDiff()
	if ecDiff && !prog.hSent {
		if hb := s.h.H(); hb >= 0 {
			bh := hdr
			bh.kind, bh.step = kindBaseH, hb
			if err := s.h.links.call(ctx, k.host, bh, net.Buffers{frameHead(bh, nil, 0, nil)}); err != nil {
				if errors.Is(err, errBehindH) {
					// The holder holds no step up to H (it lags, or lost
					// its store). Asking again would not change that: the
					// base goes whole, without baseH, as a new store (the
					// one it has stays as the previous store until H
					// reaches the base; none of its steps is one a decode
					// at H reads). Any other refusal passes (a placement
					// or a generation switching): baseH is asked again
					// after the round's backoff, and the base waits for
					// it, so that BeginBase never drops a verified
					// refresh H may name already.
					prog.hSent, prog.asBase = true, true
				}
				res.err = errors.Join(res.err, fmt.Errorf("baseH %d to rank %d before the base of step %d: %w", hb, k.rank, ref.step, err))
				return
			}
		}
		prog.hSent = true
	}
	if prog.asBase {
		n, err := r.sendRefBase(ctx, hdr, k.host, ref)
		res.baseB += n
		if err != nil {
			res.err = errors.Join(res.err, fmt.Errorf("base of step %d to rank %d from the snapshot: %w", ref.step, k.rank, err))
			return
		}
		// The holder holds the base: it grafted it onto a store that
		// holds its step (the differentials it holds after it stay), or
		// made a store of it alone. Replicated counts the base's step
		// for it, and whatever it holds after it once it says so: it is
		// probed (needProbe).
		prog.done, prog.in = true, true
		res.acked, res.rebased = ref.step, true
		res.next, res.setNext, res.base = needProbe, true, ref.step
		return
	}
	// giveUp handles a holder that cannot take the refresh in chunks.
	giveUp := func(err error) bool {
		var re *remoteError
		if !errors.As(err, &re) || re.why != failStale && re.why != failGap {
			return false
		}
		if ecDiff {
			prog.asBase, prog.off = true, 0
			res.err = errors.Join(res.err, fmt.Errorf("base refresh of step %d to rank %d: %w; it goes whole", ref.step, k.rank, err))
		} else {
			prog.done = true
		}
		return true
	}
	budget := ref.budget
	if whole {
		budget = total
	}
	var sent int64
	defer func() { res.baseB += sent }()
	for sent < budget && prog.off < total {
		i := 0
		for i+1 < len(ref.offs) && ref.offs[i+1] <= prog.off {
			i++
		}
		end := total
		if i+1 < len(ref.offs) {
			end = ref.offs[i+1]
		}
		n := min(end-prog.off, maxBaseChunk, budget-sent)
		e := ref.table[i]
		hdr.kind = kindBaseChunk
		b := frameHead(hdr, []tableEntry{{name: e.name, size: e.size}}, uint64(8+n), nil)
		b = binary.BigEndian.AppendUint64(b, uint64(prog.off-ref.offs[i]))
		err := s.h.links.call(ctx, k.host, hdr, net.Buffers{b, ref.buf[prog.off : prog.off+n]})
		if err != nil {
			if !giveUp(err) {
				res.err = errors.Join(res.err, fmt.Errorf("base refresh chunk of step %d to rank %d: %w", ref.step, k.rank, err))
			}
			return
		}
		prog.off += n
		sent += n
	}
	if prog.off < total {
		return
	}
	hdr.kind = kindBaseCommit
	err := s.h.links.call(ctx, k.host, hdr, net.Buffers{frameHead(hdr, ref.table, 0, nil)})
	switch {
	case err == nil:
		prog.done, prog.in = true, true
	case giveUp(err):
	case errors.Is(err, errPutDamaged):
		// A chunk was damaged on the way: send the refresh again, once;
		// then (diff mode under EC) whole, or not at all.
		if prog.retries++; prog.retries > 1 {
			if ecDiff {
				prog.asBase = true
			} else {
				prog.done = true
			}
		}
		prog.off = 0
		res.err = errors.Join(res.err, fmt.Errorf("base refresh of step %d to rank %d: %w", ref.step, k.rank, err))
	default:
		res.err = errors.Join(res.err, fmt.Errorf("base refresh commit of step %d to rank %d: %w", ref.step, k.rank, err))
	}
}

// sendRefBase sends holder host refresh ref whole as a base (kind 5) of
// exactly its step, from the snapshot (checked against the commit's
// CRC32Cs when it was taken), and returns the bytes sent.
func (r *replicator) sendRefBase(ctx context.Context, hdr linkHdr, host int, ref *refresh) (int64, error) {
	s := r.s
	s.mu.Lock()
	if s.opt == nil {
		s.mu.Unlock()
		return 0, fmt.Errorf("rank %d has no optimizer layout yet", s.rank)
	}
	o := *s.opt
	s.mu.Unlock()
	opt := slices.IndexFunc(ref.table, func(e tableEntry) bool { return e.name == o.Region })
	hdr.kind, hdr.step = kindBase, ref.step
	total := tableBytes(ref.table)
	b := frameHead(hdr, ref.table, optDescSize+total, nil)
	b = appendOptDesc(b, opt, &o)
	bufs := net.Buffers{b}
	for _, d := range ref.views() {
		if len(d) > 0 {
			bufs = append(bufs, d)
		}
	}
	return int64(total), s.h.links.call(ctx, host, hdr, bufs)
}

// snapshotDue starts a base refresh when BaseEvery steps passed since the
// last one and the rank has holders: it copies the replicated regions of
// the newest committed step (whose slot is not staged over before the
// next step is replicated to every holder) into a snapshot buffer and
// checks the copy against the step's CRC32Cs (a slot that changed
// meanwhile is tried again next round). The buffer is an earlier
// refresh's that nothing reads any more (r.refPool), or a new one; it
// lives until every holder has the refresh (releaseRefLocked) or a newer
// refresh or a restart replaces it, and no send still reads it (rb). The
// refresh is paced over refreshSteps steps. It runs in the loop, between
// rounds.
func (r *replicator) snapshotDue() {
	s := r.s
	every := int64(s.h.cfg.Diff.baseEvery())
	s.mu.Lock()
	c := s.committed
	var names []string
	for _, i := range s.repl {
		names = append(names, s.regions[i].Name)
	}
	s.mu.Unlock()
	r.mu.Lock()
	rs := r.refStep
	if c >= 0 && (rs == noStep || rs > c) {
		r.refStep = c // the first step sent: the holders get bases
	}
	r.mu.Unlock()
	if c < 0 || rs == noStep || rs > c || c-rs < every || len(s.h.place().targets(s.rank)) == 0 {
		return
	}
	// The copy is checked, not the slot: one read of the slot. On an
	// error the snapshot's buffer is its own (the refresh in progress, if
	// any, keeps sending from its buffer): only this refresh waits.
	ref, err := r.snapshot(c, names)
	if err != nil {
		s.h.log.Debug("base refresh postponed", "rank", s.rank, "step", c, "err", err)
		return
	}
	n := s.h.cfg.Diff.refreshSteps()
	ref.budget = max(1, (int64(len(ref.buf))+n-1)/n)
	r.mu.Lock()
	if r.ref != nil {
		r.ref.rb.release() // superseded: its buffer is free once no send reads it
	}
	r.ref, r.refStep = ref, c
	clear(r.refProg)
	r.mu.Unlock()
}

// ---- The holder's side --------------------------------------------------

// recPool is a holder's free list of one owner's record buffers: the
// records its stores drop once no Restore can read them (Fold,
// FoldChecked, Truncate: diffstore.Store.SetRecycle), which the next
// differentials' records are read (diff) or encoded (encodeDeposits) into
// instead of fresh memory the kernel must fault in again. It keeps at
// most max buffers (Fold+2: what a fold hands back, and a step or two of
// slack) and gives a buffer only for a record of its very length (a
// lossless owner's records all have one), so that the bytes it holds and
// the store's count of a record are the same. Its bytes count in the
// owner's reservation (ownerReplica.diffMem). Safe for concurrent use.
type recPool struct {
	mu     sync.Mutex
	bufs   [][]byte
	bytes  uint64
	max    int
	closed bool // cleared (the owner's stores went) and not set up since
}

// setMax sets how many buffers the pool keeps, and opens it (a new store
// of the owner hands its records back to it).
func (p *recPool) setMax(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.max, p.closed = n, false
}

// put keeps b for a later record, unless the pool is full or closed
// (then the garbage collector takes it): a store dropped while it folded
// hands its records back after the owner's pool was cleared.
func (p *recPool) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b) == 0 || p.closed || len(p.bufs) >= p.max {
		return
	}
	p.bufs = append(p.bufs, b[:len(b):len(b)])
	p.bytes += uint64(len(b))
}

// get returns a buffer of n bytes from the pool (its content is
// garbage), or nil if it has none of that length. Buffers of another
// length are dropped: the owner's records changed size.
func (p *recPool) get(n uint64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.bufs) > 0 {
		k := len(p.bufs) - 1
		b := p.bufs[k]
		p.bufs[k] = nil
		p.bufs = p.bufs[:k]
		p.bytes -= uint64(len(b))
		if uint64(len(b)) == n {
			return b
		}
	}
	return nil
}

// any returns a buffer from the pool whatever its length, or nil.
func (p *recPool) any() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := len(p.bufs) - 1
	if k < 0 {
		return nil
	}
	b := p.bufs[k]
	p.bufs[k] = nil
	p.bufs = p.bufs[:k]
	p.bytes -= uint64(len(b))
	return b
}

// size returns the bytes the pool holds.
func (p *recPool) size() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// clear drops every buffer and closes the pool (the owner's stores
// went): what their folds still hand back goes to the garbage collector.
func (p *recPool) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.bufs)
	p.bufs, p.bytes, p.closed = p.bufs[:0], 0, true
}

// recordBuf returns an empty buffer for a record of owner that a local
// peer encodes (encodeDeposits): one of the owner's record pool, of the
// length of the owner's records as held here, or nil (the encoder then
// allocates). A record that comes out of another length than the
// buffer's is clipped to a copy of its own (a lossy codec's records vary):
// a record's buffer is what its store counts.
func (st *replicaStore) recordBuf(owner int) []byte {
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil
	}
	return o.recs.any()[:0]
}

// diffMem is what an owner's diff-mode copy holds in memory: its
// stores' bases, refreshes, logs and spare buffers, and the record
// buffers kept for reuse.
func (o *ownerReplica) diffMem() uint64 {
	var n int64
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds != nil {
			st := ds.Stats()
			n += st.BaseBytes + st.RefreshBytes + st.LogBytes + st.RefreshLogBytes + st.SpareBytes
		}
	}
	if o.log != nil {
		n += o.log.Bytes()
	}
	return uint64(n) + o.recs.size() + uint64(cap(o.chunk))
}

// chunkBuf returns o's chunk buffer, of n bytes (at most maxBaseChunk).
// o.mu is held.
func (o *ownerReplica) chunkBuf(n int64) []byte {
	if int64(cap(o.chunk)) < n {
		o.chunk = make([]byte, maxBaseChunk)
	}
	return o.chunk[:n]
}

// account brings the bytes reserved for o up to date, and forgets the
// CRC32Cs of steps no store or log holds. o.mu is held.
func (st *replicaStore) account(o *ownerReplica) {
	if o.dropped {
		return // dropDiff gave its reservation back; a fold that ends later changes nothing
	}
	n := o.diffMem()
	if err := st.reserve(n, o.held); err != nil {
		// Over the limit already (the data is here): count it anyway, so
		// that the next base is refused.
		st.mu.Lock()
		st.bytes = st.bytes - o.held + n
		st.mu.Unlock()
	}
	o.held = n
	low := int64(math.MaxInt64)
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds == nil {
			continue
		}
		if first, _, ok := ds.Range(); ok {
			low = min(low, first)
		}
	}
	if o.log != nil {
		// A log-only holder's steps: getLog answers each with its table.
		if first, _, ok := o.log.Range(); ok {
			low = min(low, first)
		}
	}
	for s := range o.sums {
		if s < low {
			delete(o.sums, s)
		}
	}
	for s := range o.sumGen {
		if s < low {
			delete(o.sumGen, s)
		}
	}
}

// setSums records the owner's committed CRC32Cs of step, received in
// generation gen. o.mu is held.
func (o *ownerReplica) setSums(step int64, gen uint64, t []tableEntry) {
	if o.sums == nil {
		o.sums = map[int64][]tableEntry{}
	}
	if o.sumGen == nil {
		o.sumGen = map[int64]uint64{}
	}
	o.sums[step], o.sumGen[step] = t, gen
}

// diffNewest returns the newest step o's stores hold, or -1. o.mu is held.
func (o *ownerReplica) diffNewest() int64 {
	n := int64(noStep)
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds == nil {
			continue
		}
		if _, last, ok := ds.Range(); ok {
			n = max(n, last)
		}
	}
	return n
}

// dropDiff drops o's stores. o.mu is held.
func (st *replicaStore) dropDiff(o *ownerReplica) {
	if o.bw != nil {
		o.bw.Abort()
	}
	o.cur, o.prev, o.bw, o.log = nil, nil, nil, nil
	o.recs.clear()
	st.h.forgetDrift(o.rank)
	o.chunk = nil
	clear(o.sums)
	clear(o.sumGen)
	o.diverged = nil
	st.reserve(0, o.held)
	o.held = 0
}

// checkOwner refuses (returns why, "" if none) a diff-mode request for
// o: not a holder of this placement, dropped, or of an older generation
// than one known. o.mu is held; o.gen is raised to h.gen otherwise.
func (st *replicaStore) checkOwner(o *ownerReplica, h linkHdr) (uint32, string) {
	if refuse := st.notHolder(h); refuse != "" {
		return failOther, refuse
	}
	if o.dropped {
		return failOther, fmt.Sprintf("rank %d's replicas are no longer kept here", h.owner)
	}
	if known := max(o.gen, st.h.Gen()); h.gen < known {
		return failStale, fmt.Sprintf("rank %d step %d: a request of restart generation %d, this holder knows generation %d", h.owner, h.step, h.gen, known)
	}
	o.gen = h.gen
	return 0, ""
}

// writeGap refuses a differential that does not follow, with the step
// the holder takes next (-1: it needs a base).
func writeGap(w io.Writer, h linkHdr, next int64, msg string) error {
	h.gen = uint64(next)
	return writeFail(w, h, failGap, msg)
}

// drain reads and drops n bytes of a request's data.
func drain(r io.Reader, n uint64) error {
	_, err := io.CopyN(io.Discard, r, int64(n))
	return err
}

// base receives a base of h.owner at h.step: a new store, which becomes
// the current one (the one it replaces is kept as prev while it may be
// the only one holding G).
func (st *replicaStore) base(c net.Conn, h linkHdr, t []tableEntry) error {
	if st.logHolder(h) {
		return st.logBegin(c, h, t)
	}
	total := tableBytes(t)
	if h.length != optDescSize+total || h.step < 0 {
		return fmt.Errorf("base of %d bytes for regions of %d, step %d", h.length, total, h.step)
	}
	var db [optDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return err
	}
	idx := int(binary.BigEndian.Uint32(db[:]))
	u64 := func(i int) int64 { return int64(binary.BigEndian.Uint64(db[i:])) }
	if idx >= len(t) {
		return fmt.Errorf("base: optimizer region %d of %d", idx, len(t))
	}
	opt := diffstore.Optimizer{Region: t[idx].name, N: u64(8), WOff: u64(16), MOff: u64(24), VOff: u64(32)}
	refuse := func(why uint32, msg string) error {
		if err := drain(c, total); err != nil {
			return err
		}
		return writeFail(c, h, why, msg)
	}
	if msg := st.notHolder(h); msg != "" {
		return refuse(failOther, msg)
	}
	regions := make([]diffstore.Region, len(t))
	for i, e := range t {
		regions[i] = diffstore.Region{Name: e.name, Size: e.size}
	}
	ds, err := diffstore.New(regions, opt)
	if err != nil {
		return refuse(failOther, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.recs.setMax(st.h.cfg.Diff.fold() + 2)
	ds.SetRecycle(o.recs.put)
	if why, msg := st.checkOwner(o, h); msg != "" {
		return refuse(why, msg)
	}
	if st.h.place().ecDiff() && o.cur != nil && o.cur.Held(h.step) && slices.Equal(o.cur.Regions(), regions) && o.cur.Optimizer() == opt {
		defer st.account(o)
		return st.graftBase(c, h, t, o)
	}
	// Replicas live in this agent's memory: all of them together may
	// take at most half the host's, whatever peers announce.
	if err := st.reserve(o.held+total, o.held); err != nil {
		return refuse(failOther, fmt.Sprintf("base of %d bytes for rank %d: %v", total, h.owner, err))
	}
	o.held += total
	defer st.account(o)
	w, err := ds.BeginBase(h.step)
	if err != nil {
		return refuse(failOther, err.Error())
	}
	buf := o.chunkBuf(int64(min(total, maxBaseChunk)))
	for _, e := range t {
		for off := int64(0); off < e.size; {
			n := min(e.size-off, int64(len(buf)))
			if _, err := io.ReadFull(c, buf[:n]); err != nil {
				return err
			}
			if err := w.Write(e.name, off, buf[:n]); err != nil {
				return err // cannot be: the range is the region's
			}
			off += n
		}
	}
	sums := make(map[string]uint32, len(t))
	for _, e := range t {
		sums[e.name] = e.sum
	}
	// A new store's G is unbounded until SetG: the base installs now.
	if err := w.Commit(h.step, sums); err != nil {
		why := uint32(failOther)
		if errors.Is(err, diffstore.ErrCorrupt) {
			why = failCRC
		}
		return writeFail(c, h, why, fmt.Sprintf("rank %d step %d: %v", h.owner, h.step, err))
	}
	g := st.h.pin(st.h.G())
	if o.cur != nil && o.prev != nil && !o.cur.Held(g) && o.prev.Held(g) && !ds.Held(g) {
		// Both old stores may be needed: the previous one holds G (as
		// known here: the launcher's may be newer, never older) and the
		// current one steps after it that were acknowledged, which G may
		// come to name and this base does not hold. Dropping either could
		// lose a recoverable step; the owner sends the base again (after
		// a backoff), once G reached the current store's base (setGDiff
		// then drops the previous one).
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d: a base of step %d while this holder keeps two older copies until G (%d here) reaches the newer one's", h.owner, h.step, g))
	}
	ds.SetG(g)
	if o.cur != nil {
		// The current store becomes the previous one: it holds every step
		// acknowledged since the last base; the one before it goes (it
		// was kept only while it alone held G, which it no longer does:
		// see above).
		o.prev = o.cur
		if o.bw != nil {
			o.bw.Abort()
		}
	}
	o.cur, o.bw, o.diverged = ds, nil, nil
	o.setSums(h.step, h.gen, t)
	return writeAck(c, h)
}

// diff receives a differential of h.owner at h.step into its current
// store, and acknowledges it only if the store can restore the step.
// Nothing of its size is allocated before admitDiff checked it against
// the store and reserved it.
func (st *replicaStore) diff(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length < diffDescSize || h.step < 0 {
		return fmt.Errorf("differential of %d bytes, step %d", h.length, h.step)
	}
	var db [diffDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return err
	}
	dd := parseDiffDesc(db[:])
	if dd.opt >= len(t) {
		return fmt.Errorf("differential: optimizer region %d of %d", dd.opt, len(t))
	}
	others := tableBytes(t) - uint64(t[dd.opt].size)
	if dd.recLen > uint64(t[dd.opt].size)+maxRecordSlack || h.length != diffDescSize+dd.recLen+others {
		return fmt.Errorf("differential of %d bytes: a record of %d and other regions of %d", h.length, dd.recLen, others)
	}
	rec, release, ok, err := st.admitDiff(c, h, t, dd.opt, dd.recLen, others)
	if !ok {
		return err
	}
	defer release()
	// The whole request is read first: the link stays in step whatever
	// the answer. The store keeps these buffers (and hands the record
	// back to the owner's pool once it drops it).
	if rec == nil {
		rec = make([]byte, dd.recLen)
	}
	d, err := readDiff(c, h, t, dd, rec)
	if err != nil {
		return err
	}
	return st.takeDiff(c, h, t, d)
}

// readDiff reads a differential's data off c, after its descriptor dd:
// the record into rec (dd.recLen bytes), then every other region of t in
// its order, into buffers of their own (the store keeps them).
func readDiff(c net.Conn, h linkHdr, t []tableEntry, dd diffDesc, rec []byte) (diffstore.Diff, error) {
	d := diffstore.Diff{Step: h.step, Hyper: dd.hyper, Record: rec, Other: map[string][]byte{}, Sum: dd.sum}
	if _, err := io.ReadFull(c, d.Record); err != nil {
		return d, err
	}
	for i, e := range t {
		if i == dd.opt {
			continue
		}
		b := make([]byte, e.size)
		if _, err := io.ReadFull(c, b); err != nil {
			return d, err
		}
		d.Other[e.name] = b
	}
	return d, nil
}

// admitDiff runs the checks of a differential of h.owner at h.step (table
// t, optimizer region opt, a record of recLen bytes and other regions of
// others) that need none of its data, before the caller allocates any of
// it: h.holder holds h.owner here, the generation is current, the owner
// has a store here, t has exactly its regions (names, sizes, order) with
// the optimizer at opt, and the record is no longer than the job's codec
// makes of the optimizer's N elements. It then reserves the bytes the
// caller is about to read (recLen+others; replicaStore.reserve, as a put
// does) until release, once the data is in the store (whose own bytes
// account then counts), and takes a buffer of recLen bytes from the
// owner's record pool (rec; nil if the pool has none: the caller
// allocates it). The reservation is the same whether the pool had one or
// not (its bytes, reserved already, then count twice until release), so
// that whether a differential fits does not depend on the pool. If it
// refuses (ok false), it drains the request's
// data and answers (err is the link's error, if any): failGap (-1) if the
// owner has no store here, failOther naming the sizes if they do not fit
// the memory. A differential whose sizes are not the store's is not
// answered: err names them, and the link closes without a byte of its
// data read.
func (st *replicaStore) admitDiff(c net.Conn, h linkHdr, t []tableEntry, opt int, recLen, others uint64) (rec []byte, release func(), ok bool, err error) {
	refuse := func(answer func() error) ([]byte, func(), bool, error) {
		if err := drain(c, recLen+others); err != nil {
			return nil, nil, false, err
		}
		return nil, nil, false, answer()
	}
	if msg := st.notHolder(h); msg != "" {
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	why, msg := st.checkOwner(o, h)
	var ds *diffstore.Store
	if msg == "" {
		if ds = o.cur; ds != nil {
			if bad := diffFits(ds, t, opt, recLen, st.h.cfg.Diff.codec()); bad != "" {
				o.mu.Unlock()
				// Not one of the owner's differentials: its data, of a
				// size no store here has, is neither read nor drained.
				return nil, nil, false, fmt.Errorf("rank %d step %d: %s", h.owner, h.step, bad)
			}
		}
	}
	o.mu.Unlock()
	switch {
	case msg != "":
		msg = fmt.Sprintf("rank %d step %d: %s", h.owner, h.step, msg)
		return refuse(func() error { return writeFail(c, h, why, msg) })
	case ds == nil:
		return refuse(func() error { return writeGap(c, h, noStep, fmt.Sprintf("no base of rank %d here", h.owner)) })
	}
	n := recLen + others
	if err := st.reserve(n, 0); err != nil {
		msg := fmt.Sprintf("differential of rank %d step %d: %d bytes (a record of %d, other regions of %d): %v", h.owner, h.step, n, recLen, others, err)
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	if recLen > 0 {
		rec = o.recs.get(recLen)
	}
	return rec, func() { st.reserve(0, n) }, true, nil
}

// diffFits says why a differential with table t (optimizer at opt, a
// record of recLen bytes) cannot be one of ds's owner, or "" if it can.
func diffFits(ds *diffstore.Store, t []tableEntry, opt int, recLen uint64, codec replay.Options) string {
	return layoutFits("base", ds.Regions(), ds.Optimizer(), t, opt, recLen, codec)
}

// layoutFits says why a differential with table t (optimizer at opt, a
// record of recLen bytes) does not fit the owner's declared regions and
// optimizer, kept in the holder's what ("base", "log"), or "".
func layoutFits(what string, regions []diffstore.Region, o diffstore.Optimizer, t []tableEntry, opt int, recLen uint64, codec replay.Options) string {
	if len(t) != len(regions) {
		return fmt.Sprintf("a differential of %d regions, the owner's %s has %d", len(t), what, len(regions))
	}
	for i, r := range regions {
		if t[i].name != r.Name || t[i].size != r.Size {
			return fmt.Sprintf("a differential's region %d is %q of %d bytes, the owner's %s has %q of %d", i, t[i].name, t[i].size, what, r.Name, r.Size)
		}
	}
	if t[opt].name != o.Region {
		return fmt.Sprintf("a differential's optimizer region is %q, the owner's %s has %q", t[opt].name, what, o.Region)
	}
	if limit := maxRecordLen(o.N, codec); recLen > limit {
		return fmt.Sprintf("a record of %d bytes, more than the %d the codec makes of %d elements", recLen, limit, o.N)
	}
	return ""
}

// maxRecordLen returns the longest record of one tensor of n elements
// that codec makes (replay's record format): Raw 4 bytes an element;
// Int8 at most 5 (a scale per block of at least one); TopK at most 6.6
// (ceil(K·n)+10% entries of an index and an fp16 value), plus the
// headers, descriptor, chunk table and padding.
func maxRecordLen(n int64, codec replay.Options) uint64 {
	per := uint64(4)
	if !codec.Lossless {
		per = 7
	}
	return per*uint64(n) + 16*uint64(n>>31+1) + recordHeaderSlack
}

// takeDiff appends differential d of h.owner at h.step (read whole, its
// record included, from the network or a local peer) to the owner's
// current store, and acknowledges it only if the store can restore the
// step.
//
// A step it holds already is taken as the owner's new commit of it, not
// as a no-op, unless the CRC32Cs t it was committed with are those held:
// an owner that went back (an in-place restore to G in the same
// generation) and committed the step again otherwise (another record, or
// the same record with other hyper-parameters or other regions) replaces
// it and the steps after it. A differential the store cannot take after
// what it holds (Adam's step count does not follow, another layout), or
// a step held with other CRC32Cs at the store's base, is answered with a
// gap and no Next: the owner sends a base.
func (st *replicaStore) takeDiff(c net.Conn, h linkHdr, t []tableEntry, d diffstore.Diff) error {
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return writeFail(c, h, why, msg)
	}
	if dv := o.diverged; dv != nil {
		h.gen = uint64(dv.Step) // read as remoteError.next
		return writeFail(c, h, failDiverged, dv.Detail)
	}
	if o.cur == nil {
		return writeGap(c, h, noStep, fmt.Sprintf("no base of rank %d here", h.owner))
	}
	defer st.account(o)
	if o.bw != nil && h.step > o.bw.Step()+2*int64(st.h.cfg.Diff.baseEvery()) {
		// A refresh its owner stopped sending (it crashed, or its link
		// broke for good): Fold does not pass it, so it must go.
		o.bw.Abort()
		o.bw = nil
	}
	if held, ok := o.sums[h.step]; ok && !slices.Equal(held, t) {
		// Held with other CRC32Cs: the owner's new commit of the step
		// supersedes it and what follows it.
		if first, _, ok := o.cur.Range(); ok && h.step <= first {
			return writeGap(c, h, noStep, fmt.Sprintf("rank %d step %d: committed again with other CRC32Cs than the base held here", h.owner, h.step))
		}
		if err := o.cur.Truncate(h.step - 1); err != nil {
			return writeGap(c, h, noStep, fmt.Sprintf("rank %d step %d: committed again with other CRC32Cs: %v", h.owner, h.step, err))
		}
		st.dropSumsAfter(o, h.step-1)
	}
	err := o.cur.Append(d)
	if errors.Is(err, diffstore.ErrMismatch) {
		// A step held already with another record: the owner went back
		// (an in-place restore to G) and took another way from there.
		// Its own steps supersede the ones held after h.step-1.
		if _, last, ok := o.cur.Range(); ok && h.step <= last && o.cur.Truncate(h.step-1) == nil {
			st.dropSumsAfter(o, h.step-1)
			err = o.cur.Append(d)
		}
	}
	switch {
	case errors.Is(err, diffstore.ErrGap):
		return writeGap(c, h, o.cur.Next(), fmt.Sprintf("rank %d: %v", h.owner, err))
	case errors.Is(err, diffstore.ErrCorrupt):
		return writeFail(c, h, failCRC, fmt.Sprintf("rank %d: %v", h.owner, err))
	case errors.Is(err, diffstore.ErrMismatch):
		// It cannot follow what the store holds (sending it again would
		// not change that): a base replaces the store.
		return writeGap(c, h, noStep, fmt.Sprintf("rank %d: %v", h.owner, err))
	case err != nil:
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o.setSums(h.step, h.gen, t)
	st.maybeFold(o)
	if !o.cur.Held(h.step) {
		return writeFail(c, h, failPending, fmt.Sprintf("rank %d step %d taken, not restorable yet", h.owner, h.step))
	}
	return writeAck(c, h)
}

// dropSumsAfter forgets the CRC32Cs of the steps after step that no
// store holds any more (the current one was truncated after step). o.mu
// is held.
func (st *replicaStore) dropSumsAfter(o *ownerReplica, step int64) {
	for s := range o.sums {
		if s > step && (o.prev == nil || !o.prev.Held(s)) {
			delete(o.sums, s)
			delete(o.sumGen, s)
		}
	}
}

// baseChunk receives a chunk of a base refresh at h.step into the current
// store's refresh (begun by the first chunk of that step, once the
// refresh's buffers are reserved). The chunk's bytes are read only after
// the checks that need none of them, and must fall within the store's
// region.
func (st *replicaStore) baseChunk(c net.Conn, h linkHdr, t []tableEntry) error {
	if len(t) != 1 || h.length < 8 || h.length-8 > maxBaseChunk || h.length-8 > uint64(t[0].size) {
		return fmt.Errorf("base chunk of %d bytes for %d regions", h.length, len(t))
	}
	var ob [8]byte
	if _, err := io.ReadFull(c, ob[:]); err != nil {
		return err
	}
	off, n := int64(binary.BigEndian.Uint64(ob[:])), int64(h.length-8)
	refuse := func(answer func() error) error {
		if err := drain(c, uint64(n)); err != nil {
			return err
		}
		return answer()
	}
	if msg := st.notHolder(h); msg != "" {
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return refuse(func() error { return writeFail(c, h, why, msg) })
	}
	if o.cur == nil {
		return refuse(func() error { return writeGap(c, h, noStep, fmt.Sprintf("no base of rank %d here", h.owner)) })
	}
	i := slices.IndexFunc(o.cur.Regions(), func(r diffstore.Region) bool { return r.Name == t[0].name })
	if i < 0 || o.cur.Regions()[i].Size != t[0].size || off < 0 || off > t[0].size-n {
		msg := fmt.Sprintf("rank %d: a base chunk [%d, +%d) of region %q of %d bytes, not one of the owner's base", h.owner, off, n, t[0].name, t[0].size)
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	defer st.account(o)
	if o.bw == nil || o.bw.Step() != h.step {
		// A new refresh: its buffers (the regions' sizes) are reserved
		// before BeginBase allocates them; account then counts them.
		size := uint64(o.cur.Size())
		if err := st.reserve(o.held+size, o.held); err != nil {
			msg := fmt.Sprintf("rank %d: a base refresh of %d bytes at step %d: %v", h.owner, size, h.step, err)
			return refuse(func() error { return writeFail(c, h, failOther, msg) })
		}
		o.held += size
		w, err := o.cur.BeginBase(h.step)
		if err != nil {
			return refuse(func() error { return writeFail(c, h, failStale, fmt.Sprintf("rank %d: %v", h.owner, err)) })
		}
		o.bw, o.bwGen = w, h.gen
	}
	data := o.chunkBuf(n) // Write copies it
	if _, err := io.ReadFull(c, data); err != nil {
		return err
	}
	if err := o.bw.Write(t[0].name, off, data); err != nil {
		why := uint32(failOther)
		if errors.Is(err, diffstore.ErrStale) {
			why, o.bw = failStale, nil
		}
		return writeFail(c, h, why, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	return writeAck(c, h)
}

// baseCommit commits the base refresh at h.step with the owner's CRC32Cs
// of t: the store switches to it once G reaches its step.
func (st *replicaStore) baseCommit(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length != 0 {
		return fmt.Errorf("base commit with %d bytes of data", h.length)
	}
	if msg := st.notHolder(h); msg != "" {
		return writeFail(c, h, failOther, msg)
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return writeFail(c, h, why, msg)
	}
	if o.bw == nil || o.bw.Step() != h.step {
		return writeFail(c, h, failStale, fmt.Sprintf("rank %d: no base refresh of step %d in progress", h.owner, h.step))
	}
	defer st.account(o)
	sums := make(map[string]uint32, len(t))
	for _, e := range t {
		sums[e.name] = e.sum
	}
	if err := o.bw.Commit(h.step, sums); err != nil {
		why := uint32(failStale)
		if errors.Is(err, diffstore.ErrCorrupt) {
			why = failCRC // the refresh stays: its chunks may come again
		} else {
			o.bw = nil
		}
		return writeFail(c, h, why, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o.bw = nil
	o.setSums(h.step, h.gen, t)
	return writeAck(c, h)
}

// hasDiff acknowledges h if one of o's stores (the current one, or the
// previous one a newer base replaced) holds h.step with the regions and
// CRC32Cs of t. In diff mode under EC (ecDiff) only the current one
// counts: the owner's differentials follow it, and the previous one goes
// once H reaches the current one's base. o.mu is held.
func (o *ownerReplica) hasDiff(h linkHdr, t []tableEntry, ecDiff bool) bool {
	if o.diverged != nil || !slices.Equal(o.sums[h.step], t) {
		return false
	}
	stores := []*diffstore.Store{o.cur, o.prev}
	if ecDiff {
		stores = stores[:1]
	}
	for _, ds := range stores {
		if ds != nil && ds.Held(h.step) {
			return true
		}
	}
	return false
}

// confirmDiff records that the owner confirmed step (kindHas) in
// generation gen: step and the steps before it that the stores hold count
// as gen's (a restart of gen keeps them, as full mode keeps a buffer a
// has confirmed). o.mu is held.
func (o *ownerReplica) confirmDiff(step int64, gen uint64) {
	for s, sg := range o.sumGen {
		if s <= step && sg < gen {
			o.sumGen[s] = gen
		}
	}
}

// restoreDiff rebuilds owner's replicated regions at step into dst (by
// name, each of its region's size; nil: allocated) and returns the table
// to send them with: the owner's committed CRC32Cs, which the restored
// bytes must match (a *different* replay is an error naming rank, step
// and region), or, when a lossy codec made the step inexact, the restored
// bytes' own (with a warning: they approximate the owner's state).
func (st *replicaStore) restoreDiff(owner int, step int64, dst map[string][]byte) ([]tableEntry, map[string][]byte, error) {
	ds, t, err := st.diffSource(owner, step)
	if err != nil {
		return nil, nil, err
	}
	if dst == nil {
		dst = make(map[string][]byte, len(t))
		for _, e := range t {
			dst[e.name] = make([]byte, e.size)
		}
	}
	for _, e := range t {
		if d, ok := dst[e.name]; !ok || int64(len(d)) != e.size {
			return nil, nil, fmt.Errorf("region %q of %d bytes does not fit here (%d)", e.name, e.size, len(d))
		}
	}
	if err := ds.Restore(step, dst, replay.ReplayOptions{}); err != nil {
		return nil, nil, fmt.Errorf("rank %d step %d: %w", owner, step, err)
	}
	exact := ds.Exact(step)
	if !exact && st.h.cfg.Diff.lossless() {
		// This job promises bitwise restores: an approximation is not
		// one (a lossy differential from an owner configured otherwise).
		return nil, nil, fmt.Errorf("rank %d step %d: the replica here is not exact (a lossy differential) and the job is lossless: not restored", owner, step)
	}
	for i, e := range t {
		got := crc32c.Checksum(dst[e.name])
		switch {
		case got == e.sum:
		case exact:
			return nil, nil, fmt.Errorf("rank %d step %d region %s: replayed state differs from the owner's commit (CRC32C %08x, committed %08x)", owner, step, e.name, got, e.sum)
		default:
			t[i].sum = got
		}
	}
	if !exact {
		st.h.log.Warn("restoring an approximation of a rank's state (--diff-codec is lossy): not the owner's bytes", "rank", owner, "step", step)
	}
	return t, dst, nil
}

// diffSource returns the store of owner that holds step and the owner's
// committed table of step (a copy).
func (st *replicaStore) diffSource(owner int, step int64) (*diffstore.Store, []tableEntry, error) {
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil, nil, fmt.Errorf("no replica of rank %d here", owner)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var ds *diffstore.Store
	for _, x := range []*diffstore.Store{o.cur, o.prev} {
		if x != nil && x.Held(step) {
			ds = x
			break
		}
	}
	t := slices.Clone(o.sums[step])
	if ds == nil || t == nil {
		return nil, nil, fmt.Errorf("no replica of rank %d at step %d here", owner, step)
	}
	return ds, t, nil
}

// testHookStreamPiece, if set (by tests), may replace a piece of a
// diff-mode holder's streamed answer to a get before it is checksummed and
// sent (a replay that differs from the owner's).
var testHookStreamPiece func(holder, owner int, region string, b []byte) []byte

// getDiff answers a get (a restore from another host) in diff mode. An
// exact step is a pieces answer (pieces.go), streamed as the store replays
// it (diffstore.Store.RestorePieces): the header and the owner's committed
// table of the step first, then the regions' bytes in pieces tagged with
// where they go, each window of the optimizer's elements replayed once and
// sent as its W, M and V pieces, so that the holder never holds the whole
// state twice nor replays it thrice. Each region's CRC32C is computed from
// its pieces on the way (combined: they do not come in order); a region
// that ends with another CRC32C than the owner's (a replay that differs,
// which the receiver's check refuses too) is an error naming rank, step
// and region: it is logged and closes the link, and the next region is not
// sent. A step a lossy codec made inexact is restored whole first
// (restoreDiff) and sent as a data answer: its table carries the restored
// bytes' own CRC32Cs, known only at the end.
func (st *replicaStore) getDiff(c net.Conn, h linkHdr) error {
	ds, t, err := st.diffSource(h.owner, h.step)
	if err == nil && (!ds.Exact(h.step) || !sameShape(t, regionTable(ds.Regions()))) {
		var data map[string][]byte
		if t, data, err = st.restoreDiff(h.owner, h.step, nil); err == nil {
			views := make([][]byte, len(t))
			for i, e := range t {
				views[i] = data[e.name]
			}
			return writeFrame(c, linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}, t, views)
		}
	}
	if err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	head := linkHdr{kind: kindPieces, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
	sent := false
	sendHead := func() error {
		sent = true
		return writeFrame(c, head, t, [][]byte{}) // data non-nil: the length is the regions'
	}
	pw := newPieceWriter(c, t)
	checked := 0
	// check compares the regions before upTo, whole, with the owner's
	// CRC32Cs.
	check := func(upTo int) error {
		for ; checked < upTo; checked++ {
			e := t[checked]
			got, whole := pw.sum(checked)
			if !whole {
				return fmt.Errorf("rank %d step %d region %s: the replay left bytes out", h.owner, h.step, e.name) // not reached: RestorePieces gives every byte
			}
			if got != e.sum {
				err := fmt.Errorf("rank %d step %d region %s: replayed state differs from the owner's commit (CRC32C %08x, committed %08x)", h.owner, h.step, e.name, got, e.sum)
				st.h.log.Error("a replica's replay differs from the owner's commit: closing the link", "rank", h.owner, "step", h.step, "region", e.name, "err", err)
				return err
			}
		}
		return nil
	}
	err = ds.RestorePieces(h.step, pieceChunk, replay.ReplayOptions{}, func(i int, off int64, b []byte) error {
		if !sent {
			if err := sendHead(); err != nil {
				return err
			}
		}
		if err := check(i); err != nil {
			return err
		}
		if testHookStreamPiece != nil {
			b = testHookStreamPiece(h.holder, h.owner, t[i].name, b)
		}
		return pw.write(i, off, b)
	})
	switch {
	case err != nil && !sent:
		// Nothing sent yet (a fold moved the store past the step
		// meanwhile): a refusal, the link stays.
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: %v", h.owner, h.step, err))
	case err != nil:
		return err
	case !sent:
		if err := sendHead(); err != nil { // every region empty
			return err
		}
	}
	return check(len(t))
}

// regionTable returns a table of regions (names and sizes, no CRC32Cs).
func regionTable(rs []diffstore.Region) []tableEntry {
	t := make([]tableEntry, len(rs))
	for i, r := range rs {
		t[i] = tableEntry{name: r.Name, size: r.Size}
	}
	return t
}

// setGDiff tells o's stores G, drops the previous store once the current
// one holds G, and folds if the log is long enough. o.mu is held.
//
// In diff mode under EC the stores' G is H instead (Keeper.pin), or the
// newer step the owner said H reached (baseH, o.hmin): their bases stay
// at H, no fold passes it.
func (st *replicaStore) setGDiff(o *ownerReplica, g int64) {
	if st.h.place().ecDiff() {
		g = max(st.h.pin(g), o.hmin)
	}
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds != nil {
			ds.SetG(g)
		}
	}
	if o.prev != nil && o.cur != nil {
		if first, _, ok := o.cur.Range(); ok && first <= g {
			o.prev = nil
			st.account(o)
		}
	}
	st.maybeFold(o)
}

// restartDiff drops o's steps after g received in generations older than
// gen (a restart of gen resumes from g; they were never recoverable),
// and keeps those received (or confirmed, kindHas) in gen itself: a
// holder's host may restart after the owner's rank restored from g and
// had its next steps acknowledged here, as full mode keeps the buffers
// of gen. A store is cut after the last step before the first older
// one after g; a store whose base is past that goes. o.mu is held.
func (st *replicaStore) restartDiff(o *ownerReplica, gen uint64, g int64) {
	// cut: the last step kept. Every step a store or log holds has its
	// sums.
	cut := max(o.diffNewest(), o.logNewest())
	if o.bw != nil && o.bw.Step() > g && o.bwGen < gen {
		cut = min(cut, o.bw.Step()-1)
	}
	for s := g + 1; s <= cut; s++ {
		if sg, ok := o.sumGen[s]; !ok || sg < gen {
			cut = s - 1
			break
		}
	}
	cut = max(cut, g)
	if o.bw != nil && o.bw.Step() > cut {
		o.bw = nil // Truncate aborts it
	}
	keep := func(ds *diffstore.Store) *diffstore.Store {
		if ds == nil || ds.Truncate(cut) != nil {
			return nil
		}
		return ds
	}
	o.cur, o.prev = keep(o.cur), keep(o.prev)
	if o.cur == nil {
		o.cur, o.prev = o.prev, nil
		if o.bw != nil {
			o.bw.Abort()
			o.bw = nil
		}
	}
	for s := range o.sums {
		if s > cut {
			delete(o.sums, s)
			delete(o.sumGen, s)
		}
	}
	// A divergence found in an older generation was at a step after g or
	// before: the restarted rank's steps are checked anew.
	o.diverged = nil
	st.restartLog(o, cut)
	st.setGDiff(o, g)
	st.account(o)
}

// maybeFold queues o for the host's fold goroutine once its current log
// holds DiffConfig.Fold steps up to G. o.mu is held.
func (st *replicaStore) maybeFold(o *ownerReplica) {
	h := st.h
	if o.cur == nil || h.folds == nil || h.place().ecDiff() {
		return // under EC the base stays at H: refreshes replace folds
	}
	first, last, ok := o.cur.Range()
	if !ok || min(h.G(), last)-first < int64(h.cfg.Diff.fold()) {
		return
	}
	if o.foldQueued.CompareAndSwap(false, true) {
		select {
		case h.folds <- o:
		default:
			o.foldQueued.Store(false) // queued again by the next differential
		}
	}
}

// foldReplay is how the holder's background folds replay: on one
// goroutine. A fold is not waited for (a restore replays what is not
// folded yet), so it takes one CPU at most and leaves the others to the
// ranks' steps, where with every CPU it would compete with them on all.
// Restores, which the job waits for, replay on every CPU.
var foldReplay = replay.ReplayOptions{Workers: 1}

// foldLoop folds the owners' logs queued by maybeFold into their bases,
// one at a time, until the host stops: the holder's background replay
// (diffstore.Store.Fold, which stops at G). In a lossless job it checks
// the fold before it becomes the base (diffstore.Store.FoldChecked: the
// steps are replayed once, into a spare buffer): the state at the step
// the fold ends at must have the owner's committed CRC32Cs of that step;
// if it does not, the owner's optimizer step is not replay's, the fold
// does not happen (the base stays, and the steps before the divergence
// still restore), and the owner's differentials are refused from then on
// with failDiverged, which fails its rank.
func (h *Keeper) foldLoop() {
	defer h.wg.Done()
	for {
		select {
		case <-h.life.Done():
			return
		case o := <-h.folds:
			o.foldQueued.Store(false)
			o.mu.Lock()
			ds, dv := o.cur, o.diverged
			var first, last int64
			ok := false
			if ds != nil {
				first, last, ok = ds.Range()
			}
			upTo := min(h.G(), last)
			// The committed CRC32Cs of the steps the fold may end at
			// (it stops at the store's G, which may lag h.G()): the
			// check runs with the store's fold lock held, and may not
			// take o.mu (takeDiff holds it while it truncates).
			var sums map[int64][]tableEntry
			if h.cfg.Diff.lossless() {
				sums = make(map[int64][]tableEntry, max(0, upTo-first))
				for s := first + 1; s <= upTo; s++ {
					if t, ok := o.sums[s]; ok {
						sums[s] = t
					}
				}
			}
			o.mu.Unlock()
			if dv != nil || !ok || upTo <= first {
				continue
			}
			before := ds.Stats()
			var err error
			var div *CorruptError
			if h.cfg.Diff.lossless() && ds.Exact(upTo) {
				regs := ds.Regions()
				err = ds.FoldChecked(upTo, foldReplay, func(step int64, got [][]byte) error {
					if div = h.checkFold(o.rank, regs, step, got, sums[step]); div != nil {
						return div
					}
					return nil
				})
				if div != nil {
					o.mu.Lock()
					if o.cur == ds {
						o.diverged = div
					}
					o.mu.Unlock()
					h.log.Error("a replica holder's replay of a rank's differentials differs from the rank's commit: the rank's optimizer step is not replay's; its base is kept and the rank will fail", "rank", o.rank, "step", div.Step, "err", div.Detail)
				}
			} else {
				err = ds.Fold(upTo, foldReplay)
			}
			if err != nil && div == nil {
				h.log.Warn("folding a replica's differentials failed", "rank", o.rank, "err", err)
			}
			// Whatever the fold's outcome: it may have measured a drift,
			// and moved buffers (a spare taken, records recycled).
			after := ds.Stats()
			h.foldSteps.Add(after.FoldedSteps - before.FoldedSteps)
			h.foldNS.Add(int64(after.FoldTime - before.FoldTime))
			h.noteDrift(o.rank, before, after)
			o.mu.Lock()
			h.store.account(o)
			o.mu.Unlock()
		}
	}
}

// checkFold compares owner's state at step, as a fold made it (got, one
// slice per region of regs), with the owner's committed CRC32Cs of that
// step, want (nil: not known here, nothing to compare): the divergence
// found (Detail names the region and both CRC32Cs), or nil.
func (h *Keeper) checkFold(owner int, regs []diffstore.Region, step int64, got [][]byte, want []tableEntry) *CorruptError {
	for _, e := range want {
		i := slices.IndexFunc(regs, func(r diffstore.Region) bool { return r.Name == e.name })
		if i < 0 {
			continue
		}
		if sum := crc32c.Checksum(got[i]); sum != e.sum {
			return &CorruptError{Rank: owner, Step: step, Region: e.name, Sum: e.sum, Got: sum, Replay: true,
				Detail: fmt.Sprintf("the holder on host %d replayed region %s of step %d to CRC32C %08x, committed %08x", h.cfg.Host, e.name, step, sum, e.sum)}
		}
	}
	return nil
}
