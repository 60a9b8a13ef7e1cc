package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/protect"
)

// persistRig is one rank (0) on one host with a durable tier in dir,
// driven request by request through its session, as TestOverwriteRule
// drives it: the test writes each staged slot's bytes itself.
type persistRig struct {
	t    *testing.T
	c    *cluster
	h    *Keeper
	sess *Session
	dir  string
}

// persistRegions are the rig's regions: small, two of them.
var persistRegions = []protect.Region{{Name: "optimizer", Size: 3 << 12}, {Name: "meta", Size: 100}}

func newPersistRig(t *testing.T, cfg PersistConfig) *persistRig {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	c := newClusterWith(t, [][]int{{0}}, nil, nil, func(hc *Config) {
		hc.Persist = cfg
		hc.Log = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	r := &persistRig{t: t, c: c, h: c.hosts[0], sess: c.hosts[0].Session(0), dir: cfg.Dir}
	r.call(protect.TypeProtectHello, `{"v":1,"regions":[{"name":"optimizer","size":12288},{"name":"meta","size":100}]}`)
	return r
}

func (r *persistRig) call(typ byte, payload string) any {
	r.t.Helper()
	_, ans, err := r.sess.Handle(context.Background(), typ, []byte(payload))
	if err != nil {
		r.t.Fatal(err)
	}
	return ans
}

// pattern is the rig's state of region i at step.
func pattern(step int64, i int, size int64) []byte {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(step*29 + int64(i)*7 + int64(j))
	}
	return b
}

// stage stages step and writes its state into the slot.
func (r *persistRig) stage(step int64) *protect.Staged {
	r.t.Helper()
	st := r.call(protect.TypeStage, fmt.Sprintf(`{"step":%d}`, step)).(*protect.Staged)
	if st.Err != "" {
		r.t.Fatalf("Stage(%d): %s", step, st.Err)
	}
	r.fill(step, st.Slot)
	return st
}

// fill writes step's state into slot, as the rank would.
func (r *persistRig) fill(step int64, slot int) {
	s := r.h.svc(0)
	s.mu.Lock()
	views := s.views[slot]
	s.mu.Unlock()
	for i, v := range views {
		copy(v, pattern(step, i, int64(len(v))))
	}
}

// commit commits step and publishes G = step (one rank, no holders).
func (r *persistRig) commit(step int64) {
	r.t.Helper()
	if cm := r.call(protect.TypeCommit, fmt.Sprintf(`{"step":%d}`, step)).(*protect.Committed); cm.Err != "" {
		r.t.Fatalf("Commit(%d): %s", step, cm.Err)
	}
	r.h.SetG(r.h.Gen(), step)
}

func (r *persistRig) step(step int64) {
	r.t.Helper()
	r.stage(step)
	r.commit(step)
}

// steps runs steps from to to, each base step's save done before the
// next step (a test's steps take no time: a base due while the one
// before is in flight would be skipped).
func (r *persistRig) steps(from, to int64, every int64) {
	r.t.Helper()
	for s := from; s <= to; s++ {
		r.step(s)
		if s%every == 0 {
			r.c.waitFor(fmt.Sprintf("the save of step %d", s), r.h.svc(0).dur.idle)
		}
	}
}

// idle reports whether no save is in flight.
func (p *persist) idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight == 0
}

// durable returns the rank's durable progress once cond holds.
func (r *persistRig) durableWhen(what string, cond func(*DurableProgress) bool) *DurableProgress {
	r.t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		d := r.c.progress(0).Durable
		if d != nil && cond(d) {
			return d
		}
		select {
		case <-r.c.changed:
		case <-tick.C:
		case <-deadline:
			r.t.Fatalf("timed out waiting for %s: durable progress %+v", what, d)
		}
	}
}

// checkLoad checks that the directory holds rank 0's state of step.
func (r *persistRig) checkLoad(step int64) {
	r.t.Helper()
	dst := [][]byte{make([]byte, persistRegions[0].Size), make([]byte, persistRegions[1].Size)}
	if err := durable.Load(context.Background(), r.dir, 0, step, dst); err != nil {
		r.t.Fatalf("Load(step %d): %v", step, err)
	}
	for i, b := range dst {
		if !bytes.Equal(b, pattern(step, i, int64(len(b)))) {
			r.t.Fatalf("the durable version of step %d differs from its committed state in region %s", step, persistRegions[i].Name)
		}
	}
}

