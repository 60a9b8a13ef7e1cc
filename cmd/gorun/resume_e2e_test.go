package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/durable"
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

// resumedRE matches an agent's log line about a rank resumed from disk
// (internal/agent/resume.go), which gorun shows on its stderr.
var resumedRE = regexp.MustCompile(`resumed a rank's state from the checkpoint directory.*rank=(\d+) step=(\d+) base=(\d+) "differentials replayed"=(\d+)`)

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
// later, failing if the job ends first.
func waitCommitted(t *testing.T, j *job, dir string, min int64) int64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := durable.ReadCommitted(dir); err == nil && c >= min {
			return c
		}
		select {
		case <-j.done:
			t.Fatalf("the job ended before it committed step %d (exit %d)\nstdout:\n%s\nstderr:\n%s", min, j.res.code, j.res.stdout, j.res.stderr)
		case <-time.After(5 * time.Millisecond):
		}
	}
	t.Fatalf("no commit record of step %d or later within 60 s", min)
	return -1
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
			committed := waitCommitted(t, j, dir, 30)
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
			ms := resumedRE.FindAllStringSubmatch(res.stderr, -1)
			if len(ms) != 4 {
				t.Fatalf("%d ranks say they resumed from disk, want 4\nstderr:\n%s", len(ms), res.stderr)
			}
			for _, m := range ms {
				step, _ := strconv.ParseInt(m[2], 10, 64)
				base, _ := strconv.ParseInt(m[3], 10, 64)
				replayed, _ := strconv.Atoi(m[4])
				if base != committed || step < base || int64(replayed) != step-base {
					t.Errorf("rank %s resumed step %d from base %d with %d differentials, want base %d", m[1], step, base, replayed, committed)
				}
				if tc.flags == nil && step != base {
					t.Errorf("full mode: rank %s resumed step %d, want the base %d", m[1], step, base)
				}
			}
			if tc.flags != nil && ms[0][2] == ms[0][3] {
				t.Logf("diff mode resumed at the base itself (the log on disk reached no further)")
			}
		})
	}
}

// TestResumeErrors: --resume on a directory it cannot resume exits 2
// before anything starts, saying why, and changes nothing there.
func TestResumeErrors(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--protect", "--params", "20K", "--steps", "12"}
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prep != nil {
				tc.prep(t)
			}
			res := run(t, tc.np, tc.flags)
			if res.code != 2 || !strings.Contains(res.stderr, tc.msg) {
				t.Errorf("exit %d, want 2 saying %q\nstderr:\n%s", res.code, tc.msg, res.stderr)
			}
		})
	}
	if after, err := durable.ReadCommitted(dir); err != nil || after != before {
		t.Errorf("the commit record changed: %d (%v), was %d", after, err, before)
	}
}
