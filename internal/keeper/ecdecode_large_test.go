package keeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

// TestECDecodeLargeChunks: regions of several chunks of 128 KiB or so
// (the other decode tests' regions are of a few KiB) are rebuilt bitwise
// whatever the chunk size around 128 KiB; a damaged byte past a chunk's
// first 128 KiB, in the last chunk or in the next region fails the
// region's CRC32C and is stepped around by another K-subset; with no
// subset left the decode fails with ErrUnrecoverable, not wrong bytes.
func TestECDecodeLargeChunks(t *testing.T) {
	const blk = 128 << 10
	sizes := func(x int) []int64 { return []int64{int64(3*blk + 1000 + 37*x), int64(64 + x)} }
	for _, km := range [][2]int{{2, 2}, {4, 2}} {
		k, m := km[0], km[1]
		st := newECStripe(t, k, m, sizes)
		optLen := int64(len(st.regions[0]["optimizer"]))
		p0 := k
		for _, chunk := range []int{0, blk - 1, blk, blk + 1, 2*blk + 3} {
			for _, c := range []struct {
				name  string
				gone  []int
				flips map[int][]int64
				ok    bool
			}{
				{"clean", nil, nil, true},
				{"damage in a chunk's second block", nil, map[int][]int64{p0: {blk + 5}}, true},
				{"damage in the last block", nil, map[int][]int64{p0: {optLen - 1}}, true},
				{"damage in the second region", nil, map[int][]int64{p0: {optLen + 3}}, true},
				{"damaged, no spare source", []int{p0 + 1}, map[int][]int64{p0: {2*blk + 9}}, false},
			} {
				t.Run(fmt.Sprintf("%d+%d/chunk%d/%s", k, m, chunk, c.name), func(t *testing.T) {
					// The first K-subset (the other data members, then
					// parity row 0) reads the damaged row.
					var active atomic.Int32
					srcs, _ := st.sources(append([]int{0}, c.gone...), &active, func(i int, s *memSource) { s.flips = c.flips[i] })
					views, err := st.decode(t, context.Background(), 0, srcs, &active, chunk)
					if !c.ok {
						if !errors.Is(err, ErrUnrecoverable) || !strings.Contains(err.Error(), "CRC32C") {
							t.Fatalf("got %v, want ErrUnrecoverable for a CRC32C that does not match", err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if err := st.same(0, views); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}
