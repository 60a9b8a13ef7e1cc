package main

// The model. Parameters w ∈ R^P; sample s defines a target
//
//	t_i(s) = Σ_{r<K} a_r(s)·u_r(i)
//
// a rank-K combination of a fixed random basis u_r(i) (a pure function of
// seed, i and r, recomputed on the fly, so it costs no memory) with per-sample
// coefficients a_r(s) (see sampleCoefficients). The sum is taken in float32,
// 0 + a_0·u_0 + a_1·u_1 + … + a_{K-1}·u_{K-1}, left to right, each product
// rounded before it is added. The loss of a step is
//
//	L(w) = 1/B · Σ_s ½ Σ_i (w_i - t_i(s))²
//
// so ∂L/∂w_i = 1/B · Σ_s (w_i - t_i(s)): per parameter and sample, K
// multiply-adds for the target and one fixed-point conversion; K is --compute.
// The optimum is the mean target Σ_r E[a_r]·u_r(i), which Adam approaches
// from the random initial parameters while the loss falls to the noise floor.
// The printed loss is L/P, the loss per parameter.

// block is how many parameters the kernel works on at a time: their basis
// and targets stay in L1 cache while it goes through the samples.
const block = 256

// kernelScratch is the kernel's working memory, allocated once.
type kernelScratch struct {
	u []float32 // K×block: u_r(i) for the block's parameters, r-major
	t []float32 // block: one sample's targets
}

func newKernelScratch(k int) kernelScratch {
	return kernelScratch{u: make([]float32, k*block), t: make([]float32, block)}
}

// gradChunk sets out[e], for each parameter i = first+e of a chunk, to the
// fixed-point sum over this rank's samples of w_i - t_i(s). w holds the
// chunk's parameters, coef the samples' coefficients (one row of K per
// sample) and key is the basis stream's key.
//
// If loss is not nil, it also adds Σ_i (w_i - t_i(s))² over the chunk's
// parameters to loss[n] for this rank's sample n, in float64, in increasing
// parameter order: every sample is handled whole by one rank, in the same
// order whatever the world size or the chunking, so each sample's loss is
// exactly the same too.
func gradChunk(out []int64, loss []float64, w []float32, first int, coef []float32, s kernelScratch, key uint64) {
	k := len(s.u) / block
	nloc := len(coef) / k
	w = w[:len(out)]
	for b0 := 0; b0 < len(out); b0 += block {
		n := min(block, len(out)-b0)
		o, wb, t := out[b0:b0+n], w[b0:b0+n], s.t[:n]
		for r := range k {
			fillBasis(s.u[r*block:r*block+n], key, uint64(first+b0)*uint64(k)+uint64(r), uint64(k))
		}
		clear(o)
		last := s.u[(k-1)*block : (k-1)*block+n]
		for j := range nloc {
			a := coef[j*k : j*k+k]
			// t = 0 + a_0·u_0 + … + a_{K-2}·u_{K-2}; the last term is
			// added where t is used.
			clear(t)
			for r := range k - 1 {
				addScaled(t, s.u[r*block:r*block+n], a[r])
			}
			if loss == nil {
				accumulate(o, wb, t, last, a[k-1])
			} else {
				loss[j] = accumulateLoss(o, wb, t, last, a[k-1], loss[j])
			}
		}
	}
}

// The kernel's inner loops are small functions of their own, so that each
// gets all the registers it needs.

// fillBasis sets u[e] to value c+e·stride of the basis stream.
func fillBasis(u []float32, key, c, stride uint64) {
	for e := range u {
		u[e] = unit(at(key, c))
		c += stride
	}
}

// addScaled adds a·u to t, rounding each product before the addition.
func addScaled(t, u []float32, a float32) {
	u = u[:len(t)]
	for e := range t {
		t[e] += float32(a * u[e])
	}
}

// accumulate adds to o[e] the fixed-point residual w[e] - (t[e] + a·u[e]).
func accumulate(o []int64, w, t, u []float32, a float32) {
	w, t, u = w[:len(o)], t[:len(o)], u[:len(o)]
	for e := range o {
		o[e] += toFixed(w[e] - (t[e] + float32(a*u[e])))
	}
}

// accumulateLoss is accumulate that also adds the squared residuals to l, in
// order, and returns it.
func accumulateLoss(o []int64, w, t, u []float32, a float32, l float64) float64 {
	w, t, u = w[:len(o)], t[:len(o)], u[:len(o)]
	for e := range o {
		d := w[e] - (t[e] + float32(a*u[e]))
		o[e] += toFixed(d)
		// The square of a float32 is exact in float64, so the sum is the
		// only rounding (and an FMA could not change it).
		l += float64(float64(d) * float64(d))
	}
	return l
}
