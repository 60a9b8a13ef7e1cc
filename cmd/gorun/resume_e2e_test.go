package main

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/testcluster"
)

// End-to-end tests of gorun --resume (issue 17): the whole job, launcher,
// agents and ranks, SIGKILLed mid-run, then started again with the same
// command line and --resume, must end as a run without failure (exit 0,
// the same hashes): it resumes from the checkpoint directory, at the
// commit record's step (full mode) or past it by the differentials on
// disk (diff mode, lossless).

// resumeArgs are dptrain's flags in these tests: long enough (device time
// per step) for the commit record to move past a few bases before the
// kill, short enough to end within seconds after the resume.
var resumeArgs = []string{"--steps", "90", "--device-ms", "15"}

// resumingRE matches gorun's line saying where the job resumes from
// (launcher/resume.go), restoredRE dptrain's line about each rank's
// restore.
var (
	resumingRE = regexp.MustCompile(`(?m)^gorun: resuming from step (\d+)(?:, the committed version|: the committed version of step (\d+) and (\d+) differentials replayed on every rank)$`)
	restoredRE = regexp.MustCompile(`(?m)^\[(\d+)\] dptrain: rank \d+: restored step (\d+) from tier 1 `)
)

// killWhole SIGKILLs the job j on hosts: gorun itself, then every
// process in each namespace host (agents and ranks), so that nothing of
// it runs any more and nothing cleans up.
func killWhole(t *testing.T, j *job, hosts *testcluster.Hosts) {
	t.Helper()
	if err := j.cmd.Process.Kill(); err != nil {
		t.Fatalf("killing gorun: %v", err)
	}
	for h := range hosts.Names {
		if err := hosts.KillAll(h); err != nil {
			t.Fatalf("killing host %d: %v", h, err)
		}
	}
	<-j.done
	// Agents killed leave their job directories and slot files: removed
	// here (startProtectedJob's cleanup removes the slot files too).
	id := j.jobID()
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), "gorun-"+id+"-*"))
	for _, d := range left {
		os.RemoveAll(d)
	}
}

// waitCommitted waits until the commit record in dir is at step min or
// later and, with diff, every rank's differentials on disk reach diff
// steps past it; it fails if the job ends first. It returns the commit
// record's step.
func waitCommitted(t *testing.T, j *job, dir string, min int64, diff int64) int64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := durable.ReadCommitted(dir); err == nil && c >= min && reachAll(dir, c) >= c+diff {
			return c
		}
		select {
		case <-j.done:
			t.Fatalf("the job ended before it committed step %d (exit %d)\nstdout:\n%s\nstderr:\n%s", min, j.res.code, j.res.stdout, j.res.stderr)
		case <-time.After(5 * time.Millisecond):
		}
	}
	t.Fatalf("no commit record of step %d or later (with %d differentials after it) within 60 s", min, diff)
	return -1
}

// reachAll returns the least step every rank's state can be rebuilt at
// from dir with base c (-1 if the manifest cannot be read).
func reachAll(dir string, c int64) int64 {
	m, err := durable.ReadManifest(dir)
	if err != nil {
		return -1
	}
	least := int64(math.MaxInt64)
	for r, regions := range m.Regions {
		sp, _ := cascade.Reach(dir, r, regions, c)
		least = min(least, sp.To)
	}
	return least
}

