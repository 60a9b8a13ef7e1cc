package keeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/protect"
)

// ---- The owner's side --------------------------------------------------

// replicator sends one rank's committed steps to its holders, every one
// in order to each holder: a holder must have every step that G may come
// to name (when step s+1 commits before step s is sent, G may still be
// s), and the overwrite rule keeps a step's slot until the next one is
// replicated. Steps older than the G known here are not sent (nothing
// will ever restore them).
//
// It keeps what each holder of the current placement is known to hold
// (acked): the newest step the holder acknowledged in this generation
// since it became a holder. A holder it knows nothing of (a new holder,
// a holder that moved to another host, every holder after a restart or a
// restore) is first asked whether it holds the step to send (kindHas:
// after a restart the holders on surviving hosts do), and sent it if not.
// The rank's Replicated is the oldest of its current holders' steps:
// it claims a step only once every holder of the placement has it.
//
// A send that fails is retried, with a backoff, for as long as the failure
// may be transient: a link down, a holder not yet restarted or not yet in
// the new placement, data damaged on the way. A holder that refuses the
// data as not matching the owner's CRC32Cs has the owner verify its slot
// against the CRC32Cs of its commit; if the slot no longer matches them,
// the rank's state is corrupt and no retry can help: the replicator stops
// until the next restart and the rank is failed (service.fail).
type replicator struct {
	s       *service
	mu      sync.Mutex // guards the fields below
	wantS   int64      // newest committed step to replicate
	acked   map[holderKey]int64
	ver     uint64 // changes when acked is forgotten or the holders change: a send begun before records nothing
	running bool
	cancel  context.CancelFunc
	done    chan struct{}
	wake    chan struct{} // ends a backoff wait early (new placement or addresses)
	stopped bool          // the service closed
	failed  bool          // the rank's state is corrupt: nothing to send until reset
	// restoring: the rank's slot is being rewritten (restoreRemote):
	// nothing starts the loop until resume.
	restoring bool

	fails atomic.Int64 // rounds that failed (and were retried, or stopped), ever

	// Diff mode (diff.go).
	dq      []*ownerDiff        // differentials some holder may still need, consecutive steps
	dqBytes int64               // their bytes on the wire
	dnext   map[holderKey]int64 // the step each holder takes next; absent: ask it, or send it a base
	dfails  map[holderKey]int   // consecutive refusals of a differential as damaged
	ref     *refresh            // the base refresh being sent, or nil
	refStep int64               // the step of the last refresh (at first, of the first step sent), or -1
	refProg map[holderKey]*refProg
	refPool bufPool // the snapshot buffer of a refresh nothing reads any more, for the next

	// Erasure coding (ecsend.go): the share buffers, used by one send at
	// a time (the loop's, or in diff mode the base's sendShares).
	ec ecBufs
	// Diff mode under EC: the base schedule and the coded bases
	// (ecdiff_owner.go).
	ecb ecBase
}

func (r *replicator) init(s *service) {
	r.s, r.wantS, r.refStep = s, noStep, noStep
	r.acked = map[holderKey]int64{}
	r.dnext, r.dfails, r.refProg = map[holderKey]int64{}, map[holderKey]int{}, map[holderKey]*refProg{}
	r.wake = make(chan struct{}, 1)
	r.refPool.max = 1
}

