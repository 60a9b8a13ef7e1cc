package difflog_test

import (
	"os"
	"path/filepath"
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
		steps int // what ReadBatches then reads from step 0
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
		recs, stop := durable.ReadBatches(dir, 2, 0)
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
