package replay

import (
	"errors"
	"fmt"
	"math"
)

// ErrBadHyper reports optimizer hyper-parameters that are out of range.
var ErrBadHyper = errors.New("replay: bad optimizer hyper-parameters")

// Hyper are the Adam(W) hyper-parameters of one step. With WeightDecay > 0
// the update is AdamW's (decoupled weight decay), as PyTorch's
// torch.optim.AdamW.
type Hyper struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	// T is the step number, from 1, for bias correction.
	T int
}

// Validate says what is out of range: T < 1, a beta outside [0, 1), a
// negative or non-finite learning rate, epsilon or weight decay.
func (h Hyper) Validate() error {
	finite := func(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }
	switch {
	case h.T < 1:
		return fmt.Errorf("%w: step %d; steps count from 1", ErrBadHyper, h.T)
	case !(h.Beta1 >= 0 && h.Beta1 < 1) || !(h.Beta2 >= 0 && h.Beta2 < 1):
		return fmt.Errorf("%w: betas (%v, %v) must be in [0, 1)", ErrBadHyper, h.Beta1, h.Beta2)
	case !finite(h.LR) || h.LR < 0:
		return fmt.Errorf("%w: learning rate %v", ErrBadHyper, h.LR)
	case !finite(h.Eps) || h.Eps < 0:
		return fmt.Errorf("%w: epsilon %v", ErrBadHyper, h.Eps)
	case !finite(h.WeightDecay) || h.WeightDecay < 0:
		return fmt.Errorf("%w: weight decay %v", ErrBadHyper, h.WeightDecay)
	}
	return nil
}

// Consts are the per-step constants of the update, computed in float64
// from the hyper-parameters and the step number and rounded once to
// float32, so that they are a pure function of the Hyper.
type Consts struct {
	Beta1, OneMinusBeta1 float32
	Beta2, OneMinusBeta2 float32
	Decay                float32 // 1 - lr·weightDecay
	StepSize             float32 // α_t = lr·sqrt(1-β2^t)/(1-β1^t)
	EpsHat               float32 // ε̂_t = ε·sqrt(1-β2^t)
}

// Consts returns the constants of h's step. h must be valid.
func (h Hyper) Consts() Consts {
	bc1 := 1 - math.Pow(float64(h.Beta1), float64(h.T))
	sqrtBC2 := math.Sqrt(1 - math.Pow(float64(h.Beta2), float64(h.T)))
	return Consts{
		Beta1:         h.Beta1,
		OneMinusBeta1: float32(1 - float64(h.Beta1)),
		Beta2:         h.Beta2,
		OneMinusBeta2: float32(1 - float64(h.Beta2)),
		Decay:         float32(1 - float64(h.LR)*float64(h.WeightDecay)),
		StepSize:      float32(float64(h.LR) * sqrtBC2 / bc1),
		EpsHat:        float32(float64(h.Eps) * sqrtBC2),
	}
}

// Step applies one Adam(W) step with constants c to weights w and moments
// m, v from gradient g (all of len(g) elements or more; the first len(g)
// are updated). It is AdamW, as PyTorch's torch.optim.AdamW computes it,
// with the bias corrections folded into the constants as in Kingma & Ba's
// efficient form (Algorithm 1's note, §2), element by element:
//
//	m ← β1·m + (1-β1)·g
//	v ← β2·v + (1-β2)·g²
//	w ← w·(1 - lr·λ)
//	w ← w - α_t · m / (sqrt(v) + ε̂_t)
//
// with α_t = lr·sqrt(1-β2^t)/(1-β1^t) and ε̂_t = ε·sqrt(1-β2^t). That is
// PyTorch's lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + ε) exactly, in real
// arithmetic; the float32 roundings differ, and this form needs one
// division where PyTorch's needs two, which is what bounds a fused replay
// (the divider, not memory, is its limit on AVX-512).
//
// Every operation is a float32 operation rounded on its own, in this
// order, so the result is the same on every architecture and in every
// implementation here (scalar or AVX-512, one step or fused): this is the
// reference optimizer of the package, and the one a trainer whose state
// must be replayed bit for bit has to use.
func Step(w, m, v, g []float32, c Consts) {
	n := len(g)
	w, m, v = w[:n], m[:n], v[:n]
	done := stepVector(w, m, v, g, c)
	stepScalar(w[done:], m[done:], v[done:], g[done:], c)
}

// stepScalar is the portable implementation of Step. Each product is
// converted to float32 before it is added, which forbids the compiler to
// fuse it into an FMA (Go spec, "Floating-point operators").
func stepScalar(w, m, v, g []float32, c Consts) {
	n := len(g)
	w, m, v = w[:n], m[:n], v[:n]
	for i, gi := range g {
		m[i], v[i], w[i] = adamElem(w[i], m[i], v[i], gi, &c)
	}
}

// adamElem is one element's update; it returns the new m, v, w.
func adamElem(w, m, v, g float32, c *Consts) (float32, float32, float32) {
	mi := float32(c.Beta1*m) + float32(c.OneMinusBeta1*g)
	vi := float32(c.Beta2*v) + float32(c.OneMinusBeta2*float32(g*g))
	// The float64 root rounded to float32 is the correctly rounded
	// float32 root (53 ≥ 2·24+2), as VSQRTPS computes it.
	denom := float32(math.Sqrt(float64(vi))) + c.EpsHat
	wi := float32(w * c.Decay)
	wi -= float32(c.StepSize * float32(mi/denom))
	return mi, vi, wi
}

// fusedScalar applies the steps of cs in order to elements [from,
// len(w)) of w, m, v: element e gets gradient gs[s][e] at step s. It is
// the portable implementation of the fused replay's inner loop.
func fusedScalar(w, m, v []float32, gs [][]float32, cs []Consts, from int) {
	n := len(w)
	m, v = m[:n], v[:n]
	for e := from; e < n; e++ {
		wi, mi, vi := w[e], m[e], v[e]
		for s := range cs {
			mi, vi, wi = adamElem(wi, mi, vi, gs[s][e], &cs[s])
		}
		w[e], m[e], v[e] = wi, mi, vi
	}
}

// fusedKernel is the fused inner loop for one batch of steps: the vector
// kernel where there is one, then the scalar one for the rest. One is made
// per batch and worker (it holds the broadcast constants).
type fusedKernel struct {
	cs  []Consts
	vec vecConsts
}

func newFusedKernel(cs []Consts) *fusedKernel {
	return &fusedKernel{cs: cs, vec: prepareVector(cs)}
}

// run applies the batch to w, m, v with gradients gs (one per step, each
// as long as w).
func (k *fusedKernel) run(w, m, v []float32, gs [][]float32) {
	fusedScalar(w, m, v, gs, k.cs, fusedVector(w, m, v, gs, k.vec))
}

// Vectorized reports whether Step and Fused run their AVX-512 kernels on
// this CPU (a build with GOEXPERIMENT=simd on a CPU that has them); else
// they run the portable ones, which give the same bits, slower.
func Vectorized() bool { return haveVector }
