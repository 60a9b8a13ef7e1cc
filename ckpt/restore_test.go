package ckpt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// checkAt checks that At(step) returns step in slot with its exact bytes
// and no Fallback.
func checkAt(t testing.TB, s *Slots, step uint64, slot int) *Snapshot {
	t.Helper()
	sn, err := s.At(step)
	if err != nil {
		t.Fatalf("At(%d): %v", step, err)
	}
	if sn.Step != step || sn.Slot != slot || sn.Fallback != nil {
		t.Fatalf("At(%d) is step %d in slot %d (Fallback %v), want slot %d", step, sn.Step, sn.Slot, sn.Fallback, slot)
	}
	for i, r := range s.Regions() {
		if got := sn.Region(r.Name); !bytes.Equal(got, want(step, i, r.Size)) {
			t.Fatalf("At(%d): region %q: bytes differ from what was committed", step, r.Name)
		}
	}
	if !sn.Valid() {
		t.Fatalf("At(%d): snapshot not Valid", step)
	}
	return sn
}

func TestAt(t *testing.T) {
	opt0 := stride(testRegions[0].Size) // slot 1's offset in optimizer's file
	for _, tc := range []struct {
		name    string
		commits []uint64
		setup   func(t *testing.T, s *Slots, opt Options)
		at      uint64
		slot    int    // the slot holding at, if found
		is      error  // nil: found
		msg     string // the error says
	}{
		{name: "newest", commits: []uint64{1, 2}, at: 2, slot: 1},
		{name: "older", commits: []uint64{1, 2}, at: 1, slot: 0},
		{name: "only one committed", commits: []uint64{4}, at: 4, slot: 0},
		{name: "after the newest", commits: []uint64{1, 2}, at: 3, is: ErrNoStep, msg: "step 3 (slot 0: step 1, slot 1: step 2)"},
		{name: "before the older", commits: []uint64{5, 6}, at: 4, is: ErrNoStep},
		{name: "step 0, none committed", at: 0, is: ErrNoStep, msg: "slot 0: empty, slot 1: empty"},
		{name: "none committed", at: 1, is: ErrNoStep},
		{name: "overwritten three commits ago", commits: []uint64{1, 2, 3}, at: 1, is: ErrNoStep},
		{name: "in the slot being staged", commits: []uint64{1, 2}, setup: func(t *testing.T, s *Slots, _ Options) {
			if _, err := s.Stage(3); err != nil {
				t.Fatal(err)
			}
		}, at: 1, is: ErrNoStep, msg: "slot 0: staging"},
		{name: "beside the slot being staged", commits: []uint64{1, 2}, setup: func(t *testing.T, s *Slots, _ Options) {
			if _, err := s.Stage(3); err != nil {
				t.Fatal(err)
			}
		}, at: 2, slot: 1},
		{name: "newest corrupt", commits: []uint64{1, 2}, setup: func(t *testing.T, _ *Slots, opt Options) {
			flipByte(t, opt, dataName(testJob, 0, "optimizer"), opt0+5)
		}, at: 2, is: ErrCorrupt, msg: `slot 1 (step 2): region "optimizer": CRC32C`},
		{name: "other slot corrupt, no fallback said", commits: []uint64{1, 2}, setup: func(t *testing.T, _ *Slots, opt Options) {
			flipByte(t, opt, dataName(testJob, 0, "optimizer"), opt0+5)
		}, at: 1, slot: 0},
		{name: "older corrupt", commits: []uint64{1, 2}, setup: func(t *testing.T, _ *Slots, opt Options) {
			flipByte(t, opt, dataName(testJob, 0, "meta"), 99)
		}, at: 1, is: ErrCorrupt, msg: `region "meta"`},
		{name: "header CRC", commits: []uint64{1, 2}, setup: func(t *testing.T, _ *Slots, opt Options) {
			editHeader(t, opt, func(b []byte) []byte { b[slotHdrOff+entOff] ^= 1; return b })
		}, at: 1, is: ErrCorrupt, msg: "header CRC32C"},
		{name: "both slots claim it", commits: []uint64{1, 2}, setup: func(t *testing.T, _ *Slots, opt Options) {
			editHeader(t, opt, func(b []byte) []byte {
				ne.PutUint64(b[slotHdrOff+8:], 2)
				fixSlotCRC(b, 0, len(testRegions))
				return b
			})
		}, at: 2, is: ErrCorrupt, msg: "both claim step 2"},
		{name: "unknown state word", commits: []uint64{1, 2}, setup: func(t *testing.T, _ *Slots, opt Options) {
			editHeader(t, opt, func(b []byte) []byte { b[slotHdrOff] ^= 1; return b })
		}, at: 1, is: ErrNoStep, msg: "slot 0: state 0x544d4f42"},
		{name: "closed", commits: []uint64{1}, setup: func(t *testing.T, s *Slots, _ Options) { s.Close() }, at: 1, is: errClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, opt := create(t, testRegions)
			for _, step := range tc.commits {
				commit(t, s, step)
			}
			if tc.setup != nil {
				tc.setup(t, s, opt)
			}
			for _, r := range []*Slots{s, reopen(t, opt)} {
				if r != s && tc.is == errClosed {
					r.Close()
				}
				if tc.is == nil {
					checkAt(t, r, tc.at, tc.slot)
					continue
				}
				sn, err := r.At(tc.at)
				if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) || sn != nil {
					t.Fatalf("At(%d) = %v, %v; want an error wrapping %v saying %q", tc.at, sn, err, tc.is, tc.msg)
				}
				if tc.is == ErrNoStep && errors.Is(err, ErrCorrupt) || tc.is == ErrCorrupt && errors.Is(err, ErrNoStep) {
					t.Fatalf("At(%d): %v wraps both ErrNoStep and ErrCorrupt", tc.at, err)
				}
			}
		})
	}
}

