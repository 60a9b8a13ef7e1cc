package keeper

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/protect"
)

// persistJob is a job of ranks 0 to world-1, each alone on its host, with
// a durable tier in a shared directory (it has the job's manifest: the
// hosts write no commit record of their own), driven step by step by the
// test, which also plays the launcher (decide).
type persistJob struct {
	t    *testing.T
	c    *cluster
	dir  string
	sess []*Session
	// The launcher's side: the commit record and the X published; with
	// resolve false, the protocol before X (commit and watermark only).
	resolve      bool
	committed, x int64
}

func newPersistJob(t *testing.T, world int, cfg PersistConfig, resolve bool) *persistJob {
	t.Helper()
	cfg.Dir = t.TempDir()
	m := &durable.Manifest{Job: "testjob", World: world, Protect: "full", Every: cfg.Every, Command: "x"}
	ranks := make([][]int, world)
	for r := range world {
		m.Regions = append(m.Regions, []durable.Region{{Name: "optimizer", Size: persistRegions[0].Size}, {Name: "meta", Size: persistRegions[1].Size}})
		ranks[r] = []int{r}
	}
	if err := durable.CreateManifest(cfg.Dir, m); err != nil {
		t.Fatal(err)
	}
	c := newClusterWith(t, ranks, nil, nil, func(hc *Config) { hc.Persist = cfg })
	j := &persistJob{t: t, c: c, dir: cfg.Dir, resolve: resolve, committed: -1, x: -1}
	for r := range world {
		j.sess = append(j.sess, c.hosts[r].Session(r))
		j.call(r, protect.TypeProtectHello, `{"v":1,"regions":[{"name":"optimizer","size":12288},{"name":"meta","size":100}]}`)
	}
	return j
}

func (j *persistJob) call(r int, typ byte, payload string) any {
	j.t.Helper()
	_, ans, err := j.sess[r].Handle(context.Background(), typ, []byte(payload))
	if err != nil {
		j.t.Fatal(err)
	}
	return ans
}

// step has every rank stage, write and commit step, then publishes G =
// step to every host.
func (j *persistJob) step(step int64) {
	j.t.Helper()
	for r, h := range j.c.hosts {
		st := j.call(r, protect.TypeStage, fmt.Sprintf(`{"step":%d}`, step)).(*protect.Staged)
		if st.Err != "" {
			j.t.Fatalf("rank %d: Stage(%d): %s", r, step, st.Err)
		}
		s := h.svc(r)
		s.mu.Lock()
		views := s.views[st.Slot]
		s.mu.Unlock()
		for i, v := range views {
			copy(v, pattern(step, i, int64(len(v))))
		}
		if cm := j.call(r, protect.TypeCommit, fmt.Sprintf(`{"step":%d}`, step)).(*protect.Committed); cm.Err != "" {
			j.t.Fatalf("rank %d: Commit(%d): %s", r, step, cm.Err)
		}
	}
	for _, h := range j.c.hosts {
		h.SetG(h.Gen(), step)
	}
}

// idle waits until rank r has no save in flight.
func (j *persistJob) idle(r int) {
	j.t.Helper()
	j.c.waitFor(fmt.Sprintf("rank %d's saves", r), j.c.hosts[r].svc(r).dur.idle)
}

// report returns rank r's durable progress.
func (j *persistJob) report(r int) (*DurableProgress, int64) {
	j.t.Helper()
	p := j.c.progress(r)
	if p.Durable == nil {
		j.t.Fatalf("rank %d has no durable progress", r)
	}
	return p.Durable, p.Committed
}

