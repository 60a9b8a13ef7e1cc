//go:build goexperiment.simd && amd64

package replay

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func needAVX512(t *testing.T) *codecKernelSet {
	k := vectorCodecKernels()
	if k == nil {
		t.Skip("no AVX-512 on this CPU")
	}
	return k
}

// randomBits is data with every kind of float32: uniformly random bit
// patterns (NaNs, infinities, subnormals, huge and tiny values).
var randomBits = dist{"random-bits", func(x []float32, rng *rand.Rand) {
	for i := range x {
		x[i] = math.Float32frombits(rng.Uint32())
	}
}}

// TestVectorKernelsIdentical: Compress with the AVX-512 kernels gives the
// same bytes as with the portable ones, for every codec, block size,
// length (vector tails) and kind of data; and decompression gives the
// same bits.
func TestVectorKernelsIdentical(t *testing.T) {
	vec := needAVX512(t)
	if codecKernels != vec {
		t.Fatalf("kernels in use: %s, want %s on an AVX-512 CPU", codecKernels.name, vec.name)
	}
	encodeWith := func(ks *codecKernelSet, x []float32, opt Options) ([]byte, []float32) {
		defer withKernels(ks)()
		tn := mustCompress(t, 1, x, opt)
		b := encode(t, &Record{Tensors: []*Tensor{tn}})
		return b, decompressed(t, tn)
	}
	for _, d := range []dist{normalDist, mixedDist, randomBits, cauchyDist, equalDist, spikesDist} {
		for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4099, 100_000, 1_000_003} {
			if testing.Short() && n > 100_000 {
				continue
			}
			x := genData(d, n, uint64(n))
			for _, opt := range []Options{
				{Threshold: math.MaxInt},
				{Threshold: math.MaxInt, BlockSize: 1},
				{Threshold: math.MaxInt, BlockSize: 7},
				{Threshold: math.MaxInt, BlockSize: 16},
				{Threshold: math.MaxInt, BlockSize: 33},
				{Threshold: math.MaxInt, BlockSize: 4096},
				{Threshold: 1},
				{Threshold: 1, K: 0.1, Seed: 3},
				{Threshold: 1, K: 1},
			} {
				gb, gv := encodeWith(&genericCodecKernels, x, opt)
				vb, vv := encodeWith(vec, x, opt)
				if !bytes.Equal(gb, vb) {
					t.Fatalf("%s, %d elements, %+v: the encodings differ", d.name, n, opt)
				}
				for i := range gv {
					if math.Float32bits(gv[i]) != math.Float32bits(vv[i]) {
						t.Fatalf("%s, %d elements, %+v: element %d decodes to %#08x and %#08x", d.name, n, opt, i, math.Float32bits(gv[i]), math.Float32bits(vv[i]))
					}
				}
			}
		}
	}
}

