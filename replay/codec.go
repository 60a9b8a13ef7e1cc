package replay

import (
	"fmt"
	"math"
	"strconv"
)

// Codec says how a tensor's values are encoded.
type Codec uint8

const (
	// Raw is lossless: the float32 values, bit for bit (NaN payloads,
	// infinities and -0 included).
	Raw Codec = 1
	// Int8 is dense: one int8 per element and one float32 scale per block
	// of BlockSize elements. Per block, scale = maxabs/127 over the
	// block's finite values (one ulp less in the one case where 127·scale
	// would overflow: maxabs within an ulp of math.MaxFloat32), and
	// q = round-half-to-even(x/scale) clamped to [-127, 127]; it decodes
	// as x' = float32(q)·scale, so |x - x'| <= scale/2 up to the roundings
	// of x/scale and q·scale. A block whose finite values are all zero (or
	// so small that maxabs/127 underflows to 0) has scale 0 and q = 0. A
	// non-finite x (±Inf or NaN) is stored as q = -128, which decodes to
	// NaN (0x7FC00000) and does not disturb the scale of the block's
	// finite values; use Raw (Options.Lossless) to keep non-finite values
	// exactly.
	Int8 Codec = 2
	// TopK is sparse: the entries of largest magnitude, ceil(K·Len) ±10%
	// of them, as fp16 values (IEEE binary16, round to nearest even,
	// overflowing to ±Inf beyond 65504) and int32 indices; the dropped
	// entries decode as +0. Compress estimates the magnitude threshold
	// from a jittered-stride sample of at least 2048/K entries (seeded by
	// Options.Seed; the whole tensor when that is half of it or more,
	// which makes the count exact) with a linear-time radix selection,
	// then makes one pass over the tensor keeping the entries above the
	// threshold, and those equal to it while a tie budget lasts (the
	// estimated shortfall), so that tensors of many equal values keep
	// about ceil(K·Len) too. Magnitudes are compared as the float32 bit
	// patterns with the sign cleared, which orders finite values by |x|,
	// then +Inf, then NaNs: non-finite values are the largest and are kept
	// first (a NaN stays a NaN, ±Inf stays ±Inf). Zeros are never kept.
	// Tensors of more than math.MaxInt32 elements are cut into chunks,
	// each with its base offset and its indices relative to it.
	TopK Codec = 3
)

// String returns "raw", "int8", "topk", or "Codec(n)" for another value.
func (c Codec) String() string {
	switch c {
	case Raw:
		return "raw"
	case Int8:
		return "int8"
	case TopK:
		return "topk"
	}
	return "Codec(" + strconv.Itoa(int(c)) + ")"
}

// Options choose the codec and its parameters. The zero value means the
// defaults: Int8 below 100 000 elements, TopK with K = 0.01 above
// (TierCheck §3.2, §5.1).
type Options struct {
	Lossless  bool    // always Raw
	Threshold int     // tensors with fewer elements get Int8, others TopK; 0 = 100_000
	K         float64 // fraction of entries TopK keeps; 0 = 0.01; must be in (0, 1]
	BlockSize int     // Int8 block; 0 = 256; at most 1<<30
	Seed      uint64  // seeds TopK's sampling: same input + same seed = same output
}

const (
	defaultThreshold = 100_000
	defaultK         = 0.01
	defaultBlockSize = 256
	maxBlockSize     = 1 << 30
)

// maxChunk is the most elements one TopK chunk covers: its int32 indices
// must reach them all. Tests lower it to exercise chunking.
var maxChunk = math.MaxInt32

// codecParams are Options resolved: defaults applied, values checked.
type codecParams struct {
	lossless  bool
	threshold int
	k         float64
	blockSize int
	seed      uint64
}

