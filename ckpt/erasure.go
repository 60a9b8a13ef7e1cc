package ckpt

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/klauspost/reedsolomon"
)

// Erasure coding (ECHECK, DESIGN.md §5): the alternative to replicating a
// rank's state to k other hosts. A group of K data shards (the protected
// bytes of K ranks on K distinct hosts, each padded with zeros to the
// longest) gets M parity shards, kept on M other hosts; any K of the K+M
// shards rebuild the others.
//
// The parity is linear: parity row j is the XOR over the data shards x of
// Share(x)[j], and a shard that is shorter than the stripe contributes
// nothing over its padding. So each owner computes its own shares where
// its bytes are (its host, straight from its committed slot) and the
// parity hosts XOR the shares in as they arrive, in any order, chunk by
// chunk: no host ever holds all K shards.

// ErrErasure is wrapped by the errors of [Codec]: a bad K or M, shards of
// the wrong number or size, too few shards left to rebuild from.
var ErrErasure = errors.New("ckpt: erasure code")

// MaxShards is the most data + parity shards a [Codec] takes (the
// classic GF(2^8) Reed–Solomon code; wider codes cannot compute one data
// shard's share of the parity alone).
const MaxShards = 256

// Codec is a systematic Reed–Solomon code of K data and M parity shards
// over GF(2^8), with a Cauchy matrix, so that every K of the K+M shards
// are independent. Every host of a job must use the same K and M: the
// code is fixed by them alone. A Codec is safe for concurrent use.
type Codec struct {
	k, m int
	enc  reedsolomon.Encoder
	// share[x] computes data shard x's shares in one pass: a code of one
	// data shard whose M parity rows are column x of enc's (so its parity
	// is x's share of enc's). reedsolomon's EncodeIdx would do the same
	// with enc, but it takes its vector kernels only for M >= 3 and whole
	// cache-sized rounds, adds into buffers the caller zeroes first, and
	// reads the data once per row: Encode of this code reads it once and
	// writes every row, with one goroutine (the caller's pipeline has
	// its own).
	share []reedsolomon.Encoder
	// stripe is enc with one goroutine, for Encode.
	stripe reedsolomon.Encoder
	// folds[x][j] is the GFNI bit matrix of x's coefficient in parity row
	// j, for ShareChecked's fused kernels (nil where they do not run).
	folds [][]uint64
	pow   atomic.Pointer[powCache] // ShareChecked's last x^(8n)
}

// NewCodec returns the code of k data and m parity shards (k, m >= 1,
// k+m <= MaxShards).
func NewCodec(k, m int) (*Codec, error) {
	if k < 1 || m < 1 || k+m > MaxShards {
		return nil, fmt.Errorf("%w: %d data + %d parity shards: need at least 1 of each and at most %d in all",
			ErrErasure, k, m, MaxShards)
	}
	enc, err := reedsolomon.New(k, m, reedsolomon.WithCauchyMatrix())
	if err != nil {
		return nil, fmt.Errorf("%w: %d+%d: %w", ErrErasure, k, m, err)
	}
	stripe, err := reedsolomon.New(k, m, reedsolomon.WithCauchyMatrix(), reedsolomon.WithMaxGoroutines(1))
	if err != nil {
		return nil, fmt.Errorf("%w: %d+%d: %w", ErrErasure, k, m, err)
	}
	c := &Codec{k: k, m: m, enc: enc, share: make([]reedsolomon.Encoder, k), stripe: stripe}
	// Column x of the parity rows is x's share of the byte 1 (the share
	// of a byte b is the column times b in GF(2^8)).
	col := make([][]byte, m)
	for x := range k {
		for j := range col {
			col[j] = []byte{0}
		}
		if err := enc.EncodeIdx([]byte{1}, x, col); err != nil {
			return nil, fmt.Errorf("%w: %d+%d: column %d: %w", ErrErasure, k, m, x, err)
		}
		mat := make([][]byte, m)
		for j := range mat {
			mat[j] = []byte{col[j][0]}
		}
		c.share[x], err = reedsolomon.New(1, m, reedsolomon.WithCustomMatrix(mat), reedsolomon.WithMaxGoroutines(1))
		if err != nil {
			return nil, fmt.Errorf("%w: %d+%d: member %d's code: %w", ErrErasure, k, m, x, err)
		}
	}
	if useShareFold && m <= maxFoldRows {
		if c.folds, err = c.foldMatrices(); err != nil {
			return nil, fmt.Errorf("%w: %d+%d: the fused kernels' matrices: %w", ErrErasure, k, m, err)
		}
	}
	return c, nil
}

