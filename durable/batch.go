package durable

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/gorun/gorun/internal/crc32c"
)

const (
	batchHdr  = 40
	recordHdr = 16
	// maxBatchFile bounds the size of a batch file that is read.
	maxBatchFile = 1 << 36
)

// AppendBatch writes records, the differentials of steps first to last
// (records[i] of step first+i), as one batch file of rank, which appears
// whole or not at all. It creates DIR/r<rank> if needed. Writing a batch
// of the same steps again replaces it.
func AppendBatch(dir string, rank int, first, last int64, records [][]byte) error {
	switch {
	case !validRank(rank):
		return fmt.Errorf("durable: bad rank %d", rank)
	case !validStep(first) || last < first:
		return fmt.Errorf("durable: bad batch of steps %d to %d", first, last)
	case last-first >= math.MaxUint32 || int64(len(records)) != last-first+1:
		return fmt.Errorf("durable: a batch of steps %d to %d with %d records", first, last, len(records))
	}
	if err := ensureRankDir(dir, rank); err != nil {
		return err
	}
	pieces := make([][]byte, 0, 1+2*len(records))
	hdr := make([]byte, batchHdr)
	putPreamble(hdr, magicBatch)
	le.PutUint32(hdr[8:], uint32(rank))
	le.PutUint32(hdr[12:], uint32(len(records)))
	le.PutUint64(hdr[16:], uint64(first))
	le.PutUint64(hdr[24:], uint64(last))
	le.PutUint32(hdr[36:], crc32c.Checksum(hdr[:36]))
	pieces = append(pieces, hdr)
	for i, d := range records {
		if int64(len(d)) > math.MaxUint32 {
			return fmt.Errorf("durable: record of step %d: %d bytes, more than %d", first+int64(i), len(d), uint32(math.MaxUint32))
		}
		rh := make([]byte, recordHdr)
		le.PutUint64(rh, uint64(first+int64(i)))
		le.PutUint32(rh[8:], uint32(len(d)))
		le.PutUint32(rh[12:], crc32c.Update(crc32c.Checksum(rh[:12]), d))
		pieces = append(pieces, rh, d)
	}
	return writeAtomic(rankDir(dir, rank), diffName(first, last), pieces, nil)
}

// parseBatch checks and decodes a batch file of rank named for steps a to
// b. The records' data alias buf.
func parseBatch(buf []byte, rank int, a, b int64, path string) ([]Record, error) {
	return scanBatch(&batchReader{buf: buf, size: int64(len(buf)), path: path}, rank, a, b, a, b)
}

// Bounds of what reading a batch file allocates, whatever the file says:
// a file up to wholeBatch bytes is read at once (its records alias the
// buffer); a larger one is read record by record, and a record of more
// than streamRecord bytes has its CRC32C checked in pieces of
// streamPiece bytes before it is read into a buffer of its size (twice
// read, never allocated unless it verifies), unless the scan reading it
// (batchBufs) holds a buffer that large already or has read a record of
// that size or more that verified: then it is read at once.
const (
	wholeBatch   = 64 << 20
	streamRecord = 64 << 20
	streamPiece  = 1 << 20
)

// batchReader reads a batch file: from buf when it was read whole, else
// from f, into buffers from bufs if not nil.
type batchReader struct {
	buf     []byte
	f       io.ReaderAt
	size    int64
	path    string
	bufs    *batchBufs
	scratch []byte // streamPiece bytes, for crc
	// small, if not 0, replaces streamRecord and streamPiece (tests:
	// fuzzing the paths of large records with small ones).
	small int64
}

// limits returns streamRecord and streamPiece, or small for both.
func (r *batchReader) limits() (record, piece int64) {
	if r.small > 0 {
		return r.small, r.small
	}
	return streamRecord, streamPiece
}

// batchBufs are the buffers a scan of the log (ScanBatches) reads batch
// files into. Those of the batch read last are reused for the next once
// its records are no longer needed (recycle), so that a scan of records
// of one size holds one batch's records at a time, and does not allocate
// (nor fault in) new memory for every batch.
type batchBufs struct {
	whole   []byte   // the file read whole, if it was
	free    [][]byte // record buffers of the batch before, to reuse
	used    [][]byte // record buffers of the batch being read
	scratch []byte
	// verified is the size of the largest record read into a buffer
	// that verified: a record claiming no more is read at once (what a
	// bad one makes the scan allocate is no more than a good one did).
	verified int64
}

