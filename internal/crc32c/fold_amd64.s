//go:build !purego

#include "textflag.h"

// The folding CRC (Intel, "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ Instruction"), on 512-bit vectors.
//
// The CRC, non-inverted, of a message with initial value c is the CRC
// with initial value 0 of the message whose first 4 bytes are xored with
// c (little-endian: the CRC is bit-reflected). It depends only on the
// message read as a polynomial modulo P, so the code may replace any
// 16-byte lane of the message by a lane congruent to it times x^D modulo
// P, xored into the lane D bits further on: the lane's low half h0
// (first bytes) and high half h1 give clmul(h0, x^(D+32)) ^
// clmul(h1, x^(D-32)), constants in foldK. Folding keeps a window of 64
// bytes per vector register over the message; when only one 16-byte lane
// is left, followed by fewer than 16 bytes of the message, the CRC is
// that of these last at most 31 bytes from initial value 0, which the
// SSE4.2 CRC32 instruction computes. Every load is of bytes inside p.

// func foldUpdate(crc uint32, p []byte) uint32
TEXT ·foldUpdate(SB), NOSPLIT, $0-36
	MOVL  crc+0(FP), AX
	MOVQ  p_base+8(FP), SI
	MOVQ  p_len+16(FP), CX
	VMOVD AX, X4            // the initial CRC, zero above its 32 bits
	CMPQ  CX, $256
	JB    from64

	// Z0-Z3: the first 256 bytes, the CRC xored into the first 4.
	VMOVDQU64 (SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VPXORD    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX
	CMPQ      CX, $256
	JB        fold4

	// Fold each of the 16 lanes forward by 256 bytes onto the next ones.
	VBROADCASTI32X4 ·foldK+0(SB), Z4

	PCALIGN $32
loop256:
	VMOVDQU64  (SI), Z8
	VMOVDQU64  64(SI), Z9
	VMOVDQU64  128(SI), Z10
	VMOVDQU64  192(SI), Z11
	VPCLMULQDQ $0x00, Z4, Z0, Z5
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VPCLMULQDQ $0x00, Z4, Z1, Z6
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VPCLMULQDQ $0x00, Z4, Z2, Z7
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VPCLMULQDQ $0x00, Z4, Z3, Z12
	VPCLMULQDQ $0x11, Z4, Z3, Z3
	VPTERNLOGD $0x96, Z5, Z8, Z0   // Z0 ^= Z8 ^ Z5
	VPTERNLOGD $0x96, Z6, Z9, Z1
	VPTERNLOGD $0x96, Z7, Z10, Z2
	VPTERNLOGD $0x96, Z12, Z11, Z3
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop256

fold4:
	// Fold Z0 onto Z1, Z1 onto Z2, Z2 onto Z3: 64 bytes each.
	VBROADCASTI32X4 ·foldK+16(SB), Z4
	VPCLMULQDQ      $0x00, Z4, Z0, Z5
	VPCLMULQDQ      $0x11, Z4, Z0, Z0
	VPTERNLOGD      $0x96, Z5, Z0, Z1
	VPCLMULQDQ      $0x00, Z4, Z1, Z5
	VPCLMULQDQ      $0x11, Z4, Z1, Z1
	VPTERNLOGD      $0x96, Z5, Z1, Z2
	VPCLMULQDQ      $0x00, Z4, Z2, Z5
	VPCLMULQDQ      $0x11, Z4, Z2, Z2
	VPTERNLOGD      $0x96, Z5, Z2, Z3
	JMP             loop64check

from64:
	// Z3: the first 64 bytes, the CRC xored into the first 4.
	VMOVDQU64       (SI), Z3
	VPXORD          Z4, Z3, Z3
	ADDQ            $64, SI
	SUBQ            $64, CX
	VBROADCASTI32X4 ·foldK+16(SB), Z4

loop64check:
	CMPQ CX, $64
	JB   reduce

loop64:
	// Fold Z3 forward by 64 bytes onto the next 64.
	VMOVDQU64  (SI), Z8
	VPCLMULQDQ $0x00, Z4, Z3, Z5
	VPCLMULQDQ $0x11, Z4, Z3, Z3
	VPTERNLOGD $0x96, Z5, Z8, Z3
	ADDQ       $64, SI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JAE        loop64

reduce:
	// Fold Z3's lanes 0, 1 and 2 onto lane 3 (by 48, 32 and 16 bytes;
	// lane 3's constants are 0) into X5.
	VMOVDQU64     ·foldK+32(SB), Z4
	VPCLMULQDQ    $0x00, Z4, Z3, Z5
	VPCLMULQDQ    $0x11, Z4, Z3, Z6
	VPXORQ        Z6, Z5, Z5
	VEXTRACTI32X4 $3, Z3, X7
	VEXTRACTI64X4 $1, Z5, Y6
	VPXORQ        Y6, Y5, Y5
	VEXTRACTI128  $1, Y5, X6
	VPTERNLOGD    $0x96, X6, X7, X5 // X5 ^= X7 ^ X6

	CMPQ CX, $16
	JB   last

	// Fold X5 forward by 16 bytes onto the next 16.
	VMOVDQU ·foldK+64(SB), X4

loop16:
	VMOVDQU    (SI), X8
	VPCLMULQDQ $0x00, X4, X5, X6
	VPCLMULQDQ $0x11, X4, X5, X5
	VPTERNLOGD $0x96, X6, X8, X5
	ADDQ       $16, SI
	SUBQ       $16, CX
	CMPQ       CX, $16
	JAE        loop16

last:
	// The CRC from 0 of X5's 16 bytes, then of the last CX < 16 bytes.
	VMOVQ      X5, DX
	VPEXTRQ    $1, X5, R8
	VZEROUPPER
	XORL       AX, AX
	CRC32Q     DX, AX
	CRC32Q     R8, AX
	CMPQ       CX, $8
	JB         lt8
	CRC32Q     (SI), AX
	ADDQ       $8, SI
	SUBQ       $8, CX

lt8:
	CMPQ   CX, $4
	JB     lt4
	CRC32L (SI), AX
	ADDQ   $4, SI
	SUBQ   $4, CX

lt4:
	CMPQ   CX, $2
	JB     lt2
	CRC32W (SI), AX
	ADDQ   $2, SI
	SUBQ   $2, CX

lt2:
	TESTQ  CX, CX
	JZ     done
	CRC32B (SI), AX

done:
	MOVL AX, ret+32(FP)
	RET
