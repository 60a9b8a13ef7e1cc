// Package replay keeps and replays the differential stream of a rank's
// training state (TierCheck §3.2-§3.3): every step's gradient, compressed by
// size (dense INT8 with a per-block scale for small tensors, sampled-threshold
// top-k with fp16 values and int32 indices for large ones, or lossless raw
// float32), framed in versioned, checksummed records; and Adam/AdamW replay
// of N such steps onto a base checkpoint's weights and moments, either one
// step after another (sequential) or in one pass over memory that applies
// the N steps to each element in temporal order (fused).
//
// The optimizer here ([Step]) is the reference: replay with lossless
// differentials reproduces the states it produced bit for bit, sequential
// and fused alike, because every path performs the same float32 operations
// in the same order, each rounded on its own (no fused multiply-add).
//
// Hot loops have two implementations: portable Go, always built, and
// AVX-512 kernels built with GOEXPERIMENT=simd (simd/archsimd) and used when
// the CPU has AVX-512; tests check that both give identical bits.
//
// The package has no gorun dependencies.
package replay