// take returns a free buffer of at least n bytes (the smallest), sliced
// to n, or nil if none is that large. The buffer is counted as used at
// its full capacity, which a later batch's larger records can use again
// (the view handed out is cut to n, so that appending to a record never
// writes into the rest).
func (p *batchBufs) take(n int64) []byte {
	best := -1
	for i, b := range p.free {
		if int64(cap(b)) >= n && (best < 0 || cap(b) < cap(p.free[best])) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := p.free[best]
	p.free = slices.Delete(p.free, best, best+1)
	p.used = append(p.used, b[:cap(b)])
	return b[:n:n]
}

// fits reports whether a record of n bytes is read at once: a free
// buffer has n bytes or more, or a record of n bytes or more verified.
func (p *batchBufs) fits(n int64) bool {
	if p == nil {
		return false
	}
	if n <= p.verified {
		return true
	}
	for _, b := range p.free {
		if int64(cap(b)) >= n {
			return true
		}
	}
	return false
}

// recycle makes the buffers of the batch read last free for the next
// (the records of the batch must no longer be needed) and drops the free
// buffers that batch did not use.
func (p *batchBufs) recycle() {
	clear(p.free)
	p.free, p.used = p.used, p.free[:0]
}

// release makes the buffers of a batch that did not verify free again,
// beside those it did not use.
func (p *batchBufs) release() {
	p.free = append(p.free, p.used...)
	clear(p.used)
	p.used = p.used[:0]
}

// bytes returns the n bytes at off (off+n ≤ size): a slice of buf, or a
// new buffer read from f. A file that ends before is corrupt (it shrank
// since its size was taken).
func (r *batchReader) bytes(off, n int64) ([]byte, error) {
	if r.buf != nil {
		return r.buf[off : off+n : off+n], nil
	}
	b := make([]byte, n)
	if err := r.readAt(b, off); err != nil {
		return nil, err
	}
	return b, nil
}

// record returns the n bytes of a record's data at off, read from f into
// a buffer of bufs' if one is free, else into a new one, whose size the
// caller has checked against the record's CRC32C if it is more than
// streamRecord bytes.
func (r *batchReader) record(off, n int64) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	var b []byte
	if r.bufs != nil {
		b = r.bufs.take(n)
	}
	if b == nil {
		b = make([]byte, n)
		if r.bufs != nil {
			r.bufs.used = append(r.bufs.used, b)
		}
	}
	if err := r.readAt(b, off); err != nil {
		return nil, err
	}
	return b, nil
}

func (r *batchReader) readAt(b []byte, off int64) error {
	m, err := r.f.ReadAt(b, off)
	switch {
	case m == len(b):
		return nil
	case err == nil || errors.Is(err, io.EOF):
		return corruptErr(r.path, off+int64(m), off+int64(len(b)), "the file ends (it was %d bytes)", r.size)
	default:
		return fmt.Errorf("durable: reading %s: %w", r.path, err)
	}
}

// crc returns the CRC32C of the n bytes at off continuing crc, read in
// pieces.
func (r *batchReader) crc(crc uint32, off, n int64) (uint32, error) {
	if r.buf != nil {
		return crc32c.Update(crc, r.buf[off:off+n]), nil
	}
	if r.scratch == nil {
		if r.bufs != nil && r.bufs.scratch != nil {
			r.scratch = r.bufs.scratch
		} else {
			_, piece := r.limits()
			r.scratch = make([]byte, piece)
			if r.bufs != nil {
				r.bufs.scratch = r.scratch
			}
		}
	}
	for n > 0 {
		p := r.scratch[:min(n, int64(len(r.scratch)))]
		if err := r.readAt(p, off); err != nil {
			return 0, err
		}
		crc = crc32c.Update(crc, p)
		off, n = off+int64(len(p)), n-int64(len(p))
	}
	return crc, nil
}