// TestAtConcurrent calls At on the steps Committed reports while a writer
// commits steps as fast as it can: At returns the exact bytes of the step
// asked for (unless the snapshot stopped being Valid while compared), or
// ErrNoStep once the step was overwritten, never ErrCorrupt.
func TestAtConcurrent(t *testing.T) {
	steps := uint64(300)
	if testing.Short() {
		steps = 50
	}
	w, opt := create(t, concRegions)
	r := reopen(t, opt)
	done := make(chan error, 1)
	go func() { done <- writeSteps(w, steps) }()
	expect := make([][]byte, len(concRegions))
	for i, rg := range concRegions {
		expect[i] = make([]byte, rg.Size)
	}
	var found, gone, changed int
	for finished := false; !finished; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("writer: %v", err)
			}
			finished = true
		default:
		}
		held, ok := r.Committed()
		for i := range 2 {
			if !ok[i] {
				continue
			}
			sn, err := r.At(held[i])
			if errors.Is(err, ErrNoStep) {
				gone++
				continue
			}
			if err != nil {
				t.Fatalf("At(%d): %v", held[i], err)
			}
			if sn.Step != held[i] || sn.Fallback != nil {
				t.Fatalf("At(%d) returned step %d (Fallback %v)", held[i], sn.Step, sn.Fallback)
			}
			same := true
			for j, v := range sn.Views() {
				fill(sn.Step, j, expect[j])
				same = same && bytes.Equal(v, expect[j])
			}
			switch valid := sn.Valid(); {
			case !same && valid:
				t.Fatalf("At(%d) is torn: its bytes differ, and it is still valid", sn.Step)
			case valid:
				found++
			default:
				changed++
			}
		}
	}
	checkAt(t, r, steps, int(steps-1)%2)
	checkAt(t, r, steps-1, int(steps)%2)
	t.Logf("At: %d verified, %d overwritten while compared, %d gone (ErrNoStep); %d reads again", found, changed, gone, r.rereads.Load())
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		commits []uint64
		after   uint64
		newest  uint64 // after Truncate, 0: ErrEmpty
		held    [2]uint64
		ok      [2]bool
		stage   uint64 // then staged, into slot stageTo
		stageTo int
	}{
		{name: "drop the newest", commits: []uint64{5, 6}, after: 5, newest: 5, held: [2]uint64{5, 0}, ok: [2]bool{true, false}, stage: 6, stageTo: 1},
		{name: "drop the newest, older in slot 1", commits: []uint64{5, 6, 7}, after: 6, newest: 6, held: [2]uint64{0, 6}, ok: [2]bool{false, true}, stage: 7, stageTo: 0},
		{name: "drop the newest, between the steps", commits: []uint64{5, 9}, after: 7, newest: 5, held: [2]uint64{5, 0}, ok: [2]bool{true, false}, stage: 8, stageTo: 1},
		{name: "drop both", commits: []uint64{5, 6}, after: 4, newest: 0, stage: 1, stageTo: 0},
		{name: "drop both, after 0", commits: []uint64{5, 6}, after: 0, newest: 0, stage: 1, stageTo: 0},
		{name: "at the newest: nothing", commits: []uint64{5, 6}, after: 6, newest: 6, held: [2]uint64{5, 6}, ok: [2]bool{true, true}, stage: 7, stageTo: 0},
		{name: "after the newest: nothing", commits: []uint64{5, 6}, after: 100, newest: 6, held: [2]uint64{5, 6}, ok: [2]bool{true, true}, stage: 7, stageTo: 0},
		{name: "one committed, kept", commits: []uint64{5}, after: 5, newest: 5, held: [2]uint64{5, 0}, ok: [2]bool{true, false}, stage: 6, stageTo: 1},
		{name: "one committed, dropped", commits: []uint64{5}, after: 1, newest: 0, stage: 2, stageTo: 0},
		{name: "none committed", after: 0, newest: 0, stage: 1, stageTo: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, opt := create(t, testRegions)
			for _, step := range tc.commits {
				commit(t, s, step)
			}
			before, err := readHeader(opt)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Truncate(tc.after); err != nil {
				t.Fatal(err)
			}
			after, err := readHeader(opt)
			if err != nil {
				t.Fatal(err)
			}
			if len(tc.commits) == 0 || tc.after >= tc.commits[len(tc.commits)-1] {
				if !bytes.Equal(before, after) {
					t.Fatalf("Truncate(%d) with nothing after it changed the header", tc.after)
				}
			}
			for _, r := range []*Slots{s, reopen(t, opt)} {
				if held, ok := r.Committed(); held != tc.held || ok != tc.ok {
					t.Fatalf("Committed = %v %v, want %v %v", held, ok, tc.held, tc.ok)
				}
				if tc.newest == 0 {
					if _, err := r.Newest(); !errors.Is(err, ErrEmpty) {
						t.Fatalf("Newest: %v, want ErrEmpty", err)
					}
				} else {
					checkNewest(t, r, tc.newest, -1, false)
				}
				for _, step := range tc.commits[max(0, len(tc.commits)-2):] { // the steps held
					_, err := r.At(step)
					if kept := step <= tc.after; kept != (err == nil) || !kept && !errors.Is(err, ErrNoStep) {
						t.Fatalf("At(%d) after Truncate(%d): %v", step, tc.after, err)
					}
				}
			}
			// The next step goes to the slot not holding the kept
			// newest, which stays intact.
			st, err := s.Stage(tc.stage)
			if err != nil {
				t.Fatalf("Stage(%d): %v", tc.stage, err)
			}
			if st.Slot() != tc.stageTo {
				t.Fatalf("Stage(%d) went to slot %d, want %d", tc.stage, st.Slot(), tc.stageTo)
			}
			for i, v := range st.Views() {
				fill(tc.stage, i, v)
			}
			if tc.newest != 0 {
				checkAt(t, s, tc.newest, 1-tc.stageTo)
			}
			if err := st.Commit(); err != nil {
				t.Fatal(err)
			}
			checkNewest(t, reopen(t, opt), tc.stage, tc.stageTo, false)
			if tc.newest != 0 {
				checkAt(t, s, tc.newest, 1-tc.stageTo)
			}
		})
	}
}

