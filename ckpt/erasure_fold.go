package ckpt

import (
	"fmt"

	"github.com/gorun/gorun/internal/crc32c"
)

// maxFoldRows is the most parity rows ShareChecked's fused kernels take:
// each row's CRC state is 256 bytes on ShareChecked's stack (foldFinish
// reads them through crc32c.Update256, which lets none escape to the
// heap: TestShareCheckedAllocs).
const maxFoldRows = 8

// gfniMatrix returns the bit matrix of VGF2P8AFFINEQB that multiplies a
// byte by c in the code's field, from prod[k] = c·2^k (the products of
// the basis bytes, taken from the code itself): bit i of the product is
// the parity of byte 7-i of the matrix and'ed with the byte.
func gfniMatrix(prod [8]byte) uint64 {
	var m uint64
	for i := range 8 {
		for k, v := range prod {
			if v>>i&1 != 0 {
				m |= 1 << (8*(7-i) + k)
			}
		}
	}
	return m
}

// foldMatrices returns, for each data shard x and parity row j, the GFNI
// matrix of x's coefficient in row j: Share of the bytes 1, 2, ..., 128
// gives the coefficient times each.
func (c *Codec) foldMatrices() ([][]uint64, error) {
	basis := []byte{1, 2, 4, 8, 16, 32, 64, 128}
	mats := make([][]uint64, c.k)
	shares := make([][]byte, c.m)
	for x := range mats {
		for j := range shares {
			shares[j] = make([]byte, len(basis))
		}
		if err := c.Share(basis, x, shares); err != nil {
			return nil, err
		}
		mats[x] = make([]uint64, c.m)
		for j, s := range shares {
			mats[x][j] = gfniMatrix([8]byte(s))
		}
	}
	return mats, nil
}

// ShareChecked is Share (data shard x's shares of data into shares) with
// the checks an owner sends them with: it copies data into cp (at least
// as long) and returns sum continued by data's bytes (the CRC32C of the
// shard so far, crc32c.Update), and continues each crcs[j] by shares[j]'s
// bytes. It reads each byte of data once, so the shares, cp and the sum
// are of the same bytes whatever writes into data meanwhile. Where the
// processor has AVX-512 with GFNI and VPCLMULQDQ (and M <= 8), one pass
// over data writes cp and the first row's share and folds both CRC32Cs,
// and one pass over cp (in the core's cache for a data of a few hundred
// KiB) does each other row: the bytes are not read again to be
// checksummed. Otherwise it copies, shares and checksums in passes.
func (c *Codec) ShareChecked(data []byte, x int, shares [][]byte, cp []byte, sum uint32, crcs []uint32) (uint32, error) {
	if x < 0 || x >= c.k {
		return sum, fmt.Errorf("%w: data shard %d of %d", ErrErasure, x, c.k)
	}
	if len(shares) != c.m || len(crcs) != c.m {
		return sum, fmt.Errorf("%w: %d share buffers and %d CRCs for %d parity rows", ErrErasure, len(shares), len(crcs), c.m)
	}
	if len(cp) < len(data) {
		return sum, fmt.Errorf("%w: a copy buffer of %d bytes for %d bytes of data", ErrErasure, len(cp), len(data))
	}
	for j, s := range shares {
		if len(s) != len(data) {
			return sum, fmt.Errorf("%w: share %d is %d bytes for %d bytes of data", ErrErasure, j, len(s), len(data))
		}
	}
	n := 0 // the bytes the fused kernels take: whole 256-byte blocks
	if useShareFold && c.m <= maxFoldRows && c.folds != nil {
		n = len(data) &^ 255
	}
	if n > 0 {
		var st [1 + maxFoldRows][256]byte // the data's state, then each row's
		mats := c.folds[x]
		shareFoldFirst(mats[0], data[:n], cp[:n], shares[0][:n], &st[0], &st[1])
		for j := 1; j < c.m; j++ {
			shareFoldNext(mats[j], cp[:n], shares[j][:n], &st[1+j])
		}
		pow := c.pow8n(int64(n))
		sum = foldFinish(&st[0], sum, pow)
		for j := range crcs {
			crcs[j] = foldFinish(&st[1+j], crcs[j], pow)
		}
	}
	if n == len(data) {
		return sum, nil
	}
	// The rest (or all): copied and checked, then shared from the copy.
	rest := cp[n:len(data)]
	sum = crc32c.CopyUpdate(sum, rest, data[n:])
	var a [1 + 8][]byte
	sub := a[:0]
	if c.m > len(a) {
		sub = make([][]byte, 0, c.m)
	}
	for _, s := range shares {
		sub = append(sub, s[n:])
	}
	if err := c.Share(rest, x, sub); err != nil {
		return sum, err
	}
	for j, s := range sub {
		crcs[j] = crc32c.Update(crcs[j], s)
	}
	return sum, nil
}

// foldFinish returns crc (crc32c.Update's) continued by the bytes whose
// fold state st is, pow being x^(8·their length) modulo the polynomial.
// st has the bytes' CRC from initial value 0, not inverted (R): the
// CRC32C of the 256 bytes of st from the inverted 0xffffffff, and the
// CRC is linear: the bytes from initial value ^crc give R xor
// (^crc)·x^(8n).
func foldFinish(st *[256]byte, crc, pow uint32) uint32 {
	r := ^crc32c.Update256(0xffffffff, st) // not Update: st would escape
	return ^(r ^ multModP(pow, ^crc))
}

// powCache is the last length pow8n computed, and its power: the owner's
// blocks are mostly of one length.
type powCache struct {
	n   int64
	pow uint32
}

// pow8n returns x^(8n) modulo the polynomial, from c's cache if n is the
// last length asked.
func (c *Codec) pow8n(n int64) uint32 {
	if p := c.pow.Load(); p != nil && p.n == n {
		return p.pow
	}
	p := &powCache{n: n, pow: xPow8n(n)}
	c.pow.Store(p)
	return p.pow
}
