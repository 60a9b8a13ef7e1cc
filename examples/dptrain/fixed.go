package main

// Gradients are summed in fixed point so that the sum is exact and does not
// depend on how the samples are grouped across ranks (integer addition is
// associative; floating-point addition is not).
//
// A contribution d (a float32) becomes d·2^32 rounded toward zero, as an
// int64. Its resolution is 2^-32 ≈ 2.3e-10, and the conversion is exact for
// |d| ≥ 2^-9 (where a float32's spacing is at least 2^-32); smaller values
// lose less than 2^-32 each. Contributions saturate at ±2^15 = ±32768, that
// is ±2^47 in fixed point, and NaN becomes 0; the saturation is applied to
// each sample's contribution, before any summation, so it too is independent
// of the grouping. With at most maxBatch = 2^15 contributions per parameter,
// every partial and total sum is at most 2^62 in magnitude and cannot
// overflow (and since int64 addition wraps modulo 2^64, the total would be
// grouping-independent even if a partial sum did). The sum is converted back
// once, after the reduction, by fromFixed.
const (
	fixedScale = 0x1p32                  // 2^32, one unit in fixed point
	fixedLimit = 0x1p47                  // largest magnitude of one contribution, in fixed point
	fixedMax   = fixedLimit / fixedScale // largest magnitude of one contribution, 2^15
	maxBatch   = 1 << 15                 // most contributions that can be summed without overflow
)

// toFixed converts one contribution to fixed point.
func toFixed(d float32) int64 {
	// Scaling by a power of two is exact (an overflow to ±Inf saturates).
	x := float32(d * fixedScale)
	if !(x >= -fixedLimit && x <= fixedLimit) {
		return saturate(x)
	}
	return int64(x) // truncates toward zero
}

// saturate converts an out-of-range or NaN scaled contribution.
func saturate(x float32) int64 {
	switch {
	case x > 0:
		return fixedLimit
	case x < 0:
		return -fixedLimit
	default: // NaN
		return 0
	}
}

// fromFixed converts a fixed-point sum of n contributions to their mean, as
// a float32: one float64 division by n·2^32, rounded once to float32.
func fromFixed(sum int64, n int) float32 {
	return float32(float64(sum) / (fixedScale * float64(n)))
}
