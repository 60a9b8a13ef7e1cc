package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var benchSizes = []struct {
	name string
	n    int
}{{"1M", 1 << 20}, {"16M", 16 << 20}, {"64M", 64 << 20}}

var benchCache = map[int][]float32{}

// benchGrad is a normal-ish gradient of n elements (cached: 64M normals
// take a while to draw).
func benchGrad(n int) []float32 {
	if x, ok := benchCache[n]; ok {
		return x
	}
	x := make([]float32, n)
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 1e-3)
	}
	benchCache[n] = x
	return x
}

// benchKernels are the kernel sets to measure: the portable one, and the
// vector one if it is built and the CPU has it.
func benchKernels() []*codecKernelSet {
	ks := []*codecKernelSet{&genericCodecKernels}
	if v := vectorCodecKernels(); v != nil {
		ks = append(ks, v)
	}
	return ks
}

func withKernels(ks *codecKernelSet) func() {
	old := codecKernels
	codecKernels = ks
	return func() { codecKernels = old }
}

// copyNanos measures copy() of x into a buffer of its size, in ns per
// copy: the median of 5, after a warm-up (in the same process and state
// as the benchmark that compares with it).
func copyNanos(x []float32) float64 {
	dst := make([]float32, len(x))
	copy(dst, x)
	var ts []float64
	for range 5 {
		start := time.Now()
		copy(dst, x)
		ts = append(ts, float64(time.Since(start).Nanoseconds()))
	}
	slices.Sort(ts)
	return ts[len(ts)/2]
}

// BenchmarkCompress measures Int8 and TopK (K = 0.01) on 1M, 16M and 64M
// elements with every kernel set, and a plain copy of the same bytes.
// Metrics: "×copy", compress throughput over copy throughput (the copy
// measured in the same sub-benchmark), and "compressed/dense", payload
// bytes over 4·n.
func BenchmarkCompress(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run("copy/"+sz.name, func(b *testing.B) {
			x := benchGrad(sz.n)
			dst := make([]float32, sz.n)
			copy(dst, x) // fault the pages in
			b.SetBytes(int64(4 * sz.n))
			for b.Loop() {
				copy(dst, x)
			}
		})
		for _, c := range []struct {
			name string
			opt  Options
		}{
			{"int8", Options{Threshold: math.MaxInt}},
			{"topk", Options{Threshold: 1}},
		} {
			for _, ks := range benchKernels() {
				b.Run(fmt.Sprintf("%s/%s/%s", c.name, sz.name, ks.name), func(b *testing.B) {
					defer withKernels(ks)()
					x := benchGrad(sz.n)
					var tn Tensor
					if err := CompressInto(&tn, 1, x, c.opt); err != nil { // grows the buffers
						b.Fatal(err)
					}
					cp := copyNanos(x)
					b.SetBytes(int64(4 * sz.n))
					b.ReportAllocs()
					opt := c.opt
					b.ResetTimer()
					start := time.Now()
					for i := range b.N {
						opt.Seed = uint64(i)
						if err := CompressInto(&tn, 1, x, opt); err != nil {
							b.Fatal(err)
						}
					}
					per := float64(time.Since(start).Nanoseconds()) / float64(b.N)
					b.StopTimer()
					b.ReportMetric(cp/per, "×copy")
					b.ReportMetric(float64(tn.PayloadBytes())/float64(4*sz.n), "compressed/dense")
				})
			}
		}
	}
}

// BenchmarkExpandRange measures the per-block decompression the fused
// replay does: ExpandRange over consecutive blocks of 2048 elements
// through a whole tensor (one op), "×copy" against copying the dense
// bytes.
func BenchmarkExpandRange(b *testing.B) {
	const block = 2048
	for _, sz := range benchSizes[:2] {
		for _, c := range []struct {
			name string
			opt  Options
		}{
			{"int8", Options{Threshold: math.MaxInt}},
			{"topk", Options{Threshold: 1}},
		} {
			for _, ks := range benchKernels() {
				b.Run(fmt.Sprintf("%s/%s/%s", c.name, sz.name, ks.name), func(b *testing.B) {
					defer withKernels(ks)()
					x := benchGrad(sz.n)
					tn := mustCompress(b, 1, x, c.opt)
					dst := make([]float32, sz.n)
					cp := copyNanos(x)
					b.SetBytes(int64(4 * sz.n))
					b.ReportAllocs()
					b.ResetTimer()
					start := time.Now()
					for range b.N {
						for lo := 0; lo < sz.n; lo += block {
							tn.ExpandRange(dst[lo:min(lo+block, sz.n)], lo)
						}
					}
					per := float64(time.Since(start).Nanoseconds()) / float64(b.N)
					b.StopTimer()
					b.ReportMetric(cp/per, "×copy")
				})
			}
		}
	}
}