// setSaveHook replaces the stores' Save for the test.
func setSaveHook(t *testing.T, f func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error) {
	testHookSave = f
	t.Cleanup(func() { testHookSave = nil })
}

// TestDurableHoldsSlot: a base being saved holds its slot until the save
// has read it. With a base every 2 steps, the save of step 0 is held
// before it reads the slot; steps 1 commits beside it, and the stage of
// step 2, which overwrites step 0's slot, waits (it passed the overwrite
// rule: G = 1), until the save read the slot, which still holds step 0's
// bytes. Without the hold the stage goes through and the save reads step
// 2's bytes.
func TestDurableHoldsSlot(t *testing.T) {
	started, release := make(chan int64, 4), make(chan struct{})
	var intact error
	setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
		if step == 0 {
			started <- step
			select {
			case <-release:
			case <-ctx.Done(): // the test failed: the host closes
				return ctx.Err()
			}
			for i, v := range src {
				if !bytes.Equal(v, pattern(0, i, int64(len(v)))) {
					intact = fmt.Errorf("region %d of the slot read by the save of step 0 was overwritten", i)
				}
			}
		}
		return st.Save(ctx, step, src, sums, copied)
	})
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 1})
	r.step(0)
	<-started
	r.step(1) // the other slot: no wait
	done := make(chan *protect.Staged, 1)
	go func() {
		_, ans, err := r.sess.Handle(context.Background(), protect.TypeStage, []byte(`{"step":2}`))
		if err != nil {
			t.Error(err)
		}
		done <- ans.(*protect.Staged)
	}()
	s := r.h.svc(0)
	r.c.waitFor("the stage of step 2 to wait for the save of step 0", func() bool {
		select {
		case st := <-done:
			t.Fatalf("Stage(2) went through while the save of step 0 had not read its slot: %+v", st)
		default:
		}
		return s.dur.waiting.Load() == 1
	})
	close(release)
	var st *protect.Staged
	select {
	case st = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Stage(2) still waits once the save read the slot")
	}
	if st.Err != "" {
		t.Fatalf("Stage(2) = %+v", st)
	}
	if intact != nil {
		t.Fatal(intact)
	}
	r.fill(2, st.Slot)
	r.durableWhen("the save of step 0", func(d *DurableProgress) bool { return len(d.Markers) == 1 })
	r.commit(2)
	d := r.durableWhen("the saves of steps 0 and 2", func(d *DurableProgress) bool { return len(d.Markers) == 2 })
	if d.HoldNS <= 0 || d.Saves != 2 || d.Skipped != 0 || d.Failed != 0 {
		t.Fatalf("durable progress %+v: want 2 saves and a hold wait", d)
	}
	r.checkLoad(0)
	r.checkLoad(2)
}

// TestDurableSkipsWhenBehind: with one save allowed in flight, a base due
// while the one before is still being written is skipped and counted;
// training does not wait for it (the hold ends once the slot was read).
func TestDurableSkipsWhenBehind(t *testing.T) {
	release := make(chan struct{})
	inCopied := make(chan struct{}, 1)
	setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
		if step != 0 {
			return st.Save(ctx, step, src, sums, copied)
		}
		// A slow disk: the slot is read, the writing takes long.
		return st.Save(ctx, step, src, sums, func() {
			copied()
			inCopied <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done(): // the test failed: the host closes
			}
		})
	})
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 1})
	r.step(0)
	<-inCopied
	for s := int64(1); s <= 3; s++ {
		r.step(s) // 2 is skipped: 0 is still in flight
	}
	d := r.durableWhen("the base of step 2 skipped", func(d *DurableProgress) bool { return d.Skipped == 1 })
	if d.Saves != 0 || d.Failed != 0 || len(d.Markers) != 0 {
		t.Fatalf("durable progress %+v while step 0's save is in flight", d)
	}
	close(release)
	r.durableWhen("the save of step 0", func(d *DurableProgress) bool { return len(d.Markers) == 1 })
	r.step(4)
	d = r.durableWhen("the saves of steps 0 and 4", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{0, 4}) })
	if d.Saves != 2 || d.Skipped != 1 || d.N != 1 {
		t.Fatalf("durable progress %+v", d)
	}
	r.checkLoad(4)
}

