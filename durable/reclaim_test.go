package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
)

// diffRecord is the test's differential of (rank, step).
func diffRecord(rank int, step int64) []byte {
	return fmt.Appendf(nil, "rank %d step %d %s", rank, step, bytes.Repeat([]byte{byte(step)}, int(step%7)))
}

// TestReclaimProperty runs random sequences of training steps, batches
// of differentials, saves, commits and reclamations on two ranks, and
// after every operation checks what a recovery at the commit record
// needs: each rank's version of the committed step loads intact, and
// every differential after it, up to the newest batched, reads back
// contiguous and intact.
func TestReclaimProperty(t *testing.T) {
	seeds := 24
	if testing.Short() {
		seeds = 4
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(seed), 7))
			const world = 2
			dir := newDir(t, world)
			var stores [world]*Store
			for rank := range world {
				stores[rank] = openTest(t, dir, rank, Options{Concurrency: 1 + r.IntN(2), Writers: 2})
			}
			var (
				cur       int64 = 1 // the training step
				batched   [world]int64
				saved     []int64 // steps saved by some rank
				committed int64   = -1
			)
			for op := range 150 {
				var what string
				switch k := r.IntN(10); {
				case k < 4:
					cur++
					what = "train"
				case k < 6:
					rank := r.IntN(world)
					if batched[rank] < cur {
						var recs [][]byte
						for st := batched[rank] + 1; st <= cur; st++ {
							recs = append(recs, diffRecord(rank, st))
						}
						if err := AppendBatch(dir, rank, batched[rank]+1, cur, recs); err != nil {
							t.Fatal(err)
						}
						batched[rank] = cur
					}
					what = fmt.Sprintf("batch rank %d to %d", rank, cur)
				case k < 8:
					for rank := range world {
						src, sums := testData(testRegions, rank, cur)
						err := stores[rank].Save(context.Background(), cur, src, sums, nil)
						if err != nil && !errors.Is(err, ErrBusy) {
							t.Fatalf("op %d: Save(%d): %v", op, cur, err)
						}
					}
					if !slices.Contains(saved, cur) {
						saved = append(saved, cur)
					}
					what = fmt.Sprintf("save %d", cur)
				case k < 9:
					// The launcher commits the newest step every rank
					// has marked.
					for _, st := range slices.Backward(saved) {
						m, err := Markers(dir, world, st)
						if err != nil {
							t.Fatal(err)
						}
						if st > committed && !slices.Contains(m, false) {
							if err := Commit(dir, st); err != nil {
								t.Fatal(err)
							}
							committed = st
							break
						}
					}
					what = fmt.Sprintf("commit → %d", committed)
				default:
					if committed >= 0 {
						rank := r.IntN(world)
						if _, err := stores[rank].Reclaim(committed); err != nil {
							t.Fatalf("op %d: rank %d: Reclaim(%d): %v", op, rank, committed, err)
						}
					}
					what = fmt.Sprintf("reclaim %d", committed)
				}
				if committed < 0 {
					continue
				}
				if c, err := ReadCommitted(dir); err != nil || c != committed {
					t.Fatalf("op %d (%s): ReadCommitted = %d, %v; want %d", op, what, c, err, committed)
				}
				for rank := range world {
					checkLoad(t, dir, rank, committed)
					recs, stop := readBatches(dir, rank, committed)
					if stop != nil {
						t.Fatalf("op %d (%s): rank %d: ScanBatches(%d) stopped: %v", op, what, rank, committed, stop)
					}
					want := max(0, batched[rank]-committed)
					if int64(len(recs)) != want {
						t.Fatalf("op %d (%s): rank %d: %d records after the committed step %d, want %d (batched to %d)",
							op, what, rank, len(recs), committed, want, batched[rank])
					}
					for i, rec := range recs {
						st := committed + 1 + int64(i)
						if rec.Step != st || !bytes.Equal(rec.Data, diffRecord(rank, st)) {
							t.Fatalf("op %d (%s): rank %d: record %d is of step %d or wrong, want step %d", op, what, rank, i, rec.Step, st)
						}
					}
				}
			}
			checkVerify(t, dir)
		})
	}
}