// replicatedIn returns the newest step every holder of placement p
// acknowledged since it became one (MaxStep when the rank has no
// holders): derived from acked and p each time, so that a report taken
// under a new placement never counts the holders of the one before.
//
// In diff mode under EC the parity rows hold base steps only: the
// minimum is over the differentials' targets (the clear copy's holder
// and the log-only holders), capped by the coded bases (capLocked).
func (r *replicator) replicatedIn(p *placement) int64 {
	ts := p.allTargets(r.s.rank)
	if len(ts) == 0 {
		return protect.MaxStep // every committed step
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := int64(protect.MaxStep)
	for _, k := range ts {
		if k.row > 0 && p.ecDiff() {
			continue
		}
		a, ok := r.acked[k]
		if !ok {
			a = noStep
		}
		m = min(m, a)
	}
	if p.ecDiff() {
		m = min(m, r.capLocked(p))
	}
	return m
}

// want has step, newly committed, (and the steps before it that a holder
// lacks) replicated.
func (r *replicator) want(step int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.failed {
		return
	}
	r.wantS = max(r.wantS, step)
	r.startLocked()
}

func (r *replicator) startLocked() {
	if r.running || r.restoring || r.wantS < 0 {
		return
	}
	r.running = true
	ctx, cancel := context.WithCancel(r.s.h.life)
	r.cancel, r.done = cancel, make(chan struct{})
	if r.s.h.diffMode() {
		go r.loopDiff(ctx, cancel, r.done)
		return
	}
	go r.loop(ctx, cancel, r.done)
}

// forget drops what is known of the holders: each is asked again before
// Replicated counts it. The replicator is not running (reset).
func (r *replicator) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.acked)
	clear(r.dnext)
	clear(r.dfails)
	clear(r.refProg)
	r.ver++
}

// placed switches to placement p's holders: those that left are
// forgotten, the new ones (and the ones that moved to another host) are
// asked, and the newest committed step is sent to those that lack it.
func (r *replicator) placed(p *placement) {
	s := r.s
	s.mu.Lock()
	committed := s.committed
	s.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := p.allTargets(s.rank)
	changed := len(ts) != len(r.acked)
	for k := range r.acked {
		if !slices.Contains(ts, k) {
			delete(r.acked, k)
			changed = true
		}
	}
	for k := range r.dnext {
		if !slices.Contains(ts, k) {
			delete(r.dnext, k)
			delete(r.dfails, k)
			delete(r.refProg, k)
		}
	}
	for _, k := range ts {
		if _, ok := r.acked[k]; !ok {
			changed = true
		}
	}
	if changed {
		r.ver++
	}
	r.poke()
	if r.stopped || r.failed || committed < 0 {
		return
	}
	r.wantS = max(r.wantS, committed)
	r.startLocked()
}

// poke ends the loop's backoff wait, if it is in one.
func (r *replicator) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// reset cancels the replication in flight and waits for it to end; a
// replicator stopped by a corrupt state may start again.
func (r *replicator) reset() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.wantS, r.failed = noStep, false
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	r.stopShares()
}

// pause cancels the replication in flight, waits for it to end, and
// keeps it from starting again until resume: the slots are rewritten.
// What the holders acknowledged is forgotten (each is asked again).
func (r *replicator) pause() {
	r.mu.Lock()
	r.restoring = true
	r.mu.Unlock()
	r.reset()
	r.forget()
}

// resume ends a pause and has step (the rank's newest committed step, -1:
// none) replicated.
func (r *replicator) resume(step int64) {
	r.mu.Lock()
	r.restoring = false
	r.mu.Unlock()
	r.want(step)
}

func (r *replicator) stop() {
	r.mu.Lock()
	r.stopped = true
	r.stopSnapRetryLocked()
	r.stopPacedRetryLocked()
	r.mu.Unlock()
	r.reset()
	r.releaseSnaps() // the retained snapshots' reservation (ecdiff_mem.go)
}

// sendPlan is one round of the loop: step, to the holders lacking it.
type sendPlan struct {
	step  int64
	to    []holderKey
	known []bool // whether acked knows to[i] (else it is asked first)
	ver   uint64
}

