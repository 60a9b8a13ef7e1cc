package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// End-to-end tests of state protection: examples/dptrain (and the Python
// example trainer) protect their state through the agents' rank service;
// a protected run, and one that crashed and was restarted in place
// (--max-restarts), must end with the same hashes as a plain run.

var (
	dptrainOnce sync.Once
	dptrainPath string
	dptrainErr  error
)

// dptrainBin builds examples/dptrain once per test process, beside the
// gorun binary (TestMain removes that directory). Agents in namespace
// hosts share the filesystem, so the absolute path works there too. It is
// built without -race even when gorun is: the trainer is the workload
// here, and its arithmetic under the race detector takes some 30 times
// longer (internal/keeper's own tests run the client, package protect, under -race).
func dptrainBin(t *testing.T) string {
	t.Helper()
	dptrainOnce.Do(func() {
		dptrainPath = filepath.Join(filepath.Dir(gorunBin), "dptrain")
		out, err := exec.Command("go", "build", "-o", dptrainPath, "github.com/gorun/gorun/examples/dptrain").CombinedOutput()
		if err != nil {
			dptrainErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if dptrainErr != nil {
		t.Fatalf("building dptrain: %v", dptrainErr)
	}
	return dptrainPath
}

// printJobID runs the program in "$0" "$@" after printing the job id (for
// job.jobID); exec keeps the rank's pid, exit status and signals.
const printJobID = `echo "job $GORUN_JOB_ID"; exec "$0" "$@"`

// dptrainArgs are the trainer's flags every run here shares: small, so
// that a run takes well under a second.
var dptrainArgs = []string{"--params", "200K", "--steps", "20", "--seed", "1"}

const dptrainSteps = 20

// dptrainJob starts `gorun -np 4 FLAGS -- dptrain ARGS` on two namespace
// hosts with two slots each: ranks 0 and 1 on hosts[0], 2 and 3 on hosts[1].
func dptrainJob(t *testing.T, hosts *testcluster.Hosts, flags []string, args ...string) *job {
	t.Helper()
	hf := hosts.WriteHostfile(t, t.TempDir(), 2)
	full := []string{"-np", "4", "--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr}
	full = append(full, flags...)
	full = append(full, "--", "sh", "-c", printJobID, dptrainBin(t))
	full = append(full, dptrainArgs...)
	return startProtectedJob(t, append(full, args...)...)
}

// startProtectedJob is startJob without a helper, and removes the job's
// slot files at the end of the test in case a failure left them (after
// the job's own cleanup killed gorun; checkNoSlotFiles reports them first).
func startProtectedJob(t *testing.T, args ...string) *job {
	t.Helper()
	return startProtectedJobEnv(t, nil, args...)
}

// startProtectedJobEnv is startProtectedJob with env (NAME=VALUE) added to
// gorun's own environment, which its agents inherit (not exported to the
// ranks).
func startProtectedJobEnv(t *testing.T, env []string, args ...string) *job {
	t.Helper()
	var cmdEnv []string
	if env != nil {
		cmdEnv = append(os.Environ(), env...)
	}
	var j *job
	t.Cleanup(func() {
		if m := jobIDRE.FindStringSubmatch(j.stdout.String()); m != nil {
			if left, _ := filepath.Glob("/dev/shm/gorun-" + m[1] + ".*"); len(left) > 0 {
				t.Logf("removing slot files the job left: %v", left)
				for _, f := range left {
					os.Remove(f)
				}
			}
		}
	})
	j = startJobUnder(t, nil, cmdEnv, nil, "", nil, args...)
	return j
}

var jobIDRE = regexp.MustCompile(`(?m)^\[\d+\] job (\S+)$`)

var dptrainHashRE = regexp.MustCompile(`(?m)^\[0\] (params|optimizer) sha256 ([0-9a-f]{64})$`)

// dptrainHashes returns rank 0's final params and optimizer hashes.
func dptrainHashes(t *testing.T, res result) (params, optimizer string) {
	t.Helper()
	for _, m := range dptrainHashRE.FindAllStringSubmatch(res.stdout, -1) {
		if m[1] == "params" {
			params = m[2]
		} else {
			optimizer = m[2]
		}
	}
	if params == "" || optimizer == "" {
		t.Fatalf("no final hashes printed\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	}
	return params, optimizer
}

// checkNoSlotFiles fails if a shared-memory slot file of job id
// (/dev/shm/gorun-ID.rRANK.REGION) is left; agents remove them as they
// exit, so it polls briefly. Namespace hosts share /dev/shm with this one.
func checkNoSlotFiles(t *testing.T, id string) {
	t.Helper()
	var left []string
	for range 250 {
		if left, _ = filepath.Glob("/dev/shm/gorun-" + id + ".*"); len(left) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("slot files left in /dev/shm: %v", left)
}

// checkJobCleanedUp checks that the job left no files: neither slots in
// /dev/shm nor job directories.
func checkJobCleanedUp(t *testing.T, j *job) {
	t.Helper()
	id := j.jobID()
	checkNoSlotFiles(t, id)
	checkNoJobFiles(t, id)
}

// protection is one rank's row of gorun -v's state-protection table.
type protection struct {
	committed, replicated, stages int
	replPerStep                   string
}

var (
	protTableRE = regexp.MustCompile(`(?m)^gorun: state protection: G = (-?\d+) \(`)
	protRowRE   = regexp.MustCompile(`^\s+(\d+)\s+(-?\d+)\s+(-?\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)$`)
)

// lastProtectionTable parses the last state-protection table in stderr:
// G and the rows by rank.
func lastProtectionTable(t *testing.T, stderr string) (int, map[int]protection) {
	t.Helper()
	locs := protTableRE.FindAllStringSubmatchIndex(stderr, -1)
	if len(locs) == 0 {
		t.Fatalf("no state-protection table in stderr:\n%s", stderr)
	}
	loc := locs[len(locs)-1]
	g, _ := strconv.Atoi(stderr[loc[2]:loc[3]])
	lines := strings.Split(stderr[loc[1]:], "\n")[1:] // past the title line
	if len(lines) > 0 && strings.Contains(lines[0], "committed") {
		lines = lines[1:]
	}
	rows := map[int]protection{}
	for _, l := range lines {
		m := protRowRE.FindStringSubmatch(l)
		if m == nil {
			break
		}
		r, _ := strconv.Atoi(m[1])
		var p protection
		p.committed, _ = strconv.Atoi(m[2])
		p.replicated, _ = strconv.Atoi(m[3])
		p.stages, _ = strconv.Atoi(m[4])
		p.replPerStep = m[6]
		rows[r] = p
	}
	return g, rows
}

// referenceHashes runs dptrain without protection and without a crash on
// hosts and returns its hashes.
func referenceHashes(t *testing.T, hosts *testcluster.Hosts) (params, optimizer string) {
	t.Helper()
	j := dptrainJob(t, hosts, nil)
	res := j.wait(90 * time.Second)
	if res.code != 0 {
		t.Fatalf("unprotected run: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	checkJobCleanedUp(t, j)
	return dptrainHashes(t, res)
}

func TestProtectSameHash(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	wantP, wantO := referenceHashes(t, hosts)

	j := dptrainJob(t, hosts, []string{"-v"}, "--protect")
	res := j.wait(90 * time.Second)
	if res.code != 0 {
		t.Fatalf("protected run: exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	checkJobCleanedUp(t, j)
	if p, o := dptrainHashes(t, res); p != wantP || o != wantO {
		t.Errorf("protected run ended with params %s optimizer %s, the unprotected run with %s %s", p, o, wantP, wantO)
	}

	g, rows := lastProtectionTable(t, res.stderr)
	if g != dptrainSteps-1 {
		t.Errorf("G = %d, want %d (the last step)", g, dptrainSteps-1)
	}
	if len(rows) != 4 {
		t.Fatalf("table has %d rows, want 4\nstderr:\n%s", len(rows), res.stderr)
	}
	for r := range 4 {
		p, ok := rows[r]
		if !ok {
			t.Errorf("no row for rank %d", r)
			continue
		}
		// Replicated up to the last step, and replication was measured:
		// the replicas went to the other host (a one-host job shows "-").
		if p.committed != dptrainSteps-1 || p.replicated != dptrainSteps-1 || p.stages != dptrainSteps || p.replPerStep == "-" {
			t.Errorf("rank %d: committed %d replicated %d stages %d repl/step %s, want %d %d %d and a replication time",
				r, p.committed, p.replicated, p.stages, p.replPerStep, dptrainSteps-1, dptrainSteps-1, dptrainSteps)
		}
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", res.stderr)
	}
}

func TestProtectRestartInPlace(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	wantP, wantO := referenceHashes(t, hosts)
	crash := []string{"--protect", "--fail-at-step", "12", "--fail-rank", "2", "--fail-signal", "KILL"}

	t.Run("restarted", func(t *testing.T) {
		j := dptrainJob(t, hosts, []string{"-v", "--max-restarts", "1"}, crash...)
		res := j.wait(90 * time.Second)
		checkJobCleanedUp(t, j)
		if res.code != 0 {
			t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		// The failure named is rank 2's SIGKILL, not the exits of the
		// ranks that lost it as a peer, whose reports may arrive first.
		m := regexp.MustCompile(`gorun: (rank 2 on host ` + regexp.QuoteMeta(hosts.Names[1]) + ` \(pid \d+\) was killed by SIGKILL); ` +
			`restarting every rank \(restart 1 of 1\), resuming from step (\d+)\n`).FindStringSubmatch(res.stderr)
		if m == nil {
			t.Fatalf("no report of a rank's failure and a restart resuming from a protected step\nstderr:\n%s", res.stderr)
		}
		t.Logf("%s", m[0][:len(m[0])-1])
		g, _ := strconv.Atoi(m[2])
		if g >= 12 {
			t.Errorf("resuming from step %d, but rank 2 crashed at step 12", g)
		}
		if !strings.Contains(res.stdout, fmt.Sprintf("[0] dptrain: resuming after step %d\n", g)) {
			t.Errorf("rank 0 did not resume after step %d\nstdout:\n%s", g, res.stdout)
		}
		if n := strings.Count(res.stderr, "restarting every rank"); n != 1 {
			t.Errorf("%d restarts, want 1", n)
		}
		// Tier 1: every host kept its slots, so no rank restored from
		// another host (the agents would log it; -v shows their logs).
		if !strings.Contains(res.stderr, `msg="restarting the ranks" host=`+hosts.Names[1]) {
			t.Errorf("the agents' logs are not shown with -v: cannot tell Tier 1 from Tier 2\nstderr:\n%s", res.stderr)
		} else if strings.Contains(res.stderr, "restoring from other hosts") {
			t.Errorf("a rank restored from other hosts (Tier 2), though its own host kept its slots\nstderr:\n%s", res.stderr)
		}
		if p, o := dptrainHashes(t, res); p != wantP || o != wantO {
			t.Errorf("restarted run ended with params %s optimizer %s, the uncrashed run with %s %s\nstdout:\n%s", p, o, wantP, wantO, res.stdout)
		}
		if g, _ := lastProtectionTable(t, res.stderr); g != dptrainSteps-1 {
			t.Errorf("final G = %d, want %d", g, dptrainSteps-1)
		}
	})

	// Tier 2: rank 2 overwrites its state on its host before it dies, so
	// its slots there fail their CRCs and it restores from its replica on
	// the other host: in diff mode, the holder's base and the replay of
	// the differentials since (a base every 4 steps, folds of 3, so that
	// the 20 steps see both).
	for _, tc := range []struct{ name, mode string }{{"tier 2", "full"}, {"tier 2, diff mode", "diff"}} {
		t.Run(tc.name, func(t *testing.T) {
			flags := []string{"-v", "--max-restarts", "1", "--protect-mode", tc.mode}
			if tc.mode == "diff" {
				flags = append(flags, "--base-every", "4", "--diff-fold", "3")
			}
			j := dptrainJob(t, hosts, flags, append(crash, "--fail-wipe-state")...)
			res := j.wait(90 * time.Second)
			checkJobCleanedUp(t, j)
			if res.code != 0 {
				t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
			}
			if !strings.Contains(res.stderr, "rank 2 overwrote its protected optimizer state") {
				t.Fatalf("rank 2 did not overwrite its state\nstderr:\n%s", res.stderr)
			}
			if !regexp.MustCompile(`msg="restoring from other hosts" host=` + regexp.QuoteMeta(hosts.Names[1]) + ` rank=2 `).MatchString(res.stderr) {
				t.Errorf("rank 2 did not restore from another host\nstderr:\n%s", res.stderr)
			}
			if n := strings.Count(res.stderr, `msg="restoring from other hosts"`); n != 1 {
				t.Errorf("%d ranks restored from other hosts, want 1 (rank 2)\nstderr:\n%s", n, res.stderr)
			}
			if p, o := dptrainHashes(t, res); p != wantP || o != wantO {
				t.Errorf("run restored from Tier 2 ended with params %s optimizer %s, the uncrashed run with %s %s\nstdout:\n%s", p, o, wantP, wantO, res.stdout)
			}
			// -v names the mode, and in diff mode the differentials sent.
			if !strings.Contains(res.stderr, ", mode "+tc.mode) {
				t.Errorf("-v does not say the job ran in %s mode\nstderr:\n%s", tc.mode, res.stderr)
			}
			// Diff mode's holders folded their logs (--diff-fold 3 over
			// 20 steps) and -v gives their replay time.
			if tc.mode == "diff" && !regexp.MustCompile(`holders' replay per folded step: host \d+ \S+ \(\d+ steps\);`).MatchString(res.stderr) {
				t.Errorf("-v gives no holder's replay time per folded step\nstderr:\n%s", res.stderr)
			}
		})
	}

	t.Run("no restarts", func(t *testing.T) {
		j := dptrainJob(t, hosts, nil, crash...)
		res := j.wait(90 * time.Second)
		checkJobCleanedUp(t, j)
		if strings.Contains(res.stderr, "restarting") {
			t.Errorf("restarted without --max-restarts:\n%s", res.stderr)
		}
		want := 128 + int(syscall.SIGKILL)
		if res.code != want {
			t.Fatalf("exit %d, want %d (rank 2's SIGKILL)\nstdout:\n%s\nstderr:\n%s", res.code, want, res.stdout, res.stderr)
		}
		if !regexp.MustCompile(`gorun: rank 2 on host ` + regexp.QuoteMeta(hosts.Names[1]) + ` \(pid \d+\) was killed by SIGKILL; stopping the job`).MatchString(res.stderr) {
			t.Errorf("report does not name rank 2, its host and SIGKILL:\n%s", res.stderr)
		}
	})
}

// pytrain returns the python3 on PATH and examples/pytrain's script, or
// skips the test without python3.
func pytrain(t *testing.T) (python, script string) {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	script, err = filepath.Abs("../../examples/pytrain/pytrain.py")
	if err != nil {
		t.Fatal(err)
	}
	return python, script
}

// pytrainHashRE matches examples/pytrain's final hash (rank 0's).
var pytrainHashRE = regexp.MustCompile(`(?m)^\[0\] final hash ([0-9a-f]{64})$`)

// checkHashes fails the test unless res printed dptrain's final hashes
// wantP and wantO.
func checkHashes(t *testing.T, res result, wantP, wantO string) {
	t.Helper()
	if p, o := dptrainHashes(t, res); p != wantP || o != wantO {
		t.Errorf("ended with params %s optimizer %s, the run without a failure with %s %s", p, o, wantP, wantO)
	}
}

func TestProtectPython(t *testing.T) {
	python, script := pytrain(t)
	run := func(t *testing.T, flags []string, args ...string) result {
		t.Helper()
		full := append([]string{"-np", "2", "--oversubscribe"}, flags...)
		full = append(full, "--", "sh", "-c", printJobID, python, script, "--steps", "20", "--seed", "3")
		j := startProtectedJob(t, append(full, args...)...)
		res := j.wait(90 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		checkJobCleanedUp(t, j)
		return res
	}
	hash := func(t *testing.T, res result) string {
		t.Helper()
		m := pytrainHashRE.FindStringSubmatch(res.stdout)
		if m == nil {
			t.Fatalf("no final hash printed\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		}
		return m[1]
	}

	plain := hash(t, run(t, nil, "--protect"))
	res := run(t, []string{"--max-restarts", "1"}, "--protect", "--crash-at", "12")
	m := regexp.MustCompile(`restarting every rank \(restart 1 of 1\), resuming from step (\d+)\n`).FindStringSubmatch(res.stderr)
	if m == nil {
		t.Fatalf("no restart resuming from a protected step reported\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	}
	t.Logf("%s", m[0][:len(m[0])-1])
	for r := range 2 {
		if want := fmt.Sprintf("[%d] rank %d: restored step %s\n", r, r, m[1]); !strings.Contains(res.stdout, want) {
			t.Errorf("rank %d did not restore step %s\nstdout:\n%s", r, m[1], res.stdout)
		}
	}
	if got := hash(t, res); got != plain {
		t.Errorf("crashed and restarted run ended with %s, the uncrashed one with %s\nstdout:\n%s", got, plain, res.stdout)
	}
}

// diffSourceRE matches a rank's row of -v's differential-protection
// table: rank, sent/step, bases/step, diffs/step, source.
var diffSourceRE = regexp.MustCompile(`^\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$`)

// lastDiffSources parses the last differential-protection table in
// stderr: each rank's gradient source.
func lastDiffSources(t *testing.T, stderr string) map[int]string {
	t.Helper()
	i := strings.LastIndex(stderr, "differential protection, per rank:")
	if i < 0 {
		t.Fatalf("no differential-protection table in stderr:\n%s", stderr)
	}
	lines := strings.Split(stderr[i:], "\n")[2:] // past the title and the header
	out := map[int]string{}
	for _, l := range lines {
		m := diffSourceRE.FindStringSubmatch(l)
		if m == nil {
			break
		}
		r, _ := strconv.Atoi(m[1])
		out[r] = m[5]
	}
	return out
}

// TestProtectDiffLocalPeer: --protect-mode diff with dptrain's reduced
// gradient (no --device-grad) on two namespace hosts: every holder's host
// runs data-parallel peers of its owners, so the holders take the
// gradients from them (-v: "local-peer"), and the run ends with the
// hashes of the unprotected run.
func TestProtectDiffLocalPeer(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	wantP, wantO := referenceHashes(t, hosts)
	j := dptrainJob(t, hosts, []string{"-v", "--protect-mode", "diff", "--base-every", "8", "--diff-fold", "3"}, "--protect")
	res := j.wait(90 * time.Second)
	checkJobCleanedUp(t, j)
	if res.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	checkHashes(t, res, wantP, wantO)
	src := lastDiffSources(t, res.stderr)
	if len(src) != 4 {
		t.Fatalf("the differential-protection table has %d rows, want 4\nstderr:\n%s", len(src), res.stderr)
	}
	for r, s := range src {
		if s != "local-peer" {
			t.Errorf("rank %d: gradient source %q, want local-peer\nstderr:\n%s", r, s, res.stderr)
		}
	}
}
