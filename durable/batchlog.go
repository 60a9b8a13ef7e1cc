package durable

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A rank's batch files as one log of differentials: listing them and their
// trim records, reading a range of steps (ScanBatches) and cutting the log
// at a step (TrimBatches).

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
