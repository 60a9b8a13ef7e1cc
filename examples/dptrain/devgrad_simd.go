//go:build goexperiment.simd && amd64

package main

import "simd/archsimd"

// The AVX-512 kernel of deviceGrad: deviceGradScalar's operations on
// sixteen elements at a time. The integers are computed in 64-bit lanes,
// eight to a vector (VPADDQ, VPXORQ, VPSRLVQ, VPMULLQ: exact and wrapping
// like Go's uint64), the floats in float32 lanes (VMULPS, VADDPS, VSUBPS,
// each rounded to nearest even as the scalar code's; no FMA).
//
// unit's int64(z)>>40 is taken from the high 32 bits of each 64-bit lane:
// shifted arithmetically by 8 more they are the same 24-bit signed value,
// which VCVTDQ2PS converts exactly. Gathering the high halves of two
// vectors of words into one (VPERMT2D) and converting sixteen 32-bit
// integers at a time is several times cheaper than VPSRAQ and VCVTQQ2PS
// on eight 64-bit ones (which took half the kernel's time on AMD Zen 4).

// haveVector says whether the AVX-512 kernel runs on this CPU
// (AVX512F+DQ+VL among the features archsimd bundles: VPMULLQ is
// AVX512DQ).
var haveVector = archsimd.X86.AVX512()

// vconsts are the kernel's constants, broadcast once per call of
// deviceGradVector (the compiler does not hoist broadcasts out of a loop).
// The shifts by a constant are by a vector of counts (VPSRLVQ): the
// compiler emits ShiftAllRight on Uint64x8 with its count in a register
// moved in at every use.
type vconsts struct {
	m1, m2        archsimd.Uint64x8 // mix64's multipliers
	s30, s27, s31 archsimd.Uint64x8 // and its shifts
	high          archsimd.Uint32x16
	scale         archsimd.Float32x16 // 2^-23
	quarter       archsimd.Float32x16 // 0.25
}

func newVconsts() vconsts {
	var high [16]uint32
	for k := range high {
		high[k] = uint32(2*k + 1) // the high half of word k of x:y
	}
	return vconsts{
		m1:      archsimd.BroadcastUint64x8(0xbf58476d1ce4e5b9),
		m2:      archsimd.BroadcastUint64x8(0x94d049bb133111eb),
		s30:     archsimd.BroadcastUint64x8(30),
		s27:     archsimd.BroadcastUint64x8(27),
		s31:     archsimd.BroadcastUint64x8(31),
		high:    archsimd.LoadUint32x16(&high),
		scale:   archsimd.BroadcastFloat32x16(0x1p-23),
		quarter: archsimd.BroadcastFloat32x16(0.25),
	}
}

// mix64Vec is mix64 on eight lanes.
func mix64Vec(z archsimd.Uint64x8, c *vconsts) archsimd.Uint64x8 {
	z = z.Xor(z.ShiftRight(c.s30)).Mul(c.m1)
	z = z.Xor(z.ShiftRight(c.s27)).Mul(c.m2)
	return z.Xor(z.ShiftRight(c.s31))
}

// unitVec is unit on sixteen words, those of lo (in lanes 0..7) and then
// those of hi.
func unitVec(lo, hi archsimd.Uint64x8, c *vconsts) archsimd.Float32x16 {
	top := lo.AsInt32x16().ConcatPermute(hi.AsInt32x16(), c.high)
	return top.ShiftAllRight(8).ConvertToFloat32().Mul(c.scale)
}

// deviceGradVector runs deviceGradScalar(g, w, key, noiseKey, lo) on the
// longest prefix of whole vectors of sixteen elements of g and returns its
// length; w is as long as g.
//
// The streams' counters are not multiplied out per element: lane j of
// the first two vectors of words holds key + (2(lo+j)+1)·golden (what
// at(key, 2·idx) hands mix64) and noiseKey + (2(lo+j)+2)·golden, j =
// 0..15, and each round adds 32·golden to every lane, all modulo 2^64 as
// the scalar code's products and sums are.
func deviceGradVector(g, w []float32, key, noiseKey uint64, lo int) int {
	if !haveVector {
		return 0
	}
	n := len(g) &^ 15
	if n == 0 {
		return 0
	}
	w = w[:n]
	step := uint64(golden) // the counters' step, wrapping from here on
	var lane [8]uint64
	for j := range lane {
		lane[j] = 2 * uint64(j) * step
	}
	offsets := archsimd.LoadUint64x8(&lane)
	half := archsimd.BroadcastUint64x8(16 * step) // eight elements on
	stride := half.Add(half)
	t0 := archsimd.BroadcastUint64x8(key + (2*uint64(lo)+1)*step).Add(offsets)
	n0 := archsimd.BroadcastUint64x8(noiseKey + (2*uint64(lo)+2)*step).Add(offsets)
	t1, n1 := t0.Add(half), n0.Add(half)
	c := newVconsts()
	for i := 0; i < n; i += 16 {
		target := unitVec(mix64Vec(t0, &c), mix64Vec(t1, &c), &c)
		noise := unitVec(mix64Vec(n0, &c), mix64Vec(n1, &c), &c)
		wi := archsimd.LoadFloat32x16Slice(w[i : i+16])
		wi.Sub(target.Add(c.quarter.Mul(noise))).StoreSlice(g[i : i+16])
		t0, t1 = t0.Add(stride), t1.Add(stride)
		n0, n1 = n0.Add(stride), n1.Add(stride)
	}
	// Scalar float code right after AVX-512 code runs several times
	// slower until the upper halves of the vector registers are cleared.
	archsimd.ClearAVXUpperBits()
	return n
}
