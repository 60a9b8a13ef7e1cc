package replay

import "math"

// IEEE 754 binary16 ("fp16", "half"): 1 sign bit, 5 exponent bits (bias
// 15), 10 fraction bits. TopK stores the values it keeps in this format.

// f32ToF16 converts f to binary16, rounding to nearest, ties to even, as
// the hardware conversions (F16C's VCVTPS2PH with rounding control 0)
// do: magnitudes from 65520 up overflow to ±Inf, magnitudes below 2^-14
// become subnormals (and those up to 2^-25 included round to ±0), the
// sign of zero is kept, and a NaN stays a NaN with its sign and the top
// 10 bits of its payload, its quiet bit set (so that a NaN whose payload
// lies entirely in the low bits does not turn into an infinity).
func f32ToF16(f float32) uint16 { return f32BitsToF16(math.Float32bits(f)) }

// f32BitsToF16 is f32ToF16 of the float32 whose bits are b (integer
// operations only: the vector kernels call it without leaving AVX state).
func f32BitsToF16(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7e00 | uint16(a>>13)&0x3ff
	case a >= 0x477ff000: // |f| >= 65520, halfway from 65504 (the largest half) to 65536: ties to even go up
		return sign | 0x7c00
	case a >= 0x38800000: // |f| >= 2^-14: normal (rounding may carry into the exponent, which is right)
		a -= (127 - 15) << 23
		a += 0xfff + (a>>13)&1
		return sign | uint16(a>>13)
	case a >= 0x33000000: // 2^-25 <= |f| < 2^-14: subnormal, m·2^-24 (m may round up to 1024, the smallest normal)
		e := a >> 23
		mant := a&0x7fffff | 0x800000
		shift := 126 - e // 14..24
		m := mant >> shift
		rem := mant & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && m&1 == 1 {
			m++
		}
		return sign | uint16(m)
	default: // below 2^-25 (or exactly it: the tie goes to the even 0)
		return sign
	}
}

// f16ToF32 converts a binary16 to float32, exactly (every binary16 value
// is a float32 value; a NaN keeps its sign and payload).
func f16ToF32(h uint16) float32 { return math.Float32frombits(f16ToF32Bits(h)) }

// f16ToF32Bits is the bits of f16ToF32(h) (integer operations only).
func f16ToF32Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch {
	case e == 0x1f: // Inf, NaN
		return sign | 0x7f800000 | m<<13
	case e != 0:
		return sign | (e+127-15)<<23 | m<<13
	case m == 0:
		return sign
	default: // subnormal m·2^-24: normalize
		e = 127 - 14
		for m&0x400 == 0 {
			m <<= 1
			e--
		}
		return sign | e<<23 | (m&0x3ff)<<13
	}
}