// planLocked returns the next round: the oldest step that some holder
// lacks, among the slots' steps from G (known here) to wantS, and the
// holders lacking it; step -1 when every holder is up to date. r.mu is
// held.
func (r *replicator) planLocked() sendPlan {
	s := r.s
	ts := s.h.place().allTargets(s.rank)
	g := s.h.G()
	s.mu.Lock()
	steps := s.slotStep
	s.mu.Unlock()
	next := func(after int64) int64 {
		n := int64(noStep)
		for _, st := range steps {
			if st > after && st >= g && st <= r.wantS && (n < 0 || st < n) {
				n = st
			}
		}
		return n
	}
	p := sendPlan{step: noStep, ver: r.ver}
	for _, k := range ts {
		a, ok := r.acked[k]
		if !ok {
			a = noStep
		}
		n := next(a)
		switch {
		case n < 0:
		case p.step < 0 || n < p.step:
			p.step, p.to, p.known = n, []holderKey{k}, []bool{ok}
		case n == p.step:
			p.to, p.known = append(p.to, k), append(p.known, ok)
		}
	}
	return p
}

func (r *replicator) loop(ctx context.Context, cancel context.CancelFunc, done chan struct{}) {
	defer close(done)
	defer cancel()
	s := r.s
	var rt roundRetry
	for {
		r.mu.Lock()
		var p sendPlan
		if ctx.Err() == nil && !r.failed {
			p = r.planLocked()
		}
		if p.step < 0 || ctx.Err() != nil || r.failed {
			r.running, r.cancel = false, nil
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		gen, errs, err := r.send(ctx, p)
		r.mu.Lock()
		if r.ver == p.ver {
			for i, k := range p.to {
				if errs[i] == nil {
					r.acked[k] = max(r.acked[k], p.step)
				}
			}
		}
		r.mu.Unlock()
		s.h.cfg.Changed()
		r.afterRound(ctx, gen, err, &rt, "step", p.step)
	}
}

// roundRetry is a replication loop's state between its rounds: the wait
// before the next try after a failure, and the failures in a row. The
// zero value is a loop without failures.
type roundRetry struct {
	backoff  time.Duration // 0: the first wait's, 50 ms
	failures int
	logged   time.Time // when a failure was last logged
}

// afterRound takes a round's outcome err (its generation gen) in the
// replication loop whose retry state is rt: a success resets rt; a
// *CorruptError fails the rank (r.failed: the loop ends at its next
// plan); any other error is counted, logged (the first of a series, then
// every 30 s, with attrs) and waited out before the next round, 50 ms
// doubling to 2 s, cut short by a wake (new work: the wait starts over
// at 50 ms) or by ctx.
func (r *replicator) afterRound(ctx context.Context, gen uint64, err error, rt *roundRetry, attrs ...any) {
	s := r.s
	const first, most = 50 * time.Millisecond, 2 * time.Second
	switch {
	case err == nil:
		rt.backoff, rt.failures = 0, 0
		return
	case ctx.Err() != nil:
		return
	}
	if ce, ok := errors.AsType[*CorruptError](err); ok {
		r.mu.Lock()
		r.failed = true
		r.mu.Unlock()
		s.fail(gen, ce)
		return
	}
	r.fails.Add(1)
	if rt.failures++; rt.failures == 1 || time.Since(rt.logged) > 30*time.Second {
		s.h.log.Warn("replication failed; retrying", append([]any{"rank", s.rank, "mode", s.h.mode()}, append(attrs, "failures", rt.failures, "err", err)...)...)
		rt.logged = time.Now()
	}
	if rt.backoff == 0 {
		rt.backoff = first
	}
	t := time.NewTimer(rt.backoff)
	select {
	case <-t.C:
	case <-r.wake:
		t.Stop()
		rt.backoff = first
	case <-ctx.Done():
		t.Stop()
	}
	rt.backoff = min(2*rt.backoff, most)
}

// send sends p.step to the holders p.to, asking those it knows nothing of
// whether they hold it first. It returns the generation it sent in, each
// holder's error, and their join; when a holder refused the data as
// damaged and the slot no longer matches its commit, a *CorruptError.
func (r *replicator) send(ctx context.Context, p sendPlan) (uint64, []error, error) {
	s := r.s
	step := p.step
	errs := make([]error, len(p.to))
	// The generation is read before the slot: a restart begun after this
	// (a newer generation) waits for this send to end before it truncates
	// the slot, so the bytes sent are never newer than gen says; read
	// after, it could label a step of the old generation with the new one.
	gen := s.h.Gen()
	s.mu.Lock()
	slot := -1
	for i, st := range s.slotStep {
		if st == step {
			slot = i
		}
	}
	if slot < 0 { // truncated by a restore since planLocked
		s.mu.Unlock()
		err := fmt.Errorf("step %d is no longer in a slot", step)
		for i := range errs {
			errs[i] = err
		}
		return gen, errs, err
	}
	var t []tableEntry
	var data [][]byte
	for _, i := range s.repl {
		t = append(t, tableEntry{name: s.regions[i].Name, size: s.regions[i].Size, sum: s.sums[slot][i]})
		data = append(data, s.views[slot][i])
	}
	epoch := s.slotEpoch[slot]
	s.mu.Unlock()
	// The slot holding step is not staged over before step is replicated
	// (the overwrite rule needs it to be), nor truncated before reset
	// waited for this send: its views are stable here.
	start := time.Now()
	var sent atomic.Int64 // holders sent the data (not just asked)
	var wg sync.WaitGroup
	// The parity rows (erasure coding) go together: one encoding for
	// all of them.
	var rows, ri []int
	for i, k := range p.to {
		if k.row > 0 {
			ri = append(ri, i)
		}
	}
	var ecErr error
	var ecBytes int64
	if len(ri) > 0 {
		to, known := make([]holderKey, len(ri)), make([]bool, len(ri))
		for n, i := range ri {
			to[n], known[n] = p.to[i], p.known[i]
		}
		rows = ri
		wg.Go(func() {
			var rerrs []error
			rerrs, ecErr, ecBytes = r.ecSend(ctx, step, slot, gen, epoch, t, data, to, known)
			for n, i := range rows {
				errs[i] = rerrs[n]
			}
		})
	}
	for i, k := range p.to {
		if k.row > 0 {
			continue
		}
		wg.Go(func() {
			hdr := linkHdr{owner: s.rank, holder: k.rank, step: step, gen: gen}
			if !p.known[i] {
				hdr.kind = kindHas
				if s.h.links.has(ctx, k.host, hdr, t) == nil {
					return
				}
			}
			hdr.kind = kindPut
			errs[i] = s.h.links.put(ctx, k.host, hdr, t, data)
			if errs[i] == nil {
				sent.Add(1)
			}
			if le, ok := errors.AsType[*linkError](errs[i]); ok && ctx.Err() == nil {
				s.h.linkFailed(k.host, le)
			}
		})
	}
	wg.Wait()
	if ce, ok := errors.AsType[*CorruptError](ecErr); ok {
		return gen, errs, ce
	}
	if ecBytes > 0 {
		s.replBytes.Add(ecBytes)
	}
	if err := errors.Join(errs...); err != nil {
		if errors.Is(err, errPutDamaged) {
			// The holder's copy did not match the CRC32Cs of the
			// commit. If the slot still does, the bytes were damaged on
			// the way (retried); else they changed here after the commit.
			if ce := s.verifySlot(slot, step); ce != nil {
				return gen, errs, ce
			}
			return gen, errs, fmt.Errorf("%w (rank %d's slot of step %d still matches its commit: damaged in transit)", err, s.rank, step)
		}
		return gen, errs, err
	}
	if ctx.Err() != nil {
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return gen, errs, ctx.Err()
	}
	if n := sent.Load(); n > 0 || ecBytes > 0 {
		s.replSteps.Add(1)
		s.replNS.Add(int64(time.Since(start)))
		s.replBytes.Add(int64(tableBytes(t)) * n)
	}
	return gen, errs, nil
}
