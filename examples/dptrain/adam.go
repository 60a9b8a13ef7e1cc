package main

import "math"

// adamHyper are Adam's hyper-parameters. With weightDecay > 0 the update is
// AdamW's (decoupled weight decay).
type adamHyper struct {
	lr, beta1, beta2, eps, weightDecay float32
}

// adamStepConsts are the per-step constants of the update, computed in
// float64 from the hyper-parameters and the step number and rounded once to
// float32, so that they are a pure function of (hyper-parameters, t).
type adamStepConsts struct {
	beta1, oneMinusBeta1 float32
	beta2, oneMinusBeta2 float32
	eps                  float32
	decay                float32 // 1 - lr·weightDecay
	stepSize             float32 // lr / (1 - beta1^t)
	sqrtBC2              float32 // sqrt(1 - beta2^t)
}

// consts returns the constants of step t (t ≥ 1).
func (h adamHyper) consts(t int) adamStepConsts {
	bc1 := 1 - math.Pow(float64(h.beta1), float64(t))
	bc2 := 1 - math.Pow(float64(h.beta2), float64(t))
	return adamStepConsts{
		beta1:         h.beta1,
		oneMinusBeta1: float32(1 - float64(h.beta1)),
		beta2:         h.beta2,
		oneMinusBeta2: float32(1 - float64(h.beta2)),
		eps:           h.eps,
		decay:         float32(1 - float64(float64(h.lr)*float64(h.weightDecay))),
		stepSize:      float32(float64(h.lr) / bc1),
		sqrtBC2:       float32(math.Sqrt(bc2)),
	}
}

// adamUpdate applies one Adam(W) step to a shard, element by element: the
// master weights w, the moments m and v, from the gradient g (all of the
// same length). It is PyTorch's AdamW update:
//
//	m ← β1·m + (1-β1)·g
//	v ← β2·v + (1-β2)·g²
//	w ← w·(1 - lr·λ)
//	w ← w - lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + ε)
//
// Every operation is a float32 operation rounded on its own: each product is
// converted to float32 before it is added, which forbids the compiler to fuse
// it into an FMA (Go spec, "Floating-point operators"), so the result is the
// same on every architecture. Each element's update depends only on that
// element, which is what makes the result independent of shard boundaries.
//
// The loop is written so that the compiler's register allocation gives the
// SQRTSS no false dependency on the previous iteration (an earlier version
// with a sqrt helper ran 3× slower for that reason alone: BenchmarkAdam).
func adamUpdate(w, m, v, g []float32, c adamStepConsts) {
	n := len(g)
	w, m, v = w[:n], m[:n], v[:n]
	for i, gi := range g {
		mi := float32(c.beta1*m[i]) + float32(c.oneMinusBeta1*gi)
		vi := float32(c.beta2*v[i]) + float32(c.oneMinusBeta2*float32(gi*gi))
		// The float64 root rounded to float32 is the correctly rounded
		// float32 root (53 ≥ 2·24+2); the compiler emits SQRTSS for it.
		denom := float32(float32(math.Sqrt(float64(vi)))/c.sqrtBC2) + c.eps
		wi := float32(w[i] * c.decay)
		wi -= float32(c.stepSize * float32(mi/denom))
		m[i], v[i], w[i] = mi, vi, wi
	}
}
