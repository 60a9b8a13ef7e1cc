package ckpt

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/gorun/gorun/internal/crc32c"
)

// The header file's layout; the package comment describes it byte by byte.
const (
	hdrMagic     = "GRCK"
	hdrVersion   = 1
	hdrFileSize  = 4096
	layoutSize   = 1024
	layoutCRCOff = layoutSize - 4
	countOff     = 8
	rankOff      = 12
	jobOff       = 16
	descOff      = 128
	descSize     = 40
	slotHdrOff   = 1024 // slot i's header is at slotHdrOff + i·slotHdrSize
	slotHdrSize  = 1024
	entOff       = 16 // the entries, in a slot's header
	entSize      = 16

	maxRegions = 16
	// MaxRegionSize is the largest region size.
	MaxRegionSize = 1 << 40
	// slotAlign is the alignment of the slots in a data file.
	slotAlign = 4096
)

// A slot's state word.
const (
	stateEmpty     = 0
	stateStaging   = 0x47415453 // "STAG"
	stateCommitted = 0x544D4F43 // "COMT"
)

var (
	ne = binary.NativeEndian
)

// Region is one named part of a rank's protected state.
type Region struct {
	Name string
	Size int64 // bytes, 0 to MaxRegionSize
}

// stride is the distance between the slots of a region of size bytes.
func stride(size int64) int64 {
	return (size + slotAlign - 1) &^ (slotAlign - 1)
}

// checkRegions checks the regions given to Create or Open.
func checkRegions(regions []Region) error {
	if len(regions) < 1 || len(regions) > maxRegions {
		return layoutErr("%d regions, want 1 to %d", len(regions), maxRegions)
	}
	for i, r := range regions {
		if !validName(r.Name) {
			return layoutErr("region %d: invalid name %q (want [a-z][a-z0-9_-]{0,31})", i, r.Name)
		}
		if r.Size < 0 || r.Size > MaxRegionSize {
			return layoutErr("region %q: size %d outside [0, %d]", r.Name, r.Size, int64(MaxRegionSize))
		}
		for _, q := range regions[:i] {
			if q.Name == r.Name {
				return layoutErr("region %q given twice", r.Name)
			}
		}
	}
	return nil
}

// encodeLayout returns the layout block of a rank's header file.
func encodeLayout(job string, rank int, regions []Region) []byte {
	b := make([]byte, layoutSize)
	copy(b, hdrMagic)
	b[4] = hdrVersion
	ne.PutUint32(b[countOff:], uint32(len(regions)))
	ne.PutUint32(b[rankOff:], uint32(rank))
	copy(b[jobOff:jobOff+maxJobLen], job)
	for i, r := range regions {
		d := b[descOff+descSize*i:][:descSize]
		copy(d[:maxNameLen], r.Name)
		ne.PutUint64(d[maxNameLen:], uint64(r.Size))
	}
	ne.PutUint32(b[layoutCRCOff:], crc32c.Checksum(b[:layoutCRCOff]))
	return b
}

// parseLayout checks the layout block b (layoutSize bytes of the header
// file path) of job's rank and returns its regions. Errors wrap ErrLayout.
func parseLayout(b []byte, path, job string, rank int) ([]Region, error) {
	bad := func(format string, args ...any) error {
		return layoutErr("%s: "+format, append([]any{path}, args...)...)
	}
	if len(b) < layoutSize {
		return nil, bad("layout is %d bytes, want %d", len(b), layoutSize)
	}
	b = b[:layoutSize]
	if string(b[:4]) != hdrMagic {
		return nil, bad("bad magic %q, want %q", b[:4], hdrMagic)
	}
	if b[4] != hdrVersion {
		return nil, bad("version %d, want %d", b[4], hdrVersion)
	}
	if got, want := ne.Uint32(b[layoutCRCOff:]), crc32c.Checksum(b[:layoutCRCOff]); got != want {
		return nil, bad("layout CRC32C is %#08x, the bytes give %#08x", got, want)
	}
	if !allZero(b[5:8]) {
		return nil, bad("reserved bytes 5-7 are not zero")
	}
	n := ne.Uint32(b[countOff:])
	if n < 1 || n > maxRegions {
		return nil, bad("region count %d, want 1 to %d", n, maxRegions)
	}
	if r := ne.Uint32(b[rankOff:]); uint64(r) != uint64(rank) {
		return nil, bad("the header is rank %d's, not rank %d's", r, rank)
	}
	j := b[jobOff : jobOff+maxJobLen]
	if id := trimZeros(j); string(id) != job {
		return nil, bad("the header is job %q's, not job %q's", id, job)
	}
	if !allZero(j[len(job):]) {
		return nil, bad("the job id field has bytes after its end")
	}
	if !allZero(b[jobOff+maxJobLen : descOff]) {
		return nil, bad("reserved bytes %d-%d are not zero", jobOff+maxJobLen, descOff-1)
	}
	regions := make([]Region, n)
	for i := range regions {
		d := b[descOff+descSize*i:][:descSize]
		name := trimZeros(d[:maxNameLen])
		if !validName(string(name)) {
			return nil, bad("region %d: invalid name %q", i, name)
		}
		if !allZero(d[len(name):maxNameLen]) {
			return nil, bad("region %d: name %q has bytes after its end", i, name)
		}
		size := ne.Uint64(d[maxNameLen:])
		if size > MaxRegionSize {
			return nil, bad("region %q: size %d over %d", name, size, uint64(MaxRegionSize))
		}
		regions[i] = Region{Name: string(name), Size: int64(size)}
		for _, q := range regions[:i] {
			if q.Name == regions[i].Name {
				return nil, bad("region %q named twice", q.Name)
			}
		}
	}
	if end := descOff + descSize*int(n); !allZero(b[end:layoutCRCOff]) {
		return nil, bad("bytes %d-%d after the region descriptors are not zero", end, layoutCRCOff-1)
	}
	return regions, nil
}

// sameRegions checks that the header's regions are the caller's.
func sameRegions(have, want []Region) error {
	if slices.Equal(have, want) {
		return nil
	}
	return layoutErr("the files hold regions %s, not %s", fmtRegions(have), fmtRegions(want))
}

func fmtRegions(rs []Region) string {
	b := []byte{'['}
	for i, r := range rs {
		if i > 0 {
			b = append(b, ' ')
		}
		b = fmt.Appendf(b, "%s:%d", r.Name, r.Size)
	}
	return string(append(b, ']'))
}

// trimZeros returns b up to its first zero byte.
func trimZeros(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