// TestDurableFailureGoesOn: a save that fails (the disk is full) is
// counted, its version abandoned, and training goes on; the next base is
// saved.
func TestDurableFailureGoesOn(t *testing.T) {
	setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
		if step == 2 {
			return fmt.Errorf("writing step %d: %w", step, syscall.ENOSPC)
		}
		return st.Save(ctx, step, src, sums, copied)
	})
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 2}) // 3 base files: 0, 4 and 6
	r.steps(0, 6, 2)
	d := r.durableWhen("the saves of steps 0, 4 and 6", func(d *DurableProgress) bool { return len(d.Markers) == 3 })
	if !slices.Equal(d.Markers, []int64{0, 4, 6}) || d.Saves != 3 || d.Failed != 1 || d.Skipped != 0 {
		t.Fatalf("durable progress %+v: want markers [0 4 6], 3 saves, 1 failure", d)
	}
	if err := durable.Load(context.Background(), r.dir, 0, 2, [][]byte{make([]byte, persistRegions[0].Size), make([]byte, persistRegions[1].Size)}); !errors.Is(err, durable.ErrNoVersion) {
		t.Fatalf("Load(step 2) = %v, want ErrNoVersion", err)
	}
}

// TestDurableWatermark: the regions are reported until the host learns
// of a commit record; a watermark d is committed in the host's own
// directory when the launcher's manifest is not there, and the rank's
// markers and versions before d are reclaimed.
func TestDurableWatermark(t *testing.T) {
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 2})
	d := r.durableWhen("the store open", func(*DurableProgress) bool { return true })
	if !slices.Equal(d.Regions, persistRegions) {
		t.Fatalf("regions %v before any commit record, want %v", d.Regions, persistRegions)
	}
	r.steps(0, 4, 2)
	r.durableWhen("three markers", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{0, 2, 4}) })
	r.h.SetD(2)
	d = r.durableWhen("the markers before 2 reclaimed", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{2, 4}) })
	if d.Regions != nil {
		t.Fatalf("regions still reported after a commit record: %v", d.Regions)
	}
	if c, err := durable.ReadCommitted(r.dir); err != nil || c != 2 {
		t.Fatalf("the host's commit record: %d, %v; want 2", c, err)
	}
	l, err := durable.List(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	var kept []int64
	for _, b := range l.Ranks[0].Bases {
		if b.State == durable.StateComplete || b.State == durable.StateCommitted {
			kept = append(kept, b.Step)
		}
	}
	slices.Sort(kept)
	if !slices.Equal(kept, []int64{2, 4}) || !slices.Equal(l.Ranks[0].Markers, []int64{2, 4}) {
		t.Fatalf("after the watermark 2: versions %v, markers %v; want [2 4] and [2 4]", kept, l.Ranks[0].Markers)
	}
	r.h.SetD(1) // older: ignored
	if r.h.D() != 2 {
		t.Fatalf("D = %d after an older watermark", r.h.D())
	}
}

// TestDurableWatermarkSharedDir: a host whose directory has the
// launcher's manifest (a shared file system) writes no commit record of
// its own: the launcher's is the only one.
func TestDurableWatermarkSharedDir(t *testing.T) {
	dir := t.TempDir()
	m := &durable.Manifest{Job: "testjob", World: 1, Regions: [][]durable.Region{{{Name: "optimizer", Size: 12288}, {Name: "meta", Size: 100}}}, Protect: "full", Every: 2, Command: "x"}
	if err := durable.CreateManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	r := newPersistRig(t, PersistConfig{Dir: dir, Every: 2})
	r.steps(0, 2, 2)
	r.durableWhen("two markers", func(d *DurableProgress) bool { return len(d.Markers) == 2 })
	r.h.SetD(2)
	r.durableWhen("the marker of 0 reclaimed", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{2}) })
	if c, err := durable.ReadCommitted(dir); !errors.Is(err, durable.ErrNotCommitted) {
		t.Fatalf("the host wrote a commit record (%d, %v) in the launcher's directory", c, err)
	}
}

