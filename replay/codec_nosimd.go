//go:build !(goexperiment.simd && amd64)

package replay

// Without GOEXPERIMENT=simd on amd64 there are no vector codec kernels:
// the portable loops of codec.go and codec_topk.go do all the work.

func vectorCodecKernels() *codecKernelSet { return nil }
