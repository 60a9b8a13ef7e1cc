package difflog_test

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/difflog"
)

// TestTrimBatches: the records after the step go, a batch straddling it
// keeps its prefix, the rest of the directory stays.
func TestTrimBatches(t *testing.T) {
	for _, tc := range []struct {
		after int64
		files []string
		steps int // what the log then holds after step 0
	}{
		{after: 6, files: []string{"diff.1-4", "diff.5-6"}, steps: 6},
		{after: 8, files: []string{"diff.1-4", "diff.5-8"}, steps: 8},
		{after: 12, files: []string{"diff.1-4", "diff.5-8", "diff.9-12"}, steps: 12},
		{after: 0, files: nil, steps: 0},
		{after: 1, files: []string{"diff.1-1"}, steps: 1},
	} {
		dir := t.TempDir()
		for a := int64(1); a <= 12; a += 4 {
			var recs [][]byte
			for s := a; s < a+4; s++ {
				recs = append(recs, []byte{byte(s)})
			}
			if err := durable.AppendBatch(dir, 2, a, a+3, recs); err != nil {
				t.Fatal(err)
			}
		}
		keep := filepath.Join(dir, "r2", "not-a-batch")
		if err := os.WriteFile(keep, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := difflog.TrimBatches(dir, 2, tc.after); err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(filepath.Join(dir, "r2"))
		var got []string
		for _, e := range ents {
			if e.Name() != "not-a-batch" {
				got = append(got, e.Name())
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.files) {
			t.Errorf("after %d: files %q, want %q", tc.after, got, tc.files)
		}
		recs, stop := readLog(dir, 2, 0)
		if stop != nil || len(recs) != tc.steps {
			t.Errorf("after %d: %d records (%v), want %d", tc.after, len(recs), stop, tc.steps)
		}
		for i, r := range recs {
			if r.Step != int64(i+1) || r.Data[0] != byte(i+1) {
				t.Errorf("after %d: record %d is step %d %v", tc.after, i, r.Step, r.Data)
			}
		}
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("a file not the log's went: %v", err)
		}
	}
	if err := difflog.TrimBatches(filepath.Join(t.TempDir(), "none"), 0, 3); err != nil {
		t.Errorf("no directory: %v", err)
	}
}

// readLog returns rank's records after from to the end of the log (the
// data copied) and why they stop.
func readLog(dir string, rank int, from int64) ([]durable.Record, error) {
	var out []durable.Record
	stop := durable.ScanBatches(dir, rank, from, math.MaxInt64, func(recs []durable.Record) error {
		for _, r := range recs {
			out = append(out, durable.Record{Step: r.Step, Data: bytes.Clone(r.Data)})
		}
		return nil
	})
	return out, stop
}

// TestTrimBatchesReadsThePrefixOnly: rewriting a straddling batch reads
// its steps up to after, not the log after it: what it allocates is
// about that batch, however long the log.
func TestTrimBatchesReadsThePrefixOnly(t *testing.T) {
	dir := t.TempDir()
	const batches, per, size = 16, 4, 256 << 10 // 1 MiB batches
	data := bytes.Repeat([]byte{9}, size)
	for k := range batches {
		a := int64(1 + k*per)
		if err := durable.AppendBatch(dir, 2, a, a+per-1, [][]byte{data, data, data, data}); err != nil {
			t.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := difflog.TrimBatches(dir, 2, 3); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 3*per*size {
		t.Errorf("trimming a log of %d batches of %d KiB allocated %d KiB", batches, per*size>>10, got>>10)
	}
	recs, stop := readLog(dir, 2, 0)
	if stop != nil || len(recs) != 3 || !bytes.Equal(recs[2].Data, data) {
		t.Errorf("after the trim: %d records, %v; want steps 1 to 3", len(recs), stop)
	}
}

// TestTrimBatchesPrefixFromOtherBatches: the batch straddling the step
// does not verify, and its prefix is read from the batches that hold
// those steps (one scan call per batch, the records of each copied
// before the next is read into the same buffers) and written as one.
func TestTrimBatchesPrefixFromOtherBatches(t *testing.T) {
	dir := t.TempDir()
	rec := func(s int64) []byte { return bytes.Repeat([]byte{byte(s)}, 100) } // one size: one buffer reused
	for _, b := range [][2]int64{{1, 4}, {5, 6}, {7, 8}, {5, 10}} {
		var recs [][]byte
		for s := b[0]; s <= b[1]; s++ {
			recs = append(recs, rec(s))
		}
		if err := durable.AppendBatch(dir, 2, b[0], b[1], recs); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "r2", "diff.5-10")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := difflog.TrimBatches(dir, 2, 8); err != nil {
		t.Fatal(err)
	}
	// The prefix written, read alone.
	for _, name := range []string{"diff.5-6", "diff.7-8"} {
		if err := os.Remove(filepath.Join(dir, "r2", name)); err != nil {
			t.Fatalf("the trim removed %s: %v", name, err)
		}
	}
	recs, stop := readLog(dir, 2, 0)
	if stop != nil || len(recs) != 8 {
		t.Fatalf("after the trim, the log without 5-6 and 7-8: %d records, %v; want steps 1 to 8", len(recs), stop)
	}
	for _, r := range recs {
		if !bytes.Equal(r.Data, rec(r.Step)) {
			t.Errorf("step %d: record %v..., want %v...", r.Step, r.Data[:4], rec(r.Step)[:4])
		}
	}
}
