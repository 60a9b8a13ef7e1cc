package replay

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// trajectory runs the reference optimizer for steps steps from base, with
// gradients drawn from seed, and returns the final state, each step's
// dense gradient and hyper-parameters (steps first..first+steps-1).
func trajectory(base State, seed uint64, first, steps int) (State, [][]float32, []Hyper) {
	// A gradient that depends on the weights, as a real one does, plus
	// noise.
	return trajectoryOf(base, seed, first, steps, func(rng *rand.Rand, w float32) float32 {
		return float32(0.1*float64(w)) + randomGrad(rng)
	})
}

// trajectoryOf is trajectory with gradients drawn by grad from the weight.
func trajectoryOf(base State, seed uint64, first, steps int, grad func(rng *rand.Rand, w float32) float32) (State, [][]float32, []Hyper) {
	rng := rand.New(rand.NewPCG(seed, 11))
	st := base.clone()
	n := len(st.W)
	grads := make([][]float32, steps)
	hypers := make([]Hyper, steps)
	for s := range steps {
		g := make([]float32, n)
		for i := range g {
			g[i] = grad(rng, st.W[i])
		}
		h := testHyper(first + s)
		Step(st.W, st.M, st.V, g, h.Consts())
		grads[s], hypers[s] = g, h
	}
	return st, grads, hypers
}