// TestVectorQuantizeScales runs both quantizers on one block at scales
// from subnormal to the largest, and both dequantizers on every q.
func TestVectorQuantizeScales(t *testing.T) {
	vec := needAVX512(t)
	rng := rand.New(rand.NewPCG(7, 7))
	x := make([]float32, 333)
	for _, e := range []float64{-149, -140, -130, -126, -100, -20, 0, 20, 100, 127, 127.99999} {
		for trial := range 20 {
			for i := range x {
				x[i] = float32(math.Ldexp(rng.NormFloat64(), int(e)) / 4)
			}
			if trial%2 == 0 {
				x[rng.IntN(len(x))] = float32(math.Copysign(math.Ldexp(1, int(math.Min(e, 127))), rng.NormFloat64()))
			}
			if e == 127.99999 {
				x[5] = math.MaxFloat32
			}
			gq, vq := make([]int8, len(x)), make([]int8, len(x))
			gs, vs := make([]float32, 1), make([]float32, 1)
			genericCodecKernels.quantize(x, len(x), gs, gq)
			vec.quantize(x, len(x), vs, vq)
			if math.Float32bits(gs[0]) != math.Float32bits(vs[0]) || !bytes.Equal(asBytes(gq), asBytes(vq)) {
				t.Fatalf("2^%v: scales %v and %v, or the q differ", e, gs[0], vs[0])
			}
		}
	}
	// Exact ties: scale 1, the other values halfway between integers.
	ties := []float32{127}
	for v := float32(-126.5); v < 127; v++ {
		ties = append(ties, v)
	}
	gq, vq := make([]int8, len(ties)), make([]int8, len(ties))
	gs, vs := make([]float32, 1), make([]float32, 1)
	genericCodecKernels.quantize(ties, len(ties), gs, gq)
	vec.quantize(ties, len(ties), vs, vq)
	for i, v := range ties {
		if want := int8(math.RoundToEven(float64(v))); gs[0] != 1 || gq[i] != want || vq[i] != want {
			t.Fatalf("tie %v: scale %v, q %d and %d, want %d", v, gs[0], gq[i], vq[i], want)
		}
	}

	q := make([]int8, 256+13)
	for i := range q {
		q[i] = int8(i)
	}
	for _, scale := range []float32{0, math.SmallestNonzeroFloat32, 1e-40, 1e-20, 1, 0.1, 3.7e10, math.MaxFloat32 / 128} {
		g, v := make([]float32, len(q)), make([]float32, len(q))
		genericCodecKernels.dequantize(g, q, scale)
		vec.dequantize(v, q, scale)
		for i := range g {
			if math.Float32bits(g[i]) != math.Float32bits(v[i]) {
				t.Fatalf("dequantize q=%d scale %v: %#08x and %#08x", q[i], scale, math.Float32bits(g[i]), math.Float32bits(v[i]))
			}
		}
	}
}

// TestVectorScan runs both scans at thresholds that keep nothing, a few,
// ties (with budgets from none to all), and everything non-zero.
func TestVectorScan(t *testing.T) {
	vec := needAVX512(t)
	for _, d := range []dist{normalDist, mixedDist, equalDist, spikesDist} {
		for _, n := range []int{0, 5, 63, 64, 65, 130, 10_000} {
			x := genData(d, n, 1)
			var thrs []uint32
			for _, v := range x[:min(n, 7)] {
				thrs = append(thrs, absKey(v))
			}
			thrs = append(thrs, 0, 1, 0x7f800000, 0x7fffffff)
			for _, thr := range thrs {
				for _, budget := range []int{0, 1, 3, n} {
					gi, gv, gb := genericCodecKernels.scan(x, thr, budget, nil, nil)
					vi, vv, vb := vec.scan(x, thr, budget, nil, nil)
					if fmt.Sprint(gi, gv, gb) != fmt.Sprint(vi, vv, vb) {
						t.Fatalf("%s, %d elements, threshold %#x, budget %d: the scans differ", d.name, n, thr, budget)
					}
				}
			}
		}
	}
}

// TestVectorKeysAtLeast: both filters give the same keys, for bounds
// that keep none, some and all, and lengths with vector tails.
func TestVectorKeysAtLeast(t *testing.T) {
	vec := needAVX512(t)
	rng := rand.New(rand.NewPCG(3, 3))
	for _, n := range []int{0, 1, 15, 16, 17, 100, 1000, 65_537} {
		keys := make([]uint32, n)
		for i := range keys {
			keys[i] = rng.Uint32()
		}
		for _, lo := range []uint32{1, 0x10000000, 0x3f800000, 0x7f000000, 0x7fffffff, 0x80000000} {
			g := genericCodecKernels.keysAtLeast(keys, lo, make([]uint32, n))
			v := vec.keysAtLeast(keys, lo, make([]uint32, n))
			if fmt.Sprint(g) != fmt.Sprint(v) {
				t.Fatalf("%d keys, bound %#x: the filters differ", n, lo)
			}
		}
	}
}
