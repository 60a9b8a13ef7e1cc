//go:build !purego

package ckpt

import "golang.org/x/sys/cpu"

// useShareFold reports whether this processor runs shareFoldFirst and
// shareFoldNext: AVX-512 (foundation), its GFNI and VPCLMULQDQ. x/sys/cpu
// reports AVX-512 only when the OS saves the 512-bit registers.
var useShareFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512GFNI && cpu.X86.HasAVX512VPCLMULQDQ

// shareFoldFirst copies src into cp and writes src's product by the
// coefficient whose GFNI bit matrix is mat into dst, folding src into
// the CRC state sIn and the product into sOut (erasure_fold.go), reading
// each byte of src once. len(src) is a positive multiple of 256; cp and
// dst are at least as long. Defined in erasure_fold_amd64.s.
//
//go:noescape
func shareFoldFirst(mat uint64, src, cp, dst []byte, sIn, sOut *[256]byte)

// shareFoldNext is shareFoldFirst without the copy and sIn.
//
//go:noescape
func shareFoldNext(mat uint64, src, dst []byte, sOut *[256]byte)
