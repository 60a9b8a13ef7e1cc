package ckpt

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/internal/crc32c"
)

// TestCodecSubsets: for each code, the parity XORed from per-shard
// shares (of unequal data lengths, chunk by chunk) equals whole-stripe
// parity, and every subset of at most M lost shards rebuilds the lost
// data bitwise; M+1 lost shards are refused.
func TestCodecSubsets(t *testing.T) {
	for _, tc := range []struct{ k, m int }{{2, 1}, {2, 2}, {4, 2}, {8, 4}} {
		c, err := NewCodec(tc.k, tc.m)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(tc.k), uint64(tc.m)))
		const stripe = 3000
		data := make([][]byte, tc.k)
		for x := range data {
			data[x] = make([]byte, stripe-rng.IntN(700)) // unequal lengths
			for i := range data[x] {
				data[x][i] = byte(rng.Uint32())
			}
		}
		parity := make([][]byte, tc.m)
		for j := range parity {
			parity[j] = make([]byte, stripe)
		}
		const chunk = 512
		shares := make([][]byte, tc.m)
		for x, d := range data {
			for off := 0; off < len(d); off += chunk {
				n := min(chunk, len(d)-off)
				for j := range shares {
					shares[j] = make([]byte, n)
				}
				if err := c.Share(d[off:off+n], x, shares); err != nil {
					t.Fatal(err)
				}
				for j := range shares {
					Accumulate(parity[j][off:], shares[j])
				}
			}
		}
		padded := func(x int) []byte {
			p := make([]byte, stripe)
			copy(p, data[x])
			return p
		}
		n := tc.k + tc.m
		for mask := 1; mask < 1<<n; mask++ {
			lost := bitsSet(mask)
			shards := make([][]byte, n)
			for i := range n {
				if mask&(1<<i) != 0 {
					continue
				}
				if i < tc.k {
					shards[i] = padded(i)
				} else {
					shards[i] = bytes.Clone(parity[i-tc.k])
				}
			}
			want := make([]bool, tc.k)
			for i := range tc.k {
				want[i] = mask&(1<<i) != 0
			}
			err := c.Reconstruct(shards, want)
			if lost > tc.m {
				if !errors.Is(err, ErrErasure) {
					t.Fatalf("%d+%d lost %b: err %v, want ErrErasure", tc.k, tc.m, mask, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%d+%d lost %b: %v", tc.k, tc.m, mask, err)
			}
			for x := range tc.k {
				if !bytes.Equal(shards[x], padded(x)) {
					t.Fatalf("%d+%d lost %b: data shard %d differs", tc.k, tc.m, mask, x)
				}
			}
		}
	}
}

func bitsSet(m int) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

func TestCodecBadInput(t *testing.T) {
	for _, km := range [][2]int{{0, 1}, {1, 0}, {200, 57}, {-1, 2}} {
		if _, err := NewCodec(km[0], km[1]); !errors.Is(err, ErrErasure) {
			t.Errorf("NewCodec(%d, %d): %v, want ErrErasure", km[0], km[1], err)
		}
	}
	c, err := NewCodec(2, 2)
	if err != nil {
		t.Fatal(err)
	}
	d := make([]byte, 8)
	for _, tc := range []struct {
		name   string
		x      int
		shares [][]byte
	}{
		{"shard out of range", 2, [][]byte{make([]byte, 8), make([]byte, 8)}},
		{"negative shard", -1, [][]byte{make([]byte, 8), make([]byte, 8)}},
		{"too few shares", 0, [][]byte{make([]byte, 8)}},
		{"short share", 0, [][]byte{make([]byte, 8), make([]byte, 7)}},
	} {
		if err := c.Share(d, tc.x, tc.shares); !errors.Is(err, ErrErasure) {
			t.Errorf("%s: %v, want ErrErasure", tc.name, err)
		}
	}
	if err := c.Reconstruct(make([][]byte, 3), make([]bool, 2)); !errors.Is(err, ErrErasure) {
		t.Errorf("3 shards for 2+2: %v", err)
	}
}

// TestCodecShareOverwrites: Share overwrites share buffers that hold
// bytes already (the agents reuse theirs chunk after chunk), and
// Reconstruct asked for every shard (want of K+M) rebuilds lost parity
// rows too, bitwise.
func TestCodecShareOverwrites(t *testing.T) {
	const k, m, n = 4, 2, 1000
	c, err := NewCodec(k, m)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(4, 2))
	data := make([][]byte, k)
	parity := make([][]byte, m)
	for j := range parity {
		parity[j] = make([]byte, n)
	}
	shares := make([][]byte, m)
	for j := range shares {
		shares[j] = make([]byte, n)
	}
	for x := range data {
		data[x] = make([]byte, n)
		for i := range data[x] {
			data[x][i] = byte(rng.Uint32())
		}
		for j := range shares {
			for i := range shares[j] {
				shares[j][i] = byte(rng.Uint32()) // the previous chunk's share
			}
		}
		if err := c.Share(data[x], x, shares); err != nil {
			t.Fatal(err)
		}
		for j := range shares {
			Accumulate(parity[j], shares[j])
		}
	}
	// Lose data shard 1 and parity row 0: rebuild both.
	shards := make([][]byte, k+m)
	for x := range data {
		shards[x] = bytes.Clone(data[x])
	}
	for j := range parity {
		shards[k+j] = bytes.Clone(parity[j])
	}
	shards[1], shards[k] = nil, nil
	want := make([]bool, k+m)
	want[1], want[k] = true, true
	if err := c.Reconstruct(shards, want); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shards[1], data[1]) {
		t.Error("data shard 1 differs after the rebuild")
	}
	if !bytes.Equal(shards[k], parity[0]) {
		t.Error("parity row 0 differs after the rebuild: the shares were not overwritten, or the rebuild is wrong")
	}
}

