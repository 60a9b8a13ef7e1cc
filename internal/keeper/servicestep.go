package keeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// stage applies the overwrite rule, then marks the slot to write.
func (s *service) stage(ctx context.Context, ss *Session, step int64) *protect.Staged {
	gen := ss.gen
	// A placement that replaced the session's (since its ProtectHello or
	// its last Restore) ends the wait at once: the rank restores in place.
	replaced := ss.placed.replaced
	s.mu.Lock()
	if s.corrupt != nil {
		err := s.corrupt
		s.mu.Unlock()
		return &protect.Staged{Step: step, Err: err.Error()}
	}
	if step <= s.committed {
		s.mu.Unlock()
		return &protect.Staged{Step: step, Err: fmt.Sprintf("step %d does not follow the committed step %d", step, s.committed)}
	}
	// The slot Stage will overwrite is the one not holding the newest
	// committed step; if it holds an older committed step, that one may
	// go only once the newest is recoverable everywhere.
	mustWait := s.slotStep[0] >= 0 && s.slotStep[1] >= 0
	newest, failed := s.committed, s.failed
	s.mu.Unlock()
	start := time.Now()
	if mustWait {
		if err := s.h.waitG(ctx, s.rank, gen, newest, replaced, failed, s.failure); err != nil {
			if _, ok := errors.AsType[*CorruptError](err); ok {
				return &protect.Staged{Step: step, Err: err.Error()}
			}
			return &protect.Staged{Step: step, Err: fmt.Sprintf("waiting for step %d to be recoverable everywhere: %v", newest, err),
				NewPlacement: errors.Is(err, errNewPlacement)}
		}
	}
	wait := time.Since(start)
	// A durable save may still be reading the slot to overwrite.
	if _, err := s.waitHold(ctx); err != nil {
		return &protect.Staged{Step: step, Err: fmt.Sprintf("waiting for the durable tier to read the slot: %v", err)}
	}
	if err := ss.live(); err != nil {
		return &protect.Staged{Step: step, Err: err.Error()}
	}
	s.reqMu.Lock()
	defer s.reqMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slots == nil {
		return &protect.Staged{Step: step, Err: ErrStopping.Error()}
	}
	if s.h.Gen() != gen || ss.id != s.session || step <= s.committed || mustWait && s.committed != newest || s.heldLocked() != nil {
		return &protect.Staged{Step: step, Err: "the rank's state changed while this stage waited (a restart, or another session)"}
	}
	st, err := s.slots.Stage(uint64(step))
	if err != nil {
		return &protect.Staged{Step: step, Err: err.Error()}
	}
	s.staged = st
	slot := st.Slot()
	if s.slotStep[slot] >= 0 {
		s.slotStep[slot] = noStep
	}
	s.views[slot] = st.Views()
	s.stages.Add(1)
	s.waitNS.Add(int64(wait))
	return &protect.Staged{Step: step, Slot: slot, WaitNS: int64(wait), Deposits: s.depositPlan()}
}