// K is the number of data shards, M of parity shards.
func (c *Codec) K() int { return c.k }
func (c *Codec) M() int { return c.m }

// Share overwrites shares[j], for each parity row j < M, with data shard
// x's contribution to row j over data's bytes (x < K; every shares[j] as
// long as data). XORed together (Accumulate), the shares of the K data
// shards over the same byte range are the parity of that range.
func (c *Codec) Share(data []byte, x int, shares [][]byte) error {
	if x < 0 || x >= c.k {
		return fmt.Errorf("%w: data shard %d of %d", ErrErasure, x, c.k)
	}
	if len(shares) != c.m {
		return fmt.Errorf("%w: %d share buffers for %d parity rows", ErrErasure, len(shares), c.m)
	}
	for j, s := range shares {
		if len(s) != len(data) {
			return fmt.Errorf("%w: share %d is %d bytes for %d bytes of data", ErrErasure, j, len(s), len(data))
		}
	}
	if len(data) == 0 {
		return nil
	}
	var a [1 + 8][]byte
	shards := append(append(a[:0], data), shares...)
	if err := c.share[x].Encode(shards); err != nil {
		return fmt.Errorf("%w: %w", ErrErasure, err)
	}
	return nil
}

// Encode overwrites the M parity shards of one whole stripe: shards has
// K+M entries of one length, data shards first. It is the code's own
// encoding of a stripe held in one place, on the caller's goroutine (the
// reference the shares' pipeline is measured against); the agents use
// Share.
func (c *Codec) Encode(shards [][]byte) error {
	if len(shards) != c.k+c.m {
		return fmt.Errorf("%w: %d shards for a %d+%d code", ErrErasure, len(shards), c.k, c.m)
	}
	if err := c.stripe.Encode(shards); err != nil {
		return fmt.Errorf("%w: %w", ErrErasure, err)
	}
	return nil
}

// Accumulate XORs src into dst (len(src) <= len(dst)): a share into the
// parity row it belongs to.
func Accumulate(dst, src []byte) {
	subtle.XORBytes(dst[:len(src)], dst[:len(src)], src)
}

// Reconstruct fills the shards want asks for from the others. shards has
// K+M entries, data shards first, all present ones of one length; a
// missing shard is nil or empty (an empty one with enough capacity is
// filled in place). want has K entries (data shards only) or K+M. It
// fails, wrapping ErrErasure, when fewer than K shards are present. It
// cannot tell a damaged shard from a good one: the caller checks the
// result against the shards' CRCs.
func (c *Codec) Reconstruct(shards [][]byte, want []bool) error {
	if len(shards) != c.k+c.m {
		return fmt.Errorf("%w: %d shards for a %d+%d code", ErrErasure, len(shards), c.k, c.m)
	}
	if len(want) != c.k && len(want) != c.k+c.m {
		return fmt.Errorf("%w: %d wanted flags for a %d+%d code", ErrErasure, len(want), c.k, c.m)
	}
	have := 0
	for _, s := range shards {
		if len(s) > 0 {
			have++
		}
	}
	if have < c.k {
		return fmt.Errorf("%w: %d of %d shards left; %d are needed", ErrErasure, have, c.k+c.m, c.k)
	}
	if err := c.enc.ReconstructSome(shards, want); err != nil {
		return fmt.Errorf("%w: %w", ErrErasure, err)
	}
	return nil
}
