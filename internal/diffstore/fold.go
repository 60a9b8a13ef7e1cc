package diffstore

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// Fold folds the differentials up to step upTo (or up to the last one held,
// or G (SetG), if that is earlier) into the base with the fused replay (replay.Fused):
// the base then stands at that step, and the store restores no earlier
// one. It is an optimization: Restore gives the same bytes for every step
// still in range. Fold folds what it can and returns nil when there is
// nothing to fold (no base, no differential up to upTo).
//
// While a base refresh at step b is in progress, Fold passes b only if
// what it folds is exact (the base and every differential up to its end
// lossless, see Exact): the folded base is then the owner's state bit for
// bit, the refresh only a check of it, and the log stays as short as the
// caller's folds keep it whatever the refresh's pace. The refresh, when it
// commits, finds the base past b: it is verified and dropped, and Stats
// counts it (RefreshesSuperseded). A lossy fold goes no further than b, so
// that the refresh, once it commits, replaces the drifting base rather
// than arriving behind it. (A refresh begun while a Fold is replaying, at
// a step before the fold's end, can find the base past it in either case.)
//
// Fold replays outside the store's lock: Append, Range, BeginBase and the
// refresh's Write and Commit go on meanwhile. A refresh committed during a
// fold wins: the fold's work is dropped. Restore and Truncate wait for
// the fold, and Fold for them.
func (s *Store) Fold(upTo int64, opt replay.ReplayOptions) error {
	s.foldMu.Lock()
	defer s.foldMu.Unlock()
	b, es := s.beginFold(upTo, opt)
	if len(es) == 0 {
		return nil
	}
	start := time.Now()
	st, ok := s.state(b.data[s.optIdx])
	if !ok {
		panic("diffstore: a base's optimizer region is not aligned") // alloc makes it so
	}
	if err := replayLog(st, es, opt); err != nil {
		return fmt.Errorf("diffstore: fold of steps %d to %d: %w", es[0].step, es[len(es)-1].step, err)
	}
	s.foldDone(b, es, nil, time.Since(start))
	return nil
}

// ErrFoldRefused is wrapped by FoldChecked's error when its check refused
// the folded state (the check's own error is wrapped too).
var ErrFoldRefused = errors.New("diffstore: folded state refused by the check")

// FoldChecked is Fold with a check of the folded state before it becomes
// the base: it replays the differentials Fold would fold (the same steps,
// under the same rules: G, a refresh in progress, see Fold) into a spare
// buffer, a copy of the base's optimizer region, and calls check with the
// step the fold ends at and the owner's state at that step, one slice per
// region in the order given to New (the bytes Restore would give; check
// must not change or keep them). If check returns nil, the folded state
// becomes the base, as after Fold, and the old base's optimizer buffer
// becomes the next fold's spare: each step is replayed once, where a check
// by Restore then a Fold would replay it twice. If check returns an
// error, the base and the log stay as they were (every step in range
// still restores) and FoldChecked returns an error wrapping both
// ErrFoldRefused and check's error.
//
// It holds foldMu for writing like Fold: Restore and Truncate wait for
// it, the receive path does not, and a refresh committed meanwhile wins
// (the folded state, checked or not, is dropped). check runs on the
// caller's goroutine with the store's foldMu held: it must not call
// Fold, FoldChecked, Restore, RestorePieces or Truncate on this store.
func (s *Store) FoldChecked(upTo int64, opt replay.ReplayOptions, check func(step int64, regions [][]byte) error) error {
	s.foldMu.Lock()
	defer s.foldMu.Unlock()
	b, es := s.beginFold(upTo, opt)
	if len(es) == 0 {
		return nil
	}
	start := time.Now()
	s.mu.Lock()
	spare := s.takeLocked(s.optIdx)
	s.mu.Unlock()
	if spare == nil {
		spare = alloc(s.regions[s.optIdx].Size)
	}
	// b.data changes only under foldMu, which this fold holds.
	copy(spare, b.data[s.optIdx])
	st, _ := s.state(spare)
	if err := replayLog(st, es, opt); err != nil {
		s.give(s.optIdx, spare)
		return fmt.Errorf("diffstore: fold of steps %d to %d: %w", es[0].step, es[len(es)-1].step, err)
	}
	elapsed := time.Since(start)
	last := es[len(es)-1]
	regions := slices.Clone(b.data)
	for i, o := range last.other {
		if o != nil {
			regions[i] = o
		}
	}
	regions[s.optIdx] = spare
	if err := check(last.step, regions); err != nil {
		s.mu.Lock()
		s.stats.FoldsRejected++
		s.giveLocked(s.optIdx, spare)
		s.mu.Unlock()
		return fmt.Errorf("%w: fold of steps %d to %d: %w", ErrFoldRefused, es[0].step, last.step, err)
	}
	s.foldDone(b, es, spare, elapsed)
	return nil
}

