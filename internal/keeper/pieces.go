package keeper

// The pieces answer: a diff-mode holder's answer to a get of a step its
// store restores exactly (getDiff). The store replays the owner's
// optimizer state a window of elements at a time, W, M and V of the window
// together (diffstore.Store.RestorePieces); the answer carries each piece
// where it goes, so that the holder replays every window once and never
// holds the state:
//
//	pieces = header(kind 0x84, count, length = the regions' bytes) table piece*
//	piece  = region(2) offset(8) n(4) bytes(n)
//
// big-endian; region is an index into the table. The pieces end when every
// byte of every region arrived. The sender chooses the order; the
// receiver trusts none of it: a piece of no region of the table, empty,
// outside its region or over bytes that already arrived is a protocol
// error that closes the link (never a panic, never a hole), and the bytes
// of each region are checked against the table's CRC32C, which is the
// owner's committed one, once all of them arrived. Both ends compute each
// region's CRC32C from its pieces' as they pass, combined (cover): no
// pass over a region after the fact.

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
)

const (
	kindPieces   = 0x84
	pieceHdrSize = 14
)

// pieceChunk is the most bytes of a piece a holder sends: W's, M's and V's
// pieces of a window of pieceChunk/4 elements (tests set it smaller, to
// cut small states into many windows).
var pieceChunk = diffstore.DefaultChunk

// appendPieceHdr appends the header of a piece of n bytes at off of the
// table's region-th region.
func appendPieceHdr(b []byte, region int, off int64, n int) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(region))
	b = binary.BigEndian.AppendUint64(b, uint64(off))
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

// pieceWriter writes the pieces of an answer whose table is t to w,
// computing each region's CRC32C from its pieces on the way.
type pieceWriter struct {
	w      io.Writer
	covers []cover
	hdr    [pieceHdrSize]byte
}

func newPieceWriter(w io.Writer, t []tableEntry) *pieceWriter {
	p := &pieceWriter{w: w, covers: make([]cover, len(t))}
	for i, e := range t {
		p.covers[i].size = e.size
	}
	return p
}

// write writes b, the bytes at off of region, as one piece (at most
// 4 GiB - 1); a piece that does not fit its region is an error, and
// nothing is written.
func (p *pieceWriter) write(region int, off int64, b []byte) error {
	if region < 0 || region >= len(p.covers) || uint64(len(b)) > 1<<32-1 {
		return fmt.Errorf("%w: %d bytes of region %d", errPiece, len(b), region)
	}
	cv := &p.covers[region]
	if err := cv.add(off, int64(len(b)), crc32c.Update(0, b)); err != nil {
		return err
	}
	return writeBufs(p.w, net.Buffers{appendPieceHdr(p.hdr[:0], region, off, len(b)), b})
}

// sum returns region's CRC32C and whether all of its bytes were written.
func (p *pieceWriter) sum(region int) (uint32, bool) {
	cv := &p.covers[region]
	return cv.sum(), cv.whole()
}

// readPieces reads the pieces of an answer whose table is t into dst, one
// slice per entry of t and of its size, until every byte of every region
// arrived, and checks each region's CRC32C against t's (those of step) as
// soon as all of its bytes arrived.
// Any piece that does not fit is an error (wrapping errPiece), as is a
// region whose bytes do not match their CRC32C; dst's bytes are then
// undefined.
func readPieces(r io.Reader, t []tableEntry, dst [][]byte, step int64) error {
	covers := make([]cover, len(t))
	var left uint64
	for i, e := range t {
		if int64(len(dst[i])) != e.size {
			return fmt.Errorf("region %q of %d bytes does not fit here (%d)", e.name, e.size, len(dst[i]))
		}
		covers[i].size = e.size
		left += uint64(e.size)
	}
	var ph [pieceHdrSize]byte
	for left > 0 {
		if _, err := io.ReadFull(r, ph[:]); err != nil {
			return err
		}
		region := int(binary.BigEndian.Uint16(ph[0:]))
		off := int64(binary.BigEndian.Uint64(ph[2:])) // past MaxInt64: negative, refused
		n := int64(binary.BigEndian.Uint32(ph[10:]))
		if region >= len(t) {
			return fmt.Errorf("%w: a piece of region %d, the answer has %d", errPiece, region, len(t))
		}
		cv := &covers[region]
		if err := cv.fits(off, n); err != nil {
			return fmt.Errorf("region %q: %w", t[region].name, err)
		}
		d := dst[region][off : off+n]
		if _, err := io.ReadFull(r, d); err != nil {
			return err
		}
		if err := cv.add(off, n, crc32c.Update(0, d)); err != nil {
			return fmt.Errorf("region %q: %w", t[region].name, err) // not reached: it fits
		}
		left -= uint64(n)
		if e := t[region]; cv.whole() && cv.sum() != e.sum {
			return fmt.Errorf("region %q of step %d: CRC32C %08x, want %08x: %w", e.name, step, cv.sum(), e.sum, ErrCopyCRC)
		}
	}
	for _, e := range t {
		if e.size == 0 && e.sum != 0 { // the others were checked when whole
			return fmt.Errorf("region %q of step %d: CRC32C 00000000, want %08x: %w", e.name, step, e.sum, ErrCopyCRC)
		}
	}
	return nil
}
