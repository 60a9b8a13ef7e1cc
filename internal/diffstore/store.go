package diffstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/replay"
)

// Limits on the owner's declared layout (those of ckpt and rank).
const (
	MaxRegions    = 16
	MaxRegionSize = 1 << 40
	maxNameLen    = 255
)

// Region is one of the owner's regions, as the owner declared it.
type Region struct {
	Name string
	Size int64
}

// Optimizer says where Adam's state lives in the owner's optimizer
// region: N float32 elements (little-endian) each of the master weights
// W, the first moment M and the second moment V, at byte offsets WOff,
// MOff and VOff of region Region. The offsets are multiples of 4 and the
// three ranges do not overlap.
type Optimizer struct {
	Region           string
	N                int64
	WOff, MOff, VOff int64
}

// Diff is one step's differential: what the owner's optimizer step took.
type Diff struct {
	// Step is the step this gradient produced: the owner's state at Step
	// is replay.Step of its state at Step-1 with this gradient and Hyper.
	Step int64
	// Hyper are that step's hyper-parameters (Hyper.T is Adam's step
	// count; consecutive differentials have consecutive T).
	Hyper replay.Hyper
	// Record is an encoded replay.Record of step Step holding one tensor
	// of N elements: the gradient of the owner's shard.
	Record []byte
	// Other holds the full bytes, at Step, of every region other than the
	// optimizer's, by name.
	Other map[string][]byte
	// Sum is the CRC32C (Castagnoli) of Step, Hyper and Other, which the
	// record's own CRC does not cover: the owner sets it with Seal, and
	// Append refuses a differential whose Sum does not match.
	Sum uint32
}

// Seal sets d.Sum from d's Step, Hyper and Other: the owner calls it once
// the differential is complete, before sending it.
func (d *Diff) Seal() { d.Sum = d.sum() }

// sum returns the CRC32C of d's step, its hyper-parameters (each as its
// little-endian bits; T as an int64) and its other regions in the order
// of their names, each as its name's length (uint32), the name, its
// length (uint64) and its bytes.
func (d *Diff) sum() uint32 {
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, uint64(d.Step))
	for _, f := range []float32{d.Hyper.LR, d.Hyper.Beta1, d.Hyper.Beta2, d.Hyper.Eps, d.Hyper.WeightDecay} {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	b = binary.LittleEndian.AppendUint64(b, uint64(int64(d.Hyper.T)))
	crc := crc32c.Update(0, b)
	for _, name := range slices.Sorted(maps.Keys(d.Other)) {
		o := d.Other[name]
		b = binary.LittleEndian.AppendUint32(b[:0], uint32(len(name)))
		b = append(b, name...)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(o)))
		crc = crc32c.Update(crc, b)
		crc = crc32c.Update(crc, o)
	}
	return crc
}

// Store is a holder's copy of one owner's state: a base and the log of
// differentials after it. Make one with New. It is safe for concurrent
// use (see the package comment for who waits for whom).
type Store struct {
	layout // immutable after New

	// testFoldHook, when set (by tests, before the store is used), runs
	// in Fold after it took its snapshot of the log, before it replays.
	testFoldHook func()
	// testPoison, when set (by tests, before the store is used), makes
	// giveLocked overwrite every buffer it keeps for reuse: a Restore
	// that still read one would then differ (and race, under -race).
	testPoison bool

	// foldMu serializes what touches a base's bytes in place: Fold holds
	// it for writing, Restore for reading, Truncate for writing (so that
	// no fold runs past the step it truncates to). Taken before mu.
	foldMu sync.RWMutex

	// mu guards the fields below. It is held for bookkeeping only, never
	// during a copy, a checksum or a replay.
	mu      sync.Mutex
	base    *base       // the committed base, or nil
	log     []*entry    // the differentials after base, consecutive; empty without a base
	pending *BaseWriter // the refresh in progress, or nil
	stats   Stats       // counters; the sizes are computed by Stats
	g       int64       // the step the job may restart from (SetG)

	// recycle, if set (SetRecycle), takes back the record of each
	// differential that Fold, FoldChecked or Truncate drops: they call it
	// with foldMu write-held, outside mu, so that no Restore can still
	// read the record.
	recycle func(record []byte)
	// free holds, by region index, buffers of a region's size that
	// nothing reads any more: BeginBase's refresh buffers and
	// FoldChecked's spare come from it before they are allocated. At most
	// maxSpares per region; more go to the garbage collector.
	free [][][]byte
	// retired holds, by region index, the buffers of a base that a
	// refresh replaced: a Restore begun before may still read them, so
	// they go to free only where foldMu is write-held (reclaimLocked).
	retired [][]byte
	// drift is the drift a refresh found, for the next fold to measure
	// (drift.go), or nil.
	drift *driftCheck
}

