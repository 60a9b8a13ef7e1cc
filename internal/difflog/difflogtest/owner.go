// Package difflogtest simulates a rank that protects its state in diff
// mode, for the tests of the differential log and of recoveries that
// replay it: an Owner steps its optimizer state with replay.Step (the
// reference Adam), keeps its true regions at every step, and gives each
// step's differential as a difflog.Record, sealed, with its regions'
// committed CRC32Cs, as a rank service builds it.
package difflogtest

import (
	"encoding/binary"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"unsafe"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// Names and sizes of the Owner's regions: "optimizer" (an 8-byte header
// that never changes, then W, M and V of N float32s each) and "meta" (64
// bytes, rewritten every step), in that order; with Params, a "params"
// region of 4N bytes after them (never in a differential: it is not
// replicated).
const (
	Optimizer = "optimizer"
	Meta      = "meta"
	Params    = "params"
	optHeader = 8
	MetaSize  = 64
)

// Owner is a simulated trainer's rank.
type Owner struct {
	N      int
	Codec  replay.Options
	Params bool // the rank has a params region too
	step   int64
	rng    *rand.Rand
	enc    replay.Encoder
	hyper  replay.Hyper
	// states are the rank's regions at each step, in Regions' order.
	states map[int64][][]byte
	recs   map[int64]*difflog.Record
}

// NewOwner returns an owner of n elements at step 0, whose Adam step
// count at step 1 is firstT (≥ 1), encoding its gradients with codec.
func NewOwner(seed uint64, n int, firstT int, codec replay.Options, params bool) *Owner {
	o := &Owner{N: n, Codec: codec, Params: params, rng: rand.New(rand.NewPCG(seed, 0xd1ff)),
		states: map[int64][][]byte{}, recs: map[int64]*difflog.Record{},
		hyper: replay.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, T: firstT - 1}}
	opt := make([]byte, o.optSize())
	for i := range optHeader {
		opt[i] = byte(0xA0 + i)
	}
	w, m, v := o.views(opt)
	for i := range n {
		w[i] = float32(o.rng.NormFloat64() * 0.1)
		m[i] = float32(o.rng.NormFloat64() * 1e-3)
		v[i] = float32(math.Abs(o.rng.NormFloat64()) * 1e-6)
	}
	st := [][]byte{opt, o.meta(0)}
	if params {
		st = append(st, slices.Clone(opt[optHeader:optHeader+4*n]))
	}
	o.states[0] = st
	return o
}

func (o *Owner) optSize() int { return optHeader + 12*o.N }

// Layout returns the owner's regions, in order, and its optimizer.
func (o *Owner) Layout() ([]diffstore.Region, diffstore.Optimizer) {
	rs := []diffstore.Region{{Name: Optimizer, Size: int64(o.optSize())}, {Name: Meta, Size: MetaSize}}
	if o.Params {
		rs = append(rs, diffstore.Region{Name: Params, Size: int64(4 * o.N)})
	}
	n := int64(o.N)
	return rs, diffstore.Optimizer{Region: Optimizer, N: n, WOff: optHeader, MOff: optHeader + 4*n, VOff: optHeader + 8*n}
}

// views returns W, M and V in optimizer region bytes b.
func (o *Owner) views(b []byte) (w, m, v []float32) {
	f := unsafe.Slice((*float32)(unsafe.Pointer(&b[optHeader])), 3*o.N)
	return f[:o.N:o.N], f[o.N : 2*o.N : 2*o.N], f[2*o.N:]
}

func (o *Owner) meta(step int64) []byte {
	b := make([]byte, MetaSize)
	copy(b, "difflogtest meta")
	binary.LittleEndian.PutUint64(b[16:], uint64(step))
	for i := 24; i < MetaSize; i++ {
		b[i] = byte(o.rng.Uint32())
	}
	return b
}

// Branch returns an owner whose history is o's up to o's newest step,
// and goes on from there with gradients of its own (drawn from seed): the
// history of a run that resumed at that step, beside o's.
func (o *Owner) Branch(seed uint64) *Owner {
	b := *o
	b.rng = rand.New(rand.NewPCG(seed, 0xd1ff))
	b.enc = replay.Encoder{}
	b.states, b.recs = maps.Clone(o.states), maps.Clone(o.recs)
	return &b
}

// Step returns the owner's newest step.
func (o *Owner) Step() int64 { return o.step }

// Advance trains k more steps.
func (o *Owner) Advance(k int) {
	for range k {
		o.advance()
	}
}

func (o *Owner) advance() {
	prev := o.states[o.step]
	s := o.step + 1
	opt := slices.Clone(prev[0])
	w, m, v := o.views(opt)
	g := make([]float32, o.N)
	for i := range g {
		g[i] = float32(o.rng.NormFloat64() * 0.01)
	}
	o.hyper.T++
	o.hyper.LR = float32(1e-3 * (1 + 0.01*float64(s%7)))
	rec, err := o.enc.AppendRecord(nil, uint64(s), 0, g, o.Codec)
	if err != nil {
		panic(err)
	}
	// The owner applies the true gradient, as a trainer does: with a
	// lossy codec a replay of the record is an approximation of it.
	replay.Step(w, m, v, g, o.hyper.Consts())
	st := [][]byte{opt, o.meta(s)}
	if o.Params {
		st = append(st, slices.Clone(opt[optHeader:optHeader+4*o.N]))
	}
	o.states[s] = st
	o.step = s
	d := diffstore.Diff{Step: s, Hyper: o.hyper, Record: rec, Other: map[string][]byte{Meta: slices.Clone(st[1])}}
	d.Seal()
	r := &difflog.Record{Diff: d, Optimizer: diffstore.Optimizer{Region: Optimizer, N: int64(o.N),
		WOff: optHeader, MOff: optHeader + 4*int64(o.N), VOff: optHeader + 8*int64(o.N)}}
	r.Regions = []difflog.Region{{Name: Optimizer, Size: int64(o.optSize()), Sum: crc32c.Checksum(st[0])},
		{Name: Meta, Size: MetaSize, Sum: crc32c.Checksum(st[1])}}
	o.recs[s] = r
}

// State returns the owner's regions at step (nil if it never was), in
// Layout's order; the caller must not change them.
func (o *Owner) State(step int64) [][]byte { return o.states[step] }

// Sums returns the CRC32Cs of the owner's regions at step.
func (o *Owner) Sums(step int64) []uint32 {
	var s []uint32
	for _, b := range o.states[step] {
		s = append(s, crc32c.Checksum(b))
	}
	return s
}

// Record returns step's differential (nil for step 0 or a step not
// trained).
func (o *Owner) Record(step int64) *difflog.Record { return o.recs[step] }

// Encoded returns step's record, encoded.
func (o *Owner) Encoded(step int64) []byte {
	b, err := difflog.Encode(nil, o.recs[step])
	if err != nil {
		panic(err)
	}
	return b
}
