package diffstore

import (
	"encoding/binary"
	"fmt"

	"github.com/gorun/gorun/replay"
)

// Store.Append: a differential checked against the owner's layout and the
// log (decode, checkT, heldLocked) and taken at the step Next returns.

// Append adds the differential of the step Next returns. It checks
// everything: d.Sum (ErrCorrupt if it does not match: see Diff.Seal), the
// step order (ErrGap), the record (ErrCorrupt if it does not decode), that it holds one tensor of N elements of step d.Step, that
// Other has exactly the other regions at their sizes, that the
// hyper-parameters are valid and follow the previous differential's T
// (ErrMismatch). A step the store holds already, resent with the same
// record (same length and CRC32C), and a step at or before the base's (or,
// without a base, the refresh's) are taken as no-ops: Append returns nil
// and changes nothing; a held step resent with another record is refused
// with ErrMismatch. A refused differential leaves the store unchanged.
// The store keeps d's byte slices: the caller must not change them
// afterwards.
func (s *Store) Append(d Diff) error {
	// Decode and check outside the lock: DecodeRecord reads the whole
	// record (its CRC).
	e, err := s.decode(d)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if held, err := s.heldLocked(e); held || err != nil {
		return err
	}
	p := s.pending
	if s.base != nil {
		if last := s.lastLocked(); e.step == last+1 {
			if err := checkT(e, s.prevTLocked(s.log, s.base.t)); err != nil {
				return err
			}
			s.log = append(s.log, e)
			if p != nil && e.step == p.step && len(p.log) > 0 {
				// The log reaches the refresh's step now: it takes over the
				// differentials the refresh kept.
				if checkT(p.log[0], e.hyper.T) == nil {
					s.log = append(s.log, p.log...)
				}
				clear(p.log)
				p.log = nil
			}
			return nil
		}
	}
	if p != nil && s.refreshLogsLocked() {
		if e.step == p.lastStep()+1 {
			if err := checkT(e, s.prevTLocked(p.log, 0)); err != nil {
				return err
			}
			p.log = append(p.log, e)
			return nil
		}
	}
	want, ok := s.nextLocked()
	if !ok {
		return wrapf(ErrGap, "differential of step %d: no base and no base refresh to apply it to", d.Step)
	}
	return wrapf(ErrGap, "differential of step %d, want step %d", d.Step, want)
}

// checkT checks that e's optimizer step follows prev (0: unknown).
func checkT(e *entry, prev int) error {
	if prev != 0 && e.hyper.T != prev+1 {
		return wrapf(ErrMismatch, "differential of step %d is optimizer step %d, after optimizer step %d", e.step, e.hyper.T, prev)
	}
	return nil
}

// prevTLocked returns the optimizer step of log's last entry, or t if it is empty.
func (s *Store) prevTLocked(log []*entry, t int) int {
	if n := len(log); n > 0 {
		return log[n-1].hyper.T
	}
	return t
}

// heldLocked reports whether e's step is one the store needs no more: at
// or before the base's step (the refresh's, without a base), or held
// already with the same record (ErrMismatch if with another).
func (s *Store) heldLocked(e *entry) (bool, error) {
	var at *entry
	switch p := s.pending; {
	case s.base != nil && e.step <= s.base.step:
		return true, nil
	case s.base == nil && p != nil && e.step <= p.step:
		return true, nil
	case s.base != nil && e.step <= s.lastLocked():
		at = s.log[e.step-s.base.step-1]
	case p != nil && e.step > p.step && e.step <= p.lastStep():
		at = p.log[e.step-p.step-1]
	default:
		return false, nil
	}
	if at.recLen != e.recLen || at.recSum != e.recSum {
		return false, wrapf(ErrMismatch, "differential of step %d resent with another record", e.step)
	}
	return true, nil
}

// lastLocked returns the step of the last differential of the log, or the
// base's step if it is empty. There must be a base.
func (s *Store) lastLocked() int64 {
	if n := len(s.log); n > 0 {
		return s.log[n-1].step
	}
	return s.base.step
}

