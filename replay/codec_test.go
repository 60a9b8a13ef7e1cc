package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Test data. Every generator is deterministic in its seed.

type dist struct {
	name string
	fill func(x []float32, rng *rand.Rand)
}

var (
	normalDist = dist{"normal", func(x []float32, rng *rand.Rand) {
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 1e-3)
		}
	}}
	// cauchyDist is heavy-tailed: no mean, no variance.
	cauchyDist = dist{"cauchy", func(x []float32, rng *rand.Rand) {
		for i := range x {
			x[i] = float32(math.Tan(math.Pi * (rng.Float64() - 0.5)))
		}
	}}
	equalDist = dist{"all-equal", func(x []float32, rng *rand.Rand) {
		for i := range x {
			x[i] = 0.25
		}
	}}
	// spikesDist is structured: every 64th entry is a spike of magnitude
	// 3 to about 10 (1.6% of the entries, so that K = 0.01 keeps the
	// larger spikes), the others small noise. A sample on a fixed stride
	// would alias with it.
	spikesDist = dist{"spikes", func(x []float32, rng *rand.Rand) {
		for i := range x {
			if i%64 == 0 {
				x[i] = float32(3 * (1 + math.Abs(rng.NormFloat64())))
			} else {
				x[i] = float32(rng.NormFloat64() * 0.01)
			}
		}
	}}
	// mixedDist has every awkward value: zeros of both signs, subnormals,
	// huge values beyond fp16, non-finite values, with ordinary noise.
	mixedDist = dist{"mixed", func(x []float32, rng *rand.Rand) {
		specials := []float32{
			0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -1e-40, 1e-8,
			70000, -1e6, math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)),
			math.Float32frombits(0x7fc00000), math.Float32frombits(0xff812345), math.Float32frombits(0x7f800001),
		}
		for i := range x {
			if rng.IntN(50) == 0 {
				x[i] = specials[rng.IntN(len(specials))]
			} else {
				x[i] = float32(rng.NormFloat64())
			}
		}
	}}
)

func genData(d dist, n int, seed uint64) []float32 {
	x := make([]float32, n)
	d.fill(x, rand.New(rand.NewPCG(seed, uint64(n))))
	return x
}