// layout is an owner's declared regions and optimizer layout, checked
// (newLayout): what a Store and a Log check every differential against.
type layout struct {
	regions []Region
	index   map[string]int // region name → index in regions
	opt     Optimizer
	optIdx  int
}

// base is a full copy of the owner's regions at a step. Its bytes change
// only in Fold (under foldMu, for writing); step, data's slice headers and
// exact change under Store.mu.
type base struct {
	step  int64
	data  [][]byte // one per region; the optimizer's is 8-byte aligned
	exact bool     // the owner's own bytes, or folded from lossless records only
	t     int      // Adam's step count at step, or 0 if not known
	// exactAt is the step of the last exact state this base derives
	// from: its own step while exact, else the refresh it was folded from.
	exactAt int64
}

// entry is one differential in the log. Immutable.
type entry struct {
	step   int64
	hyper  replay.Hyper
	rec    []byte         // the record as received (the caller's buffer, handed to recycle when dropped)
	tensor *replay.Tensor // decoded; its payload views rec (a copy of it if unaligned)
	other  [][]byte       // by region index; nil for the optimizer region
	bytes  int64          // rec and other
	recLen int            // the record's length
	// recSum is the record's own CRC32C, its last 4 bytes, which
	// DecodeRecord verified over the rest of it: a step resent is the
	// same if its record has the same length and CRC32C.
	recSum uint32
	sum    uint32 // the differential's Diff.Sum
}

func (e *entry) lossy() bool { return e.tensor.Codec != replay.Raw }

// hostLE says whether this machine is little-endian, as the stored
// float32 layout is: the store views the bytes as float32 in place.
var hostLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// New returns an empty store (no base, nothing to restore) for an owner
// with these regions (1 to MaxRegions, unique non-empty names, sizes 0 to
// MaxRegionSize) and this optimizer layout.
func New(regions []Region, opt Optimizer) (*Store, error) {
	l, err := newLayout(regions, opt)
	if err != nil {
		return nil, err
	}
	return &Store{layout: l, g: math.MaxInt64}, nil
}

// newLayout checks an owner's layout (see New) and returns it.
func newLayout(regions []Region, opt Optimizer) (layout, error) {
	if !hostLE {
		return layout{}, errors.New("diffstore: needs a little-endian host")
	}
	if len(regions) < 1 || len(regions) > MaxRegions {
		return layout{}, fmt.Errorf("diffstore: %d regions, want 1 to %d", len(regions), MaxRegions)
	}
	s := layout{regions: append([]Region(nil), regions...), index: make(map[string]int, len(regions)), opt: opt}
	for i, r := range regions {
		if r.Name == "" || len(r.Name) > maxNameLen {
			return layout{}, fmt.Errorf("diffstore: region %d: name of %d bytes, want 1 to %d", i, len(r.Name), maxNameLen)
		}
		if r.Size < 0 || r.Size > MaxRegionSize {
			return layout{}, fmt.Errorf("diffstore: region %q: size %d outside [0, %d]", r.Name, r.Size, int64(MaxRegionSize))
		}
		if _, dup := s.index[r.Name]; dup {
			return layout{}, fmt.Errorf("diffstore: region %q given twice", r.Name)
		}
		s.index[r.Name] = i
	}
	i, ok := s.index[opt.Region]
	if !ok {
		return layout{}, fmt.Errorf("diffstore: no optimizer region %q among the regions", opt.Region)
	}
	s.optIdx = i
	size := regions[i].Size
	if opt.N < 0 || opt.N > size/4 {
		return layout{}, fmt.Errorf("diffstore: %d elements do not fit the optimizer region %q of %d bytes", opt.N, opt.Region, size)
	}
	offs := [3]int64{opt.WOff, opt.MOff, opt.VOff}
	for k, off := range offs {
		if off < 0 || off%4 != 0 || off > size-4*opt.N {
			return layout{}, fmt.Errorf("diffstore: optimizer offset %d (%c) not a multiple of 4 within [0, %d]", off, "WMV"[k], size-4*opt.N)
		}
		for _, o := range offs[:k] {
			if off < o+4*opt.N && o < off+4*opt.N {
				return layout{}, fmt.Errorf("diffstore: optimizer ranges at offsets %d and %d overlap (%d elements)", o, off, opt.N)
			}
		}
	}
	return s, nil
}

// Regions returns the owner's regions, as given to New.
func (s *Store) Regions() []Region { return append([]Region(nil), s.regions...) }

// Optimizer returns the owner's optimizer layout, as given to New.
func (s *Store) Optimizer() Optimizer { return s.opt }

// SetRecycle makes the store hand the record of every differential that
// Fold, FoldChecked or Truncate drops from its log to fn (nil: none is
// handed back, the garbage collector takes them), once nothing can read
// it: no Restore or RestorePieces is in progress (those folds and Truncate
// exclude them), and the store keeps no reference to it. fn is called on
// the goroutine of that Fold or Truncate, outside the store's lock (it may
// not call Fold, FoldChecked, Truncate or Restore on this store); it owns
// the buffer from then on, and may give it to a later Append. Records
// dropped elsewhere (a refresh that commits drops the log before it,
// while a Restore may be reading it; Append's no-ops; refused
// differentials) go to the garbage collector.
func (s *Store) SetRecycle(fn func(record []byte)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recycle = fn
}

