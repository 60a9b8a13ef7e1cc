package diffstore

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/replay"
)

// The owner's layout in the tests: an optimizer region with an 8-byte
// header the steps never change, then W, M and V; and a 64-byte meta
// region that every step rewrites.
const (
	optName   = "optimizer"
	metaName  = "meta"
	optHeader = 8
	metaSize  = 64
	firstT    = 100 // Adam's step count at step 1: the owner started mid-training
)

// owner is a trainer simulated in the tests: one shard of n elements that
// it steps with replay.Step, the reference optimizer, from random but
// deterministic gradients and per-step hyper-parameters. It remembers its
// true state at every step.
type owner struct {
	n       int
	rng     *rand.Rand
	w, m, v []float32
	step    int64
	header  [optHeader]byte
	meta    []byte
	codec   replay.Options
	states  map[int64]map[string][]byte // the true regions at each step
	// The optimizer region's layout: W, M and V (k = 0, 1, 2) each in
	// slot pos[k] of three, a slot being 4n bytes then gap constant bytes,
	// after the header (newOwner: W, M, V in order, no gaps).
	pos [3]int
	gap int
}

// off returns the offset of W, M or V (k = 0, 1, 2) in the optimizer region.
func (o *owner) off(k int) int { return optHeader + o.pos[k]*(4*o.n+o.gap) }

// optSize returns the optimizer region's size.
func (o *owner) optSize() int { return optHeader + 3*(4*o.n+o.gap) }

// newOwner returns an owner of n elements at step 0 (its initial state),
// whose differentials use codec.
func newOwner(seed uint64, n int, codec replay.Options) *owner {
	o := &owner{n: n, rng: rand.New(rand.NewPCG(seed, 0x0b5e55ed)), codec: codec,
		w: make([]float32, n), m: make([]float32, n), v: make([]float32, n),
		meta: make([]byte, metaSize), states: map[int64]map[string][]byte{}, pos: [3]int{0, 1, 2}}
	for i := range n {
		o.w[i] = float32(o.rng.NormFloat64() * 0.1)
		o.m[i] = float32(o.rng.NormFloat64() * 1e-3)
		o.v[i] = float32(math.Abs(o.rng.NormFloat64()) * 1e-6)
	}
	for i := range o.header {
		o.header[i] = byte(0xA0 + i)
	}
	o.fillMeta()
	o.states[0] = o.regions()
	return o
}

func (o *owner) layout() ([]Region, Optimizer) {
	return []Region{{Name: metaName, Size: metaSize}, {Name: optName, Size: int64(o.optSize())}},
		Optimizer{Region: optName, N: int64(o.n), WOff: int64(o.off(0)), MOff: int64(o.off(1)), VOff: int64(o.off(2))}
}

// newStore returns an empty store for o's layout.
func (o *owner) newStore(t testing.TB) *Store {
	t.Helper()
	regions, opt := o.layout()
	s, err := New(regions, opt)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (o *owner) fillMeta() {
	binary.LittleEndian.PutUint64(o.meta, uint64(o.step))
	for i := 8; i < metaSize; i++ {
		o.meta[i] = byte(o.rng.Uint32())
	}
}

// regions returns the owner's current regions, encoded.
func (o *owner) regions() map[string][]byte {
	b := make([]byte, o.optSize())
	copy(b, o.header[:])
	for i := optHeader; i < len(b); i++ {
		b[i] = byte(i) | 0x80 // the gaps' constant bytes
	}
	for k, x := range [][]float32{o.w, o.m, o.v} {
		off := o.off(k)
		for i, f := range x {
			binary.LittleEndian.PutUint32(b[off+4*i:], math.Float32bits(f))
		}
	}
	return map[string][]byte{optName: b, metaName: bytes.Clone(o.meta)}
}

// hyper returns the hyper-parameters of step s: a changing learning rate,
// weight decay on most steps.
func (o *owner) hyper(s int64) replay.Hyper {
	h := replay.Hyper{LR: float32(1e-3 * (1 + 0.5*math.Sin(float64(s)/3))), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: firstT + int(s) - 1}
	if s%4 != 0 {
		h.WeightDecay = float32(0.01 * float64(1+s%3))
	}
	return h
}

// next runs the owner's next step and returns its differential.
func (o *owner) next(t testing.TB) Diff {
	t.Helper()
	o.step++
	g := make([]float32, o.n)
	scale := math.Pow(10, -4+4*o.rng.Float64())
	for i := range g {
		switch r := o.rng.IntN(100); {
		case r < 3:
			g[i] = 0
		case r < 4:
			g[i] = float32(o.rng.NormFloat64() * scale * 100)
		default:
			g[i] = float32(o.rng.NormFloat64() * scale)
		}
	}
	h := o.hyper(o.step)
	replay.Step(o.w, o.m, o.v, g, h.Consts())
	o.fillMeta()
	o.states[o.step] = o.regions()
	d := Diff{Step: o.step, Hyper: h, Record: encode(t, o.step, g, o.codec), Other: map[string][]byte{metaName: bytes.Clone(o.meta)}}
	d.Seal()
	return d
}

// encode returns the record of step holding g, compressed with codec.
func encode(t testing.TB, step int64, g []float32, codec replay.Options) []byte {
	t.Helper()
	tn, err := replay.Compress(0, g, codec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&replay.Record{Step: uint64(step), Tensors: []*replay.Tensor{tn}}).AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var lossless = replay.Options{Lossless: true}

// sums returns the CRC32C of every region, as an owner commits them.
func sums(regions map[string][]byte) map[string]uint32 {
	m := make(map[string]uint32, len(regions))
	for name, b := range regions {
		m[name] = crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))
	}
	return m
}

