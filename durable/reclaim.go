package durable

import (
	"errors"
	"fmt"
	"os"
	"slices"
)

// Freeing a rank's base files, markers and batches: Reclaim after a
// commit, Abandon of the steps resolved without one, Truncate to a step
// resumed or restored at.

// Reclaim frees what a recovery at committed, the step of the commit
// record, cannot need (see Reclaiming in the package comment) and
// returns the number of base files it freed. It frees nothing and
// returns an error wrapping ErrNoVersion when the rank holds no complete
// version of committed.
func (s *Store) Reclaim(committed int64) (int, error) {
	s.repair()
	if err := s.at("reclaim.lock", 0); err != nil {
		return 0, err
	}
	// Under rmu: no publish looks at the watermark before it moves and
	// writes its marker after the markers are removed.
	s.rmu.Lock()
	s.dropPending(func(p pointer) bool { return p.step < committed })
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.rmu.Unlock()
		return 0, ErrClosed
	}
	s.watermark = max(s.watermark, committed)
	if !slices.ContainsFunc(s.files, func(bf *baseFile) bool { return bf.state == fsComplete && bf.step == committed }) {
		s.mu.Unlock()
		s.rmu.Unlock()
		return 0, fmt.Errorf("%w: rank %d: reclaiming before step %d, which it does not hold: nothing freed", ErrNoVersion, s.rank, committed)
	}
	s.mu.Unlock()
	// Markers first: a marker never outlives its version.
	err := s.removeMarkers(func(step int64) bool { return step < committed })
	s.rmu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := s.removeBatches(func(a, b int64) bool { return b <= committed }); err != nil {
		return 0, err
	}
	s.pmu.Lock()
	ptrFile := -1
	if s.hasPtr {
		ptrFile = s.ptr.file
	}
	s.pmu.Unlock()
	return s.free(func(bf *baseFile) bool {
		return (bf.state == fsComplete && bf.step < committed && bf.idx != ptrFile) || bf.state == fsBroken
	})
}

// Abandon frees what can never be committed once the launcher resolved
// every step up to resolved, committed being its commit record's step
// (-1: none yet): every complete version of a step at or before
// resolved other than committed, with its marker (see Abandoning in the
// package comment). A version of such a step that completes later is
// freed at once, unmarked. The pointer, if it names a version freed,
// first moves back to the newest complete version left (by counter), or
// is removed. Abandon returns the number of base files it freed;
// resolved < 0 frees nothing.
func (s *Store) Abandon(committed, resolved int64) (int, error) {
	if resolved < 0 {
		return 0, nil
	}
	s.repair()
	if err := s.at("abandon.lock", 0); err != nil {
		return 0, err
	}
	gone := func(step int64) bool { return step <= resolved && step != committed }
	// Under rmu, as Reclaim: no publish looks before the step is given
	// up and writes its marker after the markers are removed.
	s.rmu.Lock()
	s.dropPending(func(p pointer) bool { return gone(p.step) })
	s.pmu.Lock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.pmu.Unlock()
		s.rmu.Unlock()
		return 0, ErrClosed
	}
	if resolved >= s.resolved {
		s.resolved, s.kept = resolved, max(s.kept, committed)
	}
	var todo []*baseFile
	var newest *baseFile // the newest complete version left
	for _, bf := range s.files {
		switch {
		case bf.state != fsComplete:
		case gone(bf.step):
			bf.state = fsFreeing
			todo = append(todo, bf)
		case newest == nil || bf.version > newest.version:
			newest = bf
		}
	}
	s.mu.Unlock()
	// The pointer first: it never names a freed file.
	var perr error
	if s.hasPtr && slices.ContainsFunc(todo, func(bf *baseFile) bool { return bf.idx == s.ptr.file }) {
		var p pointer
		if newest != nil {
			p = pointer{rank: s.rank, file: newest.idx, step: newest.step, version: newest.version, hdrCRC: newest.hdrCRC}
			perr = writeAtomic(s.dir, latestName, [][]byte{encodePointer(magicPointer, p)}, s.fault("latest"))
		} else {
			perr = removeSynced(s.dir, latestName)
		}
		if perr == nil {
			s.ptr, s.hasPtr = p, newest != nil
		} else {
			// The file the pointer names stays as it is, and its step's
			// markers with it; the next Abandon tries again.
			s.mu.Lock()
			todo = slices.DeleteFunc(todo, func(bf *baseFile) bool {
				if bf.idx == s.ptr.file {
					bf.state = fsComplete
					return true
				}
				return false
			})
			s.mu.Unlock()
		}
	}
	kept := int64(-1)
	if perr != nil {
		kept = s.ptr.step
	}
	s.pmu.Unlock()
	// Then the markers: a marker never outlives its version.
	merr := s.removeMarkers(func(step int64) bool { return gone(step) && step != kept })
	s.rmu.Unlock()
	if merr != nil {
		// The files stay complete, as their markers may.
		s.mu.Lock()
		for _, bf := range todo {
			bf.state = fsComplete
		}
		s.mu.Unlock()
		return 0, errors.Join(perr, merr)
	}
	freed, ferr := s.free(func(bf *baseFile) bool { return slices.Contains(todo, bf) })
	return freed, errors.Join(perr, ferr)
}

