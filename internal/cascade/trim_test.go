package cascade_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/replay"
)

// TestTrimCutShort: the layout a trim to step 6 cut short by a crash
// between the rewrite and the removal leaves (history H's batches 1-4,
// 5-8 and the rewritten 5-6, and the trim record trim.6), with history
// N's 7-10 written beside it (a writer that went on). Reach stops at 6,
// saying a trim cut the log; Load to 6 gives H's state, to 10 an error;
// never H's 7 and 8 replayed with N's 9 and 10, which lossless fails
// Load's last check and lossy gives a wrong state silently (review of
// 31c5b02). Once the next run's trim completes and N writes 7-10 again,
// Load to 10 gives N's state, bit for bit what a log of N alone gives.
func TestTrimCutShort(t *testing.T) {
	for _, tc := range []struct {
		name  string
		codec replay.Options
	}{
		{"lossless", replay.Options{Lossless: true}},
		{"lossy", replay.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := difflogtest.NewOwner(31, 2000, 1, tc.codec, false)
			h.Advance(6)
			n := h.Branch(32)
			h.Advance(4)
			n.Advance(4)
			rs := regionsOf(h)
			load := func(dir string, target int64) ([][]byte, cascade.Loaded, error) {
				dst := buffers(rs)
				got, err := cascade.Load(context.Background(), dir, testRank, rs, 0, target, dst, replay.ReplayOptions{})
				return dst, got, err
			}
			// N's state at 10 from a log of N alone.
			clean := t.TempDir()
			saveBase(t, clean, n, 0)
			appendLog(t, clean, n, 1, 10, 4)
			wantN, _, err := load(clean, 10)
			if err != nil {
				t.Fatal(err)
			}

			dir := t.TempDir()
			saveBase(t, dir, h, 0)
			appendLog(t, dir, h, 1, 8, 4) // 1-4, 5-8
			appendLog(t, dir, h, 5, 6, 2) // the rewritten prefix
			if err := os.WriteFile(filepath.Join(dir, "r3", "trim.6"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			appendLog(t, dir, n, 7, 10, 4)

			sp, stop := cascade.Reach(dir, testRank, rs, 0)
			if want := (cascade.Span{From: 0, To: 6}); sp != want || !errors.Is(stop, durable.ErrGap) || !strings.Contains(stop.Error(), "trim.6") {
				t.Errorf("Reach: %+v, %v; want %+v and a stop naming trim.6", sp, stop, want)
			}
			got6, _, err := load(dir, 6)
			if err != nil {
				t.Errorf("Load to 6: %v", err)
			} else if tc.codec.Lossless {
				checkState(t, h, 6, got6)
			}
			if _, _, err := load(dir, 10); !errors.Is(err, cascade.ErrDisk) || !strings.Contains(err.Error(), "trim") {
				t.Errorf("Load to 10: %v; want ErrDisk saying a trim cut the log", err)
			}

			// The next run resumes at 6: its trim completes, N writes
			// its steps again.
			if err := difflog.TrimBatches(dir, testRank, 6); err != nil {
				t.Fatal(err)
			}
			appendLog(t, dir, n, 7, 10, 4)
			if sp, stop := cascade.Reach(dir, testRank, rs, 0); sp.To != 10 || stop != nil {
				t.Errorf("Reach after the trim: %+v, %v; want to 10", sp, stop)
			}
			got, loaded, err := load(dir, 10)
			if err != nil {
				t.Fatalf("Load to 10 after the trim: %v", err)
			}
			for i := range got {
				if !bytes.Equal(got[i], wantN[i]) {
					t.Errorf("region %d at 10 is not N's", i)
				}
			}
			if tc.codec.Lossless {
				checkState(t, n, 10, got)
			}
			if loaded.AdamT != n.Record(10).Diff.Hyper.T {
				t.Errorf("Adam step %d, want N's %d", loaded.AdamT, n.Record(10).Diff.Hyper.T)
			}
		})
	}
}
