package ckpt

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestClaimAndSweep(t *testing.T) {
	opt := Options{Dir: t.TempDir()}
	mk := func(job string, rank int) { makeSlots(t, opt, job, rank) }
	exists := func(job string) bool {
		_, err := os.Stat(filepath.Join(opt.Dir, hdrName(job, 0)))
		return err == nil
	}
	// live: claimed by two owners (two agents of one job sharing the
	// directory); dead: its lock file is there but nobody holds it;
	// legacy: no lock file at all.
	a, err := ClaimJob("live", opt)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ClaimJob("live", opt)
	if err != nil {
		t.Fatal(err)
	}
	mk("live", 0)
	d, err := ClaimJob("dead", opt)
	if err != nil {
		t.Fatal(err)
	}
	mk("dead", 0)
	d.f.Close() // as if its process died: the kernel drops the lock
	d.f = nil
	mk("legacy", 0)

	// Listed first, removing nothing.
	if jobs, err := Unclaimed(opt); err != nil || !slices.Equal(jobs, []string{"dead"}) {
		t.Fatalf("Unclaimed = %v, %v; want [dead]", jobs, err)
	}
	if !exists("live") || !exists("dead") || !exists("legacy") {
		t.Fatalf("after Unclaimed: live %v dead %v legacy %v; want all", exists("live"), exists("dead"), exists("legacy"))
	}

	swept, err := Sweep(opt)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(swept, []string{"dead"}) {
		t.Fatalf("swept %v, want [dead]", swept)
	}
	if !exists("live") || exists("dead") || !exists("legacy") {
		t.Fatalf("after the sweep: live %v dead %v legacy %v", exists("live"), exists("dead"), exists("legacy"))
	}
	if _, err := os.Stat(filepath.Join(opt.Dir, lockName("dead"))); !os.IsNotExist(err) {
		t.Fatalf("dead job's lock file: %v", err)
	}
	// The first owner to release leaves the files to the other.
	if last, err := a.Release(); err != nil || last {
		t.Fatalf("first Release = %v, %v; want not last", last, err)
	}
	if !exists("live") {
		t.Fatal("the first release removed files another owner uses")
	}
	if last, err := b.Release(); err != nil || !last {
		t.Fatalf("second Release = %v, %v; want last", last, err)
	}
	if exists("live") {
		t.Fatal("the last release left the job's files")
	}
	if _, err := os.Stat(filepath.Join(opt.Dir, lockName("live"))); !os.IsNotExist(err) {
		t.Fatalf("lock file after the last release: %v", err)
	}
	if last, err := b.Release(); last || err != nil {
		t.Fatalf("Release twice = %v, %v", last, err)
	}
}

func TestClaimBadJob(t *testing.T) {
	for _, job := range []string{"", "-a", "A", "a.b", "a/b"} {
		if _, err := ClaimJob(job, Options{Dir: t.TempDir()}); err == nil {
			t.Errorf("ClaimJob(%q) accepted", job)
		}
	}
}

// TestClaimUntrustedLockFile: a lock file others may write (another user
// could have made it) is neither claimed nor swept.
func TestClaimUntrustedLockFile(t *testing.T) {
	opt := Options{Dir: t.TempDir()}
	path := filepath.Join(opt.Dir, lockName("job1"))
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	s, err := Create("job1", 0, testRegions, opt)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := ClaimJob("job1", opt); err == nil {
		t.Fatal("claimed a job through a lock file writable by others")
	}
	if swept, err := Sweep(opt); err != nil || len(swept) != 0 {
		t.Fatalf("Sweep = %v, %v: swept through a lock file writable by others", swept, err)
	}
	if _, err := os.Stat(filepath.Join(opt.Dir, hdrName("job1", 0))); err != nil {
		t.Fatalf("the job's files: %v", err)
	}
}

// TestSweepJob: the sweep of one job (an agent ending) removes that job's
// files and lock file when nobody holds its lock (its holder died), keeps
// them while a claim is held, and leaves other jobs' alone, unclaimed
// ones too.
func TestSweepJob(t *testing.T) {
	for _, tc := range []struct {
		name      string
		held      bool // a live claim of the job besides the dead one
		wantSwept bool
	}{
		{"dead holder", false, true},
		{"live claim", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt := Options{Dir: t.TempDir()}
			mk := func(job string, rank int) { makeSlots(t, opt, job, rank) }
			exists := func(name string) bool {
				_, err := os.Lstat(filepath.Join(opt.Dir, name))
				return err == nil
			}
			dead := func(job string) {
				t.Helper()
				c, err := ClaimJob(job, opt)
				if err != nil {
					t.Fatal(err)
				}
				mk(job, 0)
				mk(job, 1)
				c.f.Close() // as if its process died: the kernel drops the lock
				c.f = nil
			}
			dead("job1")
			dead("job2") // another job, unclaimed too
			if tc.held {
				c, err := ClaimJob("job1", opt)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Release()
			}
			swept, err := SweepJob("job1", opt)
			if err != nil || swept != tc.wantSwept {
				t.Fatalf("SweepJob = %v, %v; want %v", swept, err, tc.wantSwept)
			}
			for _, name := range []string{lockName("job1"), hdrName("job1", 0), hdrName("job1", 1)} {
				if exists(name) == tc.wantSwept {
					t.Errorf("%s: there %v, want %v", name, exists(name), !tc.wantSwept)
				}
			}
			for _, name := range []string{lockName("job2"), hdrName("job2", 0), hdrName("job2", 1)} {
				if !exists(name) {
					t.Errorf("another job's %s was removed", name)
				}
			}
		})
	}
	if _, err := SweepJob("a.b", Options{Dir: t.TempDir()}); err == nil {
		t.Error("SweepJob accepted an invalid job id")
	}
}

// makeSlots creates rank's slot files of job in opt's directory and
// closes them, as an agent that made them and ended (or died) leaves them.
func makeSlots(t *testing.T, opt Options, job string, rank int) {
	t.Helper()
	s, err := Create(job, rank, testRegions, opt)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
