//go:build !race

// Tests that the race detector would make too slow (8 GiB scanned) or
// meaningless (it makes sync.Pool drop items at random, so allocation
// counts vary).

package replay

import (
	"math"
	"testing"
)

// TestTopKPastInt32 compresses a tensor of math.MaxInt32 + 2^20 elements
// (8 GiB; the untouched pages read as zero pages and are never
// committed), with a handful of non-zero entries far apart, and checks
// that they come back at their global indices, through a record too.
func TestTopKPastInt32(t *testing.T) {
	if testing.Short() {
		t.Skip("scans 8 GiB")
	}
	if math.MaxInt == math.MaxInt32 {
		t.Skip("32-bit int")
	}
	m32 := int(math.MaxInt32) // not constants below: they would not compile for 32-bit ints
	n := m32 + 1<<20
	x := make([]float32, n)
	set := map[int]float32{
		0: 1, 12345: -2, 1 << 30: 3.5, m32 - 1: -4, m32: 5,
		m32 + 1: 6.25, m32 + 99_999: -7, n - 1: 8,
	}
	for i, v := range set {
		x[i] = v
	}
	tn := mustCompress(t, 77, x, Options{Threshold: 1})
	r, err := DecodeRecord(encode(t, &Record{Tensors: []*Tensor{tn}}))
	if err != nil {
		t.Fatal(err)
	}
	for name, tn := range map[string]*Tensor{"compressed": tn, "decoded": r.Tensors[0]} {
		if tn.Codec != TopK || tn.Len != n || tn.Kept() != len(set) {
			t.Fatalf("%s: %v of %d kept %d, want topk of %d kept %d", name, tn.Codec, tn.Len, tn.Kept(), n, len(set))
		}
		if len(tn.chunks) != 2 || tn.chunks[0].base != 0 || tn.chunks[1].base != math.MaxInt32 {
			t.Fatalf("%s: chunks %+v, want bases 0 and %d", name, tn.chunks, math.MaxInt32)
		}
		seen := 0
		for _, c := range tn.chunks {
			for j := c.start; j < c.start+c.count; j++ {
				g := c.base + int(tn.idx[j])
				v, ok := set[g]
				if !ok || f16ToF32(tn.vals[j]) != v {
					t.Fatalf("%s: entry %d is %v at %d, not a value set there", name, j, f16ToF32(tn.vals[j]), g)
				}
				seen++
			}
		}
		if seen != len(set) {
			t.Fatalf("%s: %d entries, want %d", name, seen, len(set))
		}
		dst := make([]float32, 64)
		for i, v := range set {
			lo := min(max(i-32, 0), n-len(dst))
			tn.ExpandRange(dst, lo)
			for j, got := range dst {
				want := float32(0)
				if w, ok := set[lo+j]; ok {
					want = w
				}
				if got != want {
					t.Fatalf("%s: ExpandRange around %d (%v): element %d = %v, want %v", name, i, v, lo+j, got, want)
				}
			}
		}
	}
}

// TestCompressIntoNoAlloc: the per-step path allocates nothing once the
// tensor's buffers have grown, for every codec and for a sampled and an
// exact TopK threshold; nor does ExpandRange.
func TestCompressIntoNoAlloc(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		opt  Options
	}{
		{"raw", 10_000, Options{Lossless: true}},
		{"int8", 50_000, Options{}},
		{"topk exact", 200_000, Options{}},
		{"topk sampled", 1_000_000, Options{}},
	} {
		x := genData(normalDist, tc.n, 1)
		var tn Tensor
		seed := uint64(0)
		allocs := testing.AllocsPerRun(20, func() {
			seed++
			tc.opt.Seed = seed
			if err := CompressInto(&tn, 1, x, tc.opt); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: CompressInto allocates %v times per call", tc.name, allocs)
		}
		dst := make([]float32, 2048)
		if allocs := testing.AllocsPerRun(20, func() { tn.ExpandRange(dst, tc.n/2) }); allocs != 0 {
			t.Errorf("%s: ExpandRange allocates %v times per call", tc.name, allocs)
		}
	}
}
