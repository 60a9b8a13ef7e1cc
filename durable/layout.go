package durable

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/gorun/gorun/internal/crc32c"
)

const (
	hdrSize       = 4096
	hdrCRCOff     = hdrSize - 4
	regionsOff    = 64
	regionDescLen = 40
	nameLen       = 32
	align         = 4096
	minChunk      = 4096
	maxChunk      = 1 << 30
	// maxChunks bounds a file's chunk table (64 MiB of CRCs): a layout
	// that would need more chunks needs a larger chunk size.
	maxChunks = 1 << 24

	stateFree     = 0x45455246 // "FREE"
	stateComplete = 0x454E4F44 // "DONE"
)

func roundUp(n int64) int64 { return (n + align - 1) &^ (align - 1) }

// layout is where a base file's parts are, derived from its chunk size
// and regions (never from anything else read from the file).
type layout struct {
	chunk    int64
	regions  []Region
	first    []int64 // index in the chunk table of each region's first chunk
	chunks   int64   // K, chunks in all
	dataOff  []int64 // each region's offset
	size     int64   // the file's size
	tableEnd int64   // T, where the data begin
}

// newLayout computes the layout of a file of regions cut into chunks of
// chunk bytes. regions must have been checked.
func newLayout(chunk int64, regions []Region) (*layout, error) {
	if chunk < minChunk || chunk > maxChunk || chunk%align != 0 {
		return nil, fmt.Errorf("durable: chunk size %d, want a multiple of %d from %d to %d", chunk, align, minChunk, maxChunk)
	}
	l := &layout{chunk: chunk, regions: slices.Clone(regions)}
	for _, r := range regions {
		l.first = append(l.first, l.chunks)
		l.chunks += (r.Size + chunk - 1) / chunk
	}
	if l.chunks > maxChunks {
		return nil, fmt.Errorf("durable: %d chunks of %d bytes, more than %d: use a larger chunk size", l.chunks, chunk, maxChunks)
	}
	l.tableEnd = hdrSize + roundUp(4*l.chunks)
	off := l.tableEnd
	for _, r := range regions {
		l.dataOff = append(l.dataOff, off)
		off += roundUp(r.Size)
	}
	l.size = off
	return l, nil
}

// chunkAt returns the region, offset in it and length of chunk k, 0 ≤
// k < l.chunks.
func (l *layout) chunkAt(k int64) (region int, off, n int64) {
	for r, reg := range l.regions {
		if k < l.first[r]+(reg.Size+l.chunk-1)/l.chunk {
			off = (k - l.first[r]) * l.chunk
			return r, off, min(l.chunk, reg.Size-off)
		}
	}
	panic(fmt.Sprintf("durable: chunk %d of %d", k, l.chunks))
}

// header is a base file's header, decoded.
type header struct {
	state   uint32
	rank    int
	step    int64
	version uint64
	table   uint32 // CRC32C of the chunk table
	l       *layout
}

func (h *header) complete() bool { return h.state == stateComplete }

// encodeHeader returns the 4096 bytes of h.
func encodeHeader(h *header) []byte {
	b := make([]byte, hdrSize)
	putPreamble(b, magicBase)
	le.PutUint32(b[8:], h.state)
	le.PutUint32(b[12:], uint32(h.rank))
	le.PutUint64(b[16:], uint64(h.step))
	le.PutUint64(b[24:], h.version)
	le.PutUint64(b[32:], uint64(h.l.chunk))
	le.PutUint32(b[40:], uint32(len(h.l.regions)))
	le.PutUint32(b[44:], h.table)
	for i, r := range h.l.regions {
		d := b[regionsOff+regionDescLen*i:]
		copy(d[:nameLen], r.Name)
		le.PutUint64(d[nameLen:], uint64(r.Size))
	}
	le.PutUint32(b[hdrCRCOff:], crc32c.Checksum(b[:hdrCRCOff]))
	return b
}

// parseHeader checks and decodes a base file's header of rank. It
// checks everything the header says on its own (not the file's size).
func parseHeader(b []byte, rank int, path string) (*header, error) {
	if len(b) != hdrSize {
		return nil, corruptErr(path, min(int64(len(b)), hdrSize), hdrSize, "header of %d bytes, want %d", len(b), hdrSize)
	}
	if err := checkPreamble(b, magicBase, path); err != nil {
		return nil, err
	}
	if got, want := crc32c.Checksum(b[:hdrCRCOff]), le.Uint32(b[hdrCRCOff:]); got != want {
		return nil, corruptErr(path, 0, hdrSize, "header CRC32C %#08x, the header says %#08x", got, want)
	}
	h := &header{
		state:   le.Uint32(b[8:]),
		rank:    int(le.Uint32(b[12:])),
		step:    int64(le.Uint64(b[16:])),
		version: le.Uint64(b[24:]),
		table:   le.Uint32(b[44:]),
	}
	chunk := le.Uint64(b[32:])
	n := le.Uint32(b[40:])
	switch {
	case h.state != stateFree && h.state != stateComplete:
		return nil, corruptErr(path, 8, 12, "state %#08x is neither free nor complete", h.state)
	case h.rank != rank:
		return nil, corruptErr(path, 12, 16, "rank %d, want %d", h.rank, rank)
	case h.step < 0:
		return nil, corruptErr(path, 16, 24, "negative step")
	case h.state == stateFree && (h.step != 0 || h.version != 0 || h.table != 0):
		return nil, corruptErr(path, 16, 48, "a free header with a step, version or table CRC")
	case h.state == stateComplete && h.version == 0:
		return nil, corruptErr(path, 24, 32, "a complete header with version 0")
	case chunk < minChunk || chunk > maxChunk || chunk%align != 0:
		return nil, corruptErr(path, 32, 40, "chunk size %d", chunk)
	case n < 1 || n > MaxRegions:
		return nil, corruptErr(path, 40, 44, "%d regions, want 1 to %d", n, MaxRegions)
	}
	if err := checkZero(b, 48, regionsOff, path); err != nil {
		return nil, err
	}
	regions := make([]Region, n)
	for i := range regions {
		off := regionsOff + regionDescLen*i
		d := b[off : off+regionDescLen]
		name, _, _ := bytes.Cut(d[:nameLen], []byte{0})
		if err := checkZero(d, len(name), nameLen, path); err != nil {
			return nil, corruptErr(path, int64(off+len(name)), int64(off+nameLen), "region %d: name not zero-padded", i)
		}
		regions[i] = Region{Name: string(name), Size: int64(le.Uint64(d[nameLen:]))}
	}
	if err := checkZero(b, regionsOff+regionDescLen*int(n), hdrCRCOff, path); err != nil {
		return nil, err
	}
	if err := checkRegions(regions); err != nil {
		return nil, corruptErr(path, regionsOff, int64(regionsOff+regionDescLen*int(n)), "%v", err)
	}
	l, err := newLayout(int64(chunk), regions)
	if err != nil {
		return nil, corruptErr(path, 32, int64(regionsOff+regionDescLen*int(n)), "%v", err)
	}
	h.l = l
	return h, nil
}

// sameRegions returns an error if the header's regions are not want.
func sameRegions(got, want []Region) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d regions, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("region %d is %q of %d bytes, want %q of %d bytes", i, got[i].Name, got[i].Size, want[i].Name, want[i].Size)
		}
	}
	return nil
}