func decompressed(t testing.TB, tn *Tensor) []float32 {
	t.Helper()
	out := make([]float32, tn.Len)
	if err := tn.Decompress(out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustCompress(t testing.TB, id uint32, x []float32, opt Options) *Tensor {
	t.Helper()
	tn, err := Compress(id, x, opt)
	if err != nil {
		t.Fatal(err)
	}
	return tn
}

func sampleSize(n int, k float64) int {
	m, _ := topkSampleSize(n, k)
	return m
}

func absKey(v float32) uint32 { return math.Float32bits(v) & 0x7fffffff }

func TestCodecString(t *testing.T) {
	for c, want := range map[Codec]string{Raw: "raw", Int8: "int8", TopK: "topk", 0: "Codec(0)", 9: "Codec(9)"} {
		if got := c.String(); got != want {
			t.Errorf("Codec(%d).String() = %q, want %q", uint8(c), got, want)
		}
	}
}

func TestOptions(t *testing.T) {
	x := genData(normalDist, 1000, 1)
	for _, opt := range []Options{
		{K: -0.1}, {K: 1.5}, {K: math.NaN()}, {K: math.Inf(1)}, {Threshold: -1},
		{BlockSize: -1}, {BlockSize: maxBlockSize + 1}, {Lossless: true, K: 2},
	} {
		if tn, err := Compress(1, x, opt); err == nil || tn != nil {
			t.Errorf("Compress with %+v: %v, %v; want an error", opt, tn, err)
		}
		tn := mustCompress(t, 5, x, Options{})
		if err := CompressInto(tn, 6, x[:10], opt); err == nil || tn.ID != 5 || tn.Len != 1000 {
			t.Errorf("CompressInto with %+v: error %v, tensor %d of %d; want an error and the tensor unchanged", opt, err, tn.ID, tn.Len)
		}
	}
	for _, tc := range []struct {
		n    int
		opt  Options
		want Codec
	}{
		{0, Options{}, Int8},
		{99_999, Options{}, Int8},
		{100_000, Options{}, TopK},
		{100_000, Options{Lossless: true}, Raw},
		{10, Options{Threshold: 10}, TopK},
		{9, Options{Threshold: 10}, Int8},
		{5, Options{K: 1, BlockSize: 1}, Int8},
	} {
		tn := mustCompress(t, 1, genData(normalDist, tc.n, 2), tc.opt)
		if tn.Codec != tc.want || tn.Len != tc.n {
			t.Errorf("%d elements with %+v: %v of %d, want %v", tc.n, tc.opt, tn.Codec, tn.Len, tc.want)
		}
	}
	tn := mustCompress(t, 1, genData(normalDist, 1000, 2), Options{BlockSize: 0})
	if tn.blockSize != defaultBlockSize {
		t.Errorf("default block size %d, want %d", tn.blockSize, defaultBlockSize)
	}
}

// checkRaw: bit for bit.
func checkRaw(t *testing.T, x []float32, tn *Tensor) {
	t.Helper()
	got := decompressed(t, tn)
	for i := range x {
		if math.Float32bits(got[i]) != math.Float32bits(x[i]) {
			t.Fatalf("raw element %d: %#08x, want %#08x", i, math.Float32bits(got[i]), math.Float32bits(x[i]))
		}
	}
	if tn.PayloadBytes() != 4*len(x) || tn.Kept() != len(x) {
		t.Fatalf("raw: payload %d bytes, kept %d", tn.PayloadBytes(), tn.Kept())
	}
}

// checkInt8: each block's scale is its finite maxabs/127, and each finite
// element is within scale/2 (plus the roundings of x/scale and q·scale,
// and the granularity of subnormals); non-finite ones decode as NaN.
func checkInt8(t *testing.T, x []float32, tn *Tensor, bs int) {
	t.Helper()
	got := decompressed(t, tn)
	if tn.blockSize != bs || len(tn.scales) != ceilDiv(len(x), bs) {
		t.Fatalf("int8: block size %d with %d scales for %d elements, want %d", tn.blockSize, len(tn.scales), len(x), bs)
	}
	for b, scale := range tn.scales {
		blk := x[b*bs : min((b+1)*bs, len(x))]
		m := float32(0)
		for _, v := range blk {
			if !math.IsInf(float64(v), 0) && v == v {
				m = max(m, float32(math.Abs(float64(v))))
			}
		}
		want := m / 127
		if 127*want > math.MaxFloat32 {
			want = math.Nextafter32(want, 0)
		}
		if scale != want {
			t.Fatalf("int8 block %d: scale %v, want %v", b, scale, want)
		}
		for i, v := range blk {
			g := got[b*bs+i]
			if math.IsInf(float64(v), 0) || v != v {
				if g == g {
					t.Fatalf("int8 element %d: non-finite %v decoded as %v, want NaN", b*bs+i, v, g)
				}
				continue
			}
			d := math.Abs(float64(v) - float64(g))
			bound := float64(scale)/2*(1+1e-6) + math.Abs(float64(v))*1e-6 + 0x1p-149*256
			if d > bound {
				t.Fatalf("int8 element %d: %v decoded as %v (error %g > %g, scale %g)", b*bs+i, v, g, d, bound, scale)
			}
		}
	}
	if want := align8(4*len(tn.scales)) + len(x); tn.PayloadBytes() != want || tn.Kept() != len(x) {
		t.Fatalf("int8: payload %d bytes (want %d), kept %d", tn.PayloadBytes(), want, tn.Kept())
	}
}

// checkTopK: indices ascending and within their chunks; every kept
// entry is exactly fp16(x) at its index and at or above the threshold;
// every dropped entry is at or below it, and zero once decoded; the kept
// count is exact when the whole tensor was the sample, within ±10%
// otherwise.
func checkTopK(t *testing.T, x []float32, tn *Tensor, k float64) {
	t.Helper()
	got := decompressed(t, tn)
	kept := make([]bool, len(x))
	for ci, c := range tn.chunks {
		end := len(x)
		if ci+1 < len(tn.chunks) {
			end = tn.chunks[ci+1].base
		}
		prev := -1
		for j := c.start; j < c.start+c.count; j++ {
			i := int(tn.idx[j])
			if i <= prev || c.base+i >= end {
				t.Fatalf("topk chunk %d: index %d after %d, chunk [%d, %d)", ci, i, prev, c.base, end)
			}
			prev = i
			g := c.base + i
			kept[g] = true
			if want := f32ToF16(x[g]); tn.vals[j] != want {
				t.Fatalf("topk element %d: stored %#04x, want fp16(%v) = %#04x", g, tn.vals[j], x[g], want)
			}
			if math.Float32bits(got[g]) != math.Float32bits(f16ToF32(tn.vals[j])) {
				t.Fatalf("topk element %d: decoded %v, want %v", g, got[g], f16ToF32(tn.vals[j]))
			}
			if absKey(x[g]) < tn.thr || absKey(x[g]) == 0 {
				t.Fatalf("topk element %d = %v kept, below the threshold %v", g, x[g], math.Float32frombits(tn.thr))
			}
		}
	}
	zeros := 0
	for i, v := range x {
		if absKey(v) == 0 {
			zeros++
		}
		if kept[i] {
			continue
		}
		if absKey(v) > tn.thr {
			t.Fatalf("topk element %d = %v dropped, above the threshold %v", i, v, math.Float32frombits(tn.thr))
		}
		if got[i] != 0 || math.Signbit(float64(got[i])) {
			t.Fatalf("topk element %d dropped but decoded as %v", i, got[i])
		}
	}
	target := 0
	if len(x) > 0 {
		target = topkTarget(len(x), k)
	}
	n := tn.Kept()
	switch {
	case sampleSize(len(x), k) == len(x):
		if want := min(target, len(x)-zeros); n != want {
			t.Fatalf("topk of %d elements kept %d, want exactly %d", len(x), n, want)
		}
	case math.Abs(float64(n-target)) > 0.1*float64(target):
		t.Fatalf("topk of %d elements kept %d, want %d ± 10%%", len(x), n, target)
	}
	if want := 16*len(tn.chunks) + align8(4*n) + 2*n; tn.PayloadBytes() != want {
		t.Fatalf("topk: payload %d bytes, want %d", tn.PayloadBytes(), want)
	}
}

// checkTensor checks tn against x for its codec, and that the tensor
// survives a record round trip bit for bit.
func checkTensor(t *testing.T, x []float32, tn *Tensor, opt Options) {
	t.Helper()
	p, err := opt.params()
	if err != nil {
		t.Fatal(err)
	}
	if tn.Len != len(x) {
		t.Fatalf("Len %d, want %d", tn.Len, len(x))
	}
	switch tn.Codec {
	case Raw:
		checkRaw(t, x, tn)
	case Int8:
		checkInt8(t, x, tn, p.blockSize)
	case TopK:
		checkTopK(t, x, tn, p.k)
	default:
		t.Fatalf("codec %v", tn.Codec)
	}
	b, err := (&Record{Step: 3, Tensors: []*Tensor{tn}}).AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	d := r.Tensors[0]
	if d.ID != tn.ID || d.Codec != tn.Codec || d.Len != tn.Len || d.Kept() != tn.Kept() || d.PayloadBytes() != tn.PayloadBytes() {
		t.Fatalf("through a record: %d %v %d kept %d (%d bytes), want %d %v %d kept %d (%d bytes)",
			d.ID, d.Codec, d.Len, d.Kept(), d.PayloadBytes(), tn.ID, tn.Codec, tn.Len, tn.Kept(), tn.PayloadBytes())
	}
	want, got := decompressed(t, tn), decompressed(t, d)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("through a record, element %d: %#08x, want %#08x", i, math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
}

// TestRoundTrip runs every codec over every size class, on ordinary and
// awkward data; "auto" lets the size choose between Int8 and TopK.
func TestRoundTrip(t *testing.T) {
	const bs, thr = 256, 100_000
	sizes := []int{0, 1, 2, bs - 1, bs, bs + 1, 4097, thr - 1, thr, thr + 1, 1<<20 + 3}
	modes := []struct {
		name string
		opt  Options
	}{
		{"raw", Options{Lossless: true}},
		{"int8", Options{Threshold: math.MaxInt}},
		{"int8-bs100", Options{Threshold: math.MaxInt, BlockSize: 100}},
		{"topk", Options{Threshold: 1}},
		{"topk-k0.1", Options{Threshold: 1, K: 0.1, Seed: 5}},
		{"topk-k1", Options{Threshold: 1, K: 1}},
		{"auto", Options{}},
	}
	for _, d := range []dist{normalDist, mixedDist} {
		for _, n := range sizes {
			x := genData(d, n, uint64(n)+7)
			for _, m := range modes {
				if testing.Short() && n > thr+1 && m.name != "auto" {
					continue
				}
				t.Run(fmt.Sprintf("%s/%d/%s", d.name, n, m.name), func(t *testing.T) {
					tn := mustCompress(t, 42, x, m.opt)
					if tn.ID != 42 {
						t.Fatalf("ID %d", tn.ID)
					}
					if m.name == "auto" {
						want := Int8
						if n >= thr {
							want = TopK
						}
						if tn.Codec != want {
							t.Fatalf("codec %v, want %v", tn.Codec, want)
						}
					}
					checkTensor(t, x, tn, m.opt)
				})
			}
		}
	}
}

// TestRawSpecials: Raw keeps NaN payloads, -0, infinities and subnormals.
func TestRawSpecials(t *testing.T) {
	bits := []uint32{0x7fc00000, 0x7f800001, 0xffbfffff, 0x7fc12345, 0x80000000, 0, 0x7f800000, 0xff800000, 1, 0x807fffff, 0x7f7fffff}
	x := make([]float32, len(bits))
	for i, b := range bits {
		x[i] = math.Float32frombits(b)
	}
	checkTensor(t, x, mustCompress(t, 1, x, Options{Lossless: true}), Options{Lossless: true})
}

// TestInt8Specials pins down the documented edge cases of Int8.
func TestInt8Specials(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, tc := range []struct {
		name      string
		x         []float32
		wantScale []float32
		want      []float32 // NaN means any NaN
	}{
		{"zeros", []float32{0, float32(math.Copysign(0, -1)), 0}, []float32{0}, []float32{0, 0, 0}},
		{"ties", []float32{127, 0.5, 1.5, 2.5, -0.5, -2.5}, []float32{1}, []float32{127, 0, 2, 2, 0, -2}},
		{"non-finite", []float32{inf, -inf, nan, 12.7, -1.27}, []float32{0.1}, []float32{nan, nan, nan, 12.7, -1.3000001}},
		{"only non-finite", []float32{inf, nan}, []float32{0}, []float32{nan, nan}},
		{"huge", []float32{math.MaxFloat32, -math.MaxFloat32, 1}, []float32{math.Nextafter32(math.MaxFloat32/127, 0)}, []float32{127 * math.Nextafter32(math.MaxFloat32/127, 0), -127 * math.Nextafter32(math.MaxFloat32/127, 0), 0}},
		{"tiny", []float32{math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32}, []float32{0}, []float32{0, 0}},
		{"two blocks", []float32{1, 2, 3, 4, 1000, -500}, []float32{4.0 / 127, 1000.0 / 127}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := Options{Threshold: math.MaxInt, BlockSize: 4}
			if tc.name != "two blocks" {
				opt.BlockSize = len(tc.x)
			}
			tn := mustCompress(t, 1, tc.x, opt)
			for i, s := range tc.wantScale {
				if tn.scales[i] != s {
					t.Errorf("scale %d = %v, want %v", i, tn.scales[i], s)
				}
			}
			got := decompressed(t, tn)
			for i, w := range tc.want {
				if w != w {
					if got[i] == got[i] || math.Float32bits(got[i]) != q8NaN {
						t.Errorf("element %d (%v) decoded as %v, want NaN %#08x", i, tc.x[i], got[i], q8NaN)
					}
				} else if got[i] != w {
					t.Errorf("element %d (%v) decoded as %v, want %v", i, tc.x[i], got[i], w)
				}
			}
			checkTensor(t, tc.x, tn, opt)
		})
	}
}

// withMaxChunk lowers maxChunk for one test.
func withMaxChunk(t *testing.T, n int) {
	old := maxChunk
	maxChunk = n
	t.Cleanup(func() { maxChunk = old })
}

// TestExpandRange compares ExpandRange with Decompress over random
// ranges, ranges straddling Int8 blocks and TopK chunks, and the edges.
func TestExpandRange(t *testing.T) {
	withMaxChunk(t, 1000)
	rng := rand.New(rand.NewPCG(4, 4))
	for _, tc := range []struct {
		name string
		n    int
		opt  Options
	}{
		{"raw", 5000, Options{Lossless: true}},
		{"int8", 5000, Options{Threshold: math.MaxInt}},
		{"int8-bs7", 5000, Options{Threshold: math.MaxInt, BlockSize: 7}},
		{"int8-bs1", 300, Options{Threshold: math.MaxInt, BlockSize: 1}},
		{"topk", 10_500, Options{Threshold: 1, K: 0.05}},
		{"topk-dense", 3000, Options{Threshold: 1, K: 1}},
		{"topk-empty-chunks", 5000, Options{Threshold: 1, K: 0.0001}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := genData(mixedDist, tc.n, 11)
			tn := mustCompress(t, 1, x, tc.opt)
			want := decompressed(t, tn)
			try := func(lo, hi int) {
				dst := make([]float32, hi-lo+1)
				dst[hi-lo] = 12345 // must stay
				for i := range dst[:hi-lo] {
					dst[i] = -999 // must be overwritten
				}
				tn.ExpandRange(dst[:hi-lo], lo)
				for i := lo; i < hi; i++ {
					if math.Float32bits(dst[i-lo]) != math.Float32bits(want[i]) {
						t.Fatalf("ExpandRange [%d, %d): element %d = %v, want %v", lo, hi, i, dst[i-lo], want[i])
					}
				}
				if dst[hi-lo] != 12345 {
					t.Fatalf("ExpandRange [%d, %d) wrote past its end", lo, hi)
				}
			}
			try(0, tn.Len)
			try(0, 0)
			try(tn.Len, tn.Len)
			try(tn.Len-1, tn.Len)
			for _, edge := range []int{7, 256, 1000, 2000, 3000} {
				for d := -3; d <= 3; d++ {
					for _, w := range []int{1, 2, 5, 300, 1500} {
						if lo := edge + d; lo >= 0 && lo+w <= tn.Len {
							try(lo, lo+w)
						}
					}
				}
			}
			for range 500 {
				lo := rng.IntN(tn.Len + 1)
				try(lo, lo+rng.IntN(tn.Len-lo+1))
			}
			// Consecutive blocks, as the fused replay calls it.
			for _, blk := range []int{1, 64, 2048} {
				got := make([]float32, tn.Len)
				for lo := 0; lo < tn.Len; lo += blk {
					tn.ExpandRange(got[lo:min(lo+blk, tn.Len)], lo)
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("blocks of %d: element %d = %v, want %v", blk, i, got[i], want[i])
					}
				}
			}
			for _, r := range [][2]int{{-1, 0}, {0, tn.Len + 1}, {tn.Len, tn.Len + 1}, {tn.Len + 1, tn.Len + 1}} {
				func() {
					defer func() {
						if e := recover(); e == nil || !strings.Contains(fmt.Sprint(e), "outside") {
							t.Errorf("ExpandRange [%d, %d): panic %v, want one about the range", r[0], r[1], e)
						}
					}()
					tn.ExpandRange(make([]float32, r[1]-r[0]), r[0])
				}()
			}
			if err := tn.Decompress(make([]float32, tn.Len+1)); err == nil {
				t.Error("Decompress into a wrong length succeeded")
			}
		})
	}
}

