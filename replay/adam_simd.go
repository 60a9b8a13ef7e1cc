//go:build goexperiment.simd && amd64

package replay

import "simd/archsimd"

// The AVX-512 kernels of the optimizer: the same float32 operations as
// adamElem, in the same order, sixteen elements at a time (VSQRTPS and
// VDIVPS round correctly, as the scalar code does; no FMA). A step costs
// one VSQRTPS and one VDIVPS per vector, which share the divider: that,
// not memory, bounds the fused replay.

// haveVector says whether the vector kernels run on this CPU.
var haveVector = archsimd.X86.AVX512()

// vconsts are a step's constants, broadcast.
type vconsts struct {
	beta1, omb1, beta2, omb2, decay, stepSize, epsHat archsimd.Float32x16
}

func broadcast(c *Consts) vconsts {
	b := archsimd.BroadcastFloat32x16
	return vconsts{
		b(c.Beta1), b(c.OneMinusBeta1), b(c.Beta2), b(c.OneMinusBeta2),
		b(c.Decay), b(c.StepSize), b(c.EpsHat),
	}
}

// adamVec is adamElem on sixteen elements.
func adamVec(w, m, v, g archsimd.Float32x16, c *vconsts) (archsimd.Float32x16, archsimd.Float32x16, archsimd.Float32x16) {
	mi := c.beta1.Mul(m).Add(c.omb1.Mul(g))
	vi := c.beta2.Mul(v).Add(c.omb2.Mul(g.Mul(g)))
	denom := vi.Sqrt().Add(c.epsHat)
	wi := w.Mul(c.decay)
	wi = wi.Sub(c.stepSize.Mul(mi.Div(denom)))
	return mi, vi, wi
}

// stepVector runs Step on the longest prefix of whole vectors and returns
// its length.
func stepVector(w, m, v, g []float32, c Consts) int {
	if !haveVector {
		return 0
	}
	n := len(g) &^ 15
	w, m, v, g = w[:n], m[:n], v[:n], g[:n]
	vc := broadcast(&c)
	for i := 0; i < n; i += 16 {
		mi, vi, wi := adamVec(
			archsimd.LoadFloat32x16Slice(w[i:i+16]),
			archsimd.LoadFloat32x16Slice(m[i:i+16]),
			archsimd.LoadFloat32x16Slice(v[i:i+16]),
			archsimd.LoadFloat32x16Slice(g[i:i+16]), &vc)
		mi.StoreSlice(m[i : i+16])
		vi.StoreSlice(v[i : i+16])
		wi.StoreSlice(w[i : i+16])
	}
	// Scalar float code right after AVX-512 code runs several times
	// slower until the upper halves of the vector registers are cleared.
	archsimd.ClearAVXUpperBits()
	return n
}

// vecConsts are the broadcast constants of a fused batch, prepared once
// per batch and worker.
type vecConsts []vconsts

func prepareVector(cs []Consts) vecConsts {
	if !haveVector {
		return nil
	}
	vcs := make(vecConsts, len(cs))
	for s := range cs {
		vcs[s] = broadcast(&cs[s])
	}
	return vcs
}

// fusedVector runs the fused loop on the longest prefix of whole vectors
// and returns its length.
func fusedVector(w, m, v []float32, gs [][]float32, vcs vecConsts) int {
	if vcs == nil {
		return 0
	}
	// Two vectors at a time: each step of one element is a chain of
	// dependent square root and divisions, longer in latency than in
	// throughput, so two independent chains keep the units busy.
	n2 := len(w) &^ 31
	for i := 0; i < n2; i += 32 {
		j := i + 16
		wi := archsimd.LoadFloat32x16Slice(w[i : i+16])
		mi := archsimd.LoadFloat32x16Slice(m[i : i+16])
		vi := archsimd.LoadFloat32x16Slice(v[i : i+16])
		wj := archsimd.LoadFloat32x16Slice(w[j : j+16])
		mj := archsimd.LoadFloat32x16Slice(m[j : j+16])
		vj := archsimd.LoadFloat32x16Slice(v[j : j+16])
		for s := range vcs {
			g := gs[s][i : i+32]
			mi, vi, wi = adamVec(wi, mi, vi, archsimd.LoadFloat32x16Slice(g[:16]), &vcs[s])
			mj, vj, wj = adamVec(wj, mj, vj, archsimd.LoadFloat32x16Slice(g[16:32]), &vcs[s])
		}
		mi.StoreSlice(m[i : i+16])
		vi.StoreSlice(v[i : i+16])
		wi.StoreSlice(w[i : i+16])
		mj.StoreSlice(m[j : j+16])
		vj.StoreSlice(v[j : j+16])
		wj.StoreSlice(w[j : j+16])
	}
	n := len(w) &^ 15
	for i := n2; i < n; i += 16 {
		wi := archsimd.LoadFloat32x16Slice(w[i : i+16])
		mi := archsimd.LoadFloat32x16Slice(m[i : i+16])
		vi := archsimd.LoadFloat32x16Slice(v[i : i+16])
		for s := range vcs {
			g := archsimd.LoadFloat32x16Slice(gs[s][i : i+16])
			mi, vi, wi = adamVec(wi, mi, vi, g, &vcs[s])
		}
		mi.StoreSlice(m[i : i+16])
		vi.StoreSlice(v[i : i+16])
		wi.StoreSlice(w[i : i+16])
	}
	archsimd.ClearAVXUpperBits()
	return n
}