// commit checksums and commits the staged step, then hands it to the
// replicator.
func (s *service) commit(ss *Session, step int64) *protect.Committed {
	gen := ss.gen
	s.mu.Lock()
	if ss.id != s.session {
		s.mu.Unlock()
		return &protect.Committed{Step: step, Err: errSuperseded.Error()}
	}
	st := s.staged
	if st == nil || int64(st.Step()) != step {
		s.mu.Unlock()
		return &protect.Committed{Step: step, Err: fmt.Sprintf("step %d is not the step staged", step)}
	}
	var grad gradRec
	diff := s.h.diffMode()
	if diff {
		i := slices.IndexFunc(s.grads, func(g gradRec) bool { return g.step == step })
		if i < 0 {
			s.mu.Unlock()
			return &protect.Committed{Step: step, Err: fmt.Sprintf("--protect-mode diff: commit of step %d without its Gradient (the rank hands the gradient and hyper-parameters of every step before it commits it)", step)}
		}
		grad = s.grads[i]
	}
	red := s.reduced()
	var plan depPlan
	if diff && red != nil {
		plan = s.planOf(grad.dep)
	}
	s.staged = nil
	s.mu.Unlock()
	// The CRCs of a large state take a while: outside s.mu, so that
	// Status and the replicator are not held up (reqMu keeps requests
	// serial). In diff mode the gradient is encoded meanwhile: the rank
	// does not write its half (step's parity) before Committed.
	var rec []byte
	var encErr error
	var ref *diffRefInfo
	var locals map[int]localRec
	var wg sync.WaitGroup
	if diff {
		wg.Go(func() {
			rec, encErr = s.encodeGradient(grad)
			if red != nil && encErr == nil {
				ref = &diffRefInfo{red: *red, n: grad.n, sum: crc32c.Checksum(s.grad[step%2][:4*grad.n])}
			}
		})
		if len(plan.owners) > 0 {
			wg.Go(func() { locals = s.encodeDeposits(step, plan) })
		}
	}
	err := st.Commit()
	wg.Wait()
	if err != nil {
		s.recs.put(rec)
		return &protect.Committed{Step: step, Err: err.Error()}
	}
	if encErr != nil {
		// The slot is committed but its step can never be replicated:
		// the rank must not go on with it.
		s.recs.put(rec)
		return &protect.Committed{Step: step, Err: fmt.Sprintf("encoding the gradient of step %d: %v", step, encErr)}
	}
	s.mu.Lock()
	if s.h.Gen() != gen {
		// A restart truncated the slots meanwhile (and failed or undid
		// this commit there).
		s.mu.Unlock()
		s.recs.put(rec)
		return &protect.Committed{Step: step, Err: errRestarted.Error()}
	}
	slot := st.Slot()
	s.slotStep[slot] = step
	s.sums[slot] = st.Sums()
	s.slotEpoch[slot] = ss.placed.epoch
	s.slotT[slot] = grad.hyper.T
	s.committed = step
	var od *ownerDiff
	if diff {
		s.grads = slices.DeleteFunc(s.grads, func(g gradRec) bool { return g.step <= step })
		od = s.ownerDiff(grad, rec, slot)
		od.ref = ref
		s.logDiff(od)
	}
	base := s.persistDueLocked(step, slot)
	s.mu.Unlock()
	if base != nil {
		go s.runSave(base) // persist.wg: waited for by truncate and close
	}
	if diff && red != nil {
		// The holders here waiting for this step's deposits take them
		// now, or learn that they will not come.
		s.h.local.committed(s.rank, step, gen, plan.ver, locals)
	}
	// A restart may have begun since the check above (and truncated the
	// step): the hand-off checks the generation again under the lock
	// truncateDiffs takes, so that no step of an older generation is
	// queued, or sent labelled with the new one, after the truncation.
	// The replicator takes over od's reference.
	if testHookHandOff != nil {
		testHookHandOff(s.rank, step)
	}
	s.rep.committed(gen, od, step)
	s.h.cfg.Changed()
	return &protect.Committed{Step: step}
}

// testHookHandOff, if set (by tests), runs in a Commit after the
// generation was checked and before the step is handed to the replicator:
// where a restart may begin.
var testHookHandOff func(rank int, step int64)

// gradRec is a Gradient request, kept for its step's Commit.
type gradRec struct {
	step  int64
	n     int64
	hyper replay.Hyper // diff mode
	dep   uint64       // the deposit plan version the rank followed (localpeer.go)
}

// gradient records the rank's Gradient of step: n elements in the
// buffer's half step mod 2, applied with hyper. It checks the request and
// answers at once; the elements are read (encoded) by step's Commit. In
// diff mode hyper is required, valid, and follows the previous step's
// optimizer step count, and n is the optimizer's N.
func (s *service) gradient(step, n int64, h *protect.Hyper, dep uint64) *protect.GradientDone {
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(format string, args ...any) *protect.GradientDone {
		return &protect.GradientDone{Step: step, Err: fmt.Sprintf(format, args...)}
	}
	if n*4 > s.gradSize() {
		return fail("%d elements exceed the gradient buffer of %d", n, s.gradSize()/4)
	}
	if step <= s.lastGrad {
		return fail("the gradient of step %d does not follow that of step %d", step, s.lastGrad)
	}
	rec := gradRec{step: step, n: n, dep: dep}
	if len(s.grads) >= 2 {
		// Two Gradients not yet committed hold both halves of the buffer:
		// a third would overwrite the half its step's Commit reads.
		return fail("the gradient of step %d: the gradients of steps %d and %d are not committed yet (each half of the gradient buffer is read at its step's Commit)", step, s.grads[0].step, s.grads[1].step)
	}
	if s.h.diffMode() {
		switch {
		case step <= s.committed:
			return fail("the gradient of step %d comes after the step was committed (%d)", step, s.committed)
		case s.opt == nil:
			return fail("%s", errNoOptimizer)
		case h == nil:
			return fail("--protect-mode diff: the gradient of step %d without its hyper-parameters", step)
		case n != s.opt.N:
			return fail("--protect-mode diff: a gradient of %d elements for an optimizer of %d", n, s.opt.N)
		}
		rec.hyper = h.Replay()
		if err := rec.hyper.Validate(); err != nil {
			return fail("the gradient of step %d: %v", step, err)
		}
		if s.lastT != 0 && rec.hyper.T != s.lastT+1 {
			return fail("the gradient of step %d is optimizer step %d, after optimizer step %d", step, rec.hyper.T, s.lastT)
		}
		s.lastT = rec.hyper.T
	}
	s.lastGrad = step
	s.grads = append(s.grads, rec)
	return &protect.GradientDone{Step: step, Bytes: n * 4}
}

