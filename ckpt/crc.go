package ckpt

import (
	"runtime"
	"sync"

	"github.com/gorun/gorun/internal/crc32c"
)

// crcPiece is the smallest piece of a region checksummed on its own
// goroutine: large enough that starting one costs nothing in comparison.
const crcPiece = 8 << 20

// checksum returns the CRC32C of b. A large b is cut into up to
// GOMAXPROCS pieces checksummed in parallel, whose CRCs are then combined:
// on memory not in cache, CRC32C runs at about the speed of a copy on one
// core even folded (internal/crc32c), and a commit should cost a fraction
// of the copy that precedes it.
func checksum(b []byte) uint32 {
	n := min(runtime.GOMAXPROCS(0), len(b)/crcPiece)
	if n < 2 {
		return crc32c.Checksum(b)
	}
	size := (len(b) + n - 1) / n
	crcs := make([]uint32, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { crcs[i] = crc32c.Checksum(b[i*size : min(len(b), (i+1)*size)]) })
	}
	crcs[0] = crc32c.Checksum(b[:size])
	wg.Wait()
	crc := crcs[0]
	for i := 1; i < n; i++ {
		crc = crcCombine(crc, crcs[i], int64(min(len(b), (i+1)*size)-i*size))
	}
	return crc
}

// The combination of CRCs, after zlib's crc32_combine (Mark Adler): the
// CRC of A‖B is the CRC of A times x^(8·len(B)) modulo the polynomial,
// plus the CRC of B. Polynomials are 32-bit words in reflected order (the
// top bit is x^0), as the CRC is computed.
const castagnoliPoly = 0x82F63B78 // crc32.Castagnoli

// x2n[k] is x^(2^k) modulo the polynomial.
var x2n = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

// multModP returns a·b modulo the polynomial.
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow8n returns x^(8·n) modulo the polynomial.
func xPow8n(n int64) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = multModP(x2n[k&31], p)
		}
	}
	return p
}

// CombineCRC32C returns the CRC32C of A‖B from A's and B's CRC32Cs
// (hash/crc32's Castagnoli) and B's length: a region's checksum from its
// pieces', in microseconds, without a pass over the bytes.
func CombineCRC32C(crcA, crcB uint32, lenB int64) uint32 { return crcCombine(crcA, crcB, lenB) }

// crcCombine returns the CRC32C of A‖B from crcA, crcB and B's length.
func crcCombine(crcA, crcB uint32, lenB int64) uint32 {
	return multModP(xPow8n(lenB), crcA) ^ crcB
}
