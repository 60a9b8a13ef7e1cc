//go:build !amd64 || purego

package crc32c

// useFold is false: this build has no folding code, and Update always
// uses hash/crc32.
const useFold = false

// foldMin is unused in this build.
const foldMin = 0

// foldUpdate is never called in this build (useFold is false).
func foldUpdate(crc uint32, p []byte) uint32 {
	panic("crc32c: no folding implementation in this build")
}