// encodeGradient encodes g's elements, in the gradient buffer's half of
// g's step, as a replay record with the job's codec, into a buffer from
// s.recs (a new one if it has none large enough): the caller owns the
// buffer (the record's capacity), and gives it back to s.recs, or to the
// ownerDiff that shares it. It runs under reqMu (Commit), the only user
// of s.enc.
func (s *service) encodeGradient(g gradRec) ([]byte, error) {
	half := s.grad[g.step%2]
	if g.n*4 > int64(len(half)) {
		return nil, fmt.Errorf("%d elements exceed the gradient buffer", g.n)
	}
	var x []float32
	if g.n > 0 {
		x = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(half))), g.n)
	}
	return s.enc.AppendRecord(s.recs.get(0), uint64(g.step), 0, x, s.h.cfg.Diff.codec())
}

// ownerDiff builds the differential of step g.step, just committed in
// slot: the encoded record, the hyper-parameters, the bytes of the
// replicated regions other than the optimizer's (copied: the slot is
// staged over later), sealed, with every replicated region's committed
// CRC32C. It takes over rec's buffer (from encodeGradient), and returns
// the differential with one reference, the caller's. s.mu is held.
func (s *service) ownerDiff(g gradRec, rec []byte, slot int) *ownerDiff {
	od := &ownerDiff{step: g.step, opt: -1}
	od.rec.own(&s.recs, rec)
	d := diffstore.Diff{Step: g.step, Hyper: g.hyper, Record: rec, Other: map[string][]byte{}}
	for _, i := range s.repl {
		r := s.regions[i]
		if r.Name == s.opt.Region {
			od.opt = len(od.table)
		} else {
			d.Other[r.Name] = slices.Clone(s.views[slot][i])
		}
		od.table = append(od.table, tableEntry{name: r.Name, size: r.Size, sum: s.sums[slot][i]})
	}
	d.Seal()
	od.d = d
	od.bytes = int64(diffDescSize + len(rec))
	for _, b := range d.Other {
		od.bytes += int64(len(b))
	}
	return od
}

// addReplBytes counts bytes of bases and differentials sent: the total
// first, then its parts (progress reads them in the other order).
func (s *service) addReplBytes(base, diff int64) {
	s.replBytes.Add(base + diff)
	s.replBaseBytes.Add(base)
	s.replDiffBytes.Add(diff)
}

func (s *service) status() *protect.Status {
	p := s.progress(s.h.place())
	return &protect.Status{
		Committed: p.Committed, Replicated: p.Replicated, G: s.h.G(),
		Stages: p.Stages, WaitNS: p.WaitNS, Holders: slices.Clone(s.h.holders(s.rank)),
	}
}

// fail records that the rank's committed state is corrupt (found by its
// replicator in generation gen), refuses its stages from now on, and has
// the caller fail the rank. A failure of an older generation than the
// host's is dropped: the restart that began since discarded the step.
func (s *service) fail(gen uint64, err error) {
	s.mu.Lock()
	if s.h.Gen() != gen || s.corrupt != nil {
		s.mu.Unlock()
		return
	}
	s.corrupt = err
	close(s.failed)
	s.mu.Unlock()
	msg := "a rank's protected state changed in memory after its commit: failing the rank"
	if ce, ok := errors.AsType[*CorruptError](err); ok && ce.Replay {
		msg = "a replica holder's replay of a rank's differentials differs from its commit (its optimizer step is not replay's): failing the rank"
	} else if errors.Is(err, errNoRoom) {
		msg = "a base's snapshot does not fit in the host's replica-memory reserve, and H cannot pass the base without it: failing the rank"
	}
	s.h.log.Error(msg, "rank", s.rank, "generation", gen, "err", err)
	s.h.cfg.Failed(s.rank, gen, err)
}

// failure returns why the rank failed, or nil.
func (s *service) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.corrupt == nil {
		return nil
	}
	return s.corrupt
}

// verifySlot checks every region of committed slot slot, which holds step,
// against the CRC32Cs taken at its commit (kept here, out of the rank's
// reach). It returns a *CorruptError for the first region that differs.
// The caller makes sure the slot is not staged over meanwhile.
func (s *service) verifySlot(slot int, step int64) *CorruptError {
	s.mu.Lock()
	views, sums, regions := s.views[slot], s.sums[slot], s.regions
	held := s.slotStep[slot] == step
	s.mu.Unlock()
	if !held {
		return nil // truncated by a restart meanwhile: nothing to verify
	}
	for i, v := range views {
		if got := crc32c.Checksum(v); got != sums[i] {
			return &CorruptError{Rank: s.rank, Step: step, Region: regions[i].Name, Sum: sums[i], Got: got}
		}
	}
	return nil
}
