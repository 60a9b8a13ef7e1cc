package difflog

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gorun/gorun/durable"
)

// TrimBatches removes rank's differential records of the steps after
// after from the durable directory dir (package durable's layout: the
// batches DIR/r<rank>/diff.<a>-<b>): a batch that begins after after is
// removed; one that straddles it is written again as the batch of its
// steps up to after (durable.AppendBatch), then removed. A restart that
// goes back to after calls it (through the Writer's Trim) so that the
// records of the history it discarded are never replayed after those of
// the new one. A straddling batch that does not read back whole is
// removed without its prefix (the log then ends before after: a gap, not
// a wrong state).
func TrimBatches(dir string, rank int, after int64) error {
	rd := filepath.Join(dir, "r"+strconv.Itoa(rank))
	ents, err := os.ReadDir(rd)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("difflog: %w", err)
	}
	var errs []error
	for _, e := range ents {
		a, b, ok := batchName(e.Name())
		if !ok || b <= after {
			continue
		}
		if a <= after {
			if err := rewritePrefix(dir, rank, a, after); err != nil {
				errs = append(errs, err)
			}
		}
		if err := os.Remove(filepath.Join(rd, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("difflog: %w", err))
		}
	}
	return errors.Join(errs...)
}

// rewritePrefix writes rank's records of steps a to after, read from the
// log (durable.ScanBatches, which reads no batch past after), as one
// batch, if they read back whole; else it writes nothing.
func rewritePrefix(dir string, rank int, a, after int64) error {
	data := make([][]byte, 0, after-a+1)
	var werr error
	_ = durable.ScanBatches(dir, rank, a-1, after, func(recs []durable.Record) error {
		n := len(data)
		for _, r := range recs {
			data = append(data, r.Data)
		}
		if recs[len(recs)-1].Step == after {
			werr = durable.AppendBatch(dir, rank, a, after, data)
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

// batchName parses "diff.<a>-<b>" (decimal, no leading zeros, a ≤ b).
func batchName(name string) (a, b int64, ok bool) {
	rest, ok := strings.CutPrefix(name, "diff.")
	if !ok {
		return 0, 0, false
	}
	sa, sb, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, 0, false
	}
	a, ok1 := decimal(sa)
	b, ok2 := decimal(sb)
	return a, b, ok1 && ok2 && a <= b
}

func decimal(s string) (int64, bool) {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}
