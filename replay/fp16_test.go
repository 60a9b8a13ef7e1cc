package replay

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// f16Value is the exact value of the finite binary16 h, computed from the
// definition in float64 (independently of f16ToF32).
func f16Value(h uint16) float64 {
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	var v float64
	if e == 0 {
		v = math.Ldexp(m, -24)
	} else {
		v = math.Ldexp(1+m/1024, e-15)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

// TestF16ToF32Exhaustive checks every one of the 65536 binary16 values:
// the conversion to float32 is exact, converting back gives the same bits
// (for every non-NaN), and NaNs stay NaNs with their sign and payload.
func TestF16ToF32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := f16ToF32(h)
		fb := math.Float32bits(f)
		if fb>>31 != uint32(h>>15) {
			t.Fatalf("f16ToF32(%#04x) = %v: sign lost", h, f)
		}
		if h&0x7c00 == 0x7c00 { // Inf or NaN
			if h&0x3ff == 0 {
				if !math.IsInf(float64(f), 0) {
					t.Fatalf("f16ToF32(%#04x) = %v, want Inf", h, f)
				}
			} else {
				if f == f {
					t.Fatalf("f16ToF32(%#04x) = %v, want NaN", h, f)
				}
				if got := fb >> 13 & 0x3ff; got != uint32(h&0x3ff) {
					t.Fatalf("f16ToF32(%#04x) = %#08x: payload %#x, want %#x", h, fb, got, h&0x3ff)
				}
				want := h | 0x0200 // quieted
				if back := f32ToF16(f); back != want {
					t.Fatalf("f32ToF16(f16ToF32(%#04x)) = %#04x, want %#04x", h, back, want)
				}
				continue
			}
		} else if want := f16Value(h); float64(f) != want {
			t.Fatalf("f16ToF32(%#04x) = %v, want %v", h, f, want)
		}
		if back := f32ToF16(f); back != h {
			t.Fatalf("f32ToF16(f16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

// TestF32ToF16Midpoints checks rounding at and next to every midpoint
// between consecutive binary16 values of either sign, including the one
// between the largest half (65504) and 65536, where overflow to Inf
// starts.
func TestF32ToF16Midpoints(t *testing.T) {
	for h := uint16(0); h < 0x7c00; h++ {
		lo := f16Value(h)
		hi := 65536.0 // the would-be next value after 65504
		next := h + 1 // 0x7c00 = Inf after 0x7bff
		if h < 0x7bff {
			hi = f16Value(h + 1)
		}
		mid := float32((lo + hi) / 2)
		if float64(mid) != (lo+hi)/2 {
			t.Fatalf("midpoint of %#04x not exact in float32", h)
		}
		even := h
		if h&1 == 1 {
			even = next
		}
		below := math.Nextafter32(mid, -1)
		above := math.Nextafter32(mid, math.MaxFloat32)
		for _, sign := range []uint16{0, 0x8000} {
			neg := func(f float32) float32 {
				if sign != 0 {
					return -f
				}
				return f
			}
			if got := f32ToF16(neg(mid)); got != even|sign {
				t.Fatalf("f32ToF16(%v) = %#04x, want %#04x (tie to even)", neg(mid), got, even|sign)
			}
			if got := f32ToF16(neg(below)); got != h|sign {
				t.Fatalf("f32ToF16(%v) = %#04x, want %#04x", neg(below), got, h|sign)
			}
			if got := f32ToF16(neg(above)); got != next|sign {
				t.Fatalf("f32ToF16(%v) = %#04x, want %#04x", neg(above), got, next|sign)
			}
		}
	}
}

// refF32ToF16 is a slow reference: the nearest binary16 by search in the
// sorted table of all finite non-negative binary16 values, ties to even,
// overflow to Inf at 65520 and above.
func refF32ToF16(f float32, table []float64) uint16 {
	var sign uint16
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	if f != f {
		return 0x7e00 | sign | uint16(math.Float32bits(f)>>13)&0x3ff
	}
	a := math.Abs(float64(f))
	if a >= 65520 {
		return 0x7c00 | sign
	}
	i := sort.SearchFloat64s(table, a) // first table[i] >= a
	if i < len(table) && table[i] == a {
		return uint16(i) | sign
	}
	lo, hi := table[i-1], table[i]
	switch {
	case a-lo < hi-a:
		return uint16(i-1) | sign
	case a-lo > hi-a:
		return uint16(i) | sign
	case (i-1)&1 == 0:
		return uint16(i-1) | sign
	default:
		return uint16(i) | sign
	}
}

// TestF32ToF16Sweep compares f32ToF16 with the reference on a stride
// through all float32 bit patterns, random ones, and edge cases.
func TestF32ToF16Sweep(t *testing.T) {
	table := make([]float64, 0x7c01)
	for h := range 0x7c00 {
		table[h] = f16Value(uint16(h))
	}
	table[0x7c00] = 65536 // where 0x7c00 (Inf) would be, for the search between 65504 and 65520
	try := func(b uint32) {
		f := math.Float32frombits(b)
		got, want := f32ToF16(f), refF32ToF16(f, table)
		if got != want {
			t.Fatalf("f32ToF16(%v = %#08x) = %#04x, want %#04x", f, b, got, want)
		}
	}
	edges := []float32{
		0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, math.MaxFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)),
		0x1p-25, math.Nextafter32(0x1p-25, 1), math.Nextafter32(0x1p-25, 0), 0x1p-24, 0x1.8p-24,
		0x1p-14, math.Nextafter32(0x1p-14, 0), 0x1.ff8p-15, 0x1.ffcp-15, 0x1.ffep-15,
		65504, 65519, 65519.998, 65520, 65536, 1e10, 1, -1, 0.1, -0.1, 1.0009765625, 1.00048828125,
	}
	for _, f := range edges {
		try(math.Float32bits(f))
		try(math.Float32bits(-f))
	}
	for _, b := range []uint32{0x7f800001, 0x7fc00000, 0xffc00000, 0x7f802000, 0x7fbfffff, 0xff800001, 0x7fffffff} {
		try(b)
	}
	stride := uint32(251)
	if testing.Short() {
		stride = 4099
	}
	for b := uint64(0); b < 1<<32; b += uint64(stride) {
		try(uint32(b))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		try(rng.Uint32())
	}
}
