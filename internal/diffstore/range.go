package diffstore

import (
	"slices"
)

// The steps a store restores (Range, Held, Exact), the step the job may
// restart from (SetG), and the log cut back to a step (Truncate).

// Held reports whether the store can restore step now (it is in Range).
// A holder acknowledges step s to the owner (counts it replicated) only
// when Held(s): Append's nil means the differential was taken, not that
// its step is restorable (it may wait for a refresh to commit).
func (s *Store) Held(step int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, last, ok := s.rangeLocked()
	return ok && first <= step && step <= last
}

// SetG sets G, the step the job may restart from: Fold goes no further
// than G, and a refresh verified by Commit at a step past G waits, still
// in progress (the old base and log stay), until SetG reaches its step;
// SetG then installs it. Until SetG is first called, G is unbounded. It
// never waits for a Fold.
func (s *Store) SetG(g int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.g = g
	if p := s.pending; p != nil && p.verified && p.step <= g {
		s.installLocked(p)
	}
}

// Range returns the steps the store can restore, [first, last], and false
// if it can restore none (it has no base yet, or a Truncate dropped it).
func (s *Store) Range() (first, last int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rangeLocked()
}

func (s *Store) rangeLocked() (first, last int64, ok bool) {
	if s.base == nil {
		return 0, 0, false
	}
	first, last = s.base.step, s.base.step
	if n := len(s.log); n > 0 {
		last = s.log[n-1].step
	}
	return first, last, true
}

// Exact reports whether Restore(step) gives the owner's state bit for bit:
// step is in range, and the base and every differential up to step were
// lossless.
func (s *Store) Exact(step int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, last, ok := s.rangeLocked()
	if !ok || step < first || step > last || !s.base.exact {
		return false
	}
	for _, e := range s.log {
		if e.step > step {
			break
		}
		if e.lossy() {
			return false
		}
	}
	return true
}

// Truncate drops the differentials after step after (a restart to G
// discards the steps after G) and aborts a refresh in progress of a later
// step. If after is before the base's step, it fails with ErrNotHeld and
// changes nothing: the store cannot give that step back. It waits for a
// Fold in progress.
func (s *Store) Truncate(after int64) error {
	s.foldMu.Lock()
	defer s.foldMu.Unlock()
	dropped, recycle, err := s.truncate(after)
	recycleAll(recycle, dropped)
	return err
}

// truncate is Truncate under foldMu: it returns the entries it dropped
// from the log and the recycle function to give their records to.
func (s *Store) truncate(after int64) ([]*entry, func([]byte), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reclaimLocked()
	if s.base != nil && after < s.base.step {
		return nil, nil, wrapf(ErrNotHeld, "truncate after step %d: the base is at step %d", after, s.base.step)
	}
	if p := s.pending; p != nil && p.step > after {
		s.abortLocked(p)
	} else if p != nil {
		k := len(p.log)
		for k > 0 && p.log[k-1].step > after {
			k--
		}
		clear(p.log[k:])
		p.log = p.log[:k]
	}
	i := len(s.log)
	for i > 0 && s.log[i-1].step > after {
		i--
	}
	dropped := slices.Clone(s.log[i:])
	clear(s.log[i:])
	s.log = s.log[:i]
	return dropped, s.recycle, nil
}

// recycleAll hands the records of es to recycle, if set. foldMu must be
// write-held, and es dropped from the log.
func recycleAll(recycle func([]byte), es []*entry) {
	if recycle == nil {
		return
	}
	for _, e := range es {
		recycle(e.rec)
	}
}
