//go:build !amd64 || purego

package ckpt

// useShareFold is false: this build has no fused kernels, and
// ShareChecked copies, shares and checksums in passes.
const useShareFold = false

func shareFoldFirst(mat uint64, src, cp, dst []byte, sIn, sOut *[256]byte) {
	panic("ckpt: no fused share kernel in this build")
}

func shareFoldNext(mat uint64, src, dst []byte, sOut *[256]byte) {
	panic("ckpt: no fused share kernel in this build")
}