// refreshLogsLocked reports whether the refresh in progress keeps the
// differentials after its step itself: there is no base, or the log
// stops before the refresh's step (steps were lost).
func (s *Store) refreshLogsLocked() bool {
	return s.pending != nil && (s.base == nil || s.lastLocked() < s.pending.step)
}

// decode checks d against the owner's layout and returns its log entry.
func (s *layout) decode(d Diff) (*entry, error) {
	if got := d.sum(); got != d.Sum {
		return nil, wrapf(ErrCorrupt, "differential of step %d: step, hyper-parameters and other regions have CRC32C %#08x, the owner's is %#08x", d.Step, got, d.Sum)
	}
	if d.Step < 0 {
		return nil, wrapf(ErrMismatch, "differential of step %d", d.Step)
	}
	if err := d.Hyper.Validate(); err != nil {
		return nil, fmt.Errorf("%w: differential of step %d: %w", ErrMismatch, d.Step, err)
	}
	rec, err := replay.DecodeRecord(d.Record)
	if err != nil {
		return nil, fmt.Errorf("%w: differential of step %d: %w", ErrCorrupt, d.Step, err)
	}
	switch {
	case rec.Step != uint64(d.Step):
		return nil, wrapf(ErrMismatch, "differential of step %d holds a record of step %d", d.Step, rec.Step)
	case len(rec.Tensors) != 1:
		return nil, wrapf(ErrMismatch, "differential of step %d holds %d tensors, want 1", d.Step, len(rec.Tensors))
	case int64(rec.Tensors[0].Len) != s.opt.N:
		return nil, wrapf(ErrMismatch, "differential of step %d has %d elements, the optimizer %d", d.Step, rec.Tensors[0].Len, s.opt.N)
	}
	e := &entry{step: d.Step, hyper: d.Hyper, sum: d.Sum, tensor: rec.Tensors[0], other: make([][]byte, len(s.regions)), bytes: int64(len(d.Record)),
		rec: d.Record, recLen: len(d.Record), recSum: binary.LittleEndian.Uint32(d.Record[len(d.Record)-4:])}
	if len(d.Other) != len(s.regions)-1 {
		for name := range d.Other {
			if i, ok := s.index[name]; !ok || i == s.optIdx {
				return nil, wrapf(ErrMismatch, "differential of step %d carries region %q, not one of the owner's other regions", d.Step, name)
			}
		}
	}
	for i, r := range s.regions {
		if i == s.optIdx {
			continue
		}
		b, ok := d.Other[r.Name]
		if !ok {
			return nil, wrapf(ErrMismatch, "differential of step %d lacks region %q", d.Step, r.Name)
		}
		if int64(len(b)) != r.Size {
			return nil, wrapf(ErrMismatch, "differential of step %d: region %q of %d bytes, want %d", d.Step, r.Name, len(b), r.Size)
		}
		e.other[i] = b
		e.bytes += int64(len(b))
	}
	return e, nil
}

// nextLocked returns the step the next differential must have, and false
// if no differential can be taken (no base, no refresh in progress).
func (s *Store) nextLocked() (int64, bool) {
	switch {
	case s.refreshLogsLocked():
		return s.pending.lastStep() + 1, true
	case s.base != nil:
		return s.lastLocked() + 1, true
	}
	return 0, false
}

// Next returns the step Append takes next, or -1 if it takes none (no
// base and no refresh in progress): the step from which the owner must
// resend its differentials. It is the step after the log's last (after
// the base's step if the log is empty), except while a refresh at step b
// is in progress and the log stops before b (steps were lost, or there is
// no base yet): then it is the step after the differentials the refresh
// keeps (b+1 at first). Those differentials become restorable when the
// refresh commits. Meanwhile the lost steps up to b are still taken if
// resent: once the log reaches b, it takes over the refresh's
// differentials.
func (s *Store) Next() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nextLocked()
	if !ok {
		return -1
	}
	return n
}