func (o Options) params() (codecParams, error) {
	p := codecParams{lossless: o.Lossless, threshold: o.Threshold, k: o.K, blockSize: o.BlockSize, seed: o.Seed}
	switch {
	case o.Threshold < 0:
		return p, fmt.Errorf("replay: Options.Threshold = %d, must be >= 0", o.Threshold)
	case o.Threshold == 0:
		p.threshold = defaultThreshold
	}
	switch {
	case o.K == 0:
		p.k = defaultK
	case !(o.K > 0 && o.K <= 1): // NaN included
		return p, fmt.Errorf("replay: Options.K = %v, must be in (0, 1]", o.K)
	}
	switch {
	case o.BlockSize == 0:
		p.blockSize = defaultBlockSize
	case o.BlockSize < 0 || o.BlockSize > maxBlockSize:
		return p, fmt.Errorf("replay: Options.BlockSize = %d, must be in [1, %d]", o.BlockSize, maxBlockSize)
	}
	return p, nil
}

// Tensor is one compressed tensor. Its payload may be a view into a
// decoded record's bytes (no copy). ID may be changed freely; Codec and
// Len describe the payload and must not be.
//
// A Tensor is safe for concurrent reads (Decompress, ExpandRange,
// encoding); CompressInto must not run concurrently with anything else on
// the same Tensor.
type Tensor struct {
	ID    uint32
	Codec Codec
	Len   int // elements of the dense tensor

	raw []float32 // Raw: the values

	blockSize int       // Int8: elements per block
	scales    []float32 // Int8: one per block
	q         []int8    // Int8: one per element

	chunks []topkChunk // TopK: the chunks, by ascending base
	idx    []int32     // TopK: chunk by chunk, ascending indices relative to the chunk's base
	vals   []uint16    // TopK: the fp16 values, parallel to idx

	thr  uint32 // TopK from Compress: the magnitude key (|x|'s bits) it used as threshold; not encoded
	view bool   // the payload slices view a decoded record's bytes: never write them
}

// topkChunk is one chunk of a TopK tensor: elements [base, next chunk's
// base or Len), whose entries are idx[start:start+count] (and vals).
type topkChunk struct {
	base, start, count int
}

// Compress encodes x with the codec opt chooses for its length. It
// returns an error only for bad Options.
func Compress(id uint32, x []float32, opt Options) (*Tensor, error) {
	t := new(Tensor)
	if err := CompressInto(t, id, x, opt); err != nil {
		return nil, err
	}
	return t, nil
}

// CompressInto is Compress reusing t's buffers (for the per-step path: no
// allocation in steady state). If t came from DecodeRecord, its payload
// (a view into the record's bytes) is left alone and new buffers are
// allocated. On error t is unchanged.
func CompressInto(t *Tensor, id uint32, x []float32, opt Options) error {
	p, err := opt.params()
	if err != nil {
		return err
	}
	if t.view {
		*t = Tensor{}
	}
	n := len(x)
	t.ID, t.Len, t.thr = id, n, 0
	t.raw, t.scales, t.q = t.raw[:0], t.scales[:0], t.q[:0]
	t.chunks, t.idx, t.vals = t.chunks[:0], t.idx[:0], t.vals[:0]
	switch {
	case p.lossless:
		t.Codec = Raw
		t.raw = resize(t.raw, n)
		copy(t.raw, x)
	case n < p.threshold:
		t.Codec = Int8
		t.blockSize = p.blockSize
		t.scales = resize(t.scales, ceilDiv(n, p.blockSize))
		t.q = resize(t.q, n)
		codecKernels.quantize(x, p.blockSize, t.scales, t.q)
	default:
		t.Codec = TopK
		t.compressTopK(x, p)
	}
	return nil
}

// resize returns s with length n, reusing its array if it is large enough
// (the contents are then garbage to overwrite).
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Decompress writes the dense values into dst, whose length must be t.Len.
func (t *Tensor) Decompress(dst []float32) error {
	if len(dst) != t.Len {
		return fmt.Errorf("replay: Decompress into %d elements, tensor %d has %d", len(dst), t.ID, t.Len)
	}
	switch t.Codec {
	case Raw, Int8, TopK:
	default:
		return fmt.Errorf("replay: Decompress of tensor %d: unknown codec %v", t.ID, t.Codec)
	}
	t.ExpandRange(dst, 0)
	return nil
}

