package cascade_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/replay"
)

// TestReachAndLoadHoldOneBatch: Reach over a log of many batches, and
// Load to its end, allocate about one batch's records, not the log's.
func TestReachAndLoadHoldOneBatch(t *testing.T) {
	const base, reach, batch = 2, 42, 4 // 10 batches
	const n = 64 << 10                  // a record of about 256 KiB
	o := difflogtest.NewOwner(22, n, 1, replay.Options{Lossless: true}, false)
	o.Advance(reach)
	rs := regionsOf(o)
	dir := t.TempDir()
	saveBase(t, dir, o, base)
	appendLog(t, dir, o, base+1, reach, batch)
	var one uint64 // the bytes of one batch
	for s := int64(base + 1); s <= base+batch; s++ {
		one += uint64(len(o.Encoded(s)))
	}
	allocs := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	dst := buffers(rs)
	load := func(target int64) {
		if _, err := cascade.Load(context.Background(), dir, testRank, rs, base, target, dst, replay.ReplayOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	baseOnly := allocs(func() { load(base) })
	if got := allocs(func() { load(reach) }); got > baseOnly+2*one {
		t.Errorf("Load of %d differentials in %d batches of %d KiB allocated %d KiB besides the base's %d KiB",
			reach-base, (reach-base)/batch, one>>10, (got-baseOnly)>>10, baseOnly>>10)
	}
	checkState(t, o, reach, dst)
	if got := allocs(func() {
		if sp, stop := cascade.Reach(dir, testRank, rs, base); stop != nil || sp.To != reach {
			t.Fatalf("Reach: %+v, %v", sp, stop)
		}
	}); got > 2*one {
		t.Errorf("Reach over %d batches of %d KiB allocated %d KiB", (reach-base)/batch, one>>10, got>>10)
	}
}