// TestCompressIntoReuse: CompressInto over a tensor of another codec, or
// over one decoded from a record (whose bytes it must not write), gives
// the same result as Compress.
func TestCompressIntoReuse(t *testing.T) {
	x1 := genData(normalDist, 200_000, 1)
	x2 := genData(mixedDist, 150_000, 2)
	opts := []Options{{Lossless: true}, {Threshold: math.MaxInt}, {}, {K: 0.1}}
	enc := func(tn *Tensor) []byte {
		b, err := (&Record{Tensors: []*Tensor{tn}}).AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var tn Tensor
	for _, o1 := range opts {
		for _, o2 := range opts {
			if err := CompressInto(&tn, 1, x1, o1); err != nil {
				t.Fatal(err)
			}
			if err := CompressInto(&tn, 2, x2, o2); err != nil {
				t.Fatal(err)
			}
			if got, want := enc(&tn), enc(mustCompress(t, 2, x2, o2)); string(got) != string(want) {
				t.Fatalf("CompressInto %+v after %+v differs from Compress", o2, o1)
			}
		}
	}
	b := enc(mustCompress(t, 1, x1, Options{Lossless: true}))
	keep := string(b)
	r, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := CompressInto(r.Tensors[0], 3, x2, Options{Lossless: true}); err != nil {
		t.Fatal(err)
	}
	if string(b) != keep {
		t.Fatal("CompressInto wrote into a decoded record's bytes")
	}
	checkRaw(t, x2, r.Tensors[0])
}
