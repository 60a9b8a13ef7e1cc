package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// deviceGradReference is deviceGrad as first written, one element at a
// time straight from its definition: what every path must reproduce bit
// for bit.
func deviceGradReference(g, w []float32, seed uint64, s, lo int) {
	key := streamKey(seed, domainDevice)
	for i := range g {
		idx := uint64(lo + i)
		target := unit(at(key, 2*idx))
		noise := unit(at(key^uint64(s+1)*golden, 2*idx+1))
		g[i] = w[i] - (target + float32(0.25)*noise)
	}
}

// gradPath is one way of computing deviceGrad's output: it fills g and
// returns how many leading elements it computed (the rest must be left
// alone).
type gradPath struct {
	name string
	run  func(g, w []float32, seed uint64, s, lo int) int
}

func gradPaths(t testing.TB) []gradPath {
	paths := []gradPath{
		{"deviceGrad", func(g, w []float32, seed uint64, s, lo int) int {
			deviceGrad(g, w, seed, s, lo)
			return len(g)
		}},
		{"scalar", func(g, w []float32, seed uint64, s, lo int) int {
			key, noiseKey := deviceKeys(seed, s)
			deviceGradScalar(g, w, key, noiseKey, lo)
			return len(g)
		}},
	}
	if haveVector {
		paths = append(paths, gradPath{"vector", func(g, w []float32, seed uint64, s, lo int) int {
			key, noiseKey := deviceKeys(seed, s)
			return deviceGradVector(g, w[:len(g)], key, noiseKey, lo)
		}})
	} else {
		t.Logf("no vector kernel in this build or on this CPU: only the scalar paths")
	}
	return paths
}

// poison is what the tests fill gradient buffers with beforehand: a NaN
// no path computes, so an element left unwritten or written past the end
// is seen.
var poison = math.Float32frombits(0x7fc0dead)

// TestDeviceGradIdentical: every path (deviceGrad, the scalar loop, the
// AVX-512 kernel where it runs) gives the reference's bits for every
// length 0..70 (vector tails) and a large one, at offsets lo whose
// counters wrap or not, for several seeds and steps, and with weights of
// every kind (rounding in the subtraction, huge, tiny, NaN, infinite);
// and writes exactly the elements it says it computed.
func TestDeviceGradIdentical(t *testing.T) {
	paths := gradPaths(t)
	lengths := make([]int, 0, 73)
	for n := range 71 {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 4099, 100_003)
	weights := []struct {
		name string
		fill func(w []float32, rng *rand.Rand)
	}{
		{"uniform", func(w []float32, rng *rand.Rand) {
			for i := range w {
				w[i] = float32(rng.Float64()*2 - 1)
			}
		}},
		{"random-bits", func(w []float32, rng *rand.Rand) {
			for i := range w {
				w[i] = math.Float32frombits(rng.Uint32())
			}
		}},
	}
	type args struct {
		seed uint64
		s    int
		lo   int
	}
	var cases []args
	for _, seed := range []uint64{0, 1, 0xdeadbeefcafef00d} {
		for _, s := range []int{0, 1, 29, 1 << 40} {
			for _, lo := range []int{0, 1, 7, 8, 13, 22_020_096, 1<<62 + 5, math.MaxInt - 200_000} {
				cases = append(cases, args{seed, s, lo})
			}
		}
	}
	rng := rand.New(rand.NewPCG(15, 15))
	maxLen := lengths[len(lengths)-1]
	w := make([]float32, maxLen)
	want := make([]float32, maxLen)
	got := make([]float32, maxLen)
	for _, wk := range weights {
		for _, c := range cases {
			wk.fill(w, rng)
			for _, n := range lengths {
				if testing.Short() && n > 4099 && c.lo%8 != 0 {
					continue
				}
				deviceGradReference(want[:n], w, c.seed, c.s, c.lo)
				for _, p := range paths {
					for i := range got[:min(n+1, len(got))] {
						got[i] = poison
					}
					done := p.run(got[:n], w, c.seed, c.s, c.lo)
					if done < 0 || done > n || p.name == "vector" && done != n&^15 {
						t.Fatalf("%s, %s weights, seed %#x step %d lo %d, %d elements: computed %d", p.name, wk.name, c.seed, c.s, c.lo, n, done)
					}
					for i := range n {
						wantBits := math.Float32bits(want[i])
						if i >= done {
							wantBits = math.Float32bits(poison)
						}
						if b := math.Float32bits(got[i]); b != wantBits {
							t.Fatalf("%s, %s weights, seed %#x step %d lo %d, %d elements: element %d is %#08x, want %#08x (w %#08x)",
								p.name, wk.name, c.seed, c.s, c.lo, n, i, b, wantBits, math.Float32bits(w[i]))
						}
					}
					if n < len(got) && math.Float32bits(got[n]) != math.Float32bits(poison) {
						t.Fatalf("%s, %d elements: wrote element %d", p.name, n, n)
					}
				}
			}
		}
	}
}

