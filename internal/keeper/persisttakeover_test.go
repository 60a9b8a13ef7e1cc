package keeper

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/protect"
)

// TestDurableTakeover: a rank whose store another host wrote (the rank
// was moved to this host) starts from the markers on disk, less what the
// watermark this host knows has passed: its store reclaims at once what
// the other host did not (a fresh store knows no watermark).
func TestDurableTakeover(t *testing.T) {
	dir := t.TempDir()
	regions := []durable.Region{{Name: "optimizer", Size: persistRegions[0].Size}, {Name: "meta", Size: persistRegions[1].Size}}
	st, err := durable.Open(dir, 0, regions, durable.Options{Concurrency: autoMaxConcurrency})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []int64{0, 2, 4} {
		src := [][]byte{pattern(step, 0, regions[0].Size), pattern(step, 1, regions[1].Size)}
		sums := []uint32{crc32c.Checksum(src[0]), crc32c.Checksum(src[1])}
		if err := st.Save(context.Background(), step, src, sums, nil); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	c := newClusterWith(t, [][]int{{0}}, nil, nil, func(hc *Config) { hc.Persist = PersistConfig{Dir: dir, Every: 2} })
	r := &persistRig{t: t, c: c, h: c.hosts[0], sess: c.hosts[0].Session(0), dir: dir}
	r.h.SetD(2) // the launcher committed 2 before this host opened the store
	r.call(protect.TypeProtectHello, `{"v":1,"regions":[{"name":"optimizer","size":12288},{"name":"meta","size":100}]}`)
	r.durableWhen("the store open", func(d *DurableProgress) bool { return true })
	// The host's directory is its own (no manifest): the store starts
	// from the watermark the host applied, or has it applied once the
	// host's commit record is written.
	s := r.h.svc(0)
	var markers []int64
	r.c.waitFor("the markers from 2 on", func() bool {
		s.dur.mu.Lock()
		defer s.dur.mu.Unlock()
		markers = slices.Clone(s.dur.markers)
		return slices.Equal(markers, []int64{2, 4})
	})
	l, err := durable.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range l.Ranks[0].Bases {
		if (b.State == durable.StateComplete || b.State == durable.StateCommitted) && b.Step < 2 {
			t.Fatalf("version %d kept after taking the store over at watermark 2", b.Step)
		}
	}
	r.checkLoad(4)
}

// TestDurableStoreLocked: a rank whose store another host still has open
// (the rank was moved here while its old host writes) has no store:
// its bases count as failed, training goes on, and it tries to open the
// store again at its next base; once the old host closed it, the rank's
// saves go on.
func TestDurableStoreLocked(t *testing.T) {
	dir := t.TempDir()
	regions := []durable.Region{{Name: "optimizer", Size: persistRegions[0].Size}, {Name: "meta", Size: persistRegions[1].Size}}
	old, err := durable.Open(dir, 0, regions, durable.Options{Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	r := newPersistRig(t, PersistConfig{Dir: dir, Every: 2, Concurrency: 1})
	d := r.durableWhen("the store refused", func(d *DurableProgress) bool { return d.Off != "" })
	if !strings.Contains(d.Off, "open elsewhere") {
		t.Fatalf("the rank's store is off for another reason: %q", d.Off)
	}
	r.step(0)
	r.step(1)
	r.step(2)
	r.durableWhen("two bases failed", func(d *DurableProgress) bool { return d.Failed == 2 })
	p := &r.h.svc(0).dur
	r.c.waitFor("the retries to open the store", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.reopening
	})
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	r.step(3)
	r.step(4) // fails too, and has the store opened again
	r.durableWhen("the store open", func(d *DurableProgress) bool { return d.Off == "" && d.N == 1 })
	r.steps(5, 6, 2)
	d = r.durableWhen("the save of step 6", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{6}) })
	if d.Saves != 1 || d.Failed != 3 {
		t.Fatalf("durable progress %+v: want 1 save, 3 failed", d)
	}
	r.checkLoad(6)
}