// Size returns the bytes of the owner's regions: what a base, and a
// refresh's buffers (BeginBase), take.
func (s *Store) Size() int64 {
	var n int64
	for _, r := range s.regions {
		n += r.Size
	}
	return n
}

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

// reclaimLocked moves the buffers of a replaced base to free (where free
// has none of that region): foldMu is write-held, so no Restore that may
// have read them is still in progress. mu is held.
func (s *Store) reclaimLocked() {
	for i, b := range s.retired {
		s.giveLocked(i, b)
	}
	s.retired = nil
}

// maxSpares is how many free buffers of a region the store keeps: one
// for FoldChecked's spare and one for a base refresh's, which overlap
// (a refresh arrives over several steps, while folds go on). With one, a
// refresh that found it taken by a fold allocated its own and gave it to
// the garbage collector when it was done: every refresh then faulted a
// whole region's worth of fresh memory in again.
const maxSpares = 2

// giveLocked keeps b, a buffer of region i that nothing reads any more,
// for reuse if free has fewer than maxSpares of that region (else the
// garbage collector takes it). mu is held.
func (s *Store) giveLocked(i int, b []byte) {
	if b == nil || int64(len(b)) != s.regions[i].Size {
		return
	}
	if s.free == nil {
		s.free = make([][][]byte, len(s.regions))
	}
	if len(s.free[i]) < maxSpares {
		if s.testPoison {
			for k := range b {
				b[k] = 0xA5
			}
		}
		s.free[i] = append(s.free[i], b)
	}
}

// takeLocked returns a free buffer of region i, or nil. mu is held.
func (s *Store) takeLocked(i int) []byte {
	if s.free == nil || len(s.free[i]) == 0 {
		return nil
	}
	n := len(s.free[i]) - 1
	b := s.free[i][n]
	s.free[i][n] = nil
	s.free[i] = s.free[i][:n]
	return b
}

// Stats are a store's sizes and counters (for -v).
type Stats struct {
	BaseBytes    int64 // the committed base's regions
	RefreshBytes int64 // the buffers of a refresh in progress
	LogBytes     int64 // the differentials held: records and other regions
	LogLen       int   // how many differentials are held
	// The differentials a refresh in progress keeps, after its step (when
	// the log does not reach it): restorable once it commits.
	RefreshLogBytes int64
	RefreshLogLen   int

	Refreshes           int64 // base refreshes committed
	RefreshesAborted    int64 // aborted, superseded by a newer BeginBase, or cut by Truncate
	RefreshesSuperseded int64 // committed after a Fold had moved the base past their step, and dropped

	// SpareBytes are buffers the store keeps for reuse (a replaced
	// base's, a dropped refresh's, FoldChecked's spare) or for a drift
	// measurement (a replaced base, until the next fold): memory held all
	// the same.
	SpareBytes int64

	Folds         int64         // Fold and FoldChecked calls that folded at least one step
	FoldedSteps   int64         // steps folded in all
	FoldTime      time.Duration // time spent replaying in Fold and FoldChecked
	FoldsRejected int64         // FoldChecked calls whose check refused the folded state (the base stayed)

	// Drift is the last drift of a lossy log measured against a base
	// refresh (nil: none measured; a lossless log never drifts), and
	// DriftsMeasured how many were.
	Drift          *Drift
	DriftsMeasured int64
}

// FoldPerStep returns the mean fold time per folded step, or 0.
func (st Stats) FoldPerStep() time.Duration {
	if st.FoldedSteps == 0 {
		return 0
	}
	return st.FoldTime / time.Duration(st.FoldedSteps)
}

// Stats returns the store's sizes and counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	if st.Drift != nil {
		d := *st.Drift
		st.Drift = &d
	}
	if s.base != nil {
		for _, b := range s.base.data {
			st.BaseBytes += int64(len(b))
		}
	}
	if s.pending != nil {
		for _, r := range s.regions {
			st.RefreshBytes += r.Size
		}
		for _, e := range s.pending.log {
			st.RefreshLogBytes += e.bytes
		}
		st.RefreshLogLen = len(s.pending.log)
	}
	for _, e := range s.log {
		st.LogBytes += e.bytes
	}
	st.LogLen = len(s.log)
	for _, bs := range s.free {
		for _, b := range bs {
			st.SpareBytes += int64(len(b))
		}
	}
	for _, b := range s.retired {
		st.SpareBytes += int64(len(b))
	}
	if s.drift != nil {
		st.SpareBytes += int64(len(s.drift.old)) // the replaced base, until measured
	}
	return st
}
