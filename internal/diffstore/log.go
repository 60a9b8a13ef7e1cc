package diffstore

import (
	"slices"
	"sync"
)

// Log is a log-only holder's copy of one owner's differentials (diff mode
// under erasure coding, protect/PROTOCOL.md "Erasure coding and diff mode"):
// the consecutive differentials after a step the log is anchored at, with
// no base to apply them to. It checks every differential as Store.Append
// does (the Sum, the record's CRC32C and layout, its N, the other regions'
// names and sizes, the hyper-parameters and the continuity of their T,
// consecutive steps), keeps it as taken, and gives the differentials of
// a range back (Records) for a restorer to replay onto a decoded base.
// Make one with NewLog. It is safe for concurrent use; no method waits
// for a Records in progress.
//
// The log holds the differentials of the steps (after, last]. A new log
// is not anchored: it takes a first differential of any step, which
// anchors it at the step before. TruncateThrough(h) anchors it at h (or
// later): a holder that starts at the base step h of the owner's coded
// base calls it before the first differential.
type Log struct {
	layout // immutable after NewLog

	mu       sync.Mutex
	anchored bool     // after is set: Append takes after+len(entries)+1 only
	after    int64    // the step before the first differential (anchored)
	t        int      // Adam's step count at after, or 0 if not known
	entries  []*entry // the steps after+1, after+2, …
	bytes    int64    // the entries' records and other regions
	recycle  func(record []byte)
	readers  int      // Records calls in progress
	deferred [][]byte // records dropped while readers > 0, for recycle once none is
}

// NewLog returns an empty, unanchored log for an owner with these regions
// and this optimizer layout (checked as New checks them).
func NewLog(regions []Region, opt Optimizer) (*Log, error) {
	l, err := newLayout(regions, opt)
	if err != nil {
		return nil, err
	}
	return &Log{layout: l}, nil
}

// Regions returns the owner's regions, as given to NewLog.
func (l *Log) Regions() []Region { return append([]Region(nil), l.regions...) }

// Optimizer returns the owner's optimizer layout, as given to NewLog.
func (l *Log) Optimizer() Optimizer { return l.opt }

// SetRecycle makes the log hand the record of every differential that
// TruncateThrough or Truncate drops to fn (nil: the garbage collector
// takes them), once no Records call can still read it: at once if none
// is in progress, else when the last one in progress returns. fn is called
// outside the log's lock, on the goroutine of that TruncateThrough,
// Truncate or Records (it may not call Records on this log); it owns the
// buffer from then on. Records of refused differentials and Append's
// no-ops are the caller's, as they were.
func (l *Log) SetRecycle(fn func(record []byte)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recycle = fn
}

// Append adds the differential of the step Next returns (any step if the
// log is not anchored). It checks what Store.Append checks: d.Sum
// (ErrCorrupt if it does not match), the record (ErrCorrupt if it does
// not decode), that it holds one tensor of N elements of step d.Step,
// that Other has exactly the other regions at their sizes, that the
// hyper-parameters are valid and follow the previous differential's T
// (ErrMismatch; the T of the step the log is anchored at, when a
// TruncateThrough dropped it), and the step order (ErrGap). A step at or
// before the anchor, and a step held already resent with the same record
// (same length and CRC32C), are no-ops: Append returns nil and changes
// nothing; a held step resent with another record is refused with
// ErrMismatch. A refused differential leaves the log unchanged. The log
// keeps d's byte slices: the caller must not change them afterwards.
func (l *Log) Append(d Diff) error {
	e, err := l.decode(d)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.anchored {
		l.anchored, l.after, l.t = true, e.step-1, 0
	}
	last := l.after + int64(len(l.entries))
	switch {
	case e.step <= l.after:
		return nil
	case e.step <= last:
		at := l.entries[e.step-l.after-1]
		if at.recLen != e.recLen || at.recSum != e.recSum {
			return wrapf(ErrMismatch, "differential of step %d resent with another record", e.step)
		}
		return nil
	case e.step != last+1:
		return wrapf(ErrGap, "differential of step %d, want step %d", e.step, last+1)
	}
	prev := l.t
	if n := len(l.entries); n > 0 {
		prev = l.entries[n-1].hyper.T
	}
	if err := checkT(e, prev); err != nil {
		return err
	}
	l.entries = append(l.entries, e)
	l.bytes += e.bytes
	return nil
}

// Next returns the step Append takes next, or -1 if the log is not
// anchored (it takes any step).
func (l *Log) Next() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.anchored {
		return -1
	}
	return l.after + int64(len(l.entries)) + 1
}

// Range returns the steps whose differentials the log holds, [first,
// last], and false if it holds none.
func (l *Log) Range() (first, last int64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) == 0 {
		return 0, 0, false
	}
	return l.after + 1, l.after + int64(len(l.entries)), true
}

