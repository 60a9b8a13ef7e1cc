package keeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
)

// snapshot copies the replicated regions of the committed slot holding
// step into a refresh buffer (from refPool), checked against the
// commit's CRC32Cs: a slot written meanwhile (a torn read) is an error,
// and the snapshot is tried again.
func (r *replicator) snapshot(step int64, names []string) (*refresh, error) {
	ref := &refresh{step: step}
	err := r.s.readSlot(step, names, func(t []tableEntry, data [][]byte) error {
		n := int(tableBytes(t))
		if buf := r.refPool.get(n); buf != nil {
			ref.buf = buf[:n]
		} else {
			ref.buf = make([]byte, n)
		}
		ref.rb.own(&r.refPool, ref.buf)
		off := 0
		for i, d := range data {
			ref.offs = append(ref.offs, int64(off))
			if got := crc32c.CopyUpdate(0, ref.buf[off:], d); got != t[i].sum {
				return fmt.Errorf("region %s of step %d changed while it was copied", t[i].name, step)
			}
			off += len(d)
		}
		ref.table = t
		return nil
	})
	if err != nil {
		if ref.buf != nil {
			ref.rb.release()
		}
		return nil, err
	}
	return ref, nil
}

// views returns the snapshot's regions, in table order.
func (ref *refresh) views() [][]byte {
	out := make([][]byte, len(ref.table))
	for i := range ref.table {
		end := int64(len(ref.buf))
		if i+1 < len(ref.offs) {
			end = ref.offs[i+1]
		}
		out[i] = ref.buf[ref.offs[i]:end]
	}
	return out
}

// dropRefLocked lets go of the refresh being sent and stops the send of
// its shares. r.mu is held.
func (r *replicator) dropRefLocked() {
	if sr := r.ecb.shares; sr != nil {
		sr.cancel() // it releases its reference when it ends
		r.ecb.shares, r.ecb.stopping = nil, sr
	}
	if r.ref != nil {
		r.ref.rb.release()
		r.ref = nil
	}
	clear(r.refProg)
	r.settleSnapsLocked()
}

// startSharesLocked starts the background send of the current base's
// shares to the parity rows, if it is due: the snapshot is taken, the
// gate is open, and the rows do not all have it. r.mu is held.
func (r *replicator) startSharesLocked() {
	ref := r.ref
	if ref == nil || ref.rows || r.ecb.shares != nil || r.failed || r.stopped || r.restoring || !r.gateOpen(ref) {
		return
	}
	rows := r.s.h.place().ecTargets(r.s.rank)
	if len(rows) == 0 {
		ref.rows = true
		r.advanceLocked()
		return
	}
	ctx, cancel := context.WithCancel(r.s.h.life)
	sr := &shareRun{cancel: cancel, done: make(chan struct{}), pace: r.refPaceLocked(ref)}
	old := r.ecb.stopping
	r.ecb.shares, r.ecb.stopping = sr, nil
	ref.rb.retain()
	go func() {
		defer close(sr.done)
		defer cancel()
		defer ref.rb.release()
		if old != nil {
			// Cancelled: it ends soon. Its done closes only once the
			// run it waited for ended too, so no two runs overlap.
			if testHookShareWait != nil {
				testHookShareWait(r)
			}
			<-old.done
		}
		r.sendShares(ctx, ref, sr)
	}()
}

// sendShares sends the shares of base ref to the rank's parity rows
// until every row has its share, the send is cancelled (a newer
// placement, a restart, the service closing) or the rank fails, with
// ecSend's pipeline and roundRetry's backoff between tries.
func (r *replicator) sendShares(ctx context.Context, ref *refresh, sr *shareRun) {
	s := r.s
	var rt roundRetry
	views := ref.views()
	for ctx.Err() == nil {
		rows := s.h.place().ecTargets(s.rank)
		known := make([]bool, len(rows))
		start, waited := time.Now(), sr.pace.waitedTotal()
		errs, err, n := r.ecSendLanes(ctx, ref.step, -1, 1, ref.gen, ref.epoch, ref.table, views, rows, known, sr.pace)
		// The time the send waited for the pacing (steps of training)
		// is not replication time (ReplNS: gorun -v's repl/step).
		start = start.Add(sr.pace.waitedTotal() - waited)
		if n > 0 {
			s.addReplBytes(n, 0)
		}
		r.mu.Lock()
		if r.ecb.shares != sr {
			r.mu.Unlock()
			return
		}
		all := true
		for i, k := range rows {
			if errs[i] == nil {
				r.acked[k] = max(r.acked[k], ref.step)
			} else {
				all = false
			}
		}
		if all {
			ref.rows = true
			r.ecb.shares = nil
			r.advanceLocked()
			r.startLocked()
		}
		r.mu.Unlock()
		if all {
			s.replNS.Add(int64(time.Since(start)))
			s.h.cfg.Changed()
			return
		}
		if ce, ok := errors.AsType[*CorruptError](err); ok {
			r.mu.Lock()
			if r.ecb.shares == sr {
				r.ecb.shares = nil
			}
			r.mu.Unlock()
			r.afterRound(ctx, ref.gen, ce, &rt)
			return
		}
		r.afterRound(ctx, ref.gen, err, &rt, "base", ref.step)
	}
}