// ExpandRange writes the dense values of elements [lo, lo+len(dst)) into
// dst (zeros where TopK kept nothing). It is meant to be called for
// consecutive blocks of a few thousand elements: TopK finds the first
// index >= lo by binary search and scatters the entries up to the end of
// the range; Int8 dequantizes the blocks the range covers (lo and
// len(dst) need not be aligned to them). It panics if the range is not
// within [0, t.Len).
func (t *Tensor) ExpandRange(dst []float32, lo int) {
	if lo < 0 || len(dst) > t.Len-lo {
		panic(fmt.Sprintf("replay: ExpandRange of [%d, %d) outside tensor %d's [0, %d)", lo, lo+len(dst), t.ID, t.Len))
	}
	if len(dst) == 0 {
		return
	}
	switch t.Codec {
	case Raw:
		copy(dst, t.raw[lo:])
	case Int8:
		t.expandInt8(dst, lo)
	case TopK:
		t.expandTopK(dst, lo)
	default:
		clear(dst)
	}
}

func (t *Tensor) expandInt8(dst []float32, lo int) {
	bs := t.blockSize
	dq := codecKernels.dequantize
	for len(dst) > 0 {
		b := lo / bs
		n := min((b+1)*bs-lo, len(dst))
		dq(dst[:n], t.q[lo:lo+n], t.scales[b])
		dst, lo = dst[n:], lo+n
	}
}

func (t *Tensor) expandTopK(dst []float32, lo int) {
	clear(dst)
	t.scatterTopK(dst, lo, nil, false)
}

// scatterTopK writes the kept entries of [lo, lo+len(dst)) into dst, which
// it leaves alone elsewhere (expandTopK clears it first). With record, it
// appends their offsets in dst to touched, so that the fused replay can
// zero its scratch again instead of clearing the whole range. t must be
// TopK. Values are written as bits: integer code only, which no AVX state
// slows down.
func (t *Tensor) scatterTopK(dst []float32, lo int, touched []int32, record bool) []int32 {
	out := f32bits(dst)
	hi := lo + len(dst)
	// The last chunk whose base is <= lo (the first has base 0).
	c0, c1 := 0, len(t.chunks)
	for c1-c0 > 1 {
		mid := int(uint(c0+c1) >> 1)
		if t.chunks[mid].base <= lo {
			c0 = mid
		} else {
			c1 = mid
		}
	}
	for ci := c0; ci < len(t.chunks) && t.chunks[ci].base < hi; ci++ {
		c := t.chunks[ci]
		idx := t.idx[c.start : c.start+c.count]
		vals := t.vals[c.start : c.start+c.count]
		skip := max(lo-c.base, 0)
		end := hi - c.base
		off := c.base - lo
		for j := searchInt32(idx, skip); j < len(idx) && int(idx[j]) < end; j++ {
			o := off + int(idx[j])
			out[o] = f16ToF32Bits(vals[j])
			if record {
				touched = append(touched, int32(o))
			}
		}
	}
	return touched
}

