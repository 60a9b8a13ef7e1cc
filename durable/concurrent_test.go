package durable

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
)

// TestPointerOnlyMovesForward: a save that started first and finishes
// last (out of order) leaves the newer pointer alone, in memory and on
// disk.
func TestPointerOnlyMovesForward(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{Concurrency: 2})
	atPointer := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	s.hook = func(p string, _ int64) error {
		if p == "publish" {
			first := false
			once.Do(func() { first = true })
			if first { // the older save waits here until the newer is done
				close(atPointer)
				<-release
			}
		}
		return nil
	}
	older := make(chan error)
	go func() {
		src, sums := testData(testRegions, 0, 10)
		older <- s.Save(context.Background(), 10, src, sums, nil)
	}()
	<-atPointer
	save(t, s, 20) // started later: the newer version
	close(release)
	if err := <-older; err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Latest(); !ok || v.Step != 20 {
		t.Errorf("Latest = %+v; the late older save moved the pointer back from step 20", v)
	}
	b, err := readSmall(filepath.Join(rankDir(dir, 0), latestName), ptrSize)
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePointer(b, magicPointer, 0, "LATEST")
	if err != nil || p.step != 20 {
		t.Errorf("LATEST on disk names step %d (%v), want 20", p.step, err)
	}
	// Both versions are complete and marked.
	checkLoad(t, dir, 0, 10)
	checkLoad(t, dir, 0, 20)
	checkVerify(t, dir)
}

// TestConcurrentSaves runs many saves at once, finishing in random
// order, with reclamation beside them; the pointer always names the
// newest complete version (run it with -race).
func TestConcurrentSaves(t *testing.T) {
	dir := newDir(t, 1)
	const n = 4
	s := openTest(t, dir, 0, Options{Concurrency: n, Writers: 2})
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(1, 2))
	// The hook shuffles the saves: each waits at a random point for a
	// random other save to pass a point (no sleeping).
	gate := make(chan struct{}, 1)
	s.hook = func(p string, _ int64) error {
		mu.Lock()
		wait := r.IntN(3) == 0
		mu.Unlock()
		if wait {
			select {
			case <-gate:
			default:
			}
		} else {
			select {
			case gate <- struct{}{}:
			default:
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	var step int64
	var stepMu sync.Mutex
	for w := range n {
		wg.Go(func() {
			for range 25 {
				stepMu.Lock()
				step++
				st := step
				stepMu.Unlock()
				src, sums := testData(testRegions, 0, st)
				err := s.Save(context.Background(), st, src, sums, nil)
				if err != nil && !errors.Is(err, ErrBusy) {
					t.Errorf("worker %d: Save(%d): %v", w, st, err)
				}
				// Keep files free: reclaim up to the newest complete
				// version (as the launcher would once it is committed).
				if v, ok := s.Latest(); ok {
					if _, err := s.Reclaim(v.Step); err != nil && !errors.Is(err, ErrNoVersion) {
						t.Errorf("Reclaim(%d): %v", v.Step, err)
					}
				}
				checkNewest(t, s)
			}
		})
	}
	wg.Wait()
	checkNewest(t, s)
	v, ok := s.Latest()
	if !ok {
		t.Fatal("no version at all")
	}
	s.Close()
	s = openTest(t, dir, 0, Options{Concurrency: n})
	if v2, ok := s.Latest(); !ok || v2 != v {
		t.Errorf("reopened: Latest = %+v, want %+v", v2, v)
	}
	checkLoad(t, dir, 0, v.Step)
	checkVerify(t, dir)
}

// checkNewest checks that the pointer names a version at least as new
// as every complete one.
func checkNewest(t *testing.T, s *Store) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, bf := range s.files {
		if bf.state == fsComplete && (!s.hasPtr || bf.version > s.ptr.version) {
			// A save between its header and its pointer move is fine:
			// its pointer move is to come.
			if !s.steps[bf.step] {
				t.Errorf("base.%d holds version %d, newer than the pointer's %d, and no save of it is in flight", bf.idx, bf.version, s.ptr.version)
			}
		}
	}
}