func TestResumeAfterKill(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	ref := dptrainJob(t, hosts, nil, resumeArgs...)
	res := ref.wait(120 * time.Second)
	if res.code != 0 {
		t.Fatalf("run without failure: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	wantP, wantO := dptrainHashes(t, res)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"full", nil},
		{"diff raw", []string{"--protect-mode", "diff", "--diff-codec", "raw", "--diff-batch", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			flags := append([]string{"--ckpt-dir", dir, "--ckpt-every", "10"}, tc.flags...)
			args := append([]string{"--protect"}, resumeArgs...)
			j := dptrainJob(t, hosts, flags, args...)
			var diff int64
			if tc.flags != nil {
				diff = 3 // the differentials on disk go 3 steps past the base at least
			}
			committed := waitCommitted(t, j, dir, 30, diff)
			killWhole(t, j, hosts)
			if c, err := durable.ReadCommitted(dir); err == nil {
				committed = c // it may have moved on before the kill
			}
			t.Logf("killed with the commit record at step %d", committed)

			j2 := dptrainJob(t, hosts, append(flags, "--resume"), args...)
			res := j2.wait(120 * time.Second)
			if res.code != 0 {
				t.Fatalf("--resume: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
			}
			checkJobCleanedUp(t, j2)
			if p, o := dptrainHashes(t, res); p != wantP || o != wantO {
				t.Errorf("--resume ended with params %s optimizer %s, the run without failure with %s %s", p, o, wantP, wantO)
			}
			m := resumingRE.FindStringSubmatch(res.stderr)
			if m == nil {
				t.Fatalf("gorun does not say where it resumes from\nstderr:\n%s", res.stderr)
			}
			target, _ := strconv.ParseInt(m[1], 10, 64)
			if tc.flags == nil {
				if target != committed || m[2] != "" {
					t.Errorf("full mode resumed from step %d, want the committed version %d", target, committed)
				}
			} else {
				base, _ := strconv.ParseInt(m[2], 10, 64)
				replayed, _ := strconv.ParseInt(m[3], 10, 64)
				if base != committed || target < committed+diff || replayed != target-base {
					t.Errorf("diff mode resumed from step %d (base %d, %d replayed), want base %d and at least %d differentials", target, base, replayed, committed, diff)
				}
			}
			rs := restoredRE.FindAllStringSubmatch(res.stderr, -1)
			if len(rs) != 4 {
				t.Errorf("%d ranks restored from their own slots, want 4\nstderr:\n%s", len(rs), res.stderr)
			}
			for _, r := range rs {
				if r[2] != m[1] {
					t.Errorf("rank %s restored step %s, want %d", r[1], r[2], target)
				}
			}
		})
	}
}

// TestResumeErrors: --resume on a directory it cannot resume exits 2
// before anything starts, saying why, and changes nothing there; a rank
// whose committed version is missing stops the job (exit 1) before any
// rank starts, naming it.
func TestResumeErrors(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--protect", "--params", "20K", "--steps", "40", "--device-ms", "5"}
	base := []string{"--ckpt-dir", dir, "--ckpt-every", "4", "--resume"}
	run := func(t *testing.T, np string, flags []string) result {
		t.Helper()
		full := append([]string{"-np", np}, flags...)
		full = append(full, "--", dptrainBin(t))
		return runJob(t, "", nil, append(full, args...)...)
	}
	first := run(t, "2", []string{"--ckpt-dir", dir, "--ckpt-every", "4"})
	if first.code != 0 {
		t.Fatalf("the first run: exit %d\nstderr:\n%s", first.code, first.stderr)
	}
	before, err := durable.ReadCommitted(dir)
	if err != nil {
		t.Fatalf("the first run left no commit record: %v", err)
	}
	for _, tc := range []struct {
		name  string
		np    string
		flags []string
		prep  func(t *testing.T)
		msg   string
		code  int // 0: 2
	}{
		{name: "another world size", np: "4", flags: base,
			msg: "--resume: " + dir + " holds another job or layout: world size 4, the directory's job has 2"},
		{name: "another --ckpt-every", np: "2", flags: []string{"--ckpt-dir", dir, "--ckpt-every", "5", "--resume"},
			msg: "ckpt-every 5, the directory's job has 4"},
		{name: "missing directory", np: "2", flags: []string{"--ckpt-dir", filepath.Join(dir, "none"), "--resume"},
			msg: "does not exist"},
		{name: "no commit record", np: "2", flags: base, prep: func(t *testing.T) {
			if err := os.Rename(filepath.Join(dir, "COMMITTED"), filepath.Join(dir, "COMMITTED.aside")); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Rename(filepath.Join(dir, "COMMITTED.aside"), filepath.Join(dir, "COMMITTED")) })
		}, msg: "--resume: " + dir + " has no committed version"},
		{name: "a rank's base lost", np: "2", flags: base, code: 1, prep: func(t *testing.T) {
			// The directory checks out, but rank 1's committed version is
			// gone: its agent says so, and the job stops, starting nothing.
			l, err := durable.List(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, rl := range l.Ranks {
				for _, b := range rl.Bases {
					if rl.Rank == 1 && b.Step == before && b.State == durable.StateCommitted {
						aside := b.Path + ".aside"
						if err := os.Rename(b.Path, aside); err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { os.Rename(aside, b.Path) })
					}
				}
			}
		}, msg: fmt.Sprintf("--resume: rank 1 cannot be resumed: no complete version of the committed step %d", before)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prep != nil {
				tc.prep(t)
			}
			res := run(t, tc.np, tc.flags)
			code := cmp.Or(tc.code, 2)
			if res.code != code || !strings.Contains(res.stderr, tc.msg) {
				t.Errorf("exit %d, want %d saying %q\nstderr:\n%s", res.code, code, tc.msg, res.stderr)
			}
			if strings.Contains(res.stderr, "did not report their end") {
				t.Errorf("the ranks that never started were not reported as such:\n%s", res.stderr)
			}
		})
	}
	if after, err := durable.ReadCommitted(dir); err != nil || after != before {
		t.Errorf("the commit record changed: %d (%v), was %d", after, err, before)
	}
}
