// Package crc32c computes the CRC-32C (Castagnoli) checksum, the one gorun
// keeps of every byte of protected state (checkpoint slots, replay records,
// replicas and their differentials).
//
// [Update] and [Checksum] return exactly what hash/crc32 returns with
// crc32.MakeTable(crc32.Castagnoli), for every input and initial value:
// they differ only in speed. On amd64 processors with AVX-512 and
// VPCLMULQDQ an input of 64 bytes or more is folded 256 bytes at
// a time by carry-less multiplication (the technique of Intel's "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ Instruction", on
// 512-bit vectors): on an AMD EPYC (Zen 4), 2 to 3 times as fast as
// hash/crc32's SSE4.2 code (BenchmarkRatio). Shorter inputs, other processors and architectures, and builds with the
// purego tag use hash/crc32 itself.
//
// The package is a leaf: every package of gorun may import it. Its
// functions are safe for concurrent use.
package crc32c

import (
	"hash/crc32"
	"sync"
)

// table returns hash/crc32's Castagnoli table: with it, hash/crc32 takes
// its own fastest path (SSE4.2 on amd64, the CRC32 instructions on arm64).
// It is made on first use, not at package init: making it builds
// hash/crc32's Castagnoli tables (about 0.15 ms), which every gorun paid
// at start, including launches that never checksum anything.
var table = sync.OnceValue(func() *crc32.Table { return crc32.MakeTable(crc32.Castagnoli) })

// Update returns the result of adding the bytes in p to crc, as
// crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p) does: crc is a
// previous result (0 to start), so Update(Update(0, a), b) is the CRC32C
// of a‖b.
func Update(crc uint32, p []byte) uint32 {
	if useFold && len(p) >= foldMin {
		return ^foldUpdate(^crc, p)
	}
	return crc32.Update(crc, table(), p)
}

// Update256 is Update of the 256 bytes *p, for a caller whose p is an
// array on its own stack (ckpt.Codec.ShareChecked's fold states): p does
// not escape here, where Update's slice escapes to the heap through
// hash/crc32.Update, so such a caller's array stays on its stack. The
// processors without the folding code pay for a copy of p.
func Update256(crc uint32, p *[256]byte) uint32 {
	if useFold {
		return ^foldUpdate(^crc, p[:])
	}
	b := *p // hash/crc32 leaks its input: a copy, on this path only
	return crc32.Update(crc, table(), b[:])
}

// Checksum returns the CRC32C of p, as crc32.Checksum(p,
// crc32.MakeTable(crc32.Castagnoli)) does.
func Checksum(p []byte) uint32 { return Update(0, p) }

// copyBlock is how many bytes CopyUpdate copies before it checksums them:
// small enough that the block is still in the core's cache when it is
// read again.
const copyBlock = 64 << 10

// CopyUpdate copies src into dst (which must be at least as long) and
// returns Update(crc, src), reading src from memory once: it copies a
// block, then checksums the copy while the block is in cache. It is the
// copy-and-verify of a snapshot in one pass instead of two.
func CopyUpdate(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	for off := 0; off < len(src); off += copyBlock {
		end := min(off+copyBlock, len(src))
		copy(dst[off:end], src[off:end])
		crc = Update(crc, dst[off:end])
	}
	return crc
}