// free rewrites as free the headers of the files that pick chooses
// (under mu) and returns how many it freed.
func (s *Store) free(pick func(*baseFile) bool) (int, error) {
	s.mu.Lock()
	var todo []*baseFile
	for _, bf := range s.files {
		if pick(bf) {
			bf.state = fsFreeing
			todo = append(todo, bf)
		}
	}
	s.mu.Unlock()
	var errs []error
	freed := 0
	for _, bf := range todo {
		err := s.writeFree(bf)
		s.mu.Lock()
		if err == nil {
			bf.state, bf.step, bf.version, bf.hdrCRC = fsFree, 0, 0, 0
			freed++
		} else {
			bf.state = fsBroken
			errs = append(errs, err)
		}
		s.mu.Unlock()
	}
	return freed, errors.Join(errs...)
}

// removeMarkers removes the rank's markers of the steps drop chooses.
func (s *Store) removeMarkers(drop func(step int64) bool) error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	var names []string
	for _, e := range ents {
		if step, ok := parseDone(e.Name()); ok && drop(step) {
			names = append(names, e.Name())
		}
	}
	return removeSynced(s.dir, names...)
}

// removeBatches removes the rank's batches that drop chooses.
func (s *Store) removeBatches(drop func(a, b int64) bool) error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	var names []string
	for _, e := range ents {
		if a, b, ok := parseDiff(e.Name()); ok && drop(a, b) {
			names = append(names, e.Name())
		}
	}
	return removeSynced(s.dir, names...)
}

// Truncate forgets everything the rank wrote after step (see Resuming
// and restoring in the package comment): for a job resumed, or a rank
// restored, at step. It fails if a Save is in flight.
func (s *Store) Truncate(step int64) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.inflight > 0:
		s.mu.Unlock()
		return fmt.Errorf("durable: rank %d: truncating after step %d with %d saves in flight", s.rank, step, s.inflight)
	}
	// The pointer first: it must never name a freed file.
	var newest *baseFile
	for _, bf := range s.files {
		if bf.state == fsComplete && bf.step <= step && (newest == nil || bf.version > newest.version) {
			newest = bf
		}
	}
	var p pointer
	if newest != nil {
		p = pointer{rank: s.rank, file: newest.idx, step: newest.step, version: newest.version, hdrCRC: newest.hdrCRC}
	}
	s.mu.Unlock()
	s.dropPending(func(p pointer) bool { return p.step > step })
	s.pmu.Lock()
	if !s.hasPtr || s.ptr.step > step {
		var err error
		if newest != nil {
			err = writeAtomic(s.dir, latestName, [][]byte{encodePointer(magicPointer, p)}, s.fault("latest"))
		} else {
			err = removeSynced(s.dir, latestName)
		}
		if err != nil {
			s.pmu.Unlock()
			return err
		}
		s.ptr, s.hasPtr = p, newest != nil
	}
	s.pmu.Unlock()
	if err := s.removeMarkers(func(st int64) bool { return st > step }); err != nil {
		return err
	}
	if err := trimBatches(s.root, s.rank, step); err != nil {
		return err
	}
	_, err := s.free(func(bf *baseFile) bool {
		return (bf.state == fsComplete && bf.step > step) || bf.state == fsBroken
	})
	return err
}
