package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestFixedRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		// Every float32 with 2^-9 ≤ |d| ≤ 2^15 converts exactly.
		d := float32(math.Ldexp(1+rng.Float64(), rng.IntN(24)-9))
		if rng.IntN(2) == 0 {
			d = -d
		}
		if got := fromFixed(toFixed(d), 1); got != d {
			t.Fatalf("fromFixed(toFixed(%g)) = %g", d, got)
		}
	}
	for _, d := range []float32{0, 0x1p15, -0x1p15, 0x1p-9, 1, -1} {
		if got := fromFixed(toFixed(d), 1); got != d {
			t.Errorf("fromFixed(toFixed(%g)) = %g", d, got)
		}
	}
}

func TestFixedRounding(t *testing.T) {
	for _, tc := range []struct {
		d    float32
		want int64
	}{
		{0x1p-32, 1},
		{0x1p-33, 0},             // half a unit rounds toward zero
		{0x3p-33, 1},             // 1.5 units
		{-0x3p-33, -1},           // and symmetrically
		{0x1.8p-33, 0},           // 0.75 units
		{-0x1.fffffep-33, 0},     // just under one unit
		{0x1p-40, 0},             // below the resolution
		{1, 1 << 32},             // one unit
		{-0.25, -(1 << 30)},      // exact
		{1.0 / 3, 1431655808},    // float32(1/3) = 11184811·2^-25, exact: 11184811·2^7
		{0x1p15, 1 << 47},        // the largest unsaturated value
		{-0x1p15, -(1 << 47)},    //
		{0x1.000002p15, 1 << 47}, // just above: saturates
		{1e30, 1 << 47},
		{float32(math.Inf(1)), 1 << 47},
		{float32(math.Inf(-1)), -(1 << 47)},
		{float32(math.NaN()), 0},
	} {
		if got := toFixed(tc.d); got != tc.want {
			t.Errorf("toFixed(%g) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

// TestFixedSumCannotOverflow sums the largest contributions of a full batch.
func TestFixedSumCannotOverflow(t *testing.T) {
	for _, d := range []float32{float32(math.Inf(1)), float32(math.Inf(-1))} {
		var s int64
		for range maxBatch {
			next := s + toFixed(d)
			if (d > 0) != (next > s) {
				t.Fatalf("sum of %d contributions of %g overflows", maxBatch, d)
			}
			s = next
		}
		if got, want := fromFixed(s, maxBatch), float32(math.Copysign(fixedMax, float64(d))); got != want {
			t.Errorf("mean of %d saturated contributions: %g, want %g", maxBatch, got, want)
		}
	}
}

// TestFixedSumIsGroupingIndependent sums the same contributions in several
// groupings, as different world sizes do.
func TestFixedSumIsGroupingIndependent(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 96)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(8)-4)))
	}
	var want int64
	for _, d := range x {
		want += toFixed(d)
	}
	for _, groups := range []int{2, 3, 4, 8, 96} {
		var total int64
		for g := range groups {
			var part int64
			for i := len(x) - 1 - g; i >= 0; i -= groups { // interleaved, backwards
				part += toFixed(x[i])
			}
			total = part + total
		}
		if total != want {
			t.Errorf("%d groups: sum %d, want %d", groups, total, want)
		}
	}
}

func BenchmarkToFixed(b *testing.B) {
	x := make([]float32, 4096)
	out := make([]int64, len(x))
	for i := range x {
		x[i] = float32(i)*0.001 - 2
	}
	for b.Loop() {
		for i, d := range x {
			out[i] += toFixed(d)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(x)), "ns/value")
}
