package keeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"
)

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
		// Only the base (diff mode under EC): as much as its pacing
		// allows, whole when unpaced (planClearLocked).
		if a.ref != nil {
			r.sendChunks(ctx, hdr, a.k, a.ref, a.prog, a.limit, &res)
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
		r.sendChunks(ctx, hdr, a.k, a.ref, a.prog, a.limit, &res)
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

// sendChunks sends holder k the next chunks of refresh ref, limit bytes
// at most (the plan's: a per-step budget, or what the base's pacing
// allows, planClearLocked), and its commit once every byte went, into
// res: the bytes sent (baseB) and the failure (err), which the round
// backs off after (a link's failure is the caller's to report). Failures
// leave prog where it was: the refresh goes on in a later round.
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
func (r *replicator) sendChunks(ctx context.Context, hdr linkHdr, k holderKey, ref *refresh, prog *refProg, limit int64, res *diffRes) {
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
	budget := limit
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