// advanceLocked makes the current base coded once every row has its
// share and the data host its bytes: Base_r moves to it, and a rank on
// its data host retains its snapshot. r.mu is held.
func (r *replicator) advanceLocked() {
	ref, b := r.ref, &r.ecb
	if ref == nil || !ref.rows || !ref.data || ref.coded {
		return
	}
	ref.coded = true
	if n := len(b.coded); n == 0 || b.coded[n-1] < ref.step {
		b.coded = append(b.coded, ref.step)
		if len(b.coded) > 4 {
			b.coded = slices.Delete(b.coded, 0, len(b.coded)-4)
		}
	}
	if r.ownData(r.s.h.place()) {
		ref.rb.retain()
		b.retained = append(b.retained, ref)
	}
	r.releaseRetainedLocked(r.s.h.H())
}

// releaseRetainedLocked drops the retained snapshots H no longer needs:
// each one older than the newest retained step <= h. r.mu is held.
func (r *replicator) releaseRetainedLocked(h int64) {
	b := &r.ecb
	keep := 0 // index of the oldest snapshot kept
	for i, ref := range b.retained {
		if ref.step <= h {
			keep = i
		}
	}
	for _, ref := range b.retained[:keep] {
		ref.rb.release()
	}
	b.retained = slices.Delete(b.retained, 0, keep)
	r.settleSnapsLocked()
}

// dropRetainedAfterLocked drops the retained snapshots of steps after g
// (a restart or a restore resumes from g: they are of an abandoned
// trajectory). r.mu is held.
func (r *replicator) dropRetainedAfterLocked(g int64) {
	b := &r.ecb
	b.retained = slices.DeleteFunc(b.retained, func(ref *refresh) bool {
		if ref.step > g {
			ref.rb.release()
			return true
		}
		return false
	})
	for len(b.coded) > 0 && b.coded[len(b.coded)-1] > g {
		b.coded = b.coded[:len(b.coded)-1]
	}
	r.settleSnapsLocked()
}

// hAdvanced is told that this host learned a newer H: retained
// snapshots H passed go, and a base waiting at the gate starts.
func (r *replicator) hAdvanced(h int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseRetainedLocked(h)
	r.startSharesLocked()
	r.poke()
	if !r.stopped && !r.failed {
		r.startLocked()
	}
}

// stopShares cancels the send of shares in flight and waits for it, and
// for the one cancelled before it.
func (r *replicator) stopShares() {
	r.mu.Lock()
	sr, old := r.ecb.shares, r.ecb.stopping
	r.ecb.shares, r.ecb.stopping = nil, nil
	r.mu.Unlock()
	if sr != nil {
		sr.cancel()
		<-sr.done // after old's
	} else if old != nil {
		<-old.done
	}
}

// paceIdleMin is the shortest pause in a rank's commits that counts as a
// step for the pacing of a base's shares (sharePace); tests lengthen it
// so that only commits count.
var paceIdleMin = 20 * time.Millisecond

// sharePace paces the sends of one base (diff mode under EC), its shares
// and the clear copy's refresh (clearLimitLocked), over the refresh's
// window (a budget of refresh.budget bytes per step): by the time the
// rank commits step base+i, at most budget·(i+1) bytes of the shard are
// encoded (each row gets as many bytes of its share) and sent to the
// clear copy, and from base+σ-1 on every byte, so that the cap
// (capLocked: base+σ-1 while the base is not coded) never waits for the
// pacing.
//
// A rank that commits nothing for twice the time of its last step (at
// least paceIdleMin) is not training: each such pause counts as one more
// step, so that a trainer that stops, or waits at the overwrite rule for
// another rank, still has its base coded within about σ pauses.
//
// The pacing never touches what is encoded (the snapshot, checked
// against the commit's CRC32Cs when it was taken, and retained by the
// send), only when: the shares are still of exactly the bytes whose
// CRC32C is checked at the end (ecSendLanes).
type sharePace struct {
	base   int64 // the base step
	budget int64 // the shard's bytes allowed per step (> 0)
	total  int64 // the shard's bytes
	steps  int64 // σ (refreshSteps)

	mu        sync.Mutex
	committed int64         // the rank's newest committed step
	at        time.Time     // when it committed it (zero: not known)
	period    time.Duration // the time of its last step (0: not known)
	wake      chan struct{} // closed, and replaced, when committed moves or lifted is set
	lifted    bool          // every byte is allowed
	// waitEnd is the end in the shard of the chunk the encoder waits to
	// encode, 0 when it does not wait (tests).
	waitEnd int64
	waited  time.Duration // the time wait blocked, all told
}