// TestReclaim checks what one Reclaim removes and keeps.
func TestReclaim(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{Concurrency: 3})
	for _, st := range []int64{10, 20, 30} {
		save(t, s, st)
	}
	for _, b := range [][2]int64{{1, 10}, {11, 15}, {16, 22}, {23, 30}} {
		var recs [][]byte
		for st := b[0]; st <= b[1]; st++ {
			recs = append(recs, diffRecord(0, st))
		}
		if err := AppendBatch(dir, 0, b[0], b[1], recs); err != nil {
			t.Fatal(err)
		}
	}
	if err := Commit(dir, 20); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reclaim(25); !isNoVersion(err) {
		t.Errorf("Reclaim of a step the rank does not hold: %v, want ErrNoVersion", err)
	}
	n, err := s.Reclaim(20)
	if n != 1 || err != nil {
		t.Fatalf("Reclaim(20) = %d, %v; want 1 file freed", n, err)
	}
	ls, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	rl := ls.Ranks[0]
	if !slices.Equal(rl.Markers, []int64{20, 30}) {
		t.Errorf("markers after Reclaim(20): %v, want [20 30]", rl.Markers)
	}
	var batches [][2]int64
	for _, b := range rl.Batches {
		batches = append(batches, [2]int64{b.First, b.Last})
	}
	if !slices.Equal(batches, [][2]int64{{16, 22}, {23, 30}}) {
		t.Errorf("batches after Reclaim(20): %v, want [16-22 23-30]", batches)
	}
	var states []string
	for _, b := range rl.Bases {
		states = append(states, fmt.Sprintf("%v:%d", b.State, b.Step))
	}
	slices.Sort(states)
	if want := []string{"committed:20", "complete:30", "free:0", "free:0"}; !slices.Equal(states, want) {
		t.Errorf("base files after Reclaim(20): %v, want %v", states, want)
	}
	checkLoad(t, dir, 0, 20)
	checkLoad(t, dir, 0, 30)
	checkVerify(t, dir)
}

// TestTruncate: a resume at step 20 forgets what was written after it.
func TestTruncate(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{Concurrency: 3})
	for _, st := range []int64{10, 20, 30} {
		save(t, s, st)
	}
	for _, b := range [][2]int64{{11, 18}, {19, 24}, {25, 31}} {
		var recs [][]byte
		for st := b[0]; st <= b[1]; st++ {
			recs = append(recs, diffRecord(0, st))
		}
		if err := AppendBatch(dir, 0, b[0], b[1], recs); err != nil {
			t.Fatal(err)
		}
	}
	if err := Commit(dir, 10); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openTest(t, dir, 0, Options{Concurrency: 3})
	if err := s.Truncate(20); err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Latest(); !ok || v.Step != 20 {
		t.Errorf("Latest after Truncate(20) = %+v, want step 20", v)
	}
	if err := Load(context.Background(), dir, 0, 30, buffers(testRegions)); !isNoVersion(err) {
		t.Errorf("Load(30) after Truncate(20): %v, want ErrNoVersion", err)
	}
	if m, _ := Markers(dir, 1, 30); m[0] {
		t.Error("step 30's marker survived Truncate(20)")
	}
	recs, stop := readBatches(dir, 0, 10)
	if stop != nil || len(recs) != 10 || recs[len(recs)-1].Step != 20 {
		t.Errorf("ScanBatches after Truncate(20): %d records to step %d, %v; want 11 to 20", len(recs), recs[len(recs)-1].Step, stop)
	}
	checkLoad(t, dir, 0, 10)
	checkLoad(t, dir, 0, 20)
	checkVerify(t, dir)
	// The reopened store agrees, and saves after 20 again.
	s.Close()
	s = openTest(t, dir, 0, Options{Concurrency: 3})
	if v, ok := s.Latest(); !ok || v.Step != 20 {
		t.Errorf("Latest after reopening = %+v, want step 20", v)
	}
	save(t, s, 30)
	checkLoad(t, dir, 0, 30)
}

// TestReclaimDuringPublish: a Reclaim that runs while a save publishes
// its version (between the save's look at the watermark and its marker)
// never leaves a marker behind for a file it freed: the look and the
// marker are one step for Reclaim. The save of step 4 finishes after
// the version of step 8; Reclaim(8) starts when the save is about to
// move the pointer, and either runs whole before the save looks (which
// then frees its own file, unmarked) or waits until its marker is
// written (and then removes it, keeping the file the pointer names).
// Either way Verify finds every marker naming a version the rank holds.
func TestReclaimDuringPublish(t *testing.T) {
	dir := newDir(t, 1)
	s := openTest(t, dir, 0, Options{Concurrency: 2})
	save(t, s, 8)
	if err := Commit(dir, 8); err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	reclaimed := make(chan error, 1)
	atLock := make(chan struct{}, 1)
	s.hook = func(p string, _ int64) error {
		switch {
		case p == "reclaim.lock":
			atLock <- struct{}{}
		case p == "pointer" && armed.CompareAndSwap(true, false):
			go func() {
				_, err := s.Reclaim(8)
				reclaimed <- err
			}()
			// Reclaim either ran whole, or waits for this publish.
			select {
			case err := <-reclaimed:
				reclaimed <- err
			case <-atLock:
			}
		}
		return nil
	}
	armed.Store(true)
	src, sums := testData(testRegions, 0, 4)
	if err := s.Save(context.Background(), 4, src, sums, nil); err != nil {
		t.Fatalf("Save(4): %v", err)
	}
	if err := <-reclaimed; err != nil {
		t.Fatalf("Reclaim(8): %v", err)
	}
	checkVerify(t, dir)
	if m, _ := Markers(dir, 1, 4); m[0] {
		t.Error("step 4's marker outlived Reclaim(8)")
	}
	checkLoad(t, dir, 0, 8)
}