// searchInt32 returns the first i with a[i] >= x (len(a) if none); a is
// ascending.
func searchInt32(a []int32, x int) int {
	lo, hi := 0, len(a)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if int(a[mid]) < x {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// PayloadBytes returns the bytes of the encoded payload, as the record
// stores it: Raw 4·Len; Int8 4·blocks (padded to 8) + Len; TopK 16 per
// chunk + 4·kept (padded to 8) + 2·kept.
func (t *Tensor) PayloadBytes() int {
	switch t.Codec {
	case Raw:
		return 4 * len(t.raw)
	case Int8:
		return align8(4*len(t.scales)) + len(t.q)
	case TopK:
		return 16*len(t.chunks) + align8(4*len(t.idx)) + 2*len(t.vals)
	}
	return 0
}

// Kept returns the entries TopK kept, or Len for the dense codecs.
func (t *Tensor) Kept() int {
	if t.Codec == TopK {
		return len(t.idx)
	}
	return t.Len
}

func align8(n int) int { return (n + 7) &^ 7 }

// The Int8 codec.

const (
	q8NonFinite = -128              // the q of a non-finite input
	q8NaN       = 0x7fc00000        // what it decodes to
	roundMagic  = float32(0x1.8p23) // x+roundMagic-roundMagic rounds |x| < 2^22 to an integer, ties to even
)

// quantizeGeneric quantizes x block by block (see Int8).
func quantizeGeneric(x []float32, bs int, scales []float32, q []int8) {
	for b := range scales {
		lo := b * bs
		hi := min(lo+bs, len(x))
		scales[b] = quantizeBlockGeneric(x[lo:hi], q[lo:hi])
	}
}

// quantizeBlockGeneric quantizes one block and returns its scale.
func quantizeBlockGeneric(x []float32, q []int8) float32 {
	q = q[:len(x)]
	var m uint32 // max |x| over the finite values, as bits (which order like the values)
	for _, v := range x {
		a := math.Float32bits(v) & 0x7fffffff
		if a >= 0x7f800000 {
			a = 0
		}
		m = max(m, a)
	}
	scale := int8Scale(m)
	if scale == 0 {
		for i, v := range x {
			q[i] = quantize1(v, scale)
		}
		return scale
	}
	// quantize1, with the tests reordered for speed.
	for i, v := range x {
		r := v / scale
		if !(r >= -127) { // NaN too: overwritten below
			r = -127
		}
		if r > 127 {
			r = 127
		}
		r = float32(r+roundMagic) - roundMagic
		qi := int8(r)
		if math.Float32bits(v)&0x7fffffff >= 0x7f800000 {
			qi = q8NonFinite
		}
		q[i] = qi
	}
	return scale
}

// int8Scale is the scale of a block whose finite values have the
// magnitude whose bits are maxBits: maxabs/127, rounded to nearest, except
// that when 127·scale would overflow (maxabs within an ulp of
// math.MaxFloat32) it is the next float32 below, so that q = ±127 decodes
// to a finite value.
func int8Scale(maxBits uint32) float32 {
	s := math.Float32frombits(maxBits) / 127
	if 127*s > math.MaxFloat32 {
		s = math.Nextafter32(s, 0)
	}
	return s
}

// quantize1 is one element of Int8, as every kernel must compute it.
func quantize1(v, scale float32) int8 {
	if math.Float32bits(v)&0x7fffffff >= 0x7f800000 {
		return q8NonFinite
	}
	if scale == 0 {
		return 0
	}
	r := v / scale
	if r > 127 {
		r = 127
	} else if r < -127 {
		r = -127
	}
	r = float32(r+roundMagic) - roundMagic
	return int8(r)
}

// dequantizeGeneric decodes one block's q (or part of it) into dst.
func dequantizeGeneric(dst []float32, q []int8, scale float32) {
	q = q[:len(dst)]
	for i, v := range q {
		dst[i] = dequantize1(v, scale)
	}
}

func dequantize1(q int8, scale float32) float32 {
	if q == q8NonFinite {
		return math.Float32frombits(q8NaN)
	}
	return float32(q) * scale
}

// Kernels.

// codecKernelSet is one implementation of the hot loops; every set gives
// identical results.
type codecKernelSet struct {
	name       string
	quantize   func(x []float32, bs int, scales []float32, q []int8)
	dequantize func(dst []float32, q []int8, scale float32)
	scan       func(x []float32, thr uint32, budget int, idx []int32, vals []uint16) ([]int32, []uint16, int)
	// keysAtLeast is keysAtLeastGeneric.
	keysAtLeast func(keys []uint32, lo uint32, out []uint32) []uint32
}

var genericCodecKernels = codecKernelSet{
	name:       "generic",
	quantize:   quantizeGeneric,
	dequantize: dequantizeGeneric,
	scan:       scanGeneric,

	keysAtLeast: keysAtLeastGeneric,
}

// codecKernels is the set in use: the vector kernels if they are built
// (GOEXPERIMENT=simd on amd64) and the CPU has AVX-512, else the
// portable ones.
var codecKernels = pickCodecKernels()

func pickCodecKernels() *codecKernelSet {
	if k := vectorCodecKernels(); k != nil {
		return k
	}
	return &genericCodecKernels
}
