package durable

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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

// batchFile is a batch file's name, parsed.
type batchFile struct {
	name string
	a, b int64
}

// trimPrefix names a rank's trim records, DIR/r<rank>/trim.<S>: a trim
// of the log to step S began and has not completed, and every batch
// that ends after S is of the history it cut (see TrimBatches).
const trimPrefix = "trim."

func trimName(step int64) string { return trimPrefix + strconv.FormatInt(step, 10) }

// parseTrim returns S of trim.<S> (S is -1 for a trim of every step).
func parseTrim(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, trimPrefix)
	if !ok {
		return 0, false
	}
	if s == "-1" {
		return -1, true
	}
	return parseDec(s, math.MaxInt64)
}

// listBatches returns rank's batch files, by first step then last, the
// least step of its trim records (math.MaxInt64 if none: the log is not
// cut) and the records' names.
func listBatches(rd string) (bs []batchFile, cut int64, trims []string, err error) {
	ents, err := os.ReadDir(rd)
	if err != nil {
		return nil, 0, nil, err
	}
	cut = math.MaxInt64
	for _, e := range ents {
		if a, b, ok := parseDiff(e.Name()); ok {
			bs = append(bs, batchFile{e.Name(), a, b})
		}
		if s, ok := parseTrim(e.Name()); ok {
			cut = min(cut, s)
			trims = append(trims, e.Name())
		}
	}
	slices.SortFunc(bs, func(x, y batchFile) int {
		if x.a != y.a {
			return cmpInt(x.a, y.a)
		}
		return cmpInt(x.b, y.b)
	})
	return bs, cut, trims, nil
}

// verifyBatch checks one batch file without keeping its records.
func verifyBatch(rd string, rank int, bf batchFile) error {
	_, err := openBatch(rd, rank, bf, 0, -1, nil)
	return err
}

// openBatch reads and checks one batch file, and returns its records of
// the steps lo to hi (none if hi < lo), read into bufs' buffers if bufs
// is not nil (see batchBufs). What it allocates is bounded (wholeBatch,
// streamRecord) whatever the file's size: a file larger than
// maxBatchFile is corrupt at once.
func openBatch(rd string, rank int, bf batchFile, lo, hi int64, bufs *batchBufs) ([]Record, error) {
	p := filepath.Join(rd, bf.name)
	f, err := openRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	size := fi.Size()
	if size > maxBatchFile {
		return nil, corruptErr(p, maxBatchFile, size, "%d bytes, at most %d expected", size, int64(maxBatchFile))
	}
	r := &batchReader{f: f, size: size, path: p, bufs: bufs}
	if size <= wholeBatch {
		var buf []byte
		switch {
		case bufs == nil:
			buf = make([]byte, size)
		case int64(cap(bufs.whole)) >= size:
			buf = bufs.whole[:size]
		default:
			bufs.whole = make([]byte, size)
			buf = bufs.whole
		}
		if err := r.readAt(buf, 0); err != nil {
			return nil, err
		}
		r.buf = buf
	}
	return scanBatch(r, rank, bf.a, bf.b, lo, hi)
}

// ScanBatches reads rank's records of the steps after from up to upTo
// (upTo ≥ from; math.MaxInt64 for all), contiguous (from+1, from+2, ...
// as far as the batches that verify reach), and hands them to fn one
// batch file at a time, in step order: each call gets the records of one
// batch (those of its steps from the next wanted to upTo), every record
// of the batch checked before the call. recs and their Data are fn's
// only until it returns: the next batch is read into the same buffers,
// so that a scan holds one batch's records at a time (a batch of
// records of a size the batch before did not have is read into new
// buffers, and the old ones dropped after it). A batch file that holds
// no step from from+1 to upTo is never opened.
//
// If fn returns an error, the scan ends and ScanBatches returns it as
// it is. Else it returns nil when the log reaches upTo or simply ends
// before; or why it stopped before upTo, wrapping ErrGap (the next batch
// begins later, or a trim record cut the log: see TrimBatches) or
// ErrCorrupt (the next batch does not verify), the records handed over
// before being valid. A trim record trim.<S> ends the log at S: no
// record after S is handed over, whatever the batches hold. Where
// batches overlap, the one that reaches furthest towards upTo, and of
// those the one that ends first, is read first; if it does not verify,
// the next.
//
// (A function called per batch rather than an iterator: the records are
// valid only for the call, which a callback says by its shape, and the
// scan's own outcome, nil or why it stopped, is one result apart from
// the records, as fn's error is.)
func ScanBatches(dir string, rank int, from, upTo int64, fn func(recs []Record) error) error {
	if !validRank(rank) || from < -1 || upTo < from {
		return fmt.Errorf("durable: bad rank %d or steps %d to %d", rank, from, upTo)
	}
	if upTo == from {
		return nil
	}
	rd := rankDir(dir, rank)
	bs, cut, _, err := listBatches(rd)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	// The end of the scan, nil or why it stops at upTo, which a trim
	// record may have lowered.
	atEnd := func() error { return nil }
	if cut < upTo {
		upTo = max(cut, from)
		if slices.ContainsFunc(bs, func(bf batchFile) bool { return bf.b > upTo }) {
			atEnd = func() error {
				return fmt.Errorf("%w: rank %d: the log ends at step %d, where a trim that did not complete cut it (%s): the batches after it are of the history it cut",
					ErrGap, rank, upTo, filepath.Join(rd, trimName(cut)))
			}
		}
		if upTo == from {
			return atEnd()
		}
	}
	var bufs batchBufs
	for next := from + 1; ; {
		// The batches holding next.
		var cover []batchFile
		later := false
		for _, bf := range bs {
			if bf.a <= next && next <= bf.b {
				cover = append(cover, bf)
			}
			later = later || bf.a > next
		}
		if len(cover) == 0 {
			if later {
				i := slices.IndexFunc(bs, func(bf batchFile) bool { return bf.a > next })
				return fmt.Errorf("%w: rank %d: no batch holds step %d, the next begins at step %d (%s)",
					ErrGap, rank, next, bs[i].a, filepath.Join(rd, bs[i].name))
			}
			return nil
		}
		slices.SortFunc(cover, func(x, y batchFile) int {
			if c := cmpInt(min(y.b, upTo), min(x.b, upTo)); c != 0 {
				return c
			}
			return cmpInt(x.b, y.b)
		})
		var errs []error
		var got []Record
		for _, bf := range cover {
			recs, err := openBatch(rd, rank, bf, next, upTo, &bufs)
			if err == nil {
				got = recs
				break
			}
			bufs.release()
			errs = append(errs, err)
		}
		if got == nil {
			return fmt.Errorf("rank %d: step %d: %w", rank, next, errors.Join(errs...))
		}
		last := got[len(got)-1].Step
		if err := fn(got); err != nil {
			return err
		}
		bufs.recycle()
		if last >= upTo {
			return atEnd()
		}
		next = last + 1
	}
}

