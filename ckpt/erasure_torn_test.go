//go:build !race

// The test here writes into the data while ShareChecked reads it: a
// deliberate data race, which the race detector would report.

package ckpt

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gorun/gorun/internal/crc32c"
)

// flipData starts a goroutine that keeps flipping bytes of data, spread
// over all of it, until the returned stop is called; flips counts its
// writes, so that a caller sees whether a call overlapped some.
func flipData(data []byte, flips *atomic.Int64) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		const stride = 4099 // prime: every byte is hit in turn
		i := 0
		for !done.Load() {
			data[i] ^= byte(i) | 1
			i = (i + stride) % len(data)
			flips.Add(1)
		}
	})
	return func() {
		done.Store(true)
		wg.Wait()
	}
}

// TestShareCheckedTornData: the property the encoder relies on (every
// share is built from exactly the bytes whose CRC32C is checked), with a
// goroutine flipping bytes of the data while ShareChecked runs: whatever
// it reads, the shares are Share's of the copy ShareChecked made, the sum
// is the CRC32C of that copy continued from sum0, and each share's CRC32C
// is of the share written. A kernel that read the data again (say, a
// further row coded from data instead of the copy) gives shares of bytes
// the copy does not hold. 2+2, 4+3 and 3+8 take the fused kernels where
// the processor has them (M <= 8), 4+9 the passes; the lengths are whole
// 256-byte blocks and blocks with a tail. Each length is run until a few
// calls overlapped writes (or a bound of calls; the count is logged: on a
// busy machine the flipper may not run beside every call).
func TestShareCheckedTornData(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("the flipper needs a second processor to run beside ShareChecked")
	}
	t.Logf("fused kernels: %v", useShareFold)
	const wantOverlaps, maxCalls = 32, 2000
	for _, tc := range []struct{ k, m int }{{2, 2}, {4, 3}, {3, 8}, {4, 9}} {
		c, err := NewCodec(tc.k, tc.m)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{128 << 10, 128<<10 - 77, 4096, 300} {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(tc.k*tc.m)))
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			got := make([][]byte, tc.m)
			want := make([][]byte, tc.m)
			for j := range got {
				got[j] = make([]byte, n)
				want[j] = make([]byte, n)
			}
			cp := make([]byte, n)
			crc0 := make([]uint32, tc.m)
			crcs := make([]uint32, tc.m)
			var flips atomic.Int64
			stop := flipData(data, &flips)
			overlaps, calls := 0, 0
			for ; overlaps < wantOverlaps && calls < maxCalls; calls++ {
				x := calls % tc.k
				sum0 := rng.Uint32()
				for j := range crc0 {
					crc0[j] = rng.Uint32()
				}
				copy(crcs, crc0)
				before := flips.Load()
				sum, err := c.ShareChecked(data, x, got, cp, sum0, crcs)
				if flips.Load() != before {
					overlaps++
				}
				if err != nil {
					stop()
					t.Fatal(err)
				}
				if err := c.Share(cp, x, want); err != nil {
					stop()
					t.Fatal(err)
				}
				if w := crc32c.Update(sum0, cp); sum != w {
					t.Errorf("%d+%d member %d, %d bytes: sum %08x, the copy's %08x", tc.k, tc.m, x, n, sum, w)
				}
				for j := range got {
					if !bytes.Equal(got[j], want[j]) {
						t.Errorf("%d+%d member %d, %d bytes: share %d is not Share's of the copy", tc.k, tc.m, x, n, j)
					}
					if w := crc32c.Update(crc0[j], got[j]); crcs[j] != w {
						t.Errorf("%d+%d member %d, %d bytes: share %d CRC32C %08x, the share's %08x", tc.k, tc.m, x, n, j, crcs[j], w)
					}
				}
				if t.Failed() {
					stop()
					t.FailNow()
				}
			}
			stop()
			t.Logf("%d+%d, %d bytes: %d of %d calls overlapped writes (%d writes)", tc.k, tc.m, n, overlaps, calls, flips.Load())
		}
	}
}
