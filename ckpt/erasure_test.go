package ckpt

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
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
