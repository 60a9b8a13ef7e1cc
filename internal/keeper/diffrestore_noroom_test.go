package keeper

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gorun/gorun/replay"
)

// TestDiffRestoreHolderNoRoom: in diff mode without erasure coding and a
// lossy codec, a holder answers every restore's get with a copy it
// restores whole, reserved against its replica-memory reserve
// (getDiffWhole). A restore whose holder refuses for want of room asks
// it again once there is room (restoreRemote retries a holder loop that
// every holder refused so, retryNoRoom) and restores the holder's copy
// bit for bit; with the reserve kept full it fails with an error naming
// the reserve (errNoRoom). (A review found the refusal tried once: the
// restore failed where the code before the reservation restored.)
func TestDiffRestoreHolderNoRoom(t *testing.T) {
	lossy := replay.Options{Threshold: math.MaxInt} // int8
	peers := func(int) []int { return []int{0, 1} }
	c := newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, func(cfg *Config) {
		// No fold within the test: a fold through G makes G exact, and
		// an exact step is streamed (getDiff's pieces), not restored
		// whole (6 runs in 40 under the race detector got it so).
		diffMod(100, 100)(cfg)
		cfg.Diff.Codec = lossy
	})
	rs := startDiffRanks(t, c, 2, 7)
	runSteps(t, c, rs, 0, 6)
	g := c.publishG()
	const r = 0
	s, holder := c.hosts[0].svc(r), c.hosts[1]
	// What the holder restores of step g: the copy a restore must get.
	_, want, err := holder.store.restoreDiff(r, g, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A limit of 1 byte refuses any reservation, whatever the holder's
	// own count does meanwhile.
	full := func() { setLimit(t, holder, 1) }
	restore := func() error {
		t.Helper()
		s.reqMu.Lock()
		defer s.reqMu.Unlock()
		_, err := s.restoreRemote(context.Background(), g)
		return err
	}
	retries := 0
	testHookNoRoomRetry = func(error) { retries++ }
	t.Cleanup(func() { testHookNoRoomRetry = nil })

	// Kept full: the restore ends with the reserve named. First: once a
	// restore succeeded, the rank's replicator sends the holder a base at
	// G, which makes G exact there, and an exact step is streamed
	// (getDiff's pieces), not restored whole (3 runs in 60 under the race
	// detector got the base first when this came second).
	full()
	old := restoreNoRoomWait
	restoreNoRoomWait = 0 // one try, no wait
	err = restore()
	restoreNoRoomWait = old
	if !errors.Is(err, errNoRoom) || !strings.Contains(err.Error(), "replica-memory reserve") {
		t.Fatalf("the holder kept without room: %v; want errNoRoom naming the reserve", err)
	}

	// Full for the first try, room again from the retry on.
	retries = 0
	testHookNoRoomRetry = func(error) {
		retries++
		setLimit(t, holder, 0)
	}
	if err := restore(); err != nil {
		t.Fatalf("the holder without room, then with room: %v", err)
	}
	if retries != 1 {
		t.Fatalf("%d retries, want 1: the holder's refusal was not retried", retries)
	}
	for name, b := range want {
		got := make([]byte, len(b))
		if err := s.copySlot(g, name, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("region %s restored is not the holder's copy", name)
		}
	}
}
