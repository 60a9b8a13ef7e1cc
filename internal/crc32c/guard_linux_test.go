package crc32c

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestUpdateGuardPages checks every input that ends where a mapped page
// ends, the next page unmapped, and every input that starts where a
// mapped page starts, the page before it inaccessible: reading one byte
// outside p faults, and the test crashes.
func TestUpdateGuardPages(t *testing.T) {
	pg := unix.Getpagesize()
	// Three pages: the first made inaccessible, the second holds the data,
	// the third unmapped.
	m, err := unix.Mmap(-1, 0, 3*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	// m's mapping shrinks to its first two pages below, which Munmap(m)
	// would not accept: unmap what is left page by page.
	defer func() {
		if err := unix.MunmapPtr(unsafePointer(m), uintptr(2*pg)); err != nil {
			t.Errorf("munmap: %v", err)
		}
	}()
	if err := unix.MunmapPtr(unsafePointer(m[2*pg:]), uintptr(pg)); err != nil {
		t.Fatalf("munmap the third page: %v", err)
	}
	if err := unix.Mprotect(m[:pg], unix.PROT_NONE); err != nil {
		t.Fatalf("mprotect the first page: %v", err)
	}
	data := m[pg : 2*pg : 2*pg]
	copy(data, randomBytes(11, pg))
	for n := 0; n <= pg; n++ {
		for _, p := range [][]byte{data[pg-n:], data[:n:n]} {
			for _, c := range []uint32{0, 0xffffffff} {
				w := want(c, p)
				if got := Update(c, p); got != w {
					t.Fatalf("Update(%#x, %d bytes) = %#x, want %#x", c, n, got, w)
				}
				if useFold && n >= foldMin {
					if got := ^foldUpdate(^c, p); got != w {
						t.Fatalf("foldUpdate(%d bytes) = %#x, want %#x", n, ^got, ^w)
					}
				}
			}
		}
	}
}

// unsafePointer returns the address of b's first byte.
func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }
