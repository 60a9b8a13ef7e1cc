//go:build !purego

package crc32c

import "testing"

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
