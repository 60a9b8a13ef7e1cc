//go:build !(goexperiment.simd && amd64)

package replay

// Without GOEXPERIMENT=simd there are no vector kernels: the scalar loops
// do all the work.

const haveVector = false

func stepVector(w, m, v, g []float32, c Consts) int { return 0 }

type vecConsts struct{}

func prepareVector(cs []Consts) vecConsts { return vecConsts{} }

func fusedVector(w, m, v []float32, gs [][]float32, vcs vecConsts) int { return 0 }