// TestDeviceGradGoldenHashes: training on the accelerator's gradients ends
// with the hashes the first (scalar-only) deviceGrad gave, in a world of 1
// and of 3 (whose shards start at parameters 334 and 667: kernel and
// scalar tail split each shard differently).
func TestDeviceGradGoldenHashes(t *testing.T) {
	const (
		params    = "a97417bc687a8ea34f5ff579e55035b5ed578ede295c64d56b6bbeac633877dc"
		optimizer = "c2fa5ee8045f825a20fb8b6bdd93151f25574f24a82c0fca75110cc3a20a365f"
	)
	for _, np := range []int{1, 3} {
		res := mustRunWorld(t, np, testConfig(t, "--device-grad", "--seed", "1"), runOptions{})
		if got := fmt.Sprintf("%x", res.ParamsHash); got != params {
			t.Errorf("np %d: params hash %s, want %s", np, got, params)
		}
		if got := fmt.Sprintf("%x", res.OptimizerHash); got != optimizer {
			t.Errorf("np %d: optimizer hash %s, want %s", np, got, optimizer)
		}
	}
}

// BenchmarkDeviceGrad measures deviceGrad's paths on a shard larger than
// the caches (as the 22M-parameter shards of make bench-protect are). The
// ratio sub-benchmark times the scalar loop and deviceGrad alternately in
// the same loop, so that both see the same machine, and reports the
// fastest pass of each (ns/element) and their ratio: on a machine shared
// with other work, the fastest pass is the one least disturbed.
func BenchmarkDeviceGrad(b *testing.B) {
	const n = 1 << 21
	w := make([]float32, n)
	initParams(w, 1)
	g := make([]float32, n)
	key, noiseKey := deviceKeys(1, 7)
	perElem := func(b *testing.B) {
		b.SetBytes(8 * n) // reads w, writes g
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/elem")
	}
	b.Run("scalar", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			deviceGradScalar(g, w, key, noiseKey, 0)
		}
		perElem(b)
	})
	b.Run(fmt.Sprintf("deviceGrad/vector=%v", haveVector), func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			deviceGrad(g, w, 1, 7, 0)
		}
		perElem(b)
	})
	b.Run(fmt.Sprintf("ratio/vector=%v", haveVector), func(b *testing.B) {
		scalar, dispatch := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
		for b.Loop() {
			t0 := time.Now()
			deviceGradScalar(g, w, key, noiseKey, 0)
			t1 := time.Now()
			deviceGrad(g, w, 1, 7, 0)
			scalar, dispatch = min(scalar, t1.Sub(t0)), min(dispatch, time.Since(t1))
		}
		b.ReportMetric(float64(scalar.Nanoseconds())/n, "scalar-ns/elem")
		b.ReportMetric(float64(dispatch.Nanoseconds())/n, "deviceGrad-ns/elem")
		b.ReportMetric(float64(scalar)/float64(dispatch), "speedup")
	})
}
