package diffstore

import "slices"

// Reads of what a store holds as it holds it (diff mode under erasure
// coding, protect/PROTOCOL.md "Erasure coding and diff mode"): the base at a
// step, which is a member's shard of a coded stripe (ReadBase), and the
// differentials after it, which a restorer replays onto a decoded base
// (Records).

// ReadBase copies bytes [off, off+len(dst)) of the owner's regions at
// step, concatenated in the order given to New, into dst, with zeros past
// their end: from the store's base if its step is step and it is exact
// (the owner's bytes, or folded from lossless records only), else from a
// refresh in progress at step that Commit verified and that waits for G
// (Store.SetG). It fails with ErrNotHeld, dst unspecified, if neither is
// at step (a fold moved the base on, a refresh replaced it, or it was
// never received), and with ErrMismatch if off is negative. The bytes are
// those Commit verified against the owner's CRC32Cs: a Fold, a refresh
// that installs or a Truncate concurrent with ReadBase waits for it, or
// does not touch what it reads.
func (s *Store) ReadBase(step, off int64, dst []byte) error {
	if off < 0 {
		return wrapf(ErrMismatch, "read of the base at step %d from offset %d", step, off)
	}
	s.foldMu.RLock()
	defer s.foldMu.RUnlock()
	s.mu.Lock()
	if b := s.base; b != nil && b.step == step && b.exact {
		// Its bytes change only in Fold, and its buffers are reused only
		// once foldMu is write-held (reclaimLocked): neither while we
		// read-hold it.
		data := b.data
		s.mu.Unlock()
		copyRegions(dst, data, off)
		return nil
	}
	w := s.pending
	s.mu.Unlock()
	if w == nil || w.step != step {
		return wrapf(ErrNotHeld, "base at step %d: not held", step)
	}
	// A refresh's buffers are given back to the store (and reused by a
	// later refresh) only under w.mu (freeDead): hold it while reading.
	// Sealed, they change no more; installed since, they are the base's,
	// which foldMu keeps (see above).
	w.mu.Lock()
	defer w.mu.Unlock()
	s.mu.Lock()
	ok := w.sealed && w.bufs != nil && (w.verified || w.installed) && (s.pending == w || w.installed)
	bufs := w.bufs
	s.mu.Unlock()
	if !ok {
		return wrapf(ErrNotHeld, "base at step %d: not held (a refresh in progress, not verified)", step)
	}
	copyRegions(dst, bufs, off)
	return nil
}

// copyRegions copies bytes [off, off+len(dst)) of the concatenation of
// data into dst, zeros past its end.
func copyRegions(dst []byte, data [][]byte, off int64) {
	n := 0
	for _, d := range data {
		if n == len(dst) {
			break
		}
		if off >= int64(len(d)) {
			off -= int64(len(d))
			continue
		}
		n += copy(dst[n:], d[off:])
		off = 0
	}
	clear(dst[n:])
}

// Records calls emit with the differentials of the steps from+1 to to
// that follow the store's base, in order, as Append took them (their Sum
// included: the owner's seal), for a restorer that replays them onto a
// base of its own. It fails with ErrGap, before any emit, if the log
// after the base lacks any of these steps (they are before the base, not
// received, or kept by a refresh that has not committed), and stops at
// emit's first error, which it returns. emit must not change the
// differential's bytes, nor keep them after it returns. A Fold or a
// Truncate waits for Records to return (emit may not call them).
func (s *Store) Records(from, to int64, emit func(Diff) error) error {
	s.foldMu.RLock()
	defer s.foldMu.RUnlock()
	s.mu.Lock()
	var es []*entry
	if to > from {
		first, last, ok := s.rangeLocked()
		if !ok || from < first || to > last {
			s.mu.Unlock()
			if !ok {
				return wrapf(ErrGap, "differentials of steps (%d, %d]: no base", from, to)
			}
			return wrapf(ErrGap, "differentials of steps (%d, %d]: the store holds steps %d to %d after its base", from, to, first+1, last)
		}
		// A copy: a refresh that installs clears the log's dropped slots.
		es = slices.Clone(s.log[from-first : to-first])
	}
	s.mu.Unlock()
	// The entries never change, and their records are handed to recycle
	// only with foldMu write-held.
	for _, e := range es {
		if err := emit(s.diff(e)); err != nil {
			return err
		}
	}
	return nil
}
