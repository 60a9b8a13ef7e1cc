package keeper

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gorun/gorun/ckpt"
)

// CRC32C of bytes that arrive out of order. A region's CRC32C is known
// once all of its bytes passed, in whatever order, without a pass over the
// region: each piece's CRC32C is computed as it passes (in cache), and the
// CRC32Cs of ranges that meet are combined (zlib's crc32_combine, the
// x^(8n) mod P form: ckpt.CombineCRC32C), a few microseconds each.

// maxSpans bounds the disjoint ranges a cover keeps of one region: a
// sender of pieces keeps to a few (the optimizer region's W, M and V
// advancing window by window, the bytes between them).
const maxSpans = 1024

// errPiece is a piece that does not fit its region: out of bounds, empty,
// or over bytes already passed.
var errPiece = errors.New("a piece does not fit its region")

// span is a range [lo, hi) of a region's bytes that passed, and its
// CRC32C.
type span struct {
	lo, hi int64
	crc    uint32
}

// cover is the set of bytes of one region of size bytes that passed so
// far, as the fewest ranges (sorted, disjoint, none meeting the next),
// each with its CRC32C: when the region is whole, one range with the
// region's CRC32C. It accepts a byte once.
type cover struct {
	size  int64
	n     int64 // bytes passed
	spans []span
}

// fits says whether n bytes at off are in the region and none of them
// passed yet (an empty piece does not fit).
func (c *cover) fits(off, n int64) error {
	if n <= 0 || off < 0 || off > c.size || n > c.size-off {
		return fmt.Errorf("%w: %d bytes at %d of a region of %d", errPiece, n, off, c.size)
	}
	i := c.search(off)
	if i > 0 && c.spans[i-1].hi > off || i < len(c.spans) && c.spans[i].lo < off+n {
		return fmt.Errorf("%w: %d bytes at %d overlap bytes that passed", errPiece, n, off)
	}
	return nil
}

// search returns the index of the first range that starts at or after
// off.
func (c *cover) search(off int64) int {
	i, _ := slices.BinarySearchFunc(c.spans, off, func(s span, off int64) int {
		switch {
		case s.lo < off:
			return -1
		case s.lo > off:
			return 1
		}
		return 0
	})
	return i
}

// add records n bytes at off, whose CRC32C is crc, as passed: an error
// (errPiece) if they do not fit, or if the region would be cut into more
// than maxSpans ranges.
func (c *cover) add(off, n int64, crc uint32) error {
	if err := c.fits(off, n); err != nil {
		return err
	}
	i := c.search(off)
	left := i > 0 && c.spans[i-1].hi == off
	right := i < len(c.spans) && c.spans[i].lo == off+n
	switch {
	case left && right:
		l, r := &c.spans[i-1], c.spans[i]
		l.crc = ckpt.CombineCRC32C(ckpt.CombineCRC32C(l.crc, crc, n), r.crc, r.hi-r.lo)
		l.hi = r.hi
		c.spans = slices.Delete(c.spans, i, i+1)
	case left:
		l := &c.spans[i-1]
		l.crc, l.hi = ckpt.CombineCRC32C(l.crc, crc, n), off+n
	case right:
		r := &c.spans[i]
		r.crc, r.lo = ckpt.CombineCRC32C(crc, r.crc, r.hi-r.lo), off
	default:
		if len(c.spans) >= maxSpans {
			return fmt.Errorf("%w: the region's pieces leave more than %d holes", errPiece, maxSpans)
		}
		c.spans = slices.Insert(c.spans, i, span{lo: off, hi: off + n, crc: crc})
	}
	c.n += n
	return nil
}

// whole says whether every byte of the region passed.
func (c *cover) whole() bool { return c.n == c.size }

// sum returns the CRC32C of the region, once whole (that of no bytes, 0,
// for a region of size 0).
func (c *cover) sum() uint32 {
	if len(c.spans) == 0 {
		return 0
	}
	return c.spans[0].crc
}