func compressAll(t testing.TB, grads [][]float32, opt Options) []*Tensor {
	t.Helper()
	out := make([]*Tensor, len(grads))
	for s, g := range grads {
		var err error
		if out[s], err = Compress(7, g, opt); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestReplayIsExact: with lossless differentials, sequential and fused
// replay reproduce the optimizer's states bit for bit, whatever the
// number of workers, the block size, the length (vector tails) and the
// number of steps (including more than one fused batch).
func TestReplayIsExact(t *testing.T) {
	for _, tc := range []struct {
		n, steps, workers, block int
	}{
		{0, 3, 1, 0},
		{1, 1, 1, 0},
		{17, 5, 2, 16},
		{1000, 16, 3, 64},
		{4099, 4, 2, 0},
		{5000, 70, 2, 512}, // two fused batches
		{100_003, 8, 0, 0},
	} {
		t.Run(fmt.Sprintf("n=%d/steps=%d/workers=%d/block=%d", tc.n, tc.steps, tc.workers, tc.block), func(t *testing.T) {
			base := randomState(uint64(tc.n), tc.n)
			want, grads, hypers := trajectory(base, 5, 4, tc.steps)
			diffs := compressAll(t, grads, Options{Lossless: true})
			opt := ReplayOptions{Workers: tc.workers, Block: tc.block}

			seq := base.clone()
			if err := Sequential(seq, diffs, hypers, opt); err != nil {
				t.Fatal(err)
			}
			checkSameState(t, "sequential", seq, want)

			fus := base.clone()
			if err := Fused(fus, diffs, hypers, opt); err != nil {
				t.Fatal(err)
			}
			checkSameState(t, "fused", fus, want)
		})
	}
}

// TestReplayThroughRecords: the differentials survive encoding into
// records and decoding (views into the record bytes) with exactness.
func TestReplayThroughRecords(t *testing.T) {
	const n, steps = 3000, 6
	base := randomState(9, n)
	want, grads, hypers := trajectory(base, 6, 1, steps)
	var diffs []*Tensor
	for s, g := range grads {
		tn, err := Compress(3, g, Options{Lossless: true})
		if err != nil {
			t.Fatal(err)
		}
		b, err := (&Record{Step: uint64(s + 1), Tensors: []*Tensor{tn}}).AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := DecodeRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		diffs = append(diffs, r.Tensors[0])
	}
	got := base.clone()
	if err := Fused(got, diffs, hypers, ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	checkSameState(t, "fused from records", got, want)
}

// TestLossyReplay measures how replay from lossy differentials departs
// from the original trajectory after 100 steps (error feedback is out of
// scope: what a codec drops is lost for good), and checks it against
// Adam's own bound: a step moves a weight by at most
// α_t·(1-β1)/sqrt(1-β2) (plus weight decay), so two
// trajectories from one base differ by at most twice the sum of those.
// The gradients are dense (the weights' pull plus noise with a heavy tail,
// Student-t with 3 degrees of freedom), or sparse (0.5% of the entries
// nonzero, as in embedding tables). It reports
// the error relative to the weights and relative to how far the weights
// moved. Sequential and fused replay of the same lossy stream agree bit
// for bit.
func TestLossyReplay(t *testing.T) {
	const steps = 100
	dense := func(rng *rand.Rand, w float32) float32 {
		// t(3) = N / sqrt(χ²(3)/3).
		chi := 0.0
		for range 3 {
			x := rng.NormFloat64()
			chi += x * x
		}
		return float32(0.1*float64(w)) + float32(1e-2*rng.NormFloat64()/math.Sqrt(chi/3))
	}
	sparse := func(rng *rand.Rand, w float32) float32 {
		if rng.IntN(200) != 0 {
			return 0
		}
		return float32(1e-2 * rng.NormFloat64())
	}
	for _, tc := range []struct {
		name string
		n    int
		opt  Options
		grad func(*rand.Rand, float32) float32
	}{
		{"int8, dense gradients", 50_000, Options{}, dense},
		{"topk k=0.01, dense gradients", 200_000, Options{Threshold: 1}, dense},
		{"topk k=0.1, dense gradients", 200_000, Options{Threshold: 1, K: 0.1}, dense},
		{"topk k=0.01, sparse gradients", 200_000, Options{Threshold: 1}, sparse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() || raceEnabled {
				tc.n /= 10 // the same measurement, smaller
			}
			base := randomState(21, tc.n)
			want, grads, hypers := trajectoryOf(base, 8, 1, steps, tc.grad)
			diffs := compressAll(t, grads, tc.opt)
			got := base.clone()
			if err := Fused(got, diffs, hypers, ReplayOptions{}); err != nil {
				t.Fatal(err)
			}
			seq := base.clone()
			if err := Sequential(seq, diffs, hypers, ReplayOptions{}); err != nil {
				t.Fatal(err)
			}
			checkSameState(t, "lossy sequential vs fused", seq, got)

			bound := 0.0
			for _, h := range hypers {
				c := h.Consts()
				step := float64(c.StepSize) * float64(1-h.Beta1) / math.Sqrt(float64(1-h.Beta2))
				bound += 2 * (step + float64(h.LR*h.WeightDecay)*4)
			}
			var maxAbs, maxRel, sumRel, sumErr, sumMove float64
			for i := range want.W {
				d := math.Abs(float64(got.W[i]) - float64(want.W[i]))
				rel := d / math.Max(math.Abs(float64(want.W[i])), 1e-3)
				maxAbs, maxRel, sumRel = max(maxAbs, d), max(maxRel, rel), sumRel+rel
				sumErr += d
				sumMove += math.Abs(float64(want.W[i]) - float64(base.W[i]))
			}
			n := float64(len(want.W))
			t.Logf("%s, %d steps: weights' relative error max %.3g, mean %.3g; absolute max %.3g (Adam's bound %.3g); mean error / mean movement %.3g",
				tc.name, steps, maxRel, sumRel/n, maxAbs, bound, sumErr/sumMove)
			if maxAbs > bound || math.IsNaN(maxAbs) {
				t.Fatalf("lossy replay departs by %v, beyond Adam's bound %v", maxAbs, bound)
			}
		})
	}
}

func TestReplayMismatch(t *testing.T) {
	base := randomState(1, 100)
	_, grads, hypers := trajectory(base, 1, 1, 3)
	diffs := compressAll(t, grads, Options{Lossless: true})
	other, _ := Compress(1, make([]float32, 99), Options{Lossless: true})
	tests := []struct {
		name   string
		st     State
		diffs  []*Tensor
		hypers []Hyper
		want   error
	}{
		{"moments too short", State{W: base.W, M: base.M[:99], V: base.V}, diffs, hypers, ErrMismatch},
		{"fewer steps than differentials", base, diffs, hypers[:2], ErrMismatch},
		{"differential of another length", base, []*Tensor{diffs[0], other, diffs[2]}, hypers, ErrMismatch},
		{"nil differential", base, []*Tensor{diffs[0], nil, diffs[2]}, hypers, ErrMismatch},
		{"steps not consecutive", base, diffs, []Hyper{hypers[0], hypers[2], hypers[1]}, ErrMismatch},
		{"bad hyper-parameters", base, diffs, []Hyper{hypers[0], {T: 2, Beta1: 2}, hypers[2]}, ErrBadHyper},
	}
	for _, tc := range tests {
		for name, f := range map[string]func(State, []*Tensor, []Hyper, ReplayOptions) error{"sequential": Sequential, "fused": Fused} {
			st := tc.st.clone()
			if err := f(st, tc.diffs, tc.hypers, ReplayOptions{}); !errors.Is(err, tc.want) {
				t.Errorf("%s, %s: %v, want %v", tc.name, name, err, tc.want)
			}
		}
	}
}
