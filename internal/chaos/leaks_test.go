package chaos

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// gordumpFixture is one of internal/gordump's goroutine dumps (real
// gorun dumps: clean, and with a leaked launcher lane), shared rather
// than copied.
func gordumpFixture(name string) string {
	return filepath.Join("..", "gordump", "testdata", name)
}

// TestLauncherGoroutines reads the launcher's goroutine dump as checkLeaks
// does: gorun's goroutines left in it are leaks, each with its stack; a
// missing dump is one unless the harness killed the launcher.
func TestLauncherGoroutines(t *testing.T) {
	for _, tt := range []struct {
		name   string
		dump   string // a path, "" for none
		killed bool
		hung   string
		want   []string // what each leak says, in order
	}{
		{"clean", gordumpFixture("clean.txt"), false, "", nil},
		{"leaked", gordumpFixture("leaked.txt"), false, "", []string{"launcher.(*lane).run", "os/exec.(*Cmd).Wait"}},
		{"leaked, then killed", gordumpFixture("leaked.txt"), true, "", []string{"launcher.(*lane).run", "os/exec.(*Cmd).Wait"}},
		{"no dump", "", false, "", []string{"wrote no goroutine dump"}},
		{"no dump, SIGKILLed", "", true, "", nil},
		{"no dump, SIGQUIT", "", false, "gorun ran past 3m0s", nil},
		{"not a dump", filepath.Join("testdata", "mpisteps.c"), false, "", []string{"not a goroutine dump"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := &Job{Goroutines: filepath.Join("testdata", "absent"), killed: tt.killed, hung: tt.hung}
			if tt.dump != "" {
				j.Goroutines = tt.dump
			}
			got := launcherGoroutines(j)
			if len(got) != len(tt.want) {
				t.Fatalf("%d leaks, want %d: %q", len(got), len(tt.want), got)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("leak %d is %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

// TestLeakMPICHFiles: an MPICH segment file that appeared while the job
// ran and that no process uses is a leak, and is removed; one there
// before the job started, one in use (open here), and other names are
// not the job's leaks and stay. When every agent of the job was killed
// (toClean), the unused new one is not a leak but left for gorun clean.
func TestLeakMPICHFiles(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-time.Hour) // past the sweep's minimum age
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
		return p
	}
	before := mk("mpich_shar_tmpBefor1")
	j := &Job{mpichBefore: mpichFiles(dir)}
	if !j.mpichBefore["mpich_shar_tmpBefor1"] || len(j.mpichBefore) != 1 {
		t.Fatalf("the files before: %v", j.mpichBefore)
	}
	leaked := mk("mpich_shar_tmpLeak01")
	live := mk("mpich_shar_tmpLive01")
	f, err := os.Open(live)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	other := mk("other_shar_tmp12345")

	leaks, left := mpichLeaks(j, dir, true)
	if len(leaks) != 0 || !slices.Equal(left, []string{leaked}) {
		t.Errorf("every agent killed: leaks %q, left %q; want none and %s", leaks, left, leaked)
	}
	leaks, left = mpichLeaks(j, dir, false)
	if len(leaks) != 1 || !strings.Contains(leaks[0], leaked) || len(left) != 0 {
		t.Errorf("leaks %q (left %q), want only %s", leaks, left, leaked)
	}
	if _, err := os.Stat(leaked); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the leaked file was not removed: %v", err)
	}
	for _, p := range []string{before, live, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%v (must stay)", err)
		}
	}
	if leaks, _ := mpichLeaks(j, dir, false); len(leaks) != 0 {
		t.Errorf("a second check: %q, want none", leaks)
	}
}

// TestCleanedMPICH: gorun clean's lines about MPICH files are the job's
// when they name a file left for it, another program's when they name a
// file there before the job, and leaks otherwise (the agents' end sweep
// should have removed it); other lines are passed on.
func TestCleanedMPICH(t *testing.T) {
	left := []string{"/dev/shm/mpich_shar_tmpLeft01"}
	before := map[string]bool{"mpich_shar_tmpBefor1": true}
	for _, tc := range []struct {
		line               string
		ours, leak, others bool
	}{
		{"removed MPICH shared-memory file /dev/shm/mpich_shar_tmpLeft01", true, false, false},
		{"removed MPICH shared-memory file /dev/shm/mpich_shar_tmpBefor1", false, false, true},
		{"removed MPICH shared-memory file /dev/shm/mpich_shar_tmpNew001", false, true, false},
		{"removed job directory /tmp/gorun-other-1.agent", false, false, true},
	} {
		ours, leaks, others := cleanedMPICH([]string{tc.line}, left, before)
		if (len(ours) == 1) != tc.ours || (len(leaks) == 1) != tc.leak || (len(others) == 1) != tc.others {
			t.Errorf("%q: ours %q, leaks %q, others %q", tc.line, ours, leaks, others)
		}
	}
}