// decide is the launcher's turn (launcher/durable.go): X the minimum of
// G and the ranks' resolved steps, the newest step after the record and
// the X before, at or below X, that every rank has a marker of
// committed, then D and X published to every host, which the test waits
// for them to apply. Without resolve, it commits the newest step at or
// below G every rank has a marker of and publishes D alone.
func (j *persistJob) decide() {
	j.t.Helper()
	g := int64(-1)
	for _, h := range j.c.hosts {
		g = max(g, h.G())
	}
	x, lo := g, j.committed
	var markers []map[int64]bool
	for r := range j.c.hosts {
		d, _ := j.report(r)
		if j.resolve {
			x = min(x, d.Resolved)
		}
		m := map[int64]bool{}
		for _, st := range d.Markers {
			m[st] = true
		}
		markers = append(markers, m)
	}
	if j.resolve {
		if x <= j.x {
			return
		}
		lo = max(lo, j.x)
	}
	v := int64(-1)
	for st := range markers[0] {
		all := st > lo && st <= x && st > v
		for _, m := range markers[1:] {
			all = all && m[st]
		}
		if all {
			v = st
		}
	}
	if v >= 0 {
		if err := durable.Commit(j.dir, v); err != nil {
			j.t.Fatal(err)
		}
		j.committed = v
	}
	if !j.resolve && v < 0 {
		return
	}
	if j.resolve {
		j.x = x
	}
	for _, h := range j.c.hosts {
		h.dur.mu.Lock()
		before := h.dur.rounds
		h.dur.mu.Unlock()
		if j.resolve {
			h.SetDurable(j.committed, j.x)
		} else {
			h.SetD(j.committed)
		}
		j.c.waitFor("the host to apply the watermark", func() bool {
			h.dur.mu.Lock()
			defer h.dur.mu.Unlock()
			return h.dur.rounds > before
		})
	}
}

// TestDurableAbandonUnstalls: the two ways the durable tier stalled for
// good (the review of issue 17), played by the ranks' services with the
// launcher's rules: with X the commits go on past them; without (the
// protocol before X, checked too so that the scenarios keep stalling
// it), the commit record stays where it was and a rank's bases are all
// skipped.
func TestDurableAbandonUnstalls(t *testing.T) {
	for _, resolve := range []bool{false, true} {
		t.Run(fmt.Sprintf("failed save/resolve=%v", resolve), func(t *testing.T) {
			// N = 1 (two base files): rank 1's save of 12 fails (EIO),
			// rank 0's succeeds; at 16 rank 0 has no free file, rank 1
			// saves; then no step is ever on both.
			j := newPersistJob(t, 2, PersistConfig{Every: 4, Concurrency: 1}, resolve)
			setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
				if step == 12 && st == j.c.hosts[1].svc(1).dur.store {
					return fmt.Errorf("writing step %d: %w", step, syscall.EIO)
				}
				return st.Save(ctx, step, src, sums, copied)
			})
			for step := int64(0); step <= 36; step++ {
				j.step(step)
				if step%4 == 0 {
					j.idle(0)
					j.idle(1)
					j.decide()
				}
			}
			d0, _ := j.report(0)
			if !resolve {
				if j.committed != 8 || d0.Skipped == 0 {
					t.Fatalf("without X: committed %d, rank 0 skipped %d; the scenario no longer stalls at 8", j.committed, d0.Skipped)
				}
				return
			}
			d1, _ := j.report(1)
			if j.committed != 36 || d1.Failed != 1 {
				t.Fatalf("committed %d after step 36 (rank 0 %+v, rank 1 %+v), want 36 and rank 1's one failure", j.committed, d0, d1)
			}
			checkCommitted(t, j.dir, 2, 36)
		})
		t.Run(fmt.Sprintf("slow first save/resolve=%v", resolve), func(t *testing.T) {
			// Automatic N (one save at a time at first; five base files):
			// rank 1's first save is slow, its bases 4 to 16 are skipped;
			// rank 0 saves 0, 4, 8, 12 and 16, and at 20 has no free file.
			release := make(chan struct{})
			j := newPersistJob(t, 2, PersistConfig{Every: 4}, resolve)
			setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
				if step != 0 || st != j.c.hosts[1].svc(1).dur.store {
					return st.Save(ctx, step, src, sums, copied)
				}
				return st.Save(ctx, step, src, sums, func() {
					copied() // the slot is free again: a slow disk
					select {
					case <-release:
					case <-ctx.Done(): // the test failed: the host closes
					}
				})
			})
			for step := int64(0); step <= 36; step++ {
				if step == 21 {
					close(release)
					j.idle(1)
					j.decide()
				}
				j.step(step)
				if step%4 == 0 {
					j.idle(0)
					if step > 20 {
						j.idle(1)
					}
					j.decide()
				}
			}
			d0, _ := j.report(0)
			d1, _ := j.report(1)
			if !resolve {
				if j.committed != 0 || d0.Skipped == 0 {
					t.Fatalf("without X: committed %d, rank 0 skipped %d; the scenario no longer stalls at 0", j.committed, d0.Skipped)
				}
				return
			}
			if j.committed != 36 || d1.Skipped < 4 || d0.Skipped == 0 {
				t.Fatalf("committed %d after step 36 (rank 0 %+v, rank 1 %+v), want 36 after rank 1's skipped bases", j.committed, d0, d1)
			}
			checkCommitted(t, j.dir, 2, 36)
		})
	}
}

