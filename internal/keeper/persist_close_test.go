package keeper

import (
	"context"
	"fmt"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/protect"
)

// TestDurableCloseAppliesLastWatermark: the end of a job (issue 17's
// flaky e2e). The launcher commits the last base as the ranks end, and
// tells the host to exit at once: the host's Close must apply that
// watermark to every local rank's store before it closes them, not drop
// it with its loop. The ordering is injected: both ranks' stores are
// held (their opMu) while the loop takes the watermark up, so that it
// is still in its round, on the first store, when Close begins; the
// stores are let go only once Close is under way (waiting for the loop,
// or, without the wait, having stopped the host). Without the wait the
// loop stops after the first store and the other rank keeps the
// version of step 32 and its marker, before the commit record 36.
func TestDurableCloseAppliesLastWatermark(t *testing.T) {
	const every, last = 4, 36
	cfg := PersistConfig{Dir: t.TempDir(), Every: every, Concurrency: 2}
	m := &durable.Manifest{Job: "testjob", World: 2, Protect: "full", Every: every, Command: "x"}
	for range 2 {
		m.Regions = append(m.Regions, []durable.Region{{Name: "optimizer", Size: persistRegions[0].Size}, {Name: "meta", Size: persistRegions[1].Size}})
	}
	if err := durable.CreateManifest(cfg.Dir, m); err != nil {
		t.Fatal(err)
	}
	c := newClusterWith(t, [][]int{{0, 1}}, nil, nil, func(hc *Config) { hc.Persist = cfg })
	h := c.hosts[0]
	sess := []*Session{h.Session(0), h.Session(1)}
	call := func(r int, typ byte, payload string) any {
		t.Helper()
		_, ans, err := sess[r].Handle(context.Background(), typ, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	for r := range sess {
		call(r, protect.TypeProtectHello, `{"v":1,"regions":[{"name":"optimizer","size":12288},{"name":"meta","size":100}]}`)
	}
	rounds := func() int {
		h.dur.mu.Lock()
		defer h.dur.mu.Unlock()
		return h.dur.rounds
	}
	for step := int64(0); step <= last; step++ {
		for r := range sess {
			st := call(r, protect.TypeStage, fmt.Sprintf(`{"step":%d}`, step)).(*protect.Staged)
			if st.Err != "" {
				t.Fatalf("rank %d: Stage(%d): %s", r, step, st.Err)
			}
			s := h.svc(r)
			s.mu.Lock()
			views := s.views[st.Slot]
			s.mu.Unlock()
			for i, v := range views {
				copy(v, pattern(step, i, int64(len(v))))
			}
			if cm := call(r, protect.TypeCommit, fmt.Sprintf(`{"step":%d}`, step)).(*protect.Committed); cm.Err != "" {
				t.Fatalf("rank %d: Commit(%d): %s", r, step, cm.Err)
			}
		}
		h.SetG(h.Gen(), step)
		if step%every != 0 {
			continue
		}
		for r := range sess {
			c.waitFor(fmt.Sprintf("rank %d's saves", r), h.svc(r).dur.idle)
		}
		if step == last {
			break
		}
		// The launcher's turn before the last: step committed and
		// applied (the host keeps two base files free).
		if err := durable.Commit(cfg.Dir, step); err != nil {
			t.Fatal(err)
		}
		before := rounds()
		h.SetDurable(step, step)
		c.waitFor("the host to apply the watermark", func() bool { return rounds() > before })
	}
	// Each rank now holds 32, committed, and 36, marked.
	for r := range sess {
		if d := c.progress(r).Durable; d == nil || len(d.Markers) != 2 || d.Markers[0] != last-every || d.Markers[1] != last {
			t.Fatalf("rank %d's durable progress %+v, want the markers of %d and %d", r, d, last-every, last)
		}
	}
	// The last commit, as the ranks end: the loop takes it up and stops
	// on the first store, held.
	if err := durable.Commit(cfg.Dir, last); err != nil {
		t.Fatal(err)
	}
	for r := range sess {
		h.svc(r).dur.opMu.Lock()
	}
	h.SetDurable(last, last)
	c.waitFor("the host's loop to take the last watermark up", func() bool {
		h.dur.mu.Lock()
		defer h.dur.mu.Unlock()
		return h.dur.appliedD == last
	})
	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	c.waitFor("the host's Close to be under way", func() bool {
		h.dur.mu.Lock()
		defer h.dur.mu.Unlock()
		return h.dur.closing || h.life.Err() != nil
	})
	for r := range sess {
		h.svc(r).dur.opMu.Unlock()
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	l, err := durable.List(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Ranks) != 2 {
		t.Fatalf("%d ranks in the directory, want 2", len(l.Ranks))
	}
	for _, r := range l.Ranks {
		for _, b := range r.Bases {
			if b.State == durable.StateComplete && b.Step < last {
				t.Errorf("rank %d keeps version %d from before the commit record %d (%s)", r.Rank, b.Step, last, b.Path)
			}
		}
		for _, s := range r.Markers {
			if s < last {
				t.Errorf("rank %d keeps the marker of step %d, before the commit record %d", r.Rank, s, last)
			}
		}
	}
}