// chunk is one piece of a base refresh.
type chunk struct {
	region string
	off    int64
	b      []byte
}

// chunks cuts regions into pieces of random sizes, in a random order.
func chunks(rng *rand.Rand, regions map[string][]byte) []chunk {
	var cs []chunk
	for _, name := range []string{optName, metaName} {
		b := regions[name]
		for off := 0; off < len(b); {
			n := min(len(b)-off, 1+rng.IntN(len(b)/3+1))
			cs = append(cs, chunk{name, int64(off), b[off : off+n]})
			off += n
		}
	}
	rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	return cs
}

// sendBase sends a whole base refresh of the owner's state at step and
// commits it.
func sendBase(t testing.TB, s *Store, o *owner, step int64) {
	t.Helper()
	w, err := s.BeginBase(step)
	if err != nil {
		t.Fatal(err)
	}
	st := o.states[step]
	writeChunks(t, w, st, 1)
	if err := w.Commit(step, sums(st)); err != nil {
		t.Fatal(err)
	}
}

// writeChunks writes regions into refresh w in chunks cut and ordered
// by seed (with the refresh's step).
func writeChunks(t testing.TB, w *BaseWriter, regions map[string][]byte, seed uint64) {
	t.Helper()
	for _, c := range chunks(rand.New(rand.NewPCG(uint64(w.Step()), seed)), regions) {
		if err := w.Write(c.region, c.off, c.b); err != nil {
			t.Fatal(err)
		}
	}
}

// restore returns the store's restore of step.
func restore(s *Store, step int64, opt replay.ReplayOptions) (map[string][]byte, error) {
	dst := map[string][]byte{}
	for _, r := range s.regions {
		dst[r.Name] = make([]byte, r.Size)
	}
	return dst, s.Restore(step, dst, opt)
}

// checkRestore checks that the store restores step as the owner's true
// state, bit for bit.
func checkRestore(t testing.TB, s *Store, o *owner, step int64, opt replay.ReplayOptions) {
	t.Helper()
	got, err := restore(s, step, opt)
	if err != nil {
		t.Fatalf("restore of step %d: %v", step, err)
	}
	for name, want := range o.states[step] {
		if !bytes.Equal(got[name], want) {
			t.Fatalf("restore of step %d: region %q differs from the owner's (first at byte %d)", step, name, firstDiff(got[name], want))
		}
	}
	checkPieces(t, s, step, 4+int(step*37%3000), opt, got)
}

// checkRange checks Range and every step in it.
func checkRange(t testing.TB, s *Store, o *owner, first, last int64, opt replay.ReplayOptions) {
	t.Helper()
	f, l, ok := s.Range()
	if !ok || f != first || l != last {
		t.Fatalf("Range = %d, %d, %v; want %d, %d, true", f, l, ok, first, last)
	}
	for step := first; step <= last; step++ {
		checkRestore(t, s, o, step, opt)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// rewind puts the owner back to its state at step (it restarted from
// there); its next gradients differ from those it took the first time.
func (o *owner) rewind(step int64) {
	st := o.states[step]
	for k, x := range [][]float32{o.w, o.m, o.v} {
		off := o.off(k)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(st[optName][off+4*i:]))
		}
	}
	copy(o.meta, st[metaName])
	o.step = step
	for s := range o.states {
		if s > step {
			delete(o.states, s)
		}
	}
	o.rng.Uint64()
}
