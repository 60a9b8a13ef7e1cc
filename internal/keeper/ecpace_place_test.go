package keeper

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// placeAll gives every working host of pj a new placement of epoch at
// G g and H hb, of the same layout (a Source makes it a new one), and
// restores every rank there.
func (pj *pacedJob) placeAll(t *testing.T, epoch uint64, g, hb int64) {
	t.Helper()
	for h := range pj.work {
		var mine []int
		for r, x := range pj.hostOf {
			if x == h {
				mine = append(mine, r)
			}
		}
		p := Placement{Ranks: mine, HostOf: pj.hostOf, Holders: pj.holders, EC: pj.groups, Epoch: epoch, G: g, Logs: pj.logs, H: hb,
			Sources: map[int]Source{0: {Opt: 0, Params: 0}}}
		if err := pj.c.hosts[h].SetPlacement(p); err != nil {
			t.Fatalf("host %d: %v", h, err)
		}
	}
	pj.restoreAll(g)
}

// restoreAll has every rank of pj restore, as a new process with the
// same states would, and checks that it restores step g.
func (pj *pacedJob) restoreAll(g int64) {
	t := pj.t
	t.Helper()
	for r, old := range pj.rs {
		old.close()
		dr, err := newDiffRank(t, pj.c.hosts[pj.hostOf[r]], r, 11, old.states)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dr.close)
		if res, err := dr.restore(context.Background()); err != nil || res.Step != g {
			t.Fatalf("rank %d: restore: %+v, %v; want step %d", r, res, err, g)
		}
		pj.rs[r] = dr
	}
}

// pacedRuns returns every rank's base refresh and share send, and fails
// the test unless each is base b's, paced.
func (pj *pacedJob) pacedRuns(b int64) (map[int]*refresh, map[int]*shareRun) {
	t := pj.t
	t.Helper()
	olds, runs := map[int]*refresh{}, map[int]*shareRun{}
	for r := range pj.hostOf {
		x := pj.rep(r)
		x.mu.Lock()
		olds[r], runs[r] = x.ref, x.ecb.shares
		x.mu.Unlock()
		if olds[r] == nil || olds[r].step != b || runs[r] == nil || runs[r].pace == nil {
			t.Fatalf("rank %d: base %v, shares %v: want base %d's shares going, paced", r, olds[r], runs[r], b)
		}
	}
	return olds, runs
}

// waitG publishes G and H until G is g or later.
func (pj *pacedJob) waitG(g int64) {
	pj.t.Helper()
	pj.c.waitFor(fmt.Sprintf("G %d or later", g), func() bool {
		pj.publish()
		pg, _ := pj.published()
		return pg >= g
	})
}

// coded reports whether every rank of pj has a base at step b or later
// coded (every parity row took its shares).
func (pj *pacedJob) coded(b int64) bool {
	for r := range pj.hostOf {
		x := pj.rep(r)
		x.mu.Lock()
		ok := x.ecb.base() >= b
		x.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// TestSharePacePlacements: a new placement while base 8's shares wait at
// the pacing. At G 8 (the paced base becomes the new schedule's anchor)
// the job runs on past the next base; at G 9 (a newer base supersedes the
// paced one) the paced send ends, its snapshot is let go, and no row
// holds a share of base 8. Either way every rank is recoverable bitwise
// from every set of lost hosts afterwards. (A review's tests: the lift
// itself is not what they show, since every rank's restore after a
// placement cancels the paced send anyway.)
func TestSharePacePlacements(t *testing.T) {
	const b = paceEvery
	t.Run("at the base", func(t *testing.T) {
		pj := newPacedJob(t)
		pj.waitG(b)
		g, hb := pj.published()
		if g != b {
			t.Fatalf("G %d, want %d", g, b)
		}
		for r := range pj.hostOf {
			x := pj.rep(r)
			x.mu.Lock()
			sr := x.ecb.shares
			x.mu.Unlock()
			if sr == nil || sr.pace == nil {
				t.Fatalf("rank %d: base %d's shares not paced", r, b)
			}
		}
		pj.placeAll(t, 2, g, hb)
		pj.run(b+1, 2*b+1)
		g, hb = pj.published()
		if hb < b {
			t.Fatalf("G %d, H %d: want H past %d", g, hb, b)
		}
		pj.everySubset(g, hb)
	})
	t.Run("past the base", func(t *testing.T) {
		pj := newPacedJob(t)
		pj.stepAll(b + 1)
		pj.quiet(b + 1)
		pj.waitG(b + 1)
		g, hb := pj.published()
		olds, runs := pj.pacedRuns(b)
		pj.placeAll(t, 2, g, hb)
		for r, sr := range runs {
			select {
			case <-sr.done:
			case <-time.After(10 * time.Second):
				t.Fatalf("rank %d: the superseded base's send goes on", r)
			}
		}
		pj.run(g+1, g+2*b+1)
		for r, ref := range olds {
			if n := ref.rb.refs.Load(); n != 0 {
				t.Errorf("rank %d: base %d's snapshot keeps %d references", r, b, n)
			}
		}
		if hs := pj.sharesIn(b); len(hs) > 0 {
			t.Errorf("shares of the superseded base %d in on hosts %v", b, hs)
		}
		pg, hb2 := pj.published()
		if hb2 < g {
			t.Fatalf("H %d, want at least %d", hb2, g)
		}
		pj.everySubset(pg, hb2)
	})
}

// TestSharePaceStoppedTrainer: a trainer that commits nothing after a
// base (it ended, or waits on something else) still gets the base coded:
// a pause in the commits counts as a step (paceIdleMin, the real one).
func TestSharePaceStoppedTrainer(t *testing.T) {
	const b = paceEvery
	chunk := ecChunkSize
	ecChunkSize = 1 << 10
	t.Cleanup(func() { ecChunkSize = chunk })
	j := newECDiffRecJob(t, 2, 1, paceEvery, 2)
	j.run(0, b-1)
	j.waitH(0)
	pj := &pacedJob{ecDiffRecJob: j}
	pj.stepAll(b)
	pj.c.waitFor("base 8 coded with no commit after it", func() bool {
		pj.publish()
		return pj.coded(b)
	})
}

// TestSharePaceReplNS: the time a paced send waits between the steps of
// training is not counted as replication time (ReplNS: gorun -v's
// repl/step and repl MB/s, benchprotect's replication rows). The test
// steps three times 200 ms apart while base 8's shares are paced; the
// sends themselves (a few KiB) take a small part of that. Counted, the
// wait made every rank's ReplNS grow by the whole 600 ms (the review's
// run: about 620 ms, and 3-6 ms without the wait).
func TestSharePaceReplNS(t *testing.T) {
	const b = paceEvery
	const sigma = paceEvery / 2
	const pause = 200 * time.Millisecond
	pj := newPacedJob(t)
	before := map[int]int64{}
	for r := range pj.hostOf {
		before[r] = pj.c.hosts[pj.hostOf[r]].svc(r).replNS.Load()
	}
	paused := time.Duration(0)
	for c := int64(b + 1); c < b+sigma; c++ {
		time.Sleep(pause) // a step of training
		paused += pause
		pj.stepAll(c)
		pj.quiet(c)
	}
	pj.c.waitFor("base 8 coded", func() bool { return pj.coded(b) })
	for r := range pj.hostOf {
		if grew := time.Duration(pj.c.hosts[pj.hostOf[r]].svc(r).replNS.Load() - before[r]); grew >= paused {
			t.Errorf("rank %d: ReplNS grew by %v over %v of steps paused: the pacing's waits counted as replication", r, grew, paused)
		}
	}
}
