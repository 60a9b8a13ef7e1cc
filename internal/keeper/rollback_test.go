package keeper

import (
	"context"
	"testing"

	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// TestReloadAfterRollback is a roll-back to the durable tier at the
// level of the rank services: the ranks ran to step 13 (their slots hold
// 12 and 13) with a durable base at step 5 committed and, in diff mode,
// their differentials on disk; the job rolls back to T (the base, or the
// step the differentials reach): each host restarts at T (its slots keep
// nothing after T), and Reload rebuilds each rank's state at T from disk
// into the slots it has, which the ranks then restore from tier 1, bit
// for bit the state committed at T, and go on. A rank whose slots hold T
// keeps them (Reload does not read the disk). Without Reload the restore
// fails: the slots hold nothing at T.
func TestReloadAfterRollback(t *testing.T) {
	noParams := []protect.Region{diffRegions[0], diffRegions[2]}
	for _, tc := range []struct {
		name    string
		mode    protect.ProtectMode
		regions []protect.Region
		t       int64
	}{
		{"full", protect.ModeFull, diffRegions, 5},
		{"diff", protect.ModeDiff, noParams, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a, rs := runToDisk(t, dir, tc.mode, tc.regions)
			if tc.mode == protect.ModeDiff {
				waitLogged(t, a, 11) // batches of 4: 8-11 the last whole one
			}
			for _, dr := range rs {
				dr.close() // the ranks are killed by the restart
			}
			for _, h := range a.hosts {
				if err := h.Restart(1, tc.t); err != nil {
					t.Fatal(err)
				}
			}
			for r, h := range a.hosts {
				fill := func(views [][]byte) (int, error) {
					l, err := cascade.Load(context.Background(), dir, r, durableRegions(tc.regions), 5, tc.t, views, replay.ReplayOptions{})
					return l.AdamT, err
				}
				loaded, err := h.Reload(r, tc.regions, tc.t, fill)
				if err != nil || !loaded {
					t.Fatalf("rank %d: Reload: %v, %v", r, loaded, err)
				}
				// Its slots hold T now: a second Reload keeps them.
				if loaded, err := h.Reload(r, tc.regions, tc.t, func([][]byte) (int, error) {
					t.Error("a second Reload read the disk")
					return 0, nil
				}); err != nil || loaded {
					t.Errorf("rank %d: second Reload: %v, %v; want kept", r, loaded, err)
				}
			}
			var again []*diffRank
			for r, dr := range rs {
				nr, err := newDiffRankOf(t, a.hosts[r], r, 51, dr.states, tc.regions)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nr.close)
				res, err := nr.restore(context.Background()) // checks the bytes against the commit at T
				if err != nil || res.Step != tc.t || res.Tier != 1 {
					t.Fatalf("rank %d: restore %+v, %v; want step %d from tier 1", r, res, err, tc.t)
				}
				again = append(again, nr)
			}
			runSteps(t, a, again, tc.t+1, tc.t+4)
		})
	}
}