// checkCommitted checks the directory's commit record and that every
// rank's committed version loads, the state of that step.
func checkCommitted(t *testing.T, dir string, world int, step int64) {
	t.Helper()
	if c, err := durable.ReadCommitted(dir); err != nil || c != step {
		t.Fatalf("commit record %d, %v; want %d", c, err, step)
	}
	for r := range world {
		dst := [][]byte{make([]byte, persistRegions[0].Size), make([]byte, persistRegions[1].Size)}
		if err := durable.Load(context.Background(), dir, r, step, dst); err != nil {
			t.Fatalf("rank %d: Load(%d): %v", r, step, err)
		}
		for i, b := range dst {
			if !slices.Equal(b, pattern(step, i, int64(len(b)))) {
				t.Fatalf("rank %d: the durable version of step %d differs in region %s", r, step, persistRegions[i].Name)
			}
		}
	}
	probs, err := durable.Verify(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("Verify: %s: %v", p.Path, p.Err)
	}
}

// TestDurableResolved: a rank's resolved step is the step before its
// oldest save in flight, or its committed step when none is; a base
// skipped or failed does not hold it back.
func TestDurableResolved(t *testing.T) {
	release := make(chan struct{})
	inCopied := make(chan struct{}, 1)
	setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
		switch step {
		case 4:
			return st.Save(ctx, step, src, sums, func() {
				copied()
				inCopied <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done(): // the test failed: the host closes
				}
			})
		case 2:
			return fmt.Errorf("writing step %d: %w", step, syscall.EIO)
		}
		return st.Save(ctx, step, src, sums, copied)
	})
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 1})
	if d := r.durableWhen("the store open", func(*DurableProgress) bool { return true }); d.Resolved != -1 {
		t.Fatalf("resolved %d before any step, want -1", d.Resolved)
	}
	r.steps(0, 3, 2)
	if d := r.durableWhen("step 3", func(d *DurableProgress) bool { return d.Saves == 1 && d.Failed == 1 }); d.Resolved != 3 {
		t.Fatalf("resolved %d at step 3 with no save in flight, want 3", d.Resolved)
	}
	r.step(4)
	<-inCopied
	for s := int64(5); s <= 7; s++ {
		r.step(s) // 6 is skipped: 4 is in flight
	}
	if d := r.durableWhen("step 6 skipped", func(d *DurableProgress) bool { return d.Skipped == 1 }); d.Resolved != 3 {
		t.Fatalf("resolved %d with the save of 4 in flight, want 3", d.Resolved)
	}
	close(release)
	if d := r.durableWhen("the save of 4", func(d *DurableProgress) bool { return d.Saves == 2 }); d.Resolved != 7 || !slices.Equal(d.Markers, []int64{0, 4}) {
		t.Fatalf("resolved %d, markers %v once the save of 4 ended; want 7 and [0 4]", d.Resolved, d.Markers)
	}
}
