package durable

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
)

// TestAbandon checks what one Abandon frees and keeps.
func TestAbandon(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{Concurrency: 3})
	for _, st := range []int64{4, 8, 12} {
		save(t, s, st)
	}
	if err := Commit(dir, 4); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Reclaim(4); n != 0 || err != nil {
		t.Fatalf("Reclaim(4) = %d, %v; want nothing freed", n, err)
	}
	if n, err := s.Abandon(4, 12); n != 2 || err != nil {
		t.Fatalf("Abandon(4, 12) = %d, %v; want 2 files freed", n, err)
	}
	if vs := s.Versions(); len(vs) != 1 || vs[0].Step != 4 {
		t.Errorf("Versions after Abandon(4, 12) = %+v, want step 4 only", vs)
	}
	if v, ok := s.Latest(); !ok || v.Step != 4 {
		t.Errorf("Latest after Abandon(4, 12) = %+v, %v; want step 4 (the pointer named 12, freed)", v, ok)
	}
	ls, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rl := ls.Ranks[0]; !slices.Equal(rl.Markers, []int64{4}) || rl.Latest == nil || rl.Latest.Step != 4 {
		t.Errorf("on disk after Abandon(4, 12): markers %v, LATEST %+v; want [4] and step 4", rl.Markers, rl.Latest)
	}
	checkVerify(t, dir)
	checkLoad(t, dir, 0, 4)
	// A save of a step given up is freed at once, unmarked.
	src, sums := testData(testRegions, 0, 10)
	if err := s.Save(context.Background(), 10, src, sums, nil); err != nil {
		t.Fatalf("Save(10) after Abandon(4, 12): %v", err)
	}
	if vs := s.Versions(); len(vs) != 1 {
		t.Errorf("Versions after a save of a step given up: %+v, want step 4 only", vs)
	}
	if m, _ := Markers(dir, 1, 10); m[0] {
		t.Error("the save of step 10, given up, was marked")
	}
	save(t, s, 16)
	if v, ok := s.Latest(); !ok || v.Step != 16 {
		t.Errorf("Latest after Save(16) = %+v, %v; want step 16", v, ok)
	}
	if n, err := s.Abandon(4, 12); n != 0 || err != nil {
		t.Errorf("Abandon(4, 12) again = %d, %v; want nothing", n, err)
	}
	checkLoad(t, dir, 0, 16)
	checkVerify(t, dir)

	// Without a commit record, every version up to the step goes.
	dir = newDir(t, 1)
	s = openTest(t, dir, 0, Options{Concurrency: 2})
	save(t, s, 3)
	save(t, s, 7)
	if n, err := s.Abandon(-1, 5); n != 1 || err != nil {
		t.Fatalf("Abandon(-1, 5) = %d, %v; want 1 file freed", n, err)
	}
	if vs := s.Versions(); len(vs) != 1 || vs[0].Step != 7 {
		t.Errorf("Versions after Abandon(-1, 5) = %+v, want step 7 only", vs)
	}
	if n, err := s.Abandon(-1, -1); n != 0 || err != nil {
		t.Errorf("Abandon(-1, -1) = %d, %v; want nothing", n, err)
	}
	checkVerify(t, dir)
}

// jobModel plays the launcher's part of the protocol (package comment,
// "Committing and abandoning") over the stores of a job's ranks, from
// what their saves returned: each rank's reported markers and resolved
// step, X and the commit record. With abandon false it plays the
// protocol before Abandon: commit, then Reclaim only.
type jobModel struct {
	t       *testing.T
	dir     string
	stores  []*Store
	abandon bool

	mu        sync.Mutex
	markers   []map[int64]bool // by rank: the steps its saves reported a marker of
	inflight  []map[int64]bool // by rank: the steps of its saves not ended
	committed int64
	x         int64
}