// TestDurableTakeoverOwnMarkers: a rank taking its store over reports the
// markers of its own versions only, each naming the version the store
// holds: a marker left naming another version (here step 2's, pointing
// at another base file) is not reported, so the launcher never commits
// a step by it.
func TestDurableTakeoverOwnMarkers(t *testing.T) {
	dir := t.TempDir()
	regions := []durable.Region{{Name: "optimizer", Size: persistRegions[0].Size}, {Name: "meta", Size: persistRegions[1].Size}}
	st, err := durable.Open(dir, 0, regions, durable.Options{Concurrency: autoMaxConcurrency})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []int64{0, 2, 4} {
		src := [][]byte{pattern(step, 0, regions[0].Size), pattern(step, 1, regions[1].Size)}
		sums := []uint32{crc32c.Checksum(src[0]), crc32c.Checksum(src[1])}
		if err := st.Save(context.Background(), step, src, sums, nil); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	// done.2 becomes a copy of done.4 with step 2: it names base file
	// and version of step 4's, not what the rank holds of step 2.
	rd := filepath.Join(dir, "r0")
	m, err := os.ReadFile(filepath.Join(rd, "done.4"))
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(m[16:], 2)
	binary.LittleEndian.PutUint32(m[36:], crc32c.Checksum(m[:36]))
	if err := os.WriteFile(filepath.Join(rd, "done.2"), m, 0o600); err != nil {
		t.Fatal(err)
	}
	c := newClusterWith(t, [][]int{{0}}, nil, nil, func(hc *Config) { hc.Persist = PersistConfig{Dir: dir, Every: 2} })
	r := &persistRig{t: t, c: c, h: c.hosts[0], sess: c.hosts[0].Session(0), dir: dir}
	r.call(protect.TypeProtectHello, `{"v":1,"regions":[{"name":"optimizer","size":12288},{"name":"meta","size":100}]}`)
	r.durableWhen("the store open", func(d *DurableProgress) bool { return true })
	s := r.h.svc(0)
	s.dur.mu.Lock()
	markers := slices.Clone(s.dur.markers)
	s.dur.mu.Unlock()
	if !slices.Equal(markers, []int64{0, 4}) {
		t.Fatalf("markers %v after taking the store over, want [0 4] (done.2 names another version)", markers)
	}
}

// TestDurableLocalCommitFails: a host whose own directory's commit record
// cannot be written (here COMMITTED is a directory) reclaims nothing
// past the record it holds: the versions and markers before the new
// watermark stay, the record is tried again, and once it is written the
// reclaim follows.
func TestDurableLocalCommitFails(t *testing.T) {
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 2})
	r.steps(0, 4, 2)
	r.durableWhen("three markers", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{0, 2, 4}) })
	if err := durable.Commit(r.dir, 0); err != nil {
		t.Fatal(err)
	}
	committed := filepath.Join(r.dir, "COMMITTED")
	if err := os.Remove(committed); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(committed, 0o700); err != nil { // unwritable, even by root
		t.Fatal(err)
	}
	rounds := func() int {
		r.h.dur.mu.Lock()
		defer r.h.dur.mu.Unlock()
		return r.h.dur.rounds
	}
	r.h.SetD(2)
	r.c.waitFor("the host's loop to take the watermark up", func() bool { return rounds() >= 1 })
	if d := r.c.progress(0).Durable; !slices.Equal(d.Markers, []int64{0, 2, 4}) {
		t.Fatalf("markers %v after a commit record that failed, want [0 2 4]", d.Markers)
	}
	l, err := durable.List(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Ranks[0].Markers, []int64{0, 2, 4}) || !slices.ContainsFunc(l.Ranks[0].Bases, func(b durable.BaseFile) bool {
		return b.State == durable.StateComplete && b.Step == 0
	}) {
		t.Fatalf("after a commit record that failed: markers %v, bases %+v; want step 0 kept", l.Ranks[0].Markers, l.Ranks[0].Bases)
	}
	if err := os.Remove(committed); err != nil {
		t.Fatal(err)
	}
	r.durableWhen("the reclaim once the record is written", func(d *DurableProgress) bool { return slices.Equal(d.Markers, []int64{2, 4}) })
	if c, err := durable.ReadCommitted(r.dir); err != nil || c != 2 {
		t.Fatalf("the host's commit record: %d, %v; want 2", c, err)
	}
}

