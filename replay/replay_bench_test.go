package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// benchParams is the replay benchmark's tensor: 64M parameters (768 MiB
// of weights and moments).
const benchParams = 64 << 20

// BenchmarkReplay: fused against sequential replay of N = 4, 16, 64 steps
// on 64M parameters, both measured in the same run on the same
// differentials, and their ratio (the target: ≥ 3× at N = 16;
// TierCheck reports 1.57× for 100 steps). The differentials are the
// stream a large tensor gets by default (top-k, k = 0.01), and lossless
// ones for N = 4 and 16. Run with GOEXPERIMENT=simd for the AVX-512
// kernels (make bench-replay).
//
//	GOEXPERIMENT=simd go test -run '^$' -bench BenchmarkReplay -benchtime 3x ./replay/
func BenchmarkReplay(b *testing.B) {
	base := benchState(benchParams)
	work := State{W: make([]float32, benchParams), M: make([]float32, benchParams), V: make([]float32, benchParams)}
	grad := make([]float32, benchParams)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range grad {
		grad[i] = float32(rng.NormFloat64() * 1e-2)
	}
	for _, tc := range []struct {
		codec string
		steps int
	}{{"topk", 4}, {"topk", 16}, {"topk", 64}, {"raw", 4}, {"raw", 16}} {
		opt := Options{Lossless: tc.codec == "raw"}
		diffs := make([]*Tensor, tc.steps)
		hypers := make([]Hyper, tc.steps)
		for s := range diffs {
			// Each step's gradient differs (a rotation), so that no
			// step can be mistaken for another.
			g := append(grad[s*7919%benchParams:], grad[:s*7919%benchParams]...)
			var err error
			if diffs[s], err = Compress(uint32(s), g, opt); err != nil {
				b.Fatal(err)
			}
			hypers[s] = testHyper(100 + s)
		}
		run := func(f func(State, []*Tensor, []Hyper, ReplayOptions) error) time.Duration {
			copy(work.W, base.W)
			copy(work.M, base.M)
			copy(work.V, base.V)
			start := time.Now()
			if err := f(work, diffs, hypers, ReplayOptions{}); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		b.Run(fmt.Sprintf("codec=%s/steps=%d", tc.codec, tc.steps), func(b *testing.B) {
			// The two alternate, and the best of each counts: this
			// machine is shared, and a slow spell should not decide
			// the ratio.
			seq, fus := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
			for b.Loop() {
				seq = min(seq, run(Sequential))
				fus = min(fus, run(Fused))
			}
			b.ReportMetric(seq.Seconds(), "seq-s")
			b.ReportMetric(fus.Seconds(), "fused-s")
			b.ReportMetric(seq.Seconds()/fus.Seconds(), "×fused-over-seq")
			b.ReportMetric(fus.Seconds()*1e9/float64(benchParams*tc.steps), "fused-ns/elem-step")
		})
		diffs = nil
	}
}

// benchState is a state of n elements with moments as after a few steps.
func benchState(n int) State {
	st := State{W: make([]float32, n), M: make([]float32, n), V: make([]float32, n)}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range st.W {
		st.W[i] = float32(rng.NormFloat64())
		st.M[i] = float32(rng.NormFloat64() * 1e-3)
		st.V[i] = float32(rng.ExpFloat64() * 1e-6)
	}
	return st
}

// BenchmarkStep: one optimizer step over 16M parameters, scalar and (when
// built with GOEXPERIMENT=simd on AVX-512) vector, beside a copy of the
// same bytes: the kernel every replay and every training step runs.
func BenchmarkStep(b *testing.B) {
	const n = 16 << 20
	st := benchState(n)
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(i%1000) * 1e-5
	}
	c := testHyper(5).Consts()
	dst := make([]float32, n)
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			copy(dst, g)
		}
	})
	b.Run("scalar", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			stepScalar(st.W, st.M, st.V, g, c)
		}
	})
	b.Run(fmt.Sprintf("Step/vector=%v", haveVector), func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			Step(st.W, st.M, st.V, g, c)
		}
	})
}