// waitedTotal returns the time wait blocked so far (p nil: 0).
func (p *sharePace) waitedTotal() time.Duration {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waited
}

// refPaceLocked returns the pacing of base ref's sends, its shares and
// the clear copy's refresh (one for both: the same budget, the same
// steps, the same lift), made by paceLocked when the first of them
// starts past the gate; nil when they are not paced. r.mu is held.
func (r *replicator) refPaceLocked(ref *refresh) *sharePace {
	if !ref.paced {
		ref.pace, ref.paced = r.paceLocked(ref), true
	}
	return ref.pace
}

// liftPaceLocked lifts the pacing of the current base's sends (it is
// the schedule's anchor now). r.mu is held.
func (r *replicator) liftPaceLocked() {
	if r.ref != nil && r.ref.pace != nil {
		r.ref.pace.lift()
	}
	if sr := r.ecb.shares; sr != nil && sr.pace != nil && (r.ref == nil || sr.pace != r.ref.pace) {
		sr.pace.lift()
	}
}

// paceLocked returns the pacing of base ref's sends, or nil when they
// are not paced: σ is 1, or no base of the schedule is coded yet (the
// cap is then the schedule's floor: G waits for this base), or ref is
// the schedule's anchor. r.mu is held.
func (r *replicator) paceLocked(ref *refresh) *sharePace {
	b := &r.ecb
	steps := r.s.h.cfg.Diff.refreshSteps()
	if steps <= 1 || b.base() < b.anchor || b.base() < 0 || ref.step <= b.anchor || ref.budget <= 0 {
		return nil
	}
	r.s.mu.Lock()
	c := r.s.committed
	r.s.mu.Unlock()
	p := &sharePace{base: ref.step, budget: ref.budget, total: int64(len(ref.buf)), steps: steps,
		committed: max(c, ref.step), at: time.Now(), wake: make(chan struct{})}
	if b.lastStep == p.committed && !b.lastAt.IsZero() {
		p.at, p.period = b.lastAt, b.stepTime
	}
	return p
}

// pacedCommitLocked records that the rank committed step (diff mode
// under EC): the time of its step, and the allowance of the current
// base's sends (refPaceLocked) and of the share send in flight, if
// paced. r.mu is held.
func (r *replicator) pacedCommitLocked(step int64) {
	b := &r.ecb
	now := time.Now()
	if !b.lastAt.IsZero() && step == b.lastStep+1 {
		b.stepTime = now.Sub(b.lastAt)
	}
	b.lastStep, b.lastAt = step, now
	if r.ref != nil && r.ref.pace != nil {
		r.ref.pace.commit(step, now, b.stepTime)
	}
	if sr := b.shares; sr != nil && sr.pace != nil && (r.ref == nil || sr.pace != r.ref.pace) {
		sr.pace.commit(step, now, b.stepTime)
	}
}

// commit moves the pacing to step, committed at now after a step of
// period (0: not known).
func (p *sharePace) commit(step int64, now time.Time, period time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if step > p.committed {
		p.committed = step
	}
	p.at, p.period = now, period
	close(p.wake)
	p.wake = make(chan struct{})
}

// lift allows every byte from now on (the base is the schedule's anchor
// now: G waits for it).
func (p *sharePace) lift() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lifted = true
	close(p.wake)
	p.wake = make(chan struct{})
}

// allowedLocked returns the shard's bytes that may be encoded at now,
// and how long until a pause in the commits adds a step (0: every byte
// is allowed). p.mu is held.
func (p *sharePace) allowedLocked(now time.Time) (int64, time.Duration) {
	n := p.committed - p.base + 1
	if p.lifted {
		n = p.steps
	}
	idle := max(2*p.period, paceIdleMin)
	next := idle
	if !p.at.IsZero() {
		since := now.Sub(p.at)
		n += int64(since / idle)
		next = idle - since%idle
	}
	if n >= p.steps {
		return p.total, 0
	}
	return min(p.total, p.budget*max(n, 0)), next
}

// wait waits until the shard's bytes up to end may be encoded, or ctx
// ends (its error).
func (p *sharePace) wait(ctx context.Context, end int64) error {
	began := time.Now()
	defer func() {
		p.mu.Lock()
		p.waited += time.Since(began)
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		allowed, next := p.allowedLocked(time.Now())
		wake := p.wake
		if end <= allowed {
			p.waitEnd = 0
			p.mu.Unlock()
			return nil
		}
		p.waitEnd = end
		p.mu.Unlock()
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			p.mu.Lock()
			p.waitEnd = 0
			p.mu.Unlock()
			return context.Cause(ctx)
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// waiting returns the end of the chunk the encoder waits for, or 0.
func (p *sharePace) waiting() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitEnd
}