// TestDurableSlotReusedAfterHold: once a save has read its slot the hold
// ends and the next stage overwrites the slot while the save is still at
// work (its chunks written, with O_DIRECT or into the page cache; its
// table, its syncs and its header to come): what the save persists is
// still the step it was given, bit for bit. The save of step 0 is paused
// right after it read the slot; step 1 commits beside it, step 2 is
// staged into step 0's slot and filled, then the save goes on.
func TestDurableSlotReusedAfterHold(t *testing.T) {
	read, resume := make(chan struct{}), make(chan struct{})
	setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
		if step != 0 {
			return st.Save(ctx, step, src, sums, copied)
		}
		return st.Save(ctx, step, src, sums, func() {
			copied() // the hold ends once runSave sees it
			close(read)
			select {
			case <-resume:
			case <-ctx.Done(): // the test failed: the host closes
			}
		})
	})
	r := newPersistRig(t, PersistConfig{Every: 2, Concurrency: 1})
	st0 := r.stage(0)
	r.commit(0)
	<-read
	r.step(1)
	st2 := r.stage(2) // waits for the hold, then fills step 0's slot with step 2's bytes
	if st2.Slot != st0.Slot {
		t.Fatalf("step 2 was staged in slot %d, step 0 in %d: want the same slot", st2.Slot, st0.Slot)
	}
	close(resume)
	r.durableWhen("the save of step 0", func(d *DurableProgress) bool { return len(d.Markers) == 1 })
	r.checkLoad(0)
}

// TestDurableWaitThenPageCache: a stage that had to wait for a save's
// hold (the save's chunk writes slow, as on a slow disk or many ranks per
// disk) has the rank's next saves write through the page cache, whose
// copy ends the hold sooner (durable.Store.CopyWaited). The save of step
// 0 lets go of its slot only once the stage of step 2 waits for it.
func TestDurableWaitThenPageCache(t *testing.T) {
	var r *persistRig
	setSaveHook(t, func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error {
		if step != 0 {
			return st.Save(ctx, step, src, sums, copied)
		}
		return st.Save(ctx, step, src, sums, func() {
			// Slow writes: the copy ends once the stage of step 2 waits.
			r.c.waitFor("the stage of step 2 to wait for the save of step 0", func() bool { return r.h.svc(0).dur.waiting.Load() == 1 })
			copied()
		})
	})
	r = newPersistRig(t, PersistConfig{Every: 2, Concurrency: 1})
	st := r.h.svc(0).dur.store
	r.step(0)
	r.step(1)
	r.stage(2) // waits for the hold of step 0's slot
	r.c.waitFor("the save of step 0", r.h.svc(0).dur.idle)
	r.commit(2)
	r.durableWhen("the saves of steps 0 and 2", func(d *DurableProgress) bool { return len(d.Markers) == 2 })
	d := r.c.progress(0).Durable
	if d.HoldNS <= 0 {
		t.Fatalf("durable progress %+v: want a hold wait", d)
	}
	if direct, cached := st.Written(); direct != 1 || cached != 1 {
		t.Fatalf("%d saves written with O_DIRECT, %d through the page cache; want step 0's direct, step 2's (after the wait) cached", direct, cached)
	}
	r.checkLoad(0)
	r.checkLoad(2)
}
