//go:build !purego

#include "textflag.h"

// The shares of one data shard with their CRC32Cs folded in as they are
// computed (erasure_fold.go): 256 bytes at a time, the data in Z8-Z11,
// its products by one coefficient of the code (VGF2P8AFFINEQB, the
// coefficient's 8x8 bit matrix in every qword of Z30) in Z12-Z15. A
// CRC32C is kept as four 512-bit fold registers (the folding of Intel's
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
// Instruction", as internal/crc32c does it): each 16-byte lane is moved
// forward by 2048 bits, by carry-less multiplication by the constants of
// foldK2048 (x^(2048+32) and x^(2048-32) modulo the Castagnoli polynomial,
// bit-reflected), and the next 256 bytes are xored in. The state, stored
// back as 256 bytes, has the message's CRC (initial value 0, not
// inverted): erasure_fold.go finishes it.

DATA foldK2048<>+0(SB)/8, $0xdcb17aa4
DATA foldK2048<>+8(SB)/8, $0xb9e02b86
GLOBL foldK2048<>(SB), RODATA|NOPTR, $16

// func shareFoldFirst(mat uint64, src, cp, dst []byte, sIn, sOut *[256]byte)
// len(src) is a positive multiple of 256; cp and dst are at least as long.
TEXT ·shareFoldFirst(SB), NOSPLIT, $0-96
	MOVQ            mat+0(FP), AX
	MOVQ            src_base+8(FP), SI
	MOVQ            src_len+16(FP), CX
	MOVQ            cp_base+32(FP), DI
	MOVQ            dst_base+56(FP), DX
	MOVQ            sIn+80(FP), R8
	MOVQ            sOut+88(FP), R9
	VPBROADCASTQ    AX, Z30
	VBROADCASTI32X4 foldK2048<>(SB), Z31
	VMOVDQU64       (R8), Z0
	VMOVDQU64       64(R8), Z1
	VMOVDQU64       128(R8), Z2
	VMOVDQU64       192(R8), Z3
	VMOVDQU64       (R9), Z4
	VMOVDQU64       64(R9), Z5
	VMOVDQU64       128(R9), Z6
	VMOVDQU64       192(R9), Z7

	PCALIGN $32
firstLoop:
	VMOVDQU64      (SI), Z8
	VMOVDQU64      64(SI), Z9
	VMOVDQU64      128(SI), Z10
	VMOVDQU64      192(SI), Z11
	VMOVDQU64      Z8, (DI)
	VMOVDQU64      Z9, 64(DI)
	VMOVDQU64      Z10, 128(DI)
	VMOVDQU64      Z11, 192(DI)
	VGF2P8AFFINEQB $0x00, Z30, Z8, Z12
	VGF2P8AFFINEQB $0x00, Z30, Z9, Z13
	VGF2P8AFFINEQB $0x00, Z30, Z10, Z14
	VGF2P8AFFINEQB $0x00, Z30, Z11, Z15
	VMOVDQU64      Z12, (DX)
	VMOVDQU64      Z13, 64(DX)
	VMOVDQU64      Z14, 128(DX)
	VMOVDQU64      Z15, 192(DX)

	// The data's state.
	VPCLMULQDQ $0x00, Z31, Z0, Z16
	VPCLMULQDQ $0x11, Z31, Z0, Z0
	VPCLMULQDQ $0x00, Z31, Z1, Z17
	VPCLMULQDQ $0x11, Z31, Z1, Z1
	VPCLMULQDQ $0x00, Z31, Z2, Z18
	VPCLMULQDQ $0x11, Z31, Z2, Z2
	VPCLMULQDQ $0x00, Z31, Z3, Z19
	VPCLMULQDQ $0x11, Z31, Z3, Z3
	VPTERNLOGD $0x96, Z16, Z8, Z0   // Z0 ^= Z8 ^ Z16
	VPTERNLOGD $0x96, Z17, Z9, Z1
	VPTERNLOGD $0x96, Z18, Z10, Z2
	VPTERNLOGD $0x96, Z19, Z11, Z3

	// The share's state.
	VPCLMULQDQ $0x00, Z31, Z4, Z20
	VPCLMULQDQ $0x11, Z31, Z4, Z4
	VPCLMULQDQ $0x00, Z31, Z5, Z21
	VPCLMULQDQ $0x11, Z31, Z5, Z5
	VPCLMULQDQ $0x00, Z31, Z6, Z22
	VPCLMULQDQ $0x11, Z31, Z6, Z6
	VPCLMULQDQ $0x00, Z31, Z7, Z23
	VPCLMULQDQ $0x11, Z31, Z7, Z7
	VPTERNLOGD $0x96, Z20, Z12, Z4
	VPTERNLOGD $0x96, Z21, Z13, Z5
	VPTERNLOGD $0x96, Z22, Z14, Z6
	VPTERNLOGD $0x96, Z23, Z15, Z7

	ADDQ $256, SI
	ADDQ $256, DI
	ADDQ $256, DX
	SUBQ $256, CX
	JNZ  firstLoop

	VMOVDQU64 Z0, (R8)
	VMOVDQU64 Z1, 64(R8)
	VMOVDQU64 Z2, 128(R8)
	VMOVDQU64 Z3, 192(R8)
	VMOVDQU64 Z4, (R9)
	VMOVDQU64 Z5, 64(R9)
	VMOVDQU64 Z6, 128(R9)
	VMOVDQU64 Z7, 192(R9)
	VZEROUPPER
	RET

