package ckpt

import (
	"testing"
)

// TestShareCheckedAllocs: ShareChecked allocates nothing per call on the
// fused path (its CRC states stay on the stack), for a 128 KiB block as
// the encoder passes it, once the codec's power of x for that length is
// cached (AllocsPerRun's warm-up call).
func TestShareCheckedAllocs(t *testing.T) {
	if !useShareFold {
		t.Skip("no fused kernels on this processor or build")
	}
	const n = 128 << 10
	for _, tc := range []struct{ k, m int }{{2, 2}, {3, 8}} {
		c, err := NewCodec(tc.k, tc.m)
		if err != nil {
			t.Fatal(err)
		}
		data, cp := make([]byte, n), make([]byte, n)
		fill(1, 0, data)
		shares := make([][]byte, tc.m)
		for j := range shares {
			shares[j] = make([]byte, n)
		}
		crcs := make([]uint32, tc.m)
		var sum uint32
		allocs := testing.AllocsPerRun(20, func() {
			if sum, err = c.ShareChecked(data, 1, shares, cp, sum, crcs); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%d+%d, %d bytes: %v allocations per call, want 0", tc.k, tc.m, n, allocs)
		}
	}
}
