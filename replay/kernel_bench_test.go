package replay

import "testing"

// BenchmarkFusedKernelInCache: the fused kernel alone, 16 steps on 2,048
// elements that stay in cache: what the divider allows (one VSQRTPS and one
// VDIVPS per vector and step), the floor under BenchmarkReplay's fused
// figure.
func BenchmarkFusedKernelInCache(b *testing.B) {
	const n, steps = 2048, 16
	st := benchState(n)
	gs := make([][]float32, steps)
	cs := make([]Consts, steps)
	for s := range gs {
		gs[s] = make([]float32, n)
		for i := range gs[s] {
			gs[s][i] = float32(i%100) * 1e-4
		}
		cs[s] = testHyper(s + 1).Consts()
	}
	k := newFusedKernel(cs)
	work := st.clone()
	for b.Loop() {
		// From the same state every time: repeated steps with zero
		// gradients would drive m into denormals, which are slow.
		copy(work.W, st.W)
		copy(work.M, st.M)
		copy(work.V, st.V)
		k.run(work.W, work.M, work.V, gs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n*steps), "ns/elem-step")
}
