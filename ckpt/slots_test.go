package ckpt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	sixteen := make([]Region, maxRegions)
	for i := range sixteen {
		sixteen[i] = Region{Name: fmt.Sprintf("r%02d_x-%d", i, i), Size: int64(1 + 517*i)}
	}
	for _, tc := range []struct {
		name    string
		regions []Region
	}{
		{"usual", testRegions},
		{"one page", []Region{{"params", 4096}}},
		{"one byte", []Region{{"meta", 1}}},
		{"only empty", []Region{{"empty", 0}}},
		{"sixteen regions", sixteen},
		{"long name", []Region{{strings.Repeat("a", 32), 4097}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, opt := create(t, tc.regions)
			if got := s.Regions(); !slices.Equal(got, tc.regions) {
				t.Fatalf("Regions() = %v, want %v", got, tc.regions)
			}
			if _, err := s.Newest(); !errors.Is(err, ErrEmpty) {
				t.Fatalf("Newest of new slots: %v, want ErrEmpty", err)
			}
			if steps, ok := s.Committed(); ok != [2]bool{} || steps != [2]uint64{} {
				t.Fatalf("Committed of new slots = %v %v", steps, ok)
			}
			// The slots alternate, starting with 0, and each commit is
			// the newest; the other slot keeps the step before.
			for i, step := range []uint64{0, 1, 2, 10, 11, 1 << 40} {
				st, err := s.Stage(step)
				if err != nil {
					t.Fatalf("Stage(%d): %v", step, err)
				}
				if st.Slot() != i%2 || st.Step() != step {
					t.Fatalf("step %d staged in slot %d as step %d, want slot %d", step, st.Slot(), st.Step(), i%2)
				}
				for j, r := range tc.regions {
					v := st.Region(r.Name)
					if int64(len(v)) != r.Size || int64(cap(v)) != r.Size {
						t.Fatalf("view of %q: len %d cap %d, want %d", r.Name, len(v), cap(v), r.Size)
					}
					fill(step, j, v)
				}
				if err := st.Commit(); err != nil {
					t.Fatal(err)
				}
				checkNewest(t, s, step, i%2, false)
				// Another mapping (as the agent's) sees the same.
				checkNewest(t, reopen(t, opt), step, i%2, false)
				steps, ok := s.Committed()
				if !ok[i%2] || steps[i%2] != step {
					t.Fatalf("Committed = %v %v after step %d in slot %d", steps, ok, step, i%2)
				}
				if i > 0 {
					prev := []uint64{0, 1, 2, 10, 11}[i-1]
					if !ok[1-i%2] || steps[1-i%2] != prev {
						t.Fatalf("Committed = %v %v, want step %d kept in slot %d", steps, ok, prev, 1-i%2)
					}
				}
			}
		})
	}
}

func TestStepsIncrease(t *testing.T) {
	s, _ := create(t, testRegions)
	commit(t, s, 5)
	commit(t, s, 7)
	for _, tc := range []struct {
		step uint64
		ok   bool
	}{{0, false}, {5, false}, {6, false}, {7, false}, {8, true}, {1 << 63, true}} {
		st, err := s.Stage(tc.step)
		if (err == nil) != tc.ok {
			t.Errorf("Stage(%d) after step 7: err %v, want ok %v", tc.step, err, tc.ok)
		}
		if err == nil && st.Slot() != 0 {
			t.Errorf("Stage(%d) in slot %d, want slot 0 (holding step 5)", tc.step, st.Slot())
		}
	}
	// The Stages above were abandoned: 7 is still the newest.
	checkNewest(t, s, 7, 1, false)
}