func newJobModel(t *testing.T, dir string, stores []*Store, abandon bool) *jobModel {
	m := &jobModel{t: t, dir: dir, stores: stores, abandon: abandon, committed: -1, x: -1}
	for range stores {
		m.markers = append(m.markers, map[int64]bool{})
		m.inflight = append(m.inflight, map[int64]bool{})
	}
	return m
}

// start notes that rank's save of step began (the rank's service does
// it before the save takes a file).
func (m *jobModel) start(rank int, step int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inflight[rank][step] = true
}

// ended notes how rank's save of step ended: a marker reported if it
// succeeded, never if it failed, even if its marker reaches the disk
// later (a pending publish).
func (m *jobModel) ended(rank int, step int64, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.inflight[rank], step)
	// The rank drops what the watermark and X passed, as package
	// rank does (a save cannot end after them: it was in flight).
	if err == nil && step >= m.committed && (step > m.x || step == m.committed) {
		m.markers[rank][step] = true
	}
}

// save runs rank's save of step at once.
func (m *jobModel) save(rank int, step int64) error {
	m.start(rank, step)
	src, sums := testData(testRegions, rank, step)
	err := m.stores[rank].Save(context.Background(), step, src, sums, nil)
	m.ended(rank, step, err)
	return err
}

// resolved is rank's resolved step when its newest step is cur.
func (m *jobModel) resolved(rank int, cur int64) int64 {
	r := cur
	for st := range m.inflight[rank] {
		r = min(r, st-1)
	}
	return r
}

// decide is the launcher's turn at G = g: X, the commit, then every
// rank's Reclaim and Abandon.
func (m *jobModel) decide(g int64) {
	m.t.Helper()
	m.mu.Lock()
	x := g
	if m.abandon {
		for r := range m.stores {
			x = min(x, m.resolved(r, g))
		}
	}
	lo := max(m.committed, m.x)
	v := int64(-1)
	for st := range m.markers[0] {
		if st <= lo || st > x || st <= v {
			continue
		}
		all := true
		for r := range m.stores {
			all = all && m.markers[r][st]
		}
		if all {
			v = st
		}
	}
	m.mu.Unlock()
	if v >= 0 {
		if err := Commit(m.dir, v); err != nil {
			m.t.Fatal(err)
		}
	}
	m.mu.Lock()
	if v >= 0 {
		m.committed = v
	}
	if m.abandon {
		m.x = max(m.x, x, m.committed)
	}
	d, xp := m.committed, m.x
	for r := range m.stores {
		for st := range m.markers[r] {
			if st < d || m.abandon && st <= xp && st != d {
				delete(m.markers[r], st)
			}
		}
	}
	m.mu.Unlock()
	for r, s := range m.stores {
		if d >= 0 {
			if _, err := s.Reclaim(d); err != nil && !errors.Is(err, ErrNoVersion) {
				m.t.Logf("rank %d: Reclaim(%d): %v", r, d, err)
			}
		}
		if m.abandon {
			if _, err := s.Abandon(d, xp); err != nil {
				m.t.Logf("rank %d: Abandon(%d, %d): %v", r, d, xp, err)
			}
		}
	}
}

// check checks that the commit record is the model's and that every
// rank holds the committed version, intact.
func (m *jobModel) check(what string) {
	m.t.Helper()
	if m.committed < 0 {
		return
	}
	if c, err := ReadCommitted(m.dir); err != nil || c != m.committed {
		m.t.Fatalf("%s: the commit record is %d, %v; want %d", what, c, err, m.committed)
	}
	for r := range m.stores {
		checkLoad(m.t, m.dir, r, m.committed)
	}
}

