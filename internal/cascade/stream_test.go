package cascade_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/replay"
)

// TestLoadReadsUpToTarget: Load to a step inside the log (at and between
// batch boundaries) gives the owner's state at it, as before, and opens
// no batch file after it: one of garbage right after the target's batch
// does not make it fail, nor ReachTo the target, while Reach, which
// reads the whole log, stops there and says so.
func TestLoadReadsUpToTarget(t *testing.T) {
	const base, reach, batch = 4, 28, 4 // batches 5-8, 9-12, ..., 25-28
	o := difflogtest.NewOwner(21, 2000, 3, replay.Options{Lossless: true}, false)
	o.Advance(reach)
	rs := regionsOf(o)
	for _, target := range []int64{4, 5, 6, 8, 9, 11, 12, 13, 20, 24} {
		t.Run(fmt.Sprint(target), func(t *testing.T) {
			dir := t.TempDir()
			saveBase(t, dir, o, base)
			appendLog(t, dir, o, base+1, reach, batch)
			// The first batch after the target's, garbage.
			after := base + 1 + (target-base+batch-1)/batch*batch
			if target == base {
				after = base + 1
			}
			garbage := fmt.Sprintf("diff.%d-%d", after, after+batch-1)
			if err := os.WriteFile(filepath.Join(dir, "r3", garbage), []byte("not a batch"), 0o600); err != nil {
				t.Fatal(err)
			}
			opened := difflogtest.WatchOpens(t, filepath.Join(dir, "r3"))
			dst := buffers(rs)
			got, err := cascade.Load(context.Background(), dir, testRank, rs, base, target, dst, replay.ReplayOptions{})
			if err != nil {
				t.Fatalf("Load to %d: %v", target, err)
			}
			wantT := 0
			if target > base {
				wantT = o.Record(target).Diff.Hyper.T
			}
			if got.Replayed != int(target-base) || !got.Exact || got.AdamT != wantT {
				t.Errorf("Load: %+v, want %d replayed, exact, Adam step %d", got, target-base, wantT)
			}
			checkState(t, o, target, dst)
			for _, name := range difflogtest.BatchesOpened(opened()) {
				var a, b int64
				if _, err := fmt.Sscanf(name, "diff.%d-%d", &a, &b); err != nil || a > target {
					t.Errorf("Load to %d opened %s", target, name)
				}
			}

			// Bounded to the target, Reach opens nothing after it either.
			if sp, stop := cascade.ReachTo(dir, testRank, rs, base, target); sp != (cascade.Span{From: base, To: target}) || stop != nil {
				t.Errorf("ReachTo %d: %+v, %v; want to %d, no stop", target, sp, stop, target)
			}
			for _, name := range difflogtest.BatchesOpened(opened()) {
				var a, b int64
				if _, err := fmt.Sscanf(name, "diff.%d-%d", &a, &b); err != nil || a > target {
					t.Errorf("ReachTo %d opened %s", target, name)
				}
			}

			sp, stop := cascade.Reach(dir, testRank, rs, base)
			if want := (cascade.Span{From: base, To: after - 1}); sp != want || !errors.Is(stop, durable.ErrCorrupt) || !strings.Contains(stop.Error(), garbage) {
				t.Errorf("Reach: %+v, %v; want %+v and %s corrupt", sp, stop, want, garbage)
			}
			if _, err := cascade.Load(context.Background(), dir, testRank, rs, base, after, buffers(rs), replay.ReplayOptions{}); !errors.Is(err, cascade.ErrDisk) || !errors.Is(err, durable.ErrCorrupt) {
				t.Errorf("Load to %d, inside the garbage: %v, want ErrDisk and durable.ErrCorrupt", after, err)
			}
		})
	}
}
