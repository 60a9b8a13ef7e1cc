//go:build !purego

package crc32c

import "golang.org/x/sys/cpu"

// useFold reports whether this processor runs foldUpdate: AVX-512
// (foundation, and VL for its 128-bit EVEX instructions), the 512-bit
// VPCLMULQDQ, and the 128-bit PCLMULQDQ and SSE4.2 CRC32 instructions of
// its last steps. x/sys/cpu reports AVX-512 only when the OS saves the
// 512-bit registers.
var useFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// foldMin is the shortest input foldUpdate accepts, and Update folds:
// from 64 bytes on, folding takes less than half of hash/crc32's time
// (BenchmarkSmall: 3.8 against 8.2 ns at 64 bytes on an AMD EPYC, Zen 4).
const foldMin = 64

// foldK holds the folding constants of foldUpdate, in pairs: a pair folds
// a 128-bit lane (two 64-bit halves, the first bytes in the low half)
// forward by D bits onto the lane D bits further in the input. Each
// constant is x^e mod P (P the Castagnoli polynomial), bit-reflected in 33
// bits (bit i is the coefficient of x^(32-i)): e = D+32 for the lane's low
// half and D-32 for its high half, the 32 making up for the reflection of
// the 64-bit products. TestFoldConstants derives them again.
//
// foldUpdate reads the pairs at fixed offsets: D = 2048 (the 256-byte
// loop), 512 (64 bytes), then 384, 256 and 128 followed by a zero pair,
// which fold a 512-bit vector's four lanes onto its last with one
// multiplication, the last lane unchanged; the 128 pair also serves the
// 16-byte loop.
var foldK = [12]uint64{
	0xdcb17aa4, 0xb9e02b86, // D = 2048
	0x740eef02, 0x9e4addf8, // D = 512
	0x1c291d04, 0x1d82c63da, // D = 384
	0x1384aa63a, 0xba4fc28e, // D = 256
	0xf20c0dfe, 0x14cd00bd6, // D = 128
	0, 0,
}

// foldUpdate returns the non-inverted CRC32C of p from the non-inverted
// crc (Update's crc and result, each complemented). len(p) must be at
// least foldMin. It never reads outside p. Defined in fold_amd64.s.
//
//go:noescape
func foldUpdate(crc uint32, p []byte) uint32
