package keeper

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/protect"
)

// TestRestoreFromDiskWhenHoldersLost: rank 0's host and its only
// holder's host are both lost; the memory tiers have nothing of rank 0,
// and its new host rebuilds its state at G from the durable tier (the
// committed base and its differentials on disk), bit for bit, and the
// job goes on. When the disk does not reach G the restore fails, saying
// why, as without a durable tier. What the log holds after G does not
// matter: a corrupt batch after G (left by a trim that failed) is never
// opened.
func TestRestoreFromDiskWhenHoldersLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		batch  int
		drop   bool // the log loses its batches past the base
		after  bool // a corrupt batch after G, which no trim removes
		reason string
	}{
		{name: "the disk reaches G", batch: 1},
		{name: "a corrupt batch after G", batch: 1, after: true},
		{name: "the disk does not reach G", batch: 1, drop: true, reason: "can be rebuilt up to step 5, not 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			holders := [][]int{{1}, {2}, {0}}
			peers := func(int) []int { return []int{0, 1, 2} }
			regions := []protect.Region{diffRegions[0], diffRegions[2]} // no params: the disk can replay
			mod := diffLogMod(dir, tc.batch)
			if tc.after {
				mod = func(c *Config) {
					diffLogMod(dir, tc.batch)(c)
					c.DiffLog.Trim = func(int, int64) error { return errors.New("no trim (test)") }
				}
			}
			c := newClusterWith(t, [][]int{{0}, {1}, {2}}, holders, peers, mod)
			rs := startDiffRanksOf(t, c, 3, 61, regions)
			runSteps(t, c, rs, 0, 12)
			waitLogged(t, c, 12)
			saveAll(t, dir, rs[0], 5)
			if err := durable.Commit(dir, 5); err != nil {
				t.Fatal(err)
			}
			if tc.drop {
				for s := int64(6); s <= 12; s++ {
					if err := removeBatch(dir, 0, s); err != nil {
						t.Fatal(err)
					}
				}
			}
			const g = 12
			var opened func() []string
			if tc.after {
				if err := os.WriteFile(filepath.Join(dir, "r0", "diff.13-13"), []byte("not a batch"), 0o600); err != nil {
					t.Fatal(err)
				}
				opened = difflogtest.WatchOpens(t, filepath.Join(dir, "r0"))
			}
			c.hosts[0].Close()
			c.hosts[1].Close()
			if err := c.hosts[2].Restart(1, g); err != nil {
				t.Fatal(err)
			}
			for _, h := range []int{0, 1} {
				c.startHost(h, []int{h}, peers, t.TempDir())
			}
			addrs := make([]string, 3)
			for i, h := range c.hosts {
				addrs[i] = h.cfg.Listener.Addr().String()
			}
			for i, h := range c.hosts {
				h.SetAddrs(addrs)
				if i < 2 {
					if err := h.Restart(1, g); err != nil {
						t.Fatal(err)
					}
				}
			}
			var again []*diffRank
			for r, dr := range rs {
				nr, err := newDiffRankOf(t, c.hosts[r], r, 61, dr.states, regions)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nr.close)
				res, err := nr.restore(context.Background()) // checks the bytes against the commit
				if r == 0 && tc.reason != "" {
					if err == nil || !strings.Contains(err.Error(), "the durable tier") || !strings.Contains(err.Error(), tc.reason) {
						t.Fatalf("rank 0: restore %+v, %v; want a failure saying %q", res, err, tc.reason)
					}
					return
				}
				if err != nil || res.Step != g {
					t.Fatalf("rank %d: restore %+v, %v", r, res, err)
				}
				if r == 0 && opened != nil {
					for _, name := range difflogtest.BatchesOpened(opened()) {
						if name == "diff.13-13" {
							t.Errorf("rank 0's restore at %d opened %s", g, name)
						}
					}
				}
				again = append(again, nr)
			}
			runSteps(t, c, again, g+1, g+4)
		})
	}
}

// removeBatch removes rank's batch holding step (a batch of one step).
func removeBatch(dir string, rank int, step int64) error {
	l, err := durable.List(dir)
	if err != nil {
		return err
	}
	for _, rl := range l.Ranks {
		for _, b := range rl.Batches {
			if rl.Rank == rank && b.First <= step && step <= b.Last {
				return os.Remove(b.Path)
			}
		}
	}
	return nil
}
