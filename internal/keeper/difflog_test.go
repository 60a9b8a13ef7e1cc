package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/replay"
)

// diffLogMod is diffMod with the differential log on disk in dir, in
// batches of batch steps. The queue holds every step of the tests: their
// steps take microseconds, much less than a batch's fsyncs, and a step
// dropped would end the log there.
func diffLogMod(dir string, batch int) func(*Config) {
	return func(c *Config) {
		diffMod(8, 100)(c)
		c.DiffLog = &DiffLogConfig{Dir: dir, Batch: batch, Queue: 64}
	}
}

// replRegions are diffRegions' replicated regions (the differentials
// carry them; params is restored from a data-parallel peer).
var replRegions = []durable.Region{{Name: "optimizer", Size: diffRegions[0].Size}, {Name: "meta", Size: diffRegions[2].Size}}

// saveReplicated writes rank dr's replicated regions committed at step
// as its durable version of step (what the agents' durable bases hold).
func saveReplicated(t *testing.T, dir string, dr *diffRank, step int64) {
	t.Helper()
	s, err := durable.Open(dir, dr.r, replRegions, durable.Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := dr.want(step)
	src := [][]byte{want["optimizer"], want["meta"]}
	if err := s.Save(context.Background(), step, src, []uint32{crc32c.Checksum(src[0]), crc32c.Checksum(src[1])}, nil); err != nil {
		t.Fatal(err)
	}
}

// waitLogged waits until every rank's differentials on disk reach step.
func waitLogged(t *testing.T, c *cluster, step int64) {
	t.Helper()
	defer func() {
		if t.Failed() {
			for i, h := range c.hosts {
				t.Logf("host %d: %+v", i, h.DiffLogStats())
			}
		}
	}()
	c.waitFor(fmt.Sprintf("the differentials on disk reach step %d", step), func() bool {
		for _, h := range c.hosts {
			for _, st := range h.DiffLogStats() {
				if st.Newest < step {
					return false
				}
			}
		}
		return true
	})
}

// checkFromDisk rebuilds rank dr's replicated regions at target from
// the durable tier (base at base, its differentials replayed) and checks
// them against what the rank committed at target, bit for bit.
func checkFromDisk(t *testing.T, dir string, dr *diffRank, base, target int64) {
	t.Helper()
	dst := [][]byte{make([]byte, replRegions[0].Size), make([]byte, replRegions[1].Size)}
	got, err := cascade.Load(context.Background(), dir, dr.r, replRegions, base, target, dst, replay.ReplayOptions{})
	if err != nil {
		t.Fatalf("rank %d: %v", dr.r, err)
	}
	if !got.Exact || got.Replayed != int(target-base) {
		t.Errorf("rank %d: %+v, want %d replayed, exact", dr.r, got, target-base)
	}
	want := dr.want(target)
	if !bytes.Equal(dst[0], want["optimizer"]) || !bytes.Equal(dst[1], want["meta"]) {
		t.Errorf("rank %d: the state rebuilt at step %d differs from the one committed", dr.r, target)
	}
}

// TestDiffLogOnDisk: every step the ranks commit in diff mode reaches
// the disk, in batches, and a rank's state at any step after a durable
// base is rebuilt from the base and the log bit for bit (the commit's
// CRC32Cs checked). A rank with a region the differentials do not carry
// (params) is rebuilt at the base only.
func TestDiffLogOnDisk(t *testing.T) {
	dir := t.TempDir()
	peers := func(int) []int { return []int{0, 1} }
	c := newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, diffLogMod(dir, 4))
	rs := startDiffRanks(t, c, 2, 31)
	runSteps(t, c, rs, 0, 21)
	waitLogged(t, c, 19) // steps 0 to 19 in batches of 4; 20 and 21 wait for more
	for _, dr := range rs {
		saveReplicated(t, dir, dr, 5)
		sp, stop := cascade.Reach(dir, dr.r, replRegions, 5)
		if sp.To < 19 {
			t.Errorf("rank %d: the log on disk reaches step %d (%v), want 19", dr.r, sp.To, stop)
		}
		checkFromDisk(t, dir, dr, 5, 19)
		checkFromDisk(t, dir, dr, 5, 11)
		sp, stop = cascade.Reach(dir, dr.r, []durable.Region{{Name: "optimizer", Size: diffRegions[0].Size}, {Name: "params", Size: 2048}, {Name: "meta", Size: 64}}, 5)
		if sp.To != 5 || stop == nil || !strings.Contains(stop.Error(), `"params"`) {
			t.Errorf("rank %d with params: reach %+v (%v), want the base only", dr.r, sp, stop)
		}
	}
	for r, st := range c.hosts[0].DiffLogStats() {
		if st.Dropped != 0 || st.Failed != 0 {
			t.Errorf("rank %d: %+v, nothing lost", r, st)
		}
	}
}

