package durable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestCrashAtEveryPoint kills the writer (a test hook stops Save at a
// named point and nothing more is written or cleaned up, as when the
// process dies) at every point of a save of step 20 by rank 1 of 2, both
// ranks having committed step 10. Then, with fresh stores on the
// directory, as after a restart: the commit record still names 10
// (unless both markers of 20 exist and the launcher committed), the
// committed version loads intact on both ranks, rank 1's step 20 either
// loads intact or is not there (never torn), Verify finds nothing wrong,
// and after Truncate to the committed step the job saves and commits 20
// again.
func TestCrashAtEveryPoint(t *testing.T) {
	points := []struct {
		point string
		arg   int64
	}{
		{"free", 0},       // before the header is made free
		{"chunk", 0},      // before the first chunk
		{"chunk", 3},      // between chunks
		{"chunk", 6},      // before the last chunk
		{"table", 0},      // every chunk written, the table not
		{"datasync", 0},   // before the data are synced
		{"header", 0},     // data synced, header not written
		{"headersync", 0}, // header written, not synced
		{"pointer", 0},    // header synced, pointer not moved
		{"latest.sync", 0},
		{"latest.rename", 0},
		{"marker", 0}, // pointer moved, marker not written
		{"marker.rename", 0},
		{"done", 0}, // marker written: between the markers and the commit record
	}
	for _, pt := range points {
		for _, launcherCommits := range []bool{false, true} {
			name := fmt.Sprintf("%s%d/commit=%v", pt.point, pt.arg, launcherCommits)
			t.Run(name, func(t *testing.T) {
				dir := newDir(t, 2)
				s0 := openTest(t, dir, 0, Options{Concurrency: 2, Writers: 3})
				s1 := openTest(t, dir, 1, Options{Concurrency: 2, Writers: 3})
				save(t, s0, 10)
				save(t, s1, 10)
				if err := Commit(dir, 10); err != nil {
					t.Fatal(err)
				}
				save(t, s0, 20)
				s1.hook = hookAt(pt.point, pt.arg, errCrash)
				src, sums := testData(testRegions, 1, 20)
				if err := s1.Save(context.Background(), 20, src, sums, nil); !errors.Is(err, errCrash) {
					t.Fatalf("Save with a crash at %s: %v", pt.point, err)
				}
				// The launcher commits only when every marker exists.
				m, err := Markers(dir, 2, 20)
				if err != nil {
					t.Fatal(err)
				}
				all := !slices.Contains(m, false)
				if all != (pt.point == "done") {
					t.Errorf("markers of step 20 after a crash at %s: %v", pt.point, m)
				}
				if all && launcherCommits {
					if err := Commit(dir, 20); err != nil {
						t.Fatal(err)
					}
				}
				s0.Close()
				s1.Close()

				// The restart.
				c, err := ReadCommitted(dir)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]int64{false: 10, true: 20}[all && launcherCommits]; c != want {
					t.Errorf("committed %d, want %d", c, want)
				}
				checkVerify(t, dir)
				checkLoad(t, dir, 0, c)
				checkLoad(t, dir, 1, c)
				dst := buffers(testRegions)
				switch err := Load(context.Background(), dir, 1, 20, dst); {
				case err == nil:
					checkLoad(t, dir, 1, 20) // whole, or not at all
				case !isNoVersion(err) || errors.Is(err, ErrCorrupt):
					t.Errorf("Load of the crashed step: %v, want it whole or ErrNoVersion", err)
				}
				s0 = openTest(t, dir, 0, Options{Concurrency: 2})
				s1 = openTest(t, dir, 1, Options{Concurrency: 2})
				for _, s := range []*Store{s0, s1} {
					if err := s.Truncate(c); err != nil {
						t.Fatal(err)
					}
				}
				if c == 10 {
					if m, _ := Markers(dir, 2, 20); slices.Contains(m, true) {
						t.Errorf("markers of step 20 survived Truncate(10): %v", m)
					}
					save(t, s0, 20)
					save(t, s1, 20)
					if err := Commit(dir, 20); err != nil {
						t.Fatal(err)
					}
				}
				checkLoad(t, dir, 0, 20)
				checkLoad(t, dir, 1, 20)
				checkVerify(t, dir)
			})
		}
	}
}
