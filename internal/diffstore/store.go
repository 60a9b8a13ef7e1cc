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
