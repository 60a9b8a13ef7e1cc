//go:build !purego

package crc32c

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestFoldConstants derives foldK again from the polynomial.
func TestFoldConstants(t *testing.T) {
	const p = 0x1EDC6F41 // Castagnoli, x^32 implicit, bit i: x^i
	// xPow returns x^e mod P, bit-reflected in 33 bits.
	xPow := func(e int) uint64 {
		r := uint64(1)
		for range e {
			r <<= 1
			if r&(1<<32) != 0 {
				r ^= 1<<32 | p
			}
		}
		var v uint64
		for i := range 32 {
			v |= (r >> i & 1) << (32 - i)
		}
		return v
	}
	var k [len(foldK)]uint64
	for i, d := range []int{2048, 512, 384, 256, 128} {
		k[2*i], k[2*i+1] = xPow(d+32), xPow(d-32)
	}
	for i := range k {
		if k[i] != foldK[i] {
			t.Errorf("foldK[%d] = %#x, want %#x", i, foldK[i], k[i])
		}
	}
}

// TestFoldUsedWhereAvailable: on a Linux processor whose flags (as
// /proc/cpuinfo lists them) have every instruction foldUpdate needs,
// Update folds: a feature check that wrongly turned the fast path off
// would leave every other test passing on hash/crc32.
func TestFoldUsedWhereAvailable(t *testing.T) {
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skipf("no /proc/cpuinfo: %v", err)
	}
	var flags []string
	for line := range strings.SplitSeq(string(info), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			flags = strings.Fields(v)
			break
		}
	}
	all := true
	for _, f := range []string{"avx512f", "avx512vl", "vpclmulqdq", "pclmulqdq", "sse4_2"} {
		all = all && slices.Contains(flags, f)
	}
	if all != useFold {
		t.Fatalf("the processor's flags say folding is available: %v; useFold = %v", all, useFold)
	}
}
