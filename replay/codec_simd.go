//go:build goexperiment.simd && amd64

package replay

import (
	"math/bits"
	"simd/archsimd"
)

// AVX-512 codec kernels (simd/archsimd, GOEXPERIMENT=simd). Each computes
// exactly what its portable counterpart in codec.go or codec_topk.go
// does, element for element, with the same IEEE operations (x/scale
// rounded once, clamped, rounded half to even; float32(q)·scale rounded
// once), so the bytes are identical; codec_simd_test.go checks it.
//
// Every kernel clears the upper halves of the vector registers
// (archsimd.ClearAVXUpperBits, VZEROUPPER) before any scalar float code
// and before returning: Go compiles scalar float operations to legacy SSE
// instructions, which run several times slower while those halves are
// dirty from AVX-512 code (measured here: the vector scan was 4× slower
// than the portable one until its candidates' handling stopped touching
// float registers).

var avx512CodecKernels = codecKernelSet{
	name:       "avx512",
	quantize:   quantizeAVX512,
	dequantize: dequantizeAVX512,
	scan:       scanAVX512,

	keysAtLeast: keysAtLeastAVX512,
}

func vectorCodecKernels() *codecKernelSet {
	if archsimd.X86.AVX512() {
		return &avx512CodecKernels
	}
	return nil
}

func quantizeAVX512(x []float32, bs int, scales []float32, q []int8) {
	for b := range scales {
		lo := b * bs
		hi := min(lo+bs, len(x))
		scales[b] = quantizeBlockAVX512(x[lo:hi], q[lo:hi])
	}
}

// quantizeBlockAVX512 is quantizeBlockGeneric. The scalar float code
// (the scale, the tail) runs after ClearAVXUpperBits: legacy SSE
// instructions after AVX-512 ones that leave the upper halves of the
// registers dirty are penalized, by far more than the vector loop gains.
func quantizeBlockAVX512(x []float32, q []int8) float32 {
	n := len(x)
	q = q[:n]
	u := f32bits(x)

	// The largest finite magnitude, as bits.
	var m uint32
	i := 0
	if n >= 16 {
		abs := archsimd.BroadcastUint32x16(0x7fffffff)
		inf := archsimd.BroadcastUint32x16(0x7f800000)
		var acc archsimd.Uint32x16
		for ; i+16 <= n; i += 16 {
			k := archsimd.LoadUint32x16Slice(u[i:]).And(abs)
			acc = acc.Max(k.Masked(k.Less(inf)))
		}
		var lanes [16]uint32
		acc.StoreSlice(lanes[:])
		archsimd.ClearAVXUpperBits()
		for _, k := range lanes {
			m = max(m, k)
		}
	}
	for _, v := range u[i:] {
		if k := v & 0x7fffffff; k < 0x7f800000 {
			m = max(m, k)
		}
	}
	scale := int8Scale(m)
	i = 0
	if scale != 0 && n >= 16 {
		abs := archsimd.BroadcastUint32x16(0x7fffffff)
		inf := archsimd.BroadcastUint32x16(0x7f800000)
		sv := archsimd.BroadcastFloat32x16(scale)
		lo, hi := archsimd.BroadcastFloat32x16(-127), archsimd.BroadcastFloat32x16(127)
		nonFinite := archsimd.BroadcastInt32x16(q8NonFinite)
		for ; i+16 <= n; i += 16 {
			v := archsimd.LoadFloat32x16Slice(x[i:])
			r := v.Div(sv).Max(lo).Min(hi).RoundToEvenScaled(0).ConvertToInt32()
			nf := v.AsUint32x16().And(abs).GreaterEqual(inf)
			nonFinite.Merge(r, nf).SaturateToInt8().StoreSlice(q[i:])
		}
		archsimd.ClearAVXUpperBits()
	}
	for ; i < n; i++ {
		q[i] = quantize1(x[i], scale)
	}
	return scale
}

func dequantizeAVX512(dst []float32, q []int8, scale float32) {
	n := len(dst)
	q = q[:n]
	sv := archsimd.BroadcastFloat32x16(scale)
	nan := archsimd.BroadcastUint32x16(q8NaN).AsFloat32x16()
	nonFinite := archsimd.BroadcastInt32x16(q8NonFinite)
	i := 0
	for ; i+16 <= n; i += 16 {
		qi := archsimd.LoadInt8x16Slice(q[i:]).ExtendToInt32()
		f := qi.ConvertToFloat32().Mul(sv)
		nan.Merge(f, qi.Equal(nonFinite)).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	for ; i < n; i++ {
		dst[i] = dequantize1(q[i], scale)
	}
}

// scanAVX512 compares 64 magnitudes with the threshold per step and hands
// the (rare) candidates, in order, to the scalar logic.
func scanAVX512(x []float32, thr uint32, budget int, idx []int32, vals []uint16) ([]int32, []uint16, int) {
	u := f32bits(x)
	n := len(u)
	lo := scanFloor(thr, budget)
	abs := archsimd.BroadcastUint32x16(0x7fffffff)
	t := archsimd.BroadcastUint32x16(lo)
	i := 0
	for ; i+64 <= n; i += 64 {
		m0 := archsimd.LoadUint32x16Slice(u[i:]).And(abs).GreaterEqual(t).ToBits()
		m1 := archsimd.LoadUint32x16Slice(u[i+16:]).And(abs).GreaterEqual(t).ToBits()
		m2 := archsimd.LoadUint32x16Slice(u[i+32:]).And(abs).GreaterEqual(t).ToBits()
		m3 := archsimd.LoadUint32x16Slice(u[i+48:]).And(abs).GreaterEqual(t).ToBits()
		all := uint64(m0) | uint64(m1)<<16 | uint64(m2)<<32 | uint64(m3)<<48
		for all != 0 {
			j := i + bits.TrailingZeros64(all)
			all &= all - 1
			if u[j]&0x7fffffff == thr {
				if budget == 0 {
					continue // the budget ran out within these 64
				}
				if budget--; budget == 0 {
					lo = thr + 1
					t = archsimd.BroadcastUint32x16(lo)
				}
			}
			idx = append(idx, int32(j))
			vals = append(vals, f32BitsToF16(u[j]))
		}
	}
	archsimd.ClearAVXUpperBits()
	for ; i < n; i++ {
		k := u[i] & 0x7fffffff
		if k < lo {
			continue
		}
		if k == thr {
			if budget--; budget == 0 {
				lo = thr + 1
			}
		}
		idx = append(idx, int32(i))
		vals = append(vals, f32BitsToF16(u[i]))
	}
	return idx, vals, budget
}

// keysAtLeastAVX512 is keysAtLeastGeneric, 16 keys per step: every step
// stores the qualifying keys compressed to the front of a vector (the
// other lanes are overwritten by the next step) and advances by their
// count, branch-free.
func keysAtLeastAVX512(keys []uint32, lo uint32, out []uint32) []uint32 {
	n := len(keys)
	out = out[:n]
	abs := archsimd.BroadcastUint32x16(0x7fffffff)
	l := archsimd.BroadcastUint32x16(lo)
	c, i := 0, 0
	for ; i+16 <= n; i += 16 { // c <= i, so out[c:c+16] is within out
		k := archsimd.LoadUint32x16Slice(keys[i:]).And(abs)
		m := k.GreaterEqual(l)
		k.Compress(m).StoreSlice(out[c:])
		c += bits.OnesCount16(m.ToBits())
	}
	archsimd.ClearAVXUpperBits()
	for _, v := range keys[i:] {
		k := v & 0x7fffffff
		out[c] = k
		c += int((lo - 1 - k) >> 31)
	}
	return out[:c]
}
