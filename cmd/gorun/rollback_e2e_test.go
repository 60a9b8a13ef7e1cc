package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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
			res := r.finish(t, 0)
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
		res := r.finish(t, 1)
		if !strings.Contains(res.stderr, "unrecoverable: rank ") || !strings.Contains(res.stderr, "has no valid copy left in memory") {
			t.Errorf("no unrecoverable report\nstderr:\n%s", res.stderr)
		}
		if strings.Contains(res.stderr, "rolling the job back") {
			t.Errorf("a job without --ckpt-dir rolled back\nstderr:\n%s", res.stderr)
		}
	})
}

// rollbackECRE matches the launcher's line about a roll-back under
// erasure coding.
var rollbackECRE = regexp.MustCompile(`rank (\d+)'s state at step (\d+) is lost with hosts ([^(]+) \(fewer than 2 of the 4 shards of its stripe of erasure-coding group 0 left\): rolling the job back to step (\d+) from --ckpt-dir \((\d+) steps? lost\)`)

// waitStderr polls gorun's stderr until re matches, failing the test
// after limit or if gorun exits first.
func (r *hsRun) waitStderr(t *testing.T, re *regexp.Regexp, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if re.MatchString(r.stderr.String()) {
			return
		}
		select {
		case <-r.done:
			t.Fatalf("gorun exited early (code %d)\nstdout:\n%s\nstderr:\n%s", r.res.code, r.res.stdout, r.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("no stderr line matching %v within %v\nstderr:\n%s", re, limit, r.stderr.String())
}

// TestRollbackToDiskEC: 8 ranks on 4 hosts under --redundancy ec:2+2
// (one group), four spares, a base every 4 steps on --ckpt-dir. Three
// hosts of the group (a data host and both parity hosts) are killed
// together after step 14: the code survives two. The job rolls back to
// the commit record's step, the spares taking the lost hosts' places,
// every clear copy and parity share encoded again from there, and ends
// with the hashes of a run without failure. In "then one more", once
// every shard is protected again the surviving data host is killed too:
// within M, its ranks (which run on their data host, so have no clear
// copy) are decoded from the parity rows encoded since the roll-back,
// without a second roll-back. The same in diff mode (--protect-mode diff,
// the raw codec, a base every step, the differentials on disk in batches
// of 4, so that the disk's reach T is mostly below H): the roll-back
// restarts the base schedule from T (H -1 until every rank coded T), and
// the last loss is decoded at H, a base coded since the roll-back, and
// replays the differentials logged since. With H left past T (the hosts'
// and the launcher's), the job hangs at G = T.
func TestRollbackToDiskEC(t *testing.T) {
	c := newHSCluster(t, 4, 4)
	g, asg := c.ecGroup(t, 2)
	lost := []int{g.Data[0], g.Parity[0], g.Parity[1]}
	wantP, wantO := hsReference(t, c)
	const every, killAfter = 4, 14
	again := regexp.MustCompile(`every optimizer shard has its clear copy and parity shares \(ec:2\+2\) again`)
	diff := []string{"--protect-mode", "diff", "--diff-codec", "raw", "--base-every", "1", "--diff-batch", "4"}
	for _, tc := range []struct {
		name    string
		oneMore bool
		flags   []string
	}{
		{"three lost", false, nil},
		{"then one more", true, nil},
		{"diff/three lost", false, diff},
		{"diff/then one more", true, diff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			flags := append([]string{"--redundancy", "ec:2+2", "--ckpt-dir", dir, "--ckpt-every", strconv.Itoa(every)}, tc.flags...)
			r := c.start(t, flags, "--protect")
			r.waitStep(t, killAfter)
			killTogether(t, c, lost...)
			var after int // where the roll-back's line ends in stderr
			if tc.oneMore {
				r.waitStderr(t, rollbackECRE, 60*time.Second)
				after = rollbackECRE.FindStringIndex(r.stderr.String())[1]
				// Protected again after the roll-back: the rows hold
				// shares encoded since.
				r.waitStderr(t, regexp.MustCompile(rollbackECRE.String()+`(?s:.*)`+again.String()), 60*time.Second)
				killTogether(t, c, g.Data[1])
			}
			res := r.finish(t, 0)
			defer func() {
				if t.Failed() {
					t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
				}
			}()
			checkHashes(t, res, wantP, wantO)
			m := rollbackECRE.FindStringSubmatch(res.stderr)
			if m == nil {
				t.Fatalf("no roll-back line in stderr")
			}
			t.Logf("%s", m[0])
			from, _ := strconv.Atoi(m[2])
			to, _ := strconv.Atoi(m[4])
			n, _ := strconv.Atoi(m[5])
			// Full mode: the commit record's step, a base step. Diff
			// mode: the base and the differentials every rank has on
			// disk.
			if to > from || n != from-to || from < killAfter-2 || tc.flags == nil && to%every != 0 {
				t.Errorf("rolled back from step %d to %d (%d lost), want G at least %d and, in full mode, a base step", from, to, n, killAfter-2)
			}
			// Diff mode: the base schedule restarts from T, H with it
			// (-v's table at the roll-back's restart).
			if tc.flags != nil && !strings.Contains(res.stderr, fmt.Sprintf("G = %d (the step every rank can resume from), H = -1 ", to)) {
				t.Errorf("no table of G = %d with H = -1 at the roll-back", to)
			}
			for _, h := range lost {
				if !strings.Contains(m[3], c.hosts.Names[h]) {
					t.Errorf("the roll-back names hosts %s, want %s", m[3], c.hosts.Names[h])
				}
			}
			if k := len(rollbackECRE.FindAllString(res.stderr, -1)); k != 1 {
				t.Errorf("%d roll-backs, want 1", k)
			}
			checkDurableDir(t, dir, r.jobID(), 8, every, int64(to+every), hsSteps-1)
			if !tc.oneMore {
				return
			}
			// The last loss is restored from memory: a plan after the
			// roll-back decodes the lost data host's ranks.
			decodes := regexp.MustCompile(` r(\d+)<-decode,`)
			var decoded []int
			for _, l := range strings.Split(res.stderr[after:], "\n") {
				if !strings.Contains(l, "hot-swap") || !strings.Contains(l, "restore epoch=") {
					continue
				}
				for _, d := range decodes.FindAllStringSubmatch(l, -1) {
					x, _ := strconv.Atoi(d[1])
					decoded = append(decoded, x)
				}
			}
			t.Logf("decoded after the roll-back: ranks %v", decoded)
			if len(decoded) == 0 {
				t.Errorf("no restore plan after the roll-back decodes a rank of %s", c.hosts.Names[g.Data[1]])
			}
			for _, x := range decoded {
				if asg[x].Host != g.Data[1] {
					t.Errorf("rank %d decoded after the roll-back; it ran on host %d, not on the data host %d lost", x, asg[x].Host, g.Data[1])
				}
			}
		})
	}
}