// Holds reports whether the log holds the differential of every step of
// (from, to]: true if to <= from. A log-only holder acknowledges step s
// to the owner only when it holds every step from the job's base H on.
func (l *Log) Holds(from, to int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return to <= from || (len(l.entries) > 0 && l.after <= from && to <= l.after+int64(len(l.entries)))
}

// Len returns how many differentials the log holds.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

// Bytes returns the bytes the log holds: its differentials' records and
// other regions.
func (l *Log) Bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes
}

// TruncateThrough drops the differentials of the steps up to h (the job's
// base H reached h: nothing will replay them) and anchors the log at h if
// it was anchored before (or not at all): it then takes step h+1 next if
// it held no later step. The T of step h, if the log held it, is kept to
// check the next differential's.
func (l *Log) TruncateThrough(h int64) {
	l.mu.Lock()
	if l.anchored && h <= l.after {
		l.mu.Unlock()
		return
	}
	k := 0
	if l.anchored {
		k = int(min(h-l.after, int64(len(l.entries))))
	}
	t := 0
	if k > 0 && l.after+int64(k) == h {
		t = l.entries[k-1].hyper.T
	}
	dropped := slices.Clone(l.entries[:k])
	clear(l.entries[:k])
	l.entries = l.entries[k:]
	if len(l.entries) == 0 {
		l.entries = nil
	}
	l.anchored, l.after, l.t = true, h, t
	fn := l.dropLocked(dropped)
	l.mu.Unlock()
	recycleAll(fn, dropped)
}

// Truncate drops the differentials after step after (a restart to G
// discards the steps after G). If the log is anchored after after, it
// fails with ErrNotHeld and changes nothing: the log cannot give the
// steps up to its anchor back.
func (l *Log) Truncate(after int64) error {
	l.mu.Lock()
	if !l.anchored {
		l.mu.Unlock()
		return nil
	}
	if after < l.after {
		l.mu.Unlock()
		return wrapf(ErrNotHeld, "truncate after step %d: the log starts after step %d", after, l.after)
	}
	k := int(min(after-l.after, int64(len(l.entries))))
	dropped := slices.Clone(l.entries[k:])
	clear(l.entries[k:])
	l.entries = l.entries[:k]
	fn := l.dropLocked(dropped)
	l.mu.Unlock()
	recycleAll(fn, dropped)
	return nil
}

// dropLocked accounts for the entries dropped from the log, and returns
// the function to hand their records to now: recycle if no Records is in
// progress, else nil (their records wait in deferred). l.mu is held.
func (l *Log) dropLocked(dropped []*entry) func([]byte) {
	for _, e := range dropped {
		l.bytes -= e.bytes
	}
	if l.recycle == nil {
		return nil
	}
	if l.readers == 0 {
		return l.recycle
	}
	for _, e := range dropped {
		l.deferred = append(l.deferred, e.rec)
	}
	return nil
}

// Records calls emit with the differentials of the steps from+1 to to, in
// order, as Append took them (their Sum included: the owner's seal). It
// fails with ErrGap, before any emit, if the log lacks any of these steps,
// and stops at emit's first error, which it returns. emit must not
// change the differential's bytes, nor keep them after it returns; it may
// call the log's other methods (a concurrent TruncateThrough or Truncate
// does not change what this Records emits).
func (l *Log) Records(from, to int64, emit func(Diff) error) error {
	l.mu.Lock()
	if to > from && (len(l.entries) == 0 || from < l.after || to > l.after+int64(len(l.entries))) {
		first, last := l.after+1, l.after+int64(len(l.entries))
		l.mu.Unlock()
		if !l.anchored || len(l.entries) == 0 {
			return wrapf(ErrGap, "differentials of steps (%d, %d]: the log holds none", from, to)
		}
		return wrapf(ErrGap, "differentials of steps (%d, %d]: the log holds steps %d to %d", from, to, first, last)
	}
	var es []*entry
	if to > from {
		es = slices.Clone(l.entries[from-l.after : to-l.after])
	}
	l.readers++
	l.mu.Unlock()
	defer l.endRead()
	for _, e := range es {
		if err := emit(l.diff(e)); err != nil {
			return err
		}
	}
	return nil
}

// endRead ends a Records call: the last one in progress hands the
// records dropped meanwhile to recycle.
func (l *Log) endRead() {
	l.mu.Lock()
	l.readers--
	var recs [][]byte
	fn := l.recycle
	if l.readers == 0 {
		recs, l.deferred = l.deferred, nil
	}
	l.mu.Unlock()
	if fn != nil {
		for _, r := range recs {
			fn(r)
		}
	}
}

// diff returns e as the Diff it was taken from (its Other a new map of
// the same slices).
func (s *layout) diff(e *entry) Diff {
	d := Diff{Step: e.step, Hyper: e.hyper, Record: e.rec, Sum: e.sum, Other: make(map[string][]byte, len(s.regions)-1)}
	for i, r := range s.regions {
		if i != s.optIdx {
			d.Other[r.Name] = e.other[i]
		}
	}
	return d
}