// TestAbandonUnstalls plays the two ways the durable tier used to stall
// for good (the review of issue 17): the ranks' uncommitted versions
// share no step, so no commit ever frees them, and with every base file
// held a rank's saves all fail ErrBusy. With Abandon the commits go on;
// without (the protocol before it), they stop, which the test checks
// too, so that the scenarios keep exercising the stall.
func TestAbandonUnstalls(t *testing.T) {
	for _, abandon := range []bool{false, true} {
		t.Run(fmt.Sprintf("failed save/abandon=%v", abandon), func(t *testing.T) {
			// N = 1, two base files per rank; rank 1's save of step 12
			// fails (EIO): rank 0 holds 8 (committed) and 12, then rank
			// 1 holds 8 and 16, and no step is ever on both.
			dir := newDir(t, 2)
			stores := []*Store{openTest(t, dir, 0, Options{Concurrency: 1}), openTest(t, dir, 1, Options{Concurrency: 1})}
			m := newJobModel(t, dir, stores, abandon)
			var busy int
			for step := int64(0); step <= 28; step += 4 {
				if step == 12 {
					stores[1].hook = hookAt("chunk", 0, syscall.EIO)
				}
				for r := range stores {
					if err := m.save(r, step); errors.Is(err, ErrBusy) {
						busy++
					} else if err != nil && !(r == 1 && step == 12) {
						t.Fatalf("rank %d: Save(%d): %v", r, step, err)
					}
				}
				stores[1].hook = nil
				m.decide(step)
				m.check(fmt.Sprintf("step %d", step))
			}
			if !abandon {
				if m.committed != 8 || busy == 0 {
					t.Fatalf("without Abandon: committed %d, %d saves busy; the scenario no longer stalls at 8", m.committed, busy)
				}
				return
			}
			if m.committed != 28 {
				t.Fatalf("committed %d after step 28, want 28 (%d saves busy)", m.committed, busy)
			}
			checkVerify(t, dir)
		})
		t.Run(fmt.Sprintf("slow first save/abandon=%v", abandon), func(t *testing.T) {
			// Rank 0 (N = 4, five files) saves 0, 4, 8, 12 and 16 while
			// rank 1's first save (N = 1) is slow and its bases 4 to 16
			// are skipped: 0 commits, and rank 0 holds 4 to 16 for good.
			dir := newDir(t, 2)
			stores := []*Store{openTest(t, dir, 0, Options{Concurrency: 4}), openTest(t, dir, 1, Options{Concurrency: 1})}
			m := newJobModel(t, dir, stores, abandon)
			release := make(chan struct{})
			slow := make(chan error, 1)
			m.start(1, 0)
			go func() {
				src, sums := testData(testRegions, 1, 0)
				err := stores[1].Save(context.Background(), 0, src, sums, func() { <-release })
				m.ended(1, 0, err)
				slow <- err
			}()
			var busy int
			for step := int64(0); step <= 28; step += 4 {
				if step == 20 {
					close(release)
					if err := <-slow; err != nil {
						t.Fatalf("rank 1's slow Save(0): %v", err)
					}
				}
				if err := m.save(0, step); errors.Is(err, ErrBusy) {
					busy++
				} else if err != nil {
					t.Fatalf("rank 0: Save(%d): %v", step, err)
				}
				if step >= 20 {
					if err := m.save(1, step); errors.Is(err, ErrBusy) {
						busy++
					} else if err != nil {
						t.Fatalf("rank 1: Save(%d): %v", step, err)
					}
				}
				m.decide(step)
				m.check(fmt.Sprintf("step %d", step))
			}
			if !abandon {
				if m.committed != 0 || busy == 0 {
					t.Fatalf("without Abandon: committed %d, %d saves busy; the scenario no longer stalls at 0", m.committed, busy)
				}
				return
			}
			if m.committed != 28 {
				t.Fatalf("committed %d after step 28, want 28 (%d saves busy)", m.committed, busy)
			}
			checkVerify(t, dir)
		})
	}
}

