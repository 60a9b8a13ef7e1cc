package replay

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// testHyper is the hyper-parameters of step t, varied per step so that a
// replay that mixed up steps would show.
func testHyper(t int) Hyper {
	return Hyper{LR: 1e-3 * float32(1+t%3), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01 * float32(t%2), T: t}
}

// randomState returns n weights and moments that look like training's:
// moments from a few real steps, so v is not all zero.
func randomState(seed uint64, n int) State {
	rng := rand.New(rand.NewPCG(seed, 7))
	st := State{W: make([]float32, n), M: make([]float32, n), V: make([]float32, n)}
	for i := range n {
		st.W[i] = float32(rng.NormFloat64())
	}
	g := make([]float32, n)
	for t := 1; t <= 3; t++ {
		for i := range g {
			g[i] = randomGrad(rng)
		}
		stepScalar(st.W, st.M, st.V, g, testHyper(t).Consts())
	}
	return st
}

// randomGrad draws a gradient entry: mostly normal, some tiny, some huge,
// some exact zeros.
func randomGrad(rng *rand.Rand) float32 {
	switch rng.IntN(20) {
	case 0:
		return 0
	case 1:
		return float32(rng.NormFloat64() * 1e-30)
	case 2:
		return float32(rng.NormFloat64() * 1e4)
	}
	return float32(rng.NormFloat64() * 1e-2)
}

func (st State) clone() State {
	return State{W: append([]float32{}, st.W...), M: append([]float32{}, st.M...), V: append([]float32{}, st.V...)}
}

// sameBits reports the first element where a and b differ in bits, or -1.
func sameBits(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

func checkSameState(t *testing.T, what string, got, want State) {
	t.Helper()
	for _, p := range []struct {
		name string
		a, b []float32
	}{{"w", got.W, want.W}, {"m", got.M, want.M}, {"v", got.V, want.V}} {
		if i := sameBits(p.a, p.b); i >= 0 {
			t.Fatalf("%s: %s[%d] = %v (%#x), want %v (%#x)", what, p.name, i, p.a[i], math.Float32bits(p.a[i]), p.b[i], math.Float32bits(p.b[i]))
		}
	}
}

// TestStepMatchesScalar: Step (the vector kernel where built and supported)
// gives the bits of the scalar reference, for every length class around
// the vector width.
func TestStepMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 1000, 4099} {
		st := randomState(uint64(n), n)
		g := make([]float32, n)
		for i := range g {
			g[i] = randomGrad(rng)
		}
		want := st.clone()
		stepScalar(want.W, want.M, want.V, g, testHyper(4).Consts())
		got := st.clone()
		Step(got.W, got.M, got.V, g, testHyper(4).Consts())
		checkSameState(t, "Step", got, want)
	}
	t.Logf("vector kernels: %v", haveVector)
}

// TestFusedKernelMatchesScalar: the fused inner loop equals N scalar steps.
func TestFusedKernelMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 16, 17, 100, 1024} {
		for _, steps := range []int{1, 2, 7, maxFusedStepsForTest()} {
			st := randomState(uint64(n*100+steps), n)
			gs := make([][]float32, steps)
			cs := make([]Consts, steps)
			for s := range gs {
				gs[s] = make([]float32, n)
				for i := range gs[s] {
					gs[s][i] = randomGrad(rng)
				}
				cs[s] = testHyper(10 + s).Consts()
			}
			want := st.clone()
			for s := range gs {
				stepScalar(want.W, want.M, want.V, gs[s], cs[s])
			}
			got := st.clone()
			newFusedKernel(cs).run(got.W, got.M, got.V, gs)
			checkSameState(t, "fused", got, want)
		}
	}
}

func maxFusedStepsForTest() int { return maxBatch }

// TestStepIsPyTorchAdamW pins the formula with values worked out by hand
// in float64 (AdamW, first step: m = (1-β1)g, v = (1-β2)g², the update is
// lr·sign(g) up to ε).
func TestStepIsPyTorchAdamW(t *testing.T) {
	w, m, v := []float32{1}, []float32{0}, []float32{0}
	h := Hyper{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.5, T: 1}
	Step(w, m, v, []float32{2}, h.Consts())
	// PyTorch: w = 1·(1 - 0.1·0.5) - 0.1/(1-0.9) · 0.2 / (sqrt(0.004)/sqrt(0.001) + 1e-8)
	// (Up to the float32 rounding of the constants: 1-β2 is 0.00099998713.)
	want := 0.95 - 1.0*0.2/(2+1e-8)
	near := func(got float32, want float64) bool { return math.Abs(float64(got)-want) <= 1e-4*math.Abs(want) }
	if !near(w[0], want) || !near(m[0], 0.2) || !near(v[0], 0.004) {
		t.Fatalf("w %v m %v v %v; want w %v m 0.2 v 0.004", w[0], m[0], v[0], want)
	}
}

func TestHyperValidate(t *testing.T) {
	good := testHyper(1)
	tests := []struct {
		name string
		mod  func(*Hyper)
	}{
		{"step 0", func(h *Hyper) { h.T = 0 }},
		{"beta1 1", func(h *Hyper) { h.Beta1 = 1 }},
		{"beta2 negative", func(h *Hyper) { h.Beta2 = -0.1 }},
		{"beta NaN", func(h *Hyper) { h.Beta1 = float32(math.NaN()) }},
		{"lr negative", func(h *Hyper) { h.LR = -1 }},
		{"lr inf", func(h *Hyper) { h.LR = float32(math.Inf(1)) }},
		{"eps NaN", func(h *Hyper) { h.Eps = float32(math.NaN()) }},
		{"decay negative", func(h *Hyper) { h.WeightDecay = -1 }},
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		h := good
		tc.mod(&h)
		if err := h.Validate(); !errors.Is(err, ErrBadHyper) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
