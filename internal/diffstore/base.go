package diffstore

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gorun/gorun/internal/crc32c"
)

// BaseWriter receives one base refresh: the owner's full regions at one
// step, in chunks, then their CRC32Cs. Make one with Store.BeginBase. Its
// methods may be called from several goroutines; they run one at a time.
type BaseWriter struct {
	s    *Store
	step int64

	// dead is set, under s.mu, once the refresh is no longer the store's
	// current one (committed, aborted, superseded, truncated).
	dead atomic.Bool

	// mu serializes Write, Commit and Abort and guards bufs (which SetG,
	// installing a verified refresh, only reads: sealed, they change no
	// more). Taken before s.mu.
	mu     sync.Mutex
	bufs   [][]byte // one per region, of its size; the optimizer's 8-byte aligned
	sealed bool     // Commit verified bufs: no more Writes

	// verified, guarded by s.mu, is set when Commit has verified the
	// refresh, which waits for G to reach its step (Store.SetG).
	verified bool
	// installed, guarded by s.mu, is set when bufs became the store's
	// base: they are not the refresh's to give back any more.
	installed bool

	// log, guarded by s.mu, holds the differentials after step, when the
	// store's log does not reach step (no base, or steps lost): the base
	// takes them when it commits.
	log []*entry
}

// lastStep returns the step of the refresh's last differential, or its
// step. The store's mu must be held.
func (w *BaseWriter) lastStep() int64 {
	if n := len(w.log); n > 0 {
		return w.log[n-1].step
	}
	return w.step
}