// TestCodecShareMatchesEncode: the shares of the K data shards, XORed,
// are the parity the code's own whole-stripe Encode computes, bitwise,
// for every member, over lengths below, at and past the vector kernels'
// 64-byte blocks, into share buffers holding old bytes.
func TestCodecShareMatchesEncode(t *testing.T) {
	for _, tc := range []struct{ k, m int }{{2, 1}, {2, 2}, {3, 3}, {4, 2}, {8, 4}, {5, 11}} {
		c, err := NewCodec(tc.k, tc.m)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, 63, 64, 65, 1000, 4096 + 17, 300_001} {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(tc.k*tc.m)))
			shards := make([][]byte, tc.k+tc.m)
			for i := range shards {
				shards[i] = make([]byte, n)
				for b := range shards[i] {
					shards[i][b] = byte(rng.Uint32()) // parity too: Encode overwrites
				}
			}
			if err := c.Encode(shards); err != nil {
				t.Fatal(err)
			}
			parity := make([][]byte, tc.m)
			shares := make([][]byte, tc.m)
			for j := range parity {
				parity[j] = make([]byte, n)
				shares[j] = make([]byte, n)
			}
			for x := range tc.k {
				for j := range shares {
					for b := range shares[j] {
						shares[j][b] = byte(rng.Uint32())
					}
				}
				if err := c.Share(shards[x], x, shares); err != nil {
					t.Fatal(err)
				}
				for j := range shares {
					Accumulate(parity[j], shares[j])
				}
			}
			for j := range parity {
				if !bytes.Equal(parity[j], shards[tc.k+j]) {
					t.Errorf("%d+%d, %d bytes: row %d of the shares differs from Encode's", tc.k, tc.m, n, j)
				}
			}
		}
	}
}

// TestCodecShareChecked: ShareChecked gives bitwise the shares Share
// gives, a copy of the data, the data's CRC32C continued from the sum
// passed in and each share's continued from its own, for every member,
// over lengths below, at and past the fused kernels' 256-byte blocks and
// odd tails, codes of up to 8 parity rows (the fused kernels, where the
// processor has them) and more (passes), into buffers holding old bytes.
func TestCodecShareChecked(t *testing.T) {
	t.Logf("fused kernels: %v", useShareFold)
	for _, tc := range []struct{ k, m int }{{2, 1}, {2, 2}, {4, 2}, {3, 3}, {5, 8}, {4, 9}} {
		c, err := NewCodec(tc.k, tc.m)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, 1, 63, 255, 256, 257, 511, 512, 4096 + 17, 128 << 10, 128<<10 + 3, 1<<20 + 100} {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(tc.k*tc.m)))
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			for x := range tc.k {
				want := make([][]byte, tc.m)
				got := make([][]byte, tc.m)
				crc0 := make([]uint32, tc.m)
				for j := range want {
					want[j] = make([]byte, n)
					got[j] = bytes.Repeat([]byte{0xee}, n)
					crc0[j] = rng.Uint32()
				}
				if err := c.Share(data, x, want); err != nil {
					t.Fatal(err)
				}
				sum0 := rng.Uint32()
				crcs := append([]uint32(nil), crc0...)
				cp := bytes.Repeat([]byte{0xdd}, n+7)
				sum, err := c.ShareChecked(data, x, got, cp, sum0, crcs)
				if err != nil {
					t.Fatal(err)
				}
				if w := crc32c.Update(sum0, data); sum != w {
					t.Errorf("%d+%d member %d, %d bytes: sum %08x, want %08x", tc.k, tc.m, x, n, sum, w)
				}
				if !bytes.Equal(cp[:n], data) || !bytes.Equal(cp[n:], bytes.Repeat([]byte{0xdd}, 7)) {
					t.Errorf("%d+%d member %d, %d bytes: the copy differs from the data, or runs past it", tc.k, tc.m, x, n)
				}
				for j := range want {
					if !bytes.Equal(got[j], want[j]) {
						t.Errorf("%d+%d member %d, %d bytes: share %d differs from Share's", tc.k, tc.m, x, n, j)
					}
					if w := crc32c.Update(crc0[j], want[j]); crcs[j] != w {
						t.Errorf("%d+%d member %d, %d bytes: share %d CRC32C %08x, want %08x", tc.k, tc.m, x, n, j, crcs[j], w)
					}
				}
			}
		}
	}
	c, _ := NewCodec(2, 2)
	if _, err := c.ShareChecked(make([]byte, 10), 0, [][]byte{make([]byte, 10), make([]byte, 10)}, make([]byte, 9), 0, make([]uint32, 2)); !errors.Is(err, ErrErasure) {
		t.Errorf("a short copy buffer: %v, want ErrErasure", err)
	}
}