// beginFold starts a fold up to upTo (foldMu write-held): it first
// measures a drift a refresh left to measure (measureDrift), then
// returns the base and the differentials to fold (foldPlan), running the
// tests' hook if there are any.
func (s *Store) beginFold(upTo int64, opt replay.ReplayOptions) (*base, []*entry) {
	s.measureDrift(opt)
	b, es := s.foldPlan(upTo)
	if len(es) > 0 && s.testFoldHook != nil {
		s.testFoldHook()
	}
	return b, es
}

// foldPlan returns the base and the differentials a fold up to upTo
// folds (see Fold), and moves a replaced base's buffers to free. foldMu
// is write-held.
func (s *Store) foldPlan(upTo int64) (*base, []*entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reclaimLocked()
	b := s.base
	upTo = min(upTo, s.g)
	var es []*entry
	if b != nil {
		exact := b.exact
		for _, e := range s.log {
			if e.step > upTo {
				break
			}
			es = append(es, e)
			exact = exact && !e.lossy()
		}
		if p := s.pending; p != nil && !exact {
			// Leave the refresh a base to replace: it resets the drift.
			k := len(es)
			for k > 0 && es[k-1].step > p.step {
				k--
			}
			es = es[:k]
		}
	}
	return b, es
}

// foldDone makes base b, with es replayed onto it (in place, or into opt
// if not nil: the base's optimizer region then), the store's base at es's
// last step, drops es from the log, and hands their records to recycle;
// if a refresh committed meanwhile (b is no longer the base), the fold's
// work is dropped. foldMu is write-held.
func (s *Store) foldDone(b *base, es []*entry, opt []byte, elapsed time.Duration) {
	s.mu.Lock()
	s.stats.Folds++
	s.stats.FoldedSteps += int64(len(es))
	s.stats.FoldTime += elapsed
	if s.base != b {
		// A refresh committed meanwhile: its base is later, and it
		// dropped from the log what it passed (those records go to the
		// garbage collector: rare, and not worth the bookkeeping).
		s.giveLocked(s.optIdx, opt)
		if opt == nil {
			s.driftFoldedLocked(b, es[len(es)-1].step)
		}
		s.mu.Unlock()
		return
	}
	last := es[len(es)-1]
	b.step = last.step
	b.t = last.hyper.T
	for i, o := range last.other {
		if o != nil {
			b.data[i] = o
		}
	}
	if opt != nil {
		// No Restore is in progress (foldMu): the old bytes are free.
		s.giveLocked(s.optIdx, b.data[s.optIdx])
		b.data[s.optIdx] = opt
	}
	for _, e := range es {
		b.exact = b.exact && !e.lossy()
	}
	if b.exact {
		b.exactAt = b.step
	}
	i := 0
	for i < len(s.log) && s.log[i].step <= last.step {
		i++
	}
	dropped := slices.Clone(s.log[:i])
	clear(s.log[:i])
	s.log = s.log[i:]
	recycle := s.recycle
	s.mu.Unlock()
	recycleAll(recycle, dropped)
}