// TestDurableTruncateOnRestart: a restart from G forgets what the rank
// saved after G (its markers too), and a stage waiting for a save's hold
// is released by it.
func TestDurableTruncateOnRestart(t *testing.T) {
	block := make(chan struct{})
	setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
		if step == 4 {
			select { // held until the restart cancels it
			case <-block:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return st.Save(ctx, step, src, sums, copied)
	})
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 2})
	r.steps(0, 3, 2)
	r.step(4)
	r.durableWhen("markers 0 and 2", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{0, 2}) })
	r.stage(5)
	r.commit(5)
	done := make(chan *protect.Staged, 1)
	go func() {
		_, ans, _ := r.sess.Handle(context.Background(), protect.TypeStage, []byte(`{"step":6}`))
		done <- ans.(*protect.Staged)
	}()
	s := r.h.svc(0)
	r.c.waitFor("the stage of step 6 to wait for the save of step 4", func() bool { return s.dur.waiting.Load() == 1 })
	if err := r.h.Restart(1, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-done:
		if st.Err == "" {
			t.Fatalf("Stage(6) of the old generation went through: %+v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stage(6) still waits after the restart")
	}
	// (The rank's slots no longer hold a step: it restores from its
	// holders next. Its markers are reported up to its committed step.)
	d := r.c.progress(0).Durable
	if d.Failed != 0 || slices.ContainsFunc(d.Markers, func(m int64) bool { return m > 1 }) {
		t.Fatalf("durable progress after the restart from 1: %+v; want no failure, no marker after 1", d)
	}
	l, err := durable.List(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Ranks[0].Markers, []int64{0}) {
		t.Fatalf("markers on disk after the restart from 1: %v, want [0]", l.Ranks[0].Markers)
	}
	for _, b := range l.Ranks[0].Bases {
		if b.State == durable.StateComplete && b.Step > 1 {
			t.Fatalf("version of step %d kept after the restart from 1", b.Step)
		}
	}
}

// TestDurableAutomaticConcurrency: with no --ckpt-concurrency the store
// is opened for autoMaxConcurrency saves (as many base files plus one)
// and a rank allows one in flight until a save measured its write time.
func TestDurableAutomaticConcurrency(t *testing.T) {
	r := newPersistRig(t, PersistConfig{Every: 1})
	if d := r.durableWhen("the store open", func(*DurableProgress) bool { return true }); d.N != 1 {
		t.Fatalf("N = %d before any save, want 1", d.N)
	}
	r.steps(0, 2, 1)
	d := r.durableWhen("three saves", func(d *DurableProgress) bool { return d.Saves+d.Skipped == 3 })
	if d.N < 1 || d.N > autoMaxConcurrency {
		t.Fatalf("N = %d, want 1 to %d", d.N, autoMaxConcurrency)
	}
	l, err := durable.List(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(l.Ranks[0].Bases); n != autoMaxConcurrency+1 {
		t.Fatalf("%d base files, want %d", n, autoMaxConcurrency+1)
	}
}

// TestQuietHandler: a store's warning repeated within the period is
// dropped (a full disk has every save warn the same), other messages
// and the same one after the period pass; derived loggers share the
// count.
func TestQuietHandler(t *testing.T) {
	var buf bytes.Buffer
	q := newQuietHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}), 30*time.Second)
	t0 := time.Unix(1000, 0)
	log := func(h slog.Handler, at time.Duration, msg string) {
		r := slog.NewRecord(t0.Add(at), slog.LevelWarn, msg, 0)
		if err := h.Handle(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	log(q, 0, "disk full")
	log(q, time.Second, "disk full")
	log(q.WithAttrs([]slog.Attr{slog.Int("rank", 1)}), 2*time.Second, "disk full")
	log(q, 3*time.Second, "header corrupt")
	log(q, 31*time.Second, "disk full")
	want := "level=WARN msg=\"disk full\"\nlevel=WARN msg=\"header corrupt\"\nlevel=WARN msg=\"disk full\"\n"
	if buf.String() != want {
		t.Fatalf("logged:\n%s\nwant:\n%s", buf.String(), want)
	}
}