// readHeader returns the header file of testJob's rank 0.
func readHeader(opt Options) ([]byte, error) {
	return os.ReadFile(filepath.Join(opt.Dir, hdrName(testJob, 0)))
}

// TestTruncateStaged checks that Truncate abandons a Staged in flight,
// whatever its step, and that Truncate of a closed Slots fails.
func TestTruncateStaged(t *testing.T) {
	for _, after := range []uint64{0, 1, 2, 3, 100} {
		s, opt := create(t, testRegions)
		commit(t, s, 1)
		commit(t, s, 2)
		st, err := s.Stage(3)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Truncate(after); err != nil {
			t.Fatal(err)
		}
		if err := st.Commit(); err == nil || !strings.Contains(err.Error(), "abandoned") {
			t.Fatalf("Commit of step 3 after Truncate(%d): %v, want abandoned", after, err)
		}
		next := min(after, 2) + 1 // the step after the newest kept
		commit(t, s, next)
		checkNewest(t, reopen(t, opt), next, -1, false)
		s.Close()
		if err := s.Truncate(after); !errors.Is(err, errClosed) {
			t.Fatalf("Truncate of closed slots: %v", err)
		}
	}
}

// TestTruncateConcurrent runs Truncate beside At, Newest and Committed
// (for the race detector, and the readers' re-read when a slot they
// verify is truncated under them).
func TestTruncateConcurrent(t *testing.T) {
	s, _ := create(t, concRegions)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Newest(); err != nil && !errors.Is(err, ErrEmpty) {
					t.Error(err)
					return
				}
				held, ok := s.Committed()
				for i := range 2 {
					if ok[i] {
						if _, err := s.At(held[i]); err != nil && !errors.Is(err, ErrNoStep) {
							t.Error(err)
							return
						}
					}
				}
			}
		})
	}
	for step := uint64(1); step <= 61; step++ {
		commit(t, s, step)
		if step%3 == 0 {
			if err := s.Truncate(step - 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	checkNewest(t, s, 61, -1, false)
}
