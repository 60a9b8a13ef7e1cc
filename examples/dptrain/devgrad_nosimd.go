//go:build !(goexperiment.simd && amd64)

package main

// Without GOEXPERIMENT=simd there is no vector kernel: deviceGradScalar
// does all the work.

const haveVector = false

func deviceGradVector(g, w []float32, key, noiseKey uint64, lo int) int { return 0 }