func TestStagedMisuse(t *testing.T) {
	s, opt := create(t, testRegions)
	commit(t, s, 1)
	st, err := s.Stage(2)
	if err != nil {
		t.Fatal(err)
	}
	if st.Region("nosuch") != nil {
		t.Error("Region of an unknown name is not nil")
	}
	st2, err := s.Stage(3) // abandons st
	if err != nil {
		t.Fatal(err)
	}
	if st2.Slot() != st.Slot() {
		t.Errorf("restaging used slot %d, want %d again", st2.Slot(), st.Slot())
	}
	if err := st.Commit(); err == nil {
		t.Error("Commit of an abandoned Staged succeeded")
	}
	for i, v := range st2.Views() {
		fill(3, i, v)
	}
	if err := st2.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := st2.Commit(); err == nil {
		t.Error("second Commit succeeded")
	}
	sn := checkNewest(t, s, 3, 1, false)
	if sn.Region("nosuch") != nil {
		t.Error("Snapshot.Region of an unknown name is not nil")
	}
	if !sn.Valid() {
		t.Error("snapshot of the newest step is not Valid")
	}
	commit(t, s, 4)
	if !sn.Valid() {
		t.Error("snapshot of step 3 not Valid once step 4 went into the other slot")
	}
	if _, err := s.Stage(5); err != nil {
		t.Fatal(err)
	}
	if sn.Valid() {
		t.Error("snapshot of step 3 still Valid with step 5 staged over it")
	}
	// Another writer's Stage under a Staged makes its Commit fail.
	other := reopen(t, opt)
	st3, err := s.Stage(6)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Stage(7); err != nil {
		t.Fatal(err)
	}
	if err := st3.Commit(); err == nil || !strings.Contains(err.Error(), "another writer") {
		t.Errorf("Commit under another writer's Stage: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Stage(8); !errors.Is(err, errClosed) {
		t.Errorf("Stage after Close: %v", err)
	}
	if _, err := s.Newest(); !errors.Is(err, errClosed) {
		t.Errorf("Newest after Close: %v", err)
	}
	if _, ok := s.Committed(); ok != [2]bool{} {
		t.Errorf("Committed after Close says %v", ok)
	}
	if sn.Valid() {
		t.Error("snapshot Valid after Close")
	}
}

// crashSteps are the crash tests' histories: the steps committed before
// the one that crashes.
var crashSteps = []struct {
	name  string
	steps []uint64
}{
	{"one committed", []uint64{1}},          // staging into the empty slot
	{"two committed", []uint64{1, 2}},       // overwriting step 1
	{"three committed", []uint64{1, 2, 3}},  // overwriting step 2 in slot 1
	{"after a gap", []uint64{4, 9, 17, 30}}, // steps need not be consecutive
}

// TestCrashAtEveryWrite stops the writer after each of the header writes
// of Stage and Commit in turn (and, with Stage done, after none, half and
// all of the regions' bytes), then maps the files afresh, as a restarted
// process, and checks that the newest step is the one committed before,
// with its exact bytes, and that the writer can carry on from there.
func TestCrashAtEveryWrite(t *testing.T) {
	n := len(testRegions)
	all := n + 4
	for _, h := range crashSteps {
		for k := 0; k <= all; k++ {
			data := []float64{1}
			switch {
			case k < 2:
				data = []float64{0} // Stage did not return
			case k == 2:
				data = []float64{0, 0.5, 1}
			}
			for _, frac := range data {
				t.Run(fmt.Sprintf("%s/writes=%d/data=%v", h.name, k, frac), func(t *testing.T) {
					s, opt := create(t, testRegions)
					for _, step := range h.steps {
						commit(t, s, step)
					}
					prev := h.steps[len(h.steps)-1]
					next := prev + 1
					target := len(h.steps) % 2
					testWriteHook = func(w int) bool { return w == k }
					defer func() { testWriteHook = nil }()
					st, err := s.Stage(next)
					if k < 2 {
						if !errors.Is(err, errStopped) {
							t.Fatalf("Stage: %v, want the hook's stop", err)
						}
					} else {
						if err != nil {
							t.Fatal(err)
						}
						for i, v := range st.Views() {
							fill(next, i, v[:int(frac*float64(len(v)))])
						}
						if frac == 1 {
							err := st.Commit()
							if k < all && !errors.Is(err, errStopped) || k == all && err != nil {
								t.Fatalf("Commit: %v", err)
							}
						}
					}
					testWriteHook = nil

					r := reopen(t, opt)
					newest, slot := prev, 1-target
					if k == all {
						newest, slot = next, target
					}
					sn := checkNewest(t, r, newest, slot, false)
					steps, ok := r.Committed()
					if k == all {
						if !ok[target] || steps[target] != next {
							t.Fatalf("Committed = %v %v, want step %d in slot %d", steps, ok, next, target)
						}
						return
					}
					// Once marked, the slot being written never looks
					// committed; before, it keeps what it had.
					if k >= 1 && ok[target] {
						t.Fatalf("slot %d, half written, says committed step %d", target, steps[target])
					}
					if k == 0 && len(h.steps) >= 2 && (!ok[target] || steps[target] != h.steps[len(h.steps)-2]) {
						t.Fatalf("slot %d, untouched, says %v %v", target, steps[target], ok[target])
					}
					// The restarted writer carries on.
					commit(t, r, next)
					checkNewest(t, r, next, target, false)
					if !sn.Valid() {
						t.Fatalf("step %d's snapshot is no longer valid after step %d committed", prev, next)
					}
				})
			}
		}
	}
}

// TestCrashProcess runs the writer in another process, SIGKILLs it at
// every point of the sequence (inside Stage and Commit, halfway through
// the regions' bytes, and after Commit), and checks in this process that
// the newest step is the last one committed, with its exact bytes.
func TestCrashProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	n := len(testRegions)
	var stops []string
	for k := range n + 4 {
		stops = append(stops, fmt.Sprintf("write=%d", k))
	}
	stops = append(stops, "data", "committed")
	for _, stop := range stops {
		t.Run(stop, func(t *testing.T) {
			s, opt := create(t, testRegions)
			commit(t, s, 1)
			commit(t, s, 2)
			h := startHelper(t, "stage", opt.Dir, stop)
			if got := h.line(t); got != stop {
				t.Fatalf("helper says %q, want %q", got, stop)
			}
			h.kill(t)
			if stop == "committed" {
				checkNewest(t, reopen(t, opt), 3, 0, false)
				return
			}
			r := reopen(t, opt)
			checkNewest(t, r, 2, 1, false)
			commit(t, r, 3)
			checkNewest(t, r, 3, 0, false)
		})
	}
}

