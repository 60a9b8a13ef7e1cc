package ckpt

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
)

// concRegions are large enough that reading them takes a while beside
// the writer's commits.
var concRegions = []Region{
	{Name: "optimizer", Size: 256 << 10},
	{Name: "params", Size: 64<<10 + 3},
	{Name: "meta", Size: 40},
}

// TestConcurrentReader reads Newest over and over while a writer (a
// goroutine with its own mapping, or another process) stages and commits
// steps as fast as it can, and checks that no snapshot is ever torn: what
// Newest returns is exactly the bytes committed for its step, unless the
// snapshot stopped being Valid (the writer staged over it) while it was
// compared. Newest never goes backwards and never fails once a step is
// committed.
func TestConcurrentReader(t *testing.T) {
	steps := uint64(400)
	if testing.Short() {
		steps = 50
	}
	for _, mode := range []string{"goroutine", "process"} {
		t.Run(mode, func(t *testing.T) {
			w, opt := create(t, concRegions)
			r := reopen(t, opt)
			done := make(chan error, 1)
			switch mode {
			case "goroutine":
				go func() { done <- writeSteps(w, steps) }()
			case "process":
				h := startHelper(t, "writer", opt.Dir, strconv.FormatUint(steps, 10))
				go func() {
					l, err := h.out.ReadString('\n')
					if err == nil && l != "done\n" {
						err = fmt.Errorf("writer says %q", l)
					}
					if err == nil {
						err = h.cmd.Wait()
					}
					done <- err
				}()
			}
			expect := make([][]byte, len(concRegions))
			for i, rg := range concRegions {
				expect[i] = make([]byte, rg.Size)
			}
			var (
				last                  uint64
				reads, valid, changed int
				writerErr             error
			)
			// A failure stops the writer's slots being read, not the
			// writer: wait for it before the test's cleanup unmaps them.
			finished := false
			defer func() {
				if !finished {
					<-done
				}
			}()
			for !finished {
				select {
				case writerErr = <-done:
					finished = true // one more read, of the final step
				default:
				}
				sn, err := r.Newest()
				if errors.Is(err, ErrEmpty) && last == 0 || errors.Is(err, ErrOutrun) && !finished {
					// Nothing committed yet; or this writer, which no
					// overwrite rule holds back, outran the reader (on a
					// loaded machine): read again.
					continue
				}
				if err != nil {
					t.Fatalf("Newest after step %d: %v", last, err)
				}
				reads++
				if sn.Step < last {
					t.Fatalf("Newest went back from step %d to %d", last, sn.Step)
				}
				if sn.Fallback != nil {
					t.Fatalf("Newest fell back: %v", sn.Fallback)
				}
				last = sn.Step
				same := true
				for i, v := range sn.Views() {
					fill(sn.Step, i, expect[i])
					same = same && bytes.Equal(v, expect[i])
				}
				switch ok := sn.Valid(); {
				case !same && ok:
					t.Fatalf("step %d's snapshot is torn: its bytes differ, and it is still valid", sn.Step)
				case ok:
					valid++
				default:
					changed++
				}
			}
			if writerErr != nil {
				t.Fatalf("writer: %v", writerErr)
			}
			if last != steps {
				t.Fatalf("the last read saw step %d, want %d", last, steps)
			}
			t.Logf("%d reads: %d verified and still valid, %d overwritten while compared; Newest read %d slots again",
				reads, valid, changed, r.rereads.Load())
		})
	}
}

// TestReadBetweenHeaderReads moves a writer on between a reader's reads
// of the two slots' headers: step 3 is being staged into slot 0 when the
// reader reads it, and by the time it reads slot 1 the writer has
// committed step 3 and is staging step 4 there. Neither slot looked
// committed, but one always was: Newest and At(3) must read again and
// return step 3, not report that nothing (or not step 3) was committed
// (CI once saw Newest do that).
func TestReadBetweenHeaderReads(t *testing.T) {
	for _, tc := range []struct {
		name string
		read func(*Slots) (*Snapshot, error)
	}{
		{"Newest", (*Slots).Newest},
		{"At", func(s *Slots) (*Snapshot, error) { return s.At(3) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, opt := create(t, testRegions)
			r := reopen(t, opt)
			commit(t, w, 1)
			commit(t, w, 2)
			third, err := w.Stage(3) // into slot 0; slot 1 holds step 2
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range third.Views() {
				fill(3, i, v)
			}
			moved := false
			testReadHook = func(slot int) {
				if slot == 0 && !moved {
					moved = true
					if err := third.Commit(); err != nil {
						t.Error(err)
					}
					if _, err := w.Stage(4); err != nil { // into slot 1, left staging
						t.Error(err)
					}
				}
			}
			defer func() { testReadHook = nil }()
			sn, err := tc.read(r)
			if !moved {
				t.Fatal("the hook never ran")
			}
			if err != nil {
				t.Fatalf("%s: %v, want step 3", tc.name, err)
			}
			if sn.Step != 3 || !sn.Valid() {
				t.Fatalf("%s: step %d (valid %v), want step 3", tc.name, sn.Step, sn.Valid())
			}
			for i, v := range sn.Views() {
				if !bytes.Equal(v, want(3, i, int64(len(v)))) {
					t.Fatalf("region %d of step 3 differs", i)
				}
			}
		})
	}
}

// TestConcurrentUse runs Stage/Commit, Newest, Committed and Regions from
// several goroutines on one Slots (for the race detector), then Close
// beside them.
func TestConcurrentUse(t *testing.T) {
	s, _ := create(t, testRegions)
	var wg sync.WaitGroup
	const n = 50
	wg.Go(func() {
		for step := uint64(1); step <= n; step++ {
			st, err := s.Stage(step)
			if err != nil {
				t.Error(err)
				return
			}
			for i, v := range st.Views() {
				fill(step, i, v)
			}
			if err := st.Commit(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 3 {
		wg.Go(func() {
			for range n {
				if sn, err := s.Newest(); err == nil {
					sn.Valid()
				} else if !errors.Is(err, ErrEmpty) {
					t.Error(err)
				}
				s.Committed()
				s.Regions()
			}
		})
	}
	wg.Wait()
	checkNewest(t, s, n, 1, false)
	var cg sync.WaitGroup
	for range 4 {
		cg.Go(func() {
			for range 20 {
				s.Newest()
				s.Committed()
			}
		})
	}
	cg.Go(func() { s.Close() })
	cg.Wait()
}