// give is giveLocked, taking mu.
func (s *Store) give(i int, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.giveLocked(i, b)
}

// Restore writes the owner's state at step into dst, one slice per
// region, by name, each of the region's size (ErrMismatch otherwise): a
// copy of the base, then a fused replay of the log up to step onto the
// optimizer's W, M and V. It does not change the store. A step outside the
// range fails with ErrNotHeld. It waits for a Fold in progress.
func (s *Store) Restore(step int64, dst map[string][]byte, opt replay.ReplayOptions) error {
	if len(dst) != len(s.regions) {
		return wrapf(ErrMismatch, "restore into %d regions, the owner has %d", len(dst), len(s.regions))
	}
	for _, r := range s.regions {
		d, ok := dst[r.Name]
		if !ok || int64(len(d)) != r.Size {
			return wrapf(ErrMismatch, "restore: region %q needs %d bytes, got %d", r.Name, r.Size, len(d))
		}
	}
	s.foldMu.RLock()
	defer s.foldMu.RUnlock()
	src, es, err := s.view(step)
	if err != nil {
		return err
	}
	for i, r := range s.regions {
		if i != s.optIdx {
			copy(dst[r.Name], src[i])
		}
	}
	d := dst[s.regions[s.optIdx].Name]
	if len(es) == 0 {
		copy(d, src[s.optIdx])
		return nil
	}
	work := d
	st, ok := s.state(d)
	if !ok { // dst is not aligned for float32: replay in an aligned copy
		work = alloc(int64(len(d)))
		st, _ = s.state(work)
	}
	copy(work, src[s.optIdx])
	if err := replayLog(st, es, opt); err != nil {
		return fmt.Errorf("diffstore: restore of step %d: %w", step, err)
	}
	if !ok {
		copy(d, work)
	}
	return nil
}

// view returns what the owner's state at step is made of: each region's
// bytes (the optimizer's and, without a differential up to step, all of
// them the base's; the other regions those of the last differential up to
// step) and the differentials to replay onto the base's optimizer region.
// ErrNotHeld if step is outside the range. foldMu must be read-held while
// the bytes are read: the base's change only in Fold, which it holds off;
// the entries never change.
func (s *Store) view(step int64) ([][]byte, []*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, last, ok := s.rangeLocked()
	if !ok {
		return nil, nil, wrapf(ErrNotHeld, "restore of step %d: no base", step)
	}
	if step < first || step > last {
		return nil, nil, wrapf(ErrNotHeld, "restore of step %d: the store holds steps %d to %d", step, first, last)
	}
	src := append([][]byte(nil), s.base.data...)
	var es []*entry
	for _, e := range s.log {
		if e.step > step {
			break
		}
		es = append(es, e)
	}
	if len(es) > 0 {
		for i, o := range es[len(es)-1].other {
			if o != nil {
				src[i] = o
			}
		}
	}
	return src, es, nil
}

// replayLog applies es, in order, to st.
func replayLog(st replay.State, es []*entry, opt replay.ReplayOptions) error {
	diffs := make([]*replay.Tensor, len(es))
	hypers := make([]replay.Hyper, len(es))
	for i, e := range es {
		diffs[i], hypers[i] = e.tensor, e.hyper
	}
	return replay.Fused(st, diffs, hypers, opt)
}

// state views the optimizer's W, M and V in region bytes b, which must be
// 4-byte aligned (false if not).
func (s *Store) state(b []byte) (replay.State, bool) {
	n := s.opt.N
	view := func(off int64) []float32 {
		if n == 0 {
			return []float32{}
		}
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[off])), n)
	}
	if n > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return replay.State{}, false
	}
	return replay.State{W: view(s.opt.WOff), M: view(s.opt.MOff), V: view(s.opt.VOff)}, true
}