// func shareFoldNext(mat uint64, src, dst []byte, sOut *[256]byte)
// len(src) is a positive multiple of 256; dst is at least as long.
TEXT ·shareFoldNext(SB), NOSPLIT, $0-64
	MOVQ            mat+0(FP), AX
	MOVQ            src_base+8(FP), SI
	MOVQ            src_len+16(FP), CX
	MOVQ            dst_base+32(FP), DX
	MOVQ            sOut+56(FP), R9
	VPBROADCASTQ    AX, Z30
	VBROADCASTI32X4 foldK2048<>(SB), Z31
	VMOVDQU64       (R9), Z4
	VMOVDQU64       64(R9), Z5
	VMOVDQU64       128(R9), Z6
	VMOVDQU64       192(R9), Z7

	PCALIGN $32
nextLoop:
	VMOVDQU64      (SI), Z8
	VMOVDQU64      64(SI), Z9
	VMOVDQU64      128(SI), Z10
	VMOVDQU64      192(SI), Z11
	VGF2P8AFFINEQB $0x00, Z30, Z8, Z12
	VGF2P8AFFINEQB $0x00, Z30, Z9, Z13
	VGF2P8AFFINEQB $0x00, Z30, Z10, Z14
	VGF2P8AFFINEQB $0x00, Z30, Z11, Z15
	VMOVDQU64      Z12, (DX)
	VMOVDQU64      Z13, 64(DX)
	VMOVDQU64      Z14, 128(DX)
	VMOVDQU64      Z15, 192(DX)
	VPCLMULQDQ     $0x00, Z31, Z4, Z20
	VPCLMULQDQ     $0x11, Z31, Z4, Z4
	VPCLMULQDQ     $0x00, Z31, Z5, Z21
	VPCLMULQDQ     $0x11, Z31, Z5, Z5
	VPCLMULQDQ     $0x00, Z31, Z6, Z22
	VPCLMULQDQ     $0x11, Z31, Z6, Z6
	VPCLMULQDQ     $0x00, Z31, Z7, Z23
	VPCLMULQDQ     $0x11, Z31, Z7, Z7
	VPTERNLOGD     $0x96, Z20, Z12, Z4
	VPTERNLOGD     $0x96, Z21, Z13, Z5
	VPTERNLOGD     $0x96, Z22, Z14, Z6
	VPTERNLOGD     $0x96, Z23, Z15, Z7
	ADDQ           $256, SI
	ADDQ           $256, DX
	SUBQ           $256, CX
	JNZ            nextLoop

	VMOVDQU64 Z4, (R9)
	VMOVDQU64 Z5, 64(R9)
	VMOVDQU64 Z6, 128(R9)
	VMOVDQU64 Z7, 192(R9)
	VZEROUPPER
	RET