// scanBatch checks a batch file of rank named for steps a to b, read
// through r, and returns its records of the steps lo to hi (none if
// hi < lo: Verify). Every record is checked; those it does not return
// are not kept (read in pieces, when not read whole).
func scanBatch(r *batchReader, rank int, a, b, lo, hi int64) ([]Record, error) {
	path, size := r.path, r.size
	bigRecord, _ := r.limits()
	if size < batchHdr {
		return nil, corruptErr(path, size, batchHdr, "%d bytes, shorter than the header", size)
	}
	buf, err := r.bytes(0, batchHdr)
	if err != nil {
		return nil, err
	}
	if err := checkPreamble(buf, magicBatch, path); err != nil {
		return nil, err
	}
	if got, want := crc32c.Checksum(buf[:36]), le.Uint32(buf[36:]); got != want {
		return nil, corruptErr(path, 0, batchHdr, "header CRC32C %#08x, the header says %#08x", got, want)
	}
	if err := checkZero(buf, 32, 36, path); err != nil {
		return nil, err
	}
	switch {
	case int(le.Uint32(buf[8:])) != rank:
		return nil, corruptErr(path, 8, 12, "rank %d, want %d", le.Uint32(buf[8:]), rank)
	case int64(le.Uint64(buf[16:])) != a || int64(le.Uint64(buf[24:])) != b:
		return nil, corruptErr(path, 16, 32, "steps %d to %d, the name says %d to %d", int64(le.Uint64(buf[16:])), int64(le.Uint64(buf[24:])), a, b)
	case int64(le.Uint32(buf[12:])) != b-a+1:
		return nil, corruptErr(path, 12, 16, "%d records for steps %d to %d", le.Uint32(buf[12:]), a, b)
	}
	n := b - a + 1
	if n > (size-batchHdr)/recordHdr {
		return nil, corruptErr(path, size, batchHdr+n*recordHdr, "%d records cannot fit in %d bytes", n, size)
	}
	var recs []Record
	if lo, hi := max(lo, a), min(hi, b); lo <= hi {
		recs = make([]Record, 0, min(hi-lo+1, 1024))
	}
	off := int64(batchHdr)
	for i := range n {
		if size-off < recordHdr {
			return nil, corruptErr(path, size, off+recordHdr, "the file ends inside record %d's header", i)
		}
		rh, err := r.bytes(off, recordHdr)
		if err != nil {
			return nil, err
		}
		step := int64(le.Uint64(rh))
		dn := int64(le.Uint32(rh[8:]))
		if step != a+i {
			return nil, corruptErr(path, off, off+8, "record %d is of step %d, want %d", i, step, a+i)
		}
		if size-off-recordHdr < dn {
			return nil, corruptErr(path, size, off+recordHdr+dn, "the file ends inside record %d (step %d) of %d bytes", i, step, dn)
		}
		want := le.Uint32(rh[12:])
		bad := func(got uint32) error {
			return corruptErr(path, off, off+recordHdr+dn, "record %d (step %d): CRC32C %#08x, the record says %#08x", i, step, got, want)
		}
		keep := lo <= step && step <= hi
		var data []byte
		switch {
		case r.buf != nil:
			data = r.buf[off+recordHdr : off+recordHdr+dn : off+recordHdr+dn]
		case keep && (dn <= bigRecord || r.bufs.fits(dn)):
			// Read at once: into a buffer of a size any file may
			// make it allocate, or one it holds already, or of no
			// more than a record that verified.
			if data, err = r.record(off+recordHdr, dn); err != nil {
				return nil, err
			}
		default:
			// Checked in pieces: instead of being read, when not
			// kept; before anything of its size is allocated, when
			// kept (then read, and checked again).
			got, err := r.crc(crc32c.Checksum(rh[:12]), off+recordHdr, dn)
			if err != nil {
				return nil, err
			}
			if got != want {
				return nil, bad(got)
			}
			if keep {
				if data, err = r.record(off+recordHdr, dn); err != nil {
					return nil, err
				}
			}
		}
		if data != nil {
			if got := crc32c.Update(crc32c.Checksum(rh[:12]), data); got != want {
				return nil, bad(got)
			}
			if r.buf == nil && r.bufs != nil {
				r.bufs.verified = max(r.bufs.verified, dn)
			}
		}
		if keep {
			recs = append(recs, Record{Step: step, Data: data})
		}
		off += recordHdr + dn
	}
	if off != size {
		return nil, corruptErr(path, off, size, "%d bytes after the last record", size-off)
	}
	return recs, nil
}
