package ckpt

import (
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"testing"
)

func TestCRCCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 1<<16)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	for _, cut := range [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {3, 5}, {100, 1000}, {4096, 60000}, {0, 1 << 16}, {1 << 16, 0}} {
		a, c := b[:cut[0]], b[cut[0]:cut[0]+cut[1]]
		want := crc32.Checksum(b[:cut[0]+cut[1]], castagnoli)
		if got := crcCombine(crc32.Checksum(a, castagnoli), crc32.Checksum(c, castagnoli), int64(len(c))); got != want {
			t.Errorf("combine at %v = %#08x, want %#08x", cut, got, want)
		}
	}
}

func TestParallelChecksum(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(old)
	b := make([]byte, 5*crcPiece+12345)
	fill(3, 0, b)
	want := crc32.Checksum(b, castagnoli)
	for _, procs := range []int{1, 2, 3, 5, 8} {
		runtime.GOMAXPROCS(procs)
		for _, n := range []int{0, 1, crcPiece - 1, 2 * crcPiece, 2*crcPiece + 1, len(b)} {
			if got, w := checksum(b[:n]), crc32.Checksum(b[:n], castagnoli); got != w {
				t.Errorf("GOMAXPROCS %d, %d bytes: %#08x, want %#08x", procs, n, got, w)
			}
		}
		if got := checksum(b); got != want {
			t.Errorf("GOMAXPROCS %d: %#08x, want %#08x", procs, got, want)
		}
	}
}
