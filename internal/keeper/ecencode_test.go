package keeper

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
)

// TestECEncodeChunk: the encoder's work on a chunk (ecEncodeChunk, block
// by block) gives bitwise the shares that ckpt.Codec.Share gives for the
// whole chunk at once, the CRC32C of the chunk's bytes continued from the
// sum passed in, and each share's CRC32C; it writes nothing of the share
// buffers past the chunk's length, and calls its hook before and after
// each block's read, in order. Sizes around the block size and odd tails;
// every member of 2+2 and 4+3.
func TestECEncodeChunk(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	sizes := []int{1, 63, 64, 65, ecBlock - 1, ecBlock, ecBlock + 1, 2*ecBlock + 77, 4*ecBlock + 4093}
	for _, km := range [][2]int{{2, 2}, {4, 3}} {
		k, m := km[0], km[1]
		codec, err := ckpt.NewCodec(k, m)
		if err != nil {
			t.Fatal(err)
		}
		for x := range k {
			for _, n := range sizes {
				t.Run(fmt.Sprintf("%d+%d/member%d/%d", k, m, x, n), func(t *testing.T) {
					piece := make([]byte, n)
					for i := range piece {
						piece[i] = byte(rng.Uint32())
					}
					want := make([][]byte, m)
					for j := range want {
						want[j] = make([]byte, n)
					}
					if err := codec.Share(piece, x, want); err != nil {
						t.Fatal(err)
					}
					sum0 := rng.Uint32()
					const pad = 100
					shares := make([][]byte, m)
					for j := range shares {
						shares[j] = bytes.Repeat([]byte{0xee}, n+pad)
					}
					crcs := make([]uint32, m)
					var calls []string
					hook := func(a int, read bool) { calls = append(calls, fmt.Sprint(a, read)) }
					sum := ecEncodeChunk(codec, x, make([]byte, ecBlock), piece, shares, make([][]byte, m), crcs, sum0, hook)
					if w := crc32c.Update(sum0, piece); sum != w {
						t.Errorf("sum %08x, want %08x", sum, w)
					}
					for j := range m {
						if !bytes.Equal(shares[j][:n], want[j]) {
							t.Errorf("share %d differs from Share's", j)
						}
						if !bytes.Equal(shares[j][n:], bytes.Repeat([]byte{0xee}, pad)) {
							t.Errorf("share %d written past the chunk", j)
						}
						if w := crc32c.Checksum(want[j]); crcs[j] != w {
							t.Errorf("share %d CRC32C %08x, want %08x", j, crcs[j], w)
						}
					}
					var wantCalls []string
					for a := 0; a < n; a += ecBlock {
						wantCalls = append(wantCalls, fmt.Sprint(a, false), fmt.Sprint(a, true))
					}
					if fmt.Sprint(calls) != fmt.Sprint(wantCalls) {
						t.Errorf("hook calls %v, want %v", calls, wantCalls)
					}
				})
			}
		}
	}
}