// flipByte inverts the byte at off of file name in opt's directory.
func flipByte(t *testing.T, opt Options, name string, off int64) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(opt.Dir, name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestCorruptData flips bytes of the regions' data and checks that Newest
// falls back to the older slot, or fails with ErrCorrupt when neither
// verifies.
func TestCorruptData(t *testing.T) {
	opt0 := stride(testRegions[0].Size) // slot 1's offset in optimizer's file
	for _, tc := range []struct {
		name     string
		flips    []string // file:offset
		step     uint64   // 0: ErrCorrupt
		fallback bool
		errs     []string
	}{
		{"none", nil, 2, false, nil},
		{"newest optimizer first byte", []string{fmt.Sprintf("optimizer:%d", opt0)}, 1, true, []string{`slot 1 (step 2): region "optimizer": CRC32C`}},
		{"newest optimizer last byte", []string{fmt.Sprintf("optimizer:%d", opt0+testRegions[0].Size-1)}, 1, true, nil},
		{"newest meta", []string{"meta:4100"}, 1, true, []string{`region "meta"`}},
		{"newest params middle", []string{"params:18000"}, 1, true, nil},
		{"older only", []string{"params:5"}, 2, false, nil},
		{"padding after the region", []string{fmt.Sprintf("optimizer:%d", opt0+testRegions[0].Size)}, 2, false, nil},
		{"both", []string{"meta:0", "meta:4096"}, 0, false, []string{"slot 0 (step 1)", "slot 1 (step 2)"}},
		{"both, different regions", []string{"optimizer:17", "params:12288"}, 0, false, []string{`"optimizer"`, `"params"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, opt := create(t, testRegions)
			commit(t, s, 1)
			commit(t, s, 2)
			for _, f := range tc.flips {
				name, off, _ := strings.Cut(f, ":")
				var o int64
				fmt.Sscan(off, &o)
				flipByte(t, opt, dataName(testJob, 0, name), o)
			}
			for _, r := range []*Slots{s, reopen(t, opt)} {
				if tc.step == 0 {
					_, err := r.Newest()
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("Newest: %v, want ErrCorrupt", err)
					}
					for _, w := range tc.errs {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("error %q does not say %q", err, w)
						}
					}
					continue
				}
				sn := checkNewest(t, r, tc.step, int(tc.step-1)%2, tc.fallback)
				for _, w := range tc.errs {
					if !strings.Contains(sn.Fallback.Error(), w) {
						t.Errorf("Fallback %q does not say %q", sn.Fallback, w)
					}
				}
			}
		})
	}
}
