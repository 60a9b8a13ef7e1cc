package main

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// End-to-end tests of the roll-back to the durable tier (issue 17): a
// host and its replica holder's host killed together, so that a lost
// rank's state at G is in no memory tier. With --ckpt-dir and a commit
// record the job rolls back to the step every rank reaches on disk and
// ends as a run without failure (the trainer is deterministic: replaying
// from T reproduces the trajectory); without --ckpt-dir it stops as
// before.

// rollbackRE matches the launcher's line about the roll-back.
var rollbackRE = regexp.MustCompile(`rank (\d+)'s state at step (\d+) is lost with hosts ([^ ]+), ([^ ]+) \(no replica left\): rolling the job back to step (\d+) from --ckpt-dir \((\d+) steps? lost\)`)

// killTogether SIGKILLs every process of hosts hs at once.
func killTogether(t *testing.T, c *hsCluster, hs ...int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(hs))
	for i, h := range hs {
		wg.Go(func() { errs[i] = c.hosts.KillAll(h) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRollbackToDisk: 6 ranks on 3 hosts, a replica each on the next
// host (--replicas 1), two spares, a base every 4 steps. Hosts 0 and 1
// are killed together after step 14: rank 0's state (host 0, its holder
// rank 2 on host 1) is lost from memory. The job rolls back to the
// commit record's step (full mode), every rank restarted from it, and
// ends with the hashes of a run without failure.
func TestRollbackToDisk(t *testing.T) {
	c := newHSCluster(t, 3, 2)
	batch := []string{"--batch", "60"} // a multiple of 6 ranks
	wantP, wantO := hsReference(t, c, batch...)
	const every, killAfter = 4, 14
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"full", nil},
		{"full in-place", []string{"--recovery", "in-place"}},
		{"diff raw", []string{"--protect-mode", "diff", "--diff-codec", "raw", "--diff-batch", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			flags := append([]string{"--ckpt-dir", dir, "--ckpt-every", strconv.Itoa(every), "--replicas", "1"}, tc.flags...)
			r := c.start(t, flags, append([]string{"--protect"}, batch...)...)
			r.waitStep(t, killAfter)
			killTogether(t, c, 0, 1)
			res := r.finish(t, 0, 2)
			defer func() {
				if t.Failed() {
					t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
				}
			}()
			checkHashes(t, res, wantP, wantO)
			diff := slices.Contains(tc.flags, "diff")
			m := rollbackRE.FindStringSubmatch(res.stderr)
			if m == nil {
				t.Fatalf("no roll-back line in stderr")
			}
			t.Logf("%s", m[0])
			g, _ := strconv.Atoi(m[2])
			to, _ := strconv.Atoi(m[5])
			lost, _ := strconv.Atoi(m[6])
			// Full mode: the commit record's step, a base step. Diff
			// mode: the base and the differentials every rank has on
			// disk (G's, unless a batch was not appended yet).
			if to > g || lost != g-to || g < killAfter-2 || !diff && to%every != 0 {
				t.Errorf("rolled back from step %d to %d (%d lost), want G at least %d and, in full mode, a base step", g, to, lost, killAfter-2)
			}
			// The durable tier goes on after the roll-back: a later base
			// committed, every file verifying, nothing of the history
			// before the roll-back left that the record makes useless.
			checkDurableDir(t, dir, r.jobID(), 6, every, int64(to+every), hsSteps-1)
			names := m[3] + " " + m[4]
			for _, h := range []int{0, 1} {
				if !strings.Contains(names, c.hosts.Names[h]) {
					t.Errorf("the roll-back names hosts %s, want %s and %s", names, c.hosts.Names[0], c.hosts.Names[1])
				}
			}
		})
	}
	t.Run("no ckpt-dir", func(t *testing.T) {
		r := c.start(t, []string{"--replicas", "1"}, append([]string{"--protect"}, batch...)...)
		r.waitStep(t, killAfter)
		killTogether(t, c, 0, 1)
		res := r.finish(t, 1, 2)
		if !strings.Contains(res.stderr, "unrecoverable: rank ") || !strings.Contains(res.stderr, "has no valid copy left in memory") {
			t.Errorf("no unrecoverable report\nstderr:\n%s", res.stderr)
		}
		if strings.Contains(res.stderr, "rolling the job back") {
			t.Errorf("a job without --ckpt-dir rolled back\nstderr:\n%s", res.stderr)
		}
	})
}