// BeginBase starts a base refresh at step (>= -1; -1 is the owner's state
// before its first step), which replaces one in progress (that one is
// aborted, but the differentials it kept after step stay, for the new
// one). The store's base and log are untouched until Commit. A step
// before the base's is refused with ErrStale. Its buffers (the regions'
// sizes) are those the store keeps for reuse (of a base a refresh or a
// checked fold replaced, once no Restore can read them; of a refresh that
// never became the base), or are allocated, outside the store's lock; a
// reused buffer is not cleared (Commit's CRC32Cs cover every byte).
func (s *Store) BeginBase(step int64) (*BaseWriter, error) {
	if step < -1 {
		return nil, wrapf(ErrMismatch, "base refresh at step %d", step)
	}
	w := &BaseWriter{s: s, step: step, bufs: make([][]byte, len(s.regions))}
	// A replaced base's buffers are free once no Restore is in progress:
	// if none is (TryLock never waits), they are now.
	reclaim := s.foldMu.TryLock()
	s.mu.Lock()
	if reclaim {
		s.reclaimLocked()
	}
	for i := range s.regions {
		w.bufs[i] = s.takeLocked(i)
	}
	s.mu.Unlock()
	if reclaim {
		s.foldMu.Unlock()
	}
	for i, r := range s.regions {
		if w.bufs[i] == nil {
			w.bufs[i] = alloc(r.Size)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.base != nil && step < s.base.step {
		for i, b := range w.bufs {
			s.giveLocked(i, b)
		}
		return nil, wrapf(ErrStale, "base refresh at step %d, the base is at step %d", step, s.base.step)
	}
	if p := s.pending; p != nil {
		// The old refresh's differentials after step follow the new one:
		// keep them (only Abort and Truncate drop differentials).
		if p.step <= step && p.lastStep() > step {
			w.log = append([]*entry(nil), p.log[step-p.step:]...)
		}
		s.abortLocked(p)
	}
	s.pending = w
	return w, nil
}

// Step returns the step of the refresh.
func (w *BaseWriter) Step() int64 { return w.step }

// Write copies b into the named region of the refresh at byte offset off.
// A range outside the region or an unknown region is refused with
// ErrMismatch; a refresh no longer current with ErrStale.
func (w *BaseWriter) Write(region string, off int64, b []byte) error {
	i, ok := w.s.index[region]
	if !ok {
		return wrapf(ErrMismatch, "base chunk of unknown region %q", region)
	}
	size := w.s.regions[i].Size
	if off < 0 || off > size || int64(len(b)) > size-off {
		return wrapf(ErrMismatch, "base chunk [%d, %d+%d) outside region %q of %d bytes", off, off, len(b), region, size)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead.Load() || w.sealed {
		w.freeDead()
		return wrapf(ErrStale, "base chunk for the refresh at step %d", w.step)
	}
	copy(w.bufs[i][off:], b)
	return nil
}

// Commit checks the owner's step against the one BeginBase was given, and
// each region's bytes against sums (the CRC32C, Castagnoli, of every
// region, by name, as ckpt commits them); a step that differs is refused
// with ErrCorrupt (one of the two messages was damaged) and changes
// nothing. It then makes the refresh the store's base: the log after the
// new base's step stays (the refresh's own differentials follow it if the
// log stopped before it, see Store.Next). A checksum mismatch is refused with
// ErrCorrupt and changes nothing (the refresh stays in progress: chunks
// may be written again); sums that do not name exactly the regions with
// ErrMismatch; a refresh no longer current, or committed already, with
// ErrStale. A refresh at a step past G (Store.SetG) is verified and then
// waits, in progress, for SetG to reach its step: Writes to it are refused
// with ErrStale, and a newer BeginBase, Abort or Truncate still drops it.
// If a Fold has
// meanwhile moved the base past the refresh's step, the refresh is
// dropped and Commit returns nil: the store holds a later base already.
func (w *BaseWriter) Commit(step int64, sums map[string]uint32) error {
	s := w.s
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead.Load() || w.sealed {
		w.freeDead()
		return wrapf(ErrStale, "commit of the refresh at step %d", w.step)
	}
	if step != w.step {
		return wrapf(ErrCorrupt, "commit of a base at step %d for the refresh begun at step %d", step, w.step)
	}
	if len(sums) != len(s.regions) {
		return wrapf(ErrMismatch, "commit of the refresh at step %d with %d checksums for %d regions", w.step, len(sums), len(s.regions))
	}
	for i, r := range s.regions {
		want, ok := sums[r.Name]
		if !ok {
			return wrapf(ErrMismatch, "commit of the refresh at step %d without the checksum of region %q", w.step, r.Name)
		}
		if got := crc32c.Checksum(w.bufs[i]); got != want {
			return wrapf(ErrCorrupt, "base at step %d: region %q has CRC32C %#08x, the owner's is %#08x", w.step, r.Name, got, want)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != w {
		w.freeDeadLocked() // not current: marked dead when it stopped being
		return wrapf(ErrStale, "commit of the refresh at step %d", w.step)
	}
	w.sealed = true
	if s.base != nil && s.base.step > w.step {
		s.pending = nil
		w.dead.Store(true)
		s.stats.RefreshesSuperseded++
		w.freeDeadLocked()
		return nil
	}
	w.verified = true
	if w.step > s.g {
		return nil // installed by SetG
	}
	s.installLocked(w)
	w.bufs = nil
	return nil
}

// installLocked makes the verified refresh in progress w the store's base.
func (s *Store) installLocked(w *BaseWriter) {
	// Read w.bufs before w is marked dead: w's next call, which sees it
	// dead, drops its reference under w.mu alone.
	nb := &base{step: w.step, data: w.bufs, exact: true, exactAt: w.step}
	s.pending = nil
	w.dead.Store(true)
	w.installed = true
	s.drift = nil
	if s.base != nil {
		// A Restore in progress may read the old base: its buffers are
		// reused only once none is (reclaimLocked).
		s.retired = slices.Clone(s.base.data)
	}
	if s.base != nil && s.lastLocked() >= w.step {
		// The log reaches the new base: keep what follows it.
		i := int(w.step - s.base.step) // entries at or before w.step
		if s.noteDriftLocked(nb, i); s.drift != nil {
			// The drift check replays onto the old optimizer buffer:
			// it is reused after that.
			s.retired[s.optIdx] = nil
		}
		if i > 0 {
			nb.t = s.log[i-1].hyper.T
		} else {
			nb.t = s.base.t
		}
		clear(s.log[:i])
		s.log = s.log[i:]
	} else {
		// The log stops before it (or there is no base): the refresh's
		// own differentials follow it.
		clear(s.log)
		s.log = w.log
	}
	w.log = nil
	s.base = nb
	s.stats.Refreshes++
}

// Abort drops the refresh (the owner crashed mid-refresh, or gave up): the
// store's base and log stay as they were. The differentials the refresh
// kept after its step (see Store.Next) are dropped. Abort of a refresh
// no longer current does nothing.
func (w *BaseWriter) Abort() {
	s := w.s
	w.mu.Lock()
	defer w.mu.Unlock()
	s.mu.Lock()
	if s.pending == w {
		s.abortLocked(w)
	}
	s.mu.Unlock()
	w.freeDead()
}

// freeDead lets go of the buffers of a refresh no longer current (w.mu
// held): the store ends a refresh under its own lock, which may not wait
// for w.mu, so the buffers go at the refresh's next Write, Commit or
// Abort. No reader ever saw them (w.mu holds off the refresh's own
// Writes): the store keeps them for its next refresh. A refresh verified
// and waiting for G keeps them (they are its base to be), and one
// installed lets go of them without giving them back (they are the
// store's base).
func (w *BaseWriter) freeDead() {
	if w.dead.Load() && w.bufs != nil {
		w.s.mu.Lock()
		w.freeDeadLocked()
		w.s.mu.Unlock()
	}
}

// freeDeadLocked is freeDead with the store's mu held too.
func (w *BaseWriter) freeDeadLocked() {
	if !w.dead.Load() {
		return
	}
	if !w.installed {
		for i, b := range w.bufs {
			w.s.giveLocked(i, b)
		}
	}
	w.bufs = nil
}

// abortLocked ends the refresh in progress p, and drops the
// differentials it kept.
func (s *Store) abortLocked(p *BaseWriter) {
	p.dead.Store(true)
	s.pending = nil
	s.stats.RefreshesAborted++
	clear(p.log)
	p.log = nil
}

// alloc returns size zero bytes, 8-byte aligned.
func alloc(size int64) []byte {
	if size == 0 {
		return []byte{}
	}
	w := make([]uint64, (size+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), size)
}
