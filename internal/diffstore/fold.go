package diffstore

import (
	"fmt"
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
	s.mu.Lock()
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
	s.mu.Unlock()
	if len(es) == 0 {
		return nil
	}
	if s.testFoldHook != nil {
		s.testFoldHook()
	}
	start := time.Now()
	st, ok := s.state(b.data[s.optIdx])
	if !ok {
		panic("diffstore: a base's optimizer region is not aligned") // alloc makes it so
	}
	if err := replayLog(st, es, opt); err != nil {
		return fmt.Errorf("diffstore: fold of steps %d to %d: %w", es[0].step, es[len(es)-1].step, err)
	}
	elapsed := time.Since(start)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Folds++
	s.stats.FoldedSteps += int64(len(es))
	s.stats.FoldTime += elapsed
	if s.base != b {
		return nil // a refresh committed meanwhile: its base is later
	}
	last := es[len(es)-1]
	b.step = last.step
	b.t = last.hyper.T
	for i, o := range last.other {
		if o != nil {
			b.data[i] = o
		}
	}
	for _, e := range es {
		b.exact = b.exact && !e.lossy()
	}
	i := 0
	for i < len(s.log) && s.log[i].step <= last.step {
		i++
	}
	clear(s.log[:i])
	s.log = s.log[i:]
	return nil
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