// TestAbandonProperty runs random jobs: every rank's saves of each base
// step may fail (an I/O error anywhere, the marker's included), be
// skipped (N in flight, or no free file), or end in any order (each is
// held once it has read its source, and released at random), while the
// model launcher commits and publishes X and the ranks reclaim and
// abandon. After every step the commit record's version loads intact on
// every rank; after the faults stop, the commits catch up with the
// steps (nothing stays held for good); and Verify finds nothing wrong.
func TestAbandonProperty(t *testing.T) {
	seeds := 16
	if testing.Short() {
		seeds = 3
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(uint64(seed), 17))
			var rmu sync.Mutex // rnd, for the hooks too
			intn := func(n int) int { rmu.Lock(); defer rmu.Unlock(); return rnd.IntN(n) }
			world := 2 + intn(2)
			dir := newDir(t, world)
			stores := make([]*Store, world)
			ns := make([]int, world)
			for r := range stores {
				ns[r] = 1 + intn(3)
				stores[r] = openTest(t, dir, r, Options{Concurrency: ns[r], Writers: 1 + intn(2)})
				stores[r].hook = func(p string, _ int64) error {
					switch p {
					case "chunk", "table", "datasync", "header", "headersync", "marker.write", "marker.sync", "latest.write", "free":
						if intn(40) == 0 {
							return syscall.EIO
						}
					}
					return nil
				}
			}
			m := newJobModel(t, dir, stores, true)
			type flight struct {
				rank int
				step int64
				gate chan struct{}
				done chan error
			}
			var flights []*flight
			land := func(f *flight) {
				close(f.gate)
				if err := <-f.done; err != nil && !errors.Is(err, syscall.EIO) && !errors.Is(err, ErrBusy) {
					t.Fatalf("rank %d: Save(%d): %v", f.rank, f.step, err)
				}
			}
			const every, steps = 4, 30
			for i := range steps {
				step := int64(i * every)
				for r := range stores {
					n := 0
					for _, f := range flights {
						if f.rank == r {
							n++
						}
					}
					if n >= ns[r] || intn(8) == 0 {
						continue // skipped, as the rank's service skips
					}
					f := &flight{rank: r, step: step, gate: make(chan struct{}), done: make(chan error, 1)}
					m.start(r, step)
					go func() {
						src, sums := testData(testRegions, r, step)
						err := stores[r].Save(context.Background(), step, src, sums, func() { <-f.gate })
						m.ended(r, step, err)
						f.done <- err
					}()
					flights = append(flights, f)
				}
				// Some saves end, in any order.
				rmu.Lock()
				rnd.Shuffle(len(flights), func(i, j int) { flights[i], flights[j] = flights[j], flights[i] })
				rmu.Unlock()
				flights = slices.DeleteFunc(flights, func(f *flight) bool {
					if intn(3) == 0 {
						return false
					}
					land(f)
					return true
				})
				m.decide(step)
				m.check(fmt.Sprintf("step %d", step))
			}
			for _, f := range flights {
				land(f)
			}
			// The faults stop: within the steps a rank needs to have
			// its saves all complete again, every step commits.
			for _, s := range stores {
				s.hook = nil
			}
			last := int64(steps * every)
			m.decide(last - every)
			for i := range 4 {
				step := last + int64(i*every)
				for r := range stores {
					if err := m.save(r, step); err != nil {
						t.Fatalf("rank %d: Save(%d) once the faults stopped: %v", r, step, err)
					}
				}
				m.decide(step)
				m.check(fmt.Sprintf("step %d", step))
				if m.committed != step {
					t.Fatalf("committed %d at step %d, once the faults stopped", m.committed, step)
				}
			}
			checkVerify(t, dir)
			for r := range stores {
				if vs := stores[r].Versions(); len(vs) != 1 {
					t.Errorf("rank %d holds %+v, want the committed version only", r, vs)
				}
				ents, err := os.ReadDir(rankDir(dir, r))
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents {
					if step, ok := parseDone(e.Name()); ok && step != m.committed {
						t.Errorf("rank %d: marker %s left", r, filepath.Join(rankDir(dir, r), e.Name()))
					}
				}
			}
		})
	}
}