// TestDiffLogRestart: a restart to G discards the steps after G from the
// log on disk, so that the steps the ranks train again (here with other
// gradients: another history) follow G there, and a rebuild from disk
// gives the new history's state, never a mix of the two. Without the
// trim, the batch that straddles G keeps the old history's steps after
// G, which a rebuild would take for the new one's until the new batch
// that reaches further is written.
func TestDiffLogRestart(t *testing.T) {
	dir := t.TempDir()
	peers := func(int) []int { return []int{0, 1} }
	c := newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, diffLogMod(dir, 4))
	rs := startDiffRanks(t, c, 2, 41)
	runSteps(t, c, rs, 0, 15)
	waitLogged(t, c, 15) // batches 0-3 to 12-15
	for _, dr := range rs {
		saveReplicated(t, dir, dr, 2)
	}
	const g = 14 // the slots hold 14 and 15
	for _, h := range c.hosts {
		if err := h.Restart(1, g); err != nil {
			t.Fatal(err)
		}
	}
	for _, dr := range rs {
		// The batch 12-15 straddled 14: 15 of the old history went.
		if sp, _ := cascade.Reach(dir, dr.r, replRegions, 2); sp.To != g {
			t.Errorf("rank %d: after the restart the log reaches step %d, want %d", dr.r, sp.To, g)
		}
		checkFromDisk(t, dir, dr, 2, g)
	}
	var again []*diffRank
	for _, dr := range rs {
		nr, err := newDiffRank(t, c.hosts[dr.r], dr.r, 4242, dr.states) // other gradients from here on
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nr.close)
		if res, err := nr.restore(context.Background()); err != nil || res.Step != g {
			t.Fatalf("rank %d: restore %+v, %v", dr.r, res, err)
		}
		again = append(again, nr)
	}
	runSteps(t, c, again, g+1, 16)
	for _, dr := range again {
		// 15 and 16 of the new history are not on disk yet (their
		// batch waits for two more steps): the old 15 must not be either.
		if sp, _ := cascade.Reach(dir, dr.r, replRegions, 2); sp.To != g {
			t.Errorf("rank %d: the log reaches step %d, want %d", dr.r, sp.To, g)
		}
	}
	runSteps(t, c, again, 17, 23)
	waitLogged(t, c, 22)
	for _, dr := range again {
		checkFromDisk(t, dir, dr, 2, 22)
	}
}

// TestDiffLogInProgress: a rank's differential log on disk whose writes
// fail reports its counters with its durable progress (what the launcher
// warns of): steps dropped, batches failed, the last error.
func TestDiffLogInProgress(t *testing.T) {
	dir := t.TempDir()
	errDisk := errors.New("no space left on device")
	peers := func(int) []int { return []int{0, 1} }
	c := newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, func(hc *Config) {
		diffLogMod(dir, 4)(hc)
		hc.DiffLog.Append = func(int, int64, int64, [][]byte) error { return errDisk }
		hc.Persist = PersistConfig{Dir: dir, Every: 1000}
	})
	rs := startDiffRanks(t, c, 2, 31)
	runSteps(t, c, rs, 0, 9)
	c.waitFor("rank 0's log reports steps 0 to 7 dropped", func() bool {
		d := c.progress(0).Durable
		return d != nil && d.Log != nil && d.Log.Dropped >= 8
	})
	l := c.progress(0).Durable.Log
	if l.Failed < 2 || l.Steps != 0 || !errors.Is(l.LastErr, errDisk) {
		t.Errorf("rank 0's log: %+v, want 2 batches failed, none written, the disk's error", l)
	}
}
