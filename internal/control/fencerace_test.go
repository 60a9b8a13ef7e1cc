package control

import (
	"strings"
	"sync"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// TestFenceOfAnOldEpochWhileTheEpochMoves: a host's part of a fence of an
// epoch the collector has left (a rank's end fails its fence after the
// launcher restarted the job) is refused while the launcher moves the
// collector on, in another goroutine: the refusal names the epoch it
// read under the lock (under -race, reading it after the unlock was a
// data race CI found).
func TestFenceOfAnOldEpochWhileTheEpochMoves(t *testing.T) {
	f := NewFenceCollector(nil, "fencerace", 1, 2)
	stale := wire.Marshal(&wire.UpFence{Host: 0, Epoch: 0, Seq: 0, Err: "rank 0 ended without entering this fence"})
	const moves = 200
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for e := uint64(2); e < 2+moves; e++ {
			if err := f.SetPlacement(e, [][]int{{0}, {1}}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range moves {
		err := f.Handle(0, stale)
		if err == nil || !strings.Contains(err.Error(), "fence of epoch 0, the current one is") {
			t.Fatalf("a fence of epoch 0: %v, want it refused as of an old epoch", err)
		}
	}
	wg.Wait()
}