// TrimBatches removes rank's records of the steps after step from the
// durable directory dir: batches that end after it are removed, and one
// that straddles it (steps a to b, a ≤ step < b) is first written again
// as the batch of its steps a to step, read from the log (ScanBatches:
// from that batch, or from others holding those steps if it does not
// verify; if they do not read back whole, it is removed without its
// prefix: the log then ends before step, a gap, not a wrong state).
//
// A crash in the middle must not leave a batch of the history cut beside
// those written after (a scan reading the old batch 5-8 beside the
// rewritten 5-6 would hand over the old steps 7 and 8, then the new
// history's 9 on), so a trim that removes anything is:
//
//  1. the trim record trim.<step> written (atomic replacement): from then
//     on every scan ends the log at step (ScanBatches), and what follows
//     is the old history's until the record goes;
//  2. the straddling batches' prefixes written;
//  3. the batches after step removed, and the directory fsynced;
//  4. the trim records removed, and the directory fsynced.
//
// A trim that finds a trim record trim.<S> of a trim that did not
// complete trims to min(step, S): until that record goes, every batch
// ending after S may be of the history it cut (those written since
// included: a writer that goes on after a failed trim writes batches
// readers do not read). If the record cannot be written, the batches
// after step are removed without their prefixes. The writer of the
// history that resumes at step must not append before TrimBatches
// returns (difflog.Writer's Reset waits for it); if TrimBatches fails
// and it does append, what it writes after a trim record is not read.
//
// A directory or rank directory that does not exist holds nothing to
// trim.
func TrimBatches(dir string, rank int, step int64) error {
	if !validRank(rank) || step < -1 {
		return fmt.Errorf("durable: bad rank %d or step %d", rank, step)
	}
	return trimBatches(dir, rank, step)
}

// trimFault, if not nil, is consulted at each step of trimBatches
// (tests): an error at "mark" is the trim record's write failing, and
// the trim goes on as it does then; at "rewrite", "remove" and "unmark"
// a crash: the trim stops there, leaving the directory as it is.
var trimFault func(op string) error

func fault(op string) error {
	if trimFault != nil {
		return trimFault(op)
	}
	return nil
}

func trimBatches(dir string, rank int, step int64) error {
	rd := rankDir(dir, rank)
	bs, cut, trims, err := listBatches(rd)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	step = min(step, cut)
	var drop []string
	var cross []batchFile
	for _, bf := range bs {
		if bf.b > step {
			drop = append(drop, bf.name)
			if bf.a <= step {
				cross = append(cross, bf)
			}
		}
	}
	if len(drop) == 0 && len(trims) == 0 {
		return nil
	}
	mark := trimName(step)
	if len(drop) > 0 && !slices.Contains(trims, mark) {
		err := fault("mark")
		if err == nil {
			err = writeAtomic(rd, mark, nil, nil)
		}
		if err != nil {
			// No record: the batches after step go without the
			// prefixes, which a crash could leave beside them.
			return errors.Join(fmt.Errorf("durable: rank %d: trimming the log to step %d: %w", rank, step, err), removeSynced(rd, drop...))
		}
		trims = append(trims, mark)
	}
	var errs []error
	for _, bf := range cross {
		if err := fault("rewrite"); err != nil {
			return err
		}
		if err := rewritePrefix(dir, rank, bf.a, step); err != nil {
			errs = append(errs, err)
		}
	}
	if err := fault("remove"); err != nil {
		return err
	}
	if err := removeSynced(rd, drop...); err != nil {
		// The trim record stays: scans end at step until a trim
		// completes.
		return errors.Join(append(errs, err)...)
	}
	if err := fault("unmark"); err != nil {
		return err
	}
	return errors.Join(append(errs, removeSynced(rd, trims...))...)
}

// rewritePrefix writes rank's records of steps a to step, read from the
// log (ScanBatches, which reads no batch past step), as one batch, if
// they read back whole; else it writes nothing.
func rewritePrefix(dir string, rank int, a, step int64) error {
	data := make([][]byte, 0, min(step-a+1, 1024))
	var werr error
	_ = ScanBatches(dir, rank, a-1, step, func(recs []Record) error {
		n := len(data)
		for _, r := range recs {
			data = append(data, r.Data)
		}
		if recs[len(recs)-1].Step == step {
			werr = AppendBatch(dir, rank, a, step, data)
			return nil
		}
		// The scan reads the next batch into these records' buffers.
		for i := n; i < len(data); i++ {
			data[i] = bytes.Clone(data[i])
		}
		return nil
	})
	return werr
}
