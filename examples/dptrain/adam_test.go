package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refAdam is a straightforward scalar Adam(W) step, written out one float32
// operation per statement, as the algorithm reads. Products are converted
// explicitly: an assignment alone would not stop the compiler fusing them
// into a later addition (Go spec, "Floating-point operators").
func refAdam(w, m, v, g float32, h adamHyper, t int) (float32, float32, float32) {
	// Per-step constants, in float64, rounded once.
	bc1 := 1 - math.Pow(float64(h.beta1), float64(t))
	sqrtBC2 := math.Sqrt(1 - math.Pow(float64(h.beta2), float64(t)))
	stepSize := float32(float64(h.lr) * sqrtBC2 / bc1) // α_t
	epsHat := float32(float64(h.eps) * sqrtBC2)        // ε̂_t
	oneMinusBeta1 := float32(1 - float64(h.beta1))
	oneMinusBeta2 := float32(1 - float64(h.beta2))
	decay := float32(1 - float64(float64(h.lr)*float64(h.weightDecay)))

	var a, b float32
	a = float32(h.beta1 * m)
	b = float32(oneMinusBeta1 * g)
	m = a + b

	a = float32(h.beta2 * v)
	b = float32(g * g)
	b = float32(oneMinusBeta2 * b)
	v = a + b

	root := float32(math.Sqrt(float64(v)))
	denom := root + epsHat

	w = float32(w * decay)
	upd := m / denom
	upd = float32(stepSize * upd)
	w = w - upd
	return w, m, v
}

func TestAdamMatchesScalarReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, h := range []adamHyper{
		{lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8},
		{lr: 0.001, beta1: 0.8, beta2: 0.95, eps: 1e-6, weightDecay: 0.1},
		{lr: 0.3, beta1: 0, beta2: 0, eps: 1e-3, weightDecay: 0.01},
	} {
		const n = 1000
		w, m, v, g := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		rw, rm, rv := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range w {
			w[i] = float32(rng.NormFloat64())
			rw[i] = w[i]
		}
		for step := 1; step <= 50; step++ {
			for i := range g {
				// Gradients over many magnitudes, including 0 and denormals.
				g[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(50)-40)))
			}
			g[0] = 0
			adamUpdate(w, m, v, g, h.consts(step))
			for i := range g {
				rw[i], rm[i], rv[i] = refAdam(rw[i], rm[i], rv[i], g[i], h, step)
				if math.Float32bits(w[i]) != math.Float32bits(rw[i]) ||
					math.Float32bits(m[i]) != math.Float32bits(rm[i]) ||
					math.Float32bits(v[i]) != math.Float32bits(rv[i]) {
					t.Fatalf("%+v step %d element %d: (w, m, v) = (%g, %g, %g), reference (%g, %g, %g)",
						h, step, i, w[i], m[i], v[i], rw[i], rm[i], rv[i])
				}
			}
		}
	}
}

// TestAdamFirstStep checks the update against its closed form: at t = 1,
// bias correction makes the step lr·g/(|g| + ε) ≈ lr·sign(g).
func TestAdamFirstStep(t *testing.T) {
	h := adamHyper{lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8}
	w := []float32{1, 1, 1}
	g := []float32{2, -0.5, 0}
	adamUpdate(w, make([]float32, 3), make([]float32, 3), g, h.consts(1))
	for i, want := range []float32{0.99, 1.01, 1} {
		if math.Abs(float64(w[i]-want)) > 1e-6 {
			t.Errorf("w[%d] = %g, want ≈ %g", i, w[i], want)
		}
	}
}

func BenchmarkAdam(b *testing.B) {
	const n = 1 << 20
	w, m, v, g := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range g {
		g[i] = float32(i%100) - 50
	}
	c := adamHyper{lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8}.consts(10)
	b.SetBytes(16 * n)
	for b.Loop() {
		adamUpdate(w, m, v, g, c)
	}
}
