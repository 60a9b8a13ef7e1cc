package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
)

// End-to-end tests of PyTorch trainers (issue 18): examples/torch/train.py,
// a deterministic DDP trainer over gloo, run by Debian's python3-torch
// (which imports only under /usr/bin/python3). Its final checksum under
// gorun, plain or with its state protected (--protect), after a rank's
// crash and a restart in place (--max-restarts), and after the loss of a
// host replaced by a spare, must be that of the same script started by a
// plain loop (as torchrun would: Debian's torchrun fails at start on
// Python 3.11).

// torchPython is the interpreter that has Debian's torch.
const torchPython = "/usr/bin/python3"

var (
	torchOnce sync.Once
	torchErr  error
)

// torchTrain returns torchPython and examples/torch/train.py, or skips the
// test: under -short, in the race pass (the Go code these tests drive is
// that of TestProtectPython and TestHotSwapPython, which run there; the
// torch runs would only be slower), and when torchPython cannot import
// torch, unless GORUN_TORCH_REQUIRE is set (CI installs torch): then the
// test fails.
func torchTrain(t *testing.T) (python, script string) {
	t.Helper()
	if testing.Short() {
		t.Skip("torch end-to-end test: not under -short")
	}
	if raceEnabled {
		t.Skip("torch end-to-end test: not in the race pass (TestProtectPython and TestHotSwapPython run the same Go code there)")
	}
	torchOnce.Do(func() {
		out, err := exec.Command(torchPython, "-c", "import torch").CombinedOutput()
		if err != nil {
			torchErr = fmt.Errorf("%s cannot import torch (apt-get install --no-install-recommends python3-torch): %w\n%s", torchPython, err, out)
		}
	})
	if torchErr != nil {
		if os.Getenv("GORUN_TORCH_REQUIRE") != "" {
			t.Fatalf("GORUN_TORCH_REQUIRE is set: %v", torchErr)
		}
		t.Skip(torchErr)
	}
	script, err := filepath.Abs("../../examples/torch/train.py")
	if err != nil {
		t.Fatal(err)
	}
	return torchPython, script
}

// torchChecksumRE matches train.py's final checksum, printed by rank 0.
var torchChecksumRE = regexp.MustCompile(`(?m)^\[0\] final checksum ([0-9a-f]{64})$`)

// torchChecksum returns rank 0's final checksum in a gorun run's output.
func torchChecksum(t *testing.T, res result) string {
	t.Helper()
	m := torchChecksumRE.FindStringSubmatch(res.stdout)
	if m == nil {
		t.Fatalf("no final checksum printed\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	}
	return m[1]
}

var (
	torchRefMu sync.Mutex
	torchRefs  = map[string]string{}
)

// torchReference returns the final checksum of train.py ARGS at world
// size world, its ranks started by a plain loop that sets RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as
// torchrun does (computed once per test process for each world and args).
func torchReference(t *testing.T, world int, args ...string) string {
	t.Helper()
	python, script := torchTrain(t)
	key := fmt.Sprint(world, args)
	torchRefMu.Lock()
	defer torchRefMu.Unlock()
	if sum, ok := torchRefs[key]; ok {
		return sum
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, world)
	outs := make([]bytes.Buffer, world)
	for r := range world {
		c := exec.CommandContext(ctx, python, append([]string{script}, args...)...)
		c.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(world),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(world),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port)
		c.Stdout, c.Stderr = &outs[r], &outs[r]
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = c
	}
	var failed []string
	for r, c := range cmds {
		if err := c.Wait(); err != nil {
			failed = append(failed, fmt.Sprintf("rank %d: %v\n%s", r, err, outs[r].String()))
		}
	}
	if failed != nil {
		t.Fatalf("reference run (world %d, %v) failed:\n%s", world, args, strings.Join(failed, "\n"))
	}
	m := regexp.MustCompile(`(?m)^final checksum ([0-9a-f]{64})$`).FindStringSubmatch(outs[0].String())
	if m == nil {
		t.Fatalf("reference run (world %d, %v): no final checksum\n%s", world, args, outs[0].String())
	}
	torchRefs[key] = m[1]
	return m[1]
}

// torchArgs are train.py's flags every test here shares: short runs.
var torchArgs = []string{"--steps", "60", "--seed", "5"}

// runTorch runs `gorun -np world --oversubscribe FLAGS -- train.py
// torchArgs ARGS` on this host and checks it exits 0 and leaves nothing.
func runTorch(t *testing.T, world int, flags []string, args ...string) result {
	t.Helper()
	python, script := torchTrain(t)
	full := append([]string{"-np", strconv.Itoa(world), "--oversubscribe"}, flags...)
	full = append(full, "--", "sh", "-c", printJobID, python, script)
	full = append(full, torchArgs...)
	j := startProtectedJob(t, append(full, args...)...)
	res := j.wait(2 * time.Minute)
	if res.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	checkJobCleanedUp(t, j)
	t.Logf("gorun -np %d %v, train.py %v: %v", world, flags, args, res.elapsed.Round(time.Millisecond))
	return res
}

// TestTorchChecksums: train.py under gorun, plain and with its state
// protected, ends with the checksum of the plain loop's run, at world
// sizes 2 and 4.
func TestTorchChecksums(t *testing.T) {
	for _, world := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", world), func(t *testing.T) {
			want := torchReference(t, world, torchArgs...)
			for _, tc := range []struct {
				name string
				args []string
			}{{"plain", nil}, {"protected", []string{"--protect"}}} {
				if got := torchChecksum(t, runTorch(t, world, nil, tc.args...)); got != want {
					t.Errorf("%s under gorun: checksum %s, the plain loop's %s", tc.name, got, want)
				}
			}
		})
	}
}

// torchResumedRE matches a rank's line saying where it resumed from.
var torchResumedRE = regexp.MustCompile(`(?m)^\[(\d+)\] rank (\d+): resumed at step (\d+) from (\S+)$`)

// torchResumed returns, per rank, the step each rank said it resumed at
// from gorun; it fails the test on a rank that resumed from elsewhere.
func torchResumed(t *testing.T, stdout string) map[int]int {
	t.Helper()
	got := map[int]int{}
	for _, m := range torchResumedRE.FindAllStringSubmatch(stdout, -1) {
		if m[1] != m[2] || m[4] != "gorun" {
			t.Errorf("unexpected resume line %q", m[0])
			continue
		}
		r, _ := strconv.Atoi(m[1])
		s, _ := strconv.Atoi(m[3])
		got[r] = s
	}
	return got
}

// TestTorchRestartInPlace: rank 2 of a protected run at world 4 SIGKILLs
// itself mid-run; under --max-restarts 1 every rank restarts in place,
// restores from gorun's memory (at the step after gorun's G, not at step
// 0), and the job ends with the checksum of the plain loop's run without
// a crash. (World 4, not 2: with 3 ranks or more the order in which gloo's
// ring sums a gradient element depends on DDP's bucket layout, so a
// resumed run whose layout differs from the uninterrupted one's shows.)
func TestTorchRestartInPlace(t *testing.T) {
	const world = 4
	want := torchReference(t, world, torchArgs...)
	res := runTorch(t, world, []string{"--max-restarts", "1"}, "--protect", "--crash-at", "30", "--crash-rank", "2")
	m := regexp.MustCompile(`restarting every rank \(restart 1 of 1\), resuming from step (\d+)\n`).FindStringSubmatch(res.stderr)
	if m == nil {
		t.Fatalf("no restart resuming from a protected step reported\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	}
	g, _ := strconv.Atoi(m[1])
	t.Logf("%s", m[0][:len(m[0])-1])
	resumed := torchResumed(t, res.stdout)
	for r := range world {
		// train.py resumes at the step after the one restored.
		if s, ok := resumed[r]; !ok || s != g+1 {
			t.Errorf("rank %d resumed at step %d (said: %v), want %d, the step after gorun's %d\nstdout:\n%s", r, s, ok, g+1, g, res.stdout)
		}
	}
	if got := torchChecksum(t, res); got != want {
		t.Errorf("crashed and restarted run: checksum %s, the plain loop's %s\nstdout:\n%s", got, want, res.stdout)
	}
}

// TestTorchHostLoss: on namespace hosts with one spare, the host of ranks
// 0 and 1 (and of MASTER_ADDR) of a protected run is killed mid-run; with
// --recovery restart the spare takes its ranks, every rank restores from
// gorun (the replacement from its replica holder) and the job ends with
// exit 0 and the checksum of the plain loop's run. No GLOO_SOCKET_IFNAME is
// given: the namespaces share the host name, which resolves to loopback,
// and the agents name their eth0 (the interface of the address they
// registered) for gloo.
func TestTorchHostLoss(t *testing.T) {
	python, script := torchTrain(t)
	// BatchNorm: buffers that differ per rank, which a replacement must
	// not take from a data-parallel peer.
	args := []string{"--steps", "300", "--seed", "5", "--norm", "batch"}
	want := torchReference(t, 4, args...)
	c := newHSCluster(t, 2, 1)
	ev := filepath.Join(t.TempDir(), "events.jsonl")
	full := []string{"-np", "4", "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr,
		"-v", "--events", ev, "--recovery", "restart", "--kill-grace", "2",
		"--", "sh", "-c", printJobID, python, script, "--protect"}
	start := time.Now()
	r := &hsRun{job: startProtectedJob(t, append(full, args...)...), events: ev}
	r.waitFor(regexp.MustCompile(`(?m)^\[0\] step 49 `), 1, 90*time.Second)
	if err := c.hosts.KillAll(0); err != nil {
		t.Fatal(err)
	}
	res := r.finish(t, 0)
	t.Logf("gorun -np 4 on 2+1 namespace hosts, host 0 killed after step 49: %v", time.Since(start).Round(time.Millisecond))
	if sp := ofKind[events.Splice](readEvents(t, r.events)); len(sp) != 1 || sp[0].With != c.hosts.Names[2] {
		t.Errorf("splices %+v, want one with the spare %s", sp, c.hosts.Names[2])
	}
	// Every rank restarts (--recovery restart) at the same step, restored
	// from gorun: the replacements of ranks 0 and 1 from their holders.
	resumed := torchResumed(t, res.stdout)
	for rk := range 4 {
		if s, ok := resumed[rk]; !ok || s == 0 || s != resumed[0] {
			t.Errorf("rank %d after the loss: resumed at step %d (said: %v), want rank 0's step %d, not 0, from gorun\nstdout:\n%s", rk, s, ok, resumed[0], res.stdout)
		}
	}
	t.Logf("every rank resumed at step %d", resumed[0])
	if got := torchChecksum(t, res); got != want {
		t.Errorf("after losing rank 0's host: checksum %s, the plain loop's %s\nstdout:\n%s", got, want, res.stdout)
	}
}

// torchPidRE matches train.py --in-place's line at start: the rank's
// process and the epoch it started in.
var torchPidRE = regexp.MustCompile(`(?m)^\[(\d+)\] rank (\d+): pid (\d+) epoch (\d+)$`)

// torchRejoinedRE matches a surviving rank's line after it rejoined a new
// epoch in place.
var torchRejoinedRE = regexp.MustCompile(`(?m)^\[(\d+)\] rank (\d+): rejoined epoch (\d+) at step (\d+)$`)

// TestTorchInPlace: train.py --protect --in-place at world 4 on 2+1
// namespace hosts under --recovery in-place; a host with ranks is killed
// mid-run. Its ranks start on the spare and restore from gorun; the ranks
// of the surviving host are not restarted (each printed its pid once):
// their collective fails or their save is refused, and they rejoin the
// new epoch in place (a new gloo group on its rendezvous, a new DDP
// wrapper, back to G). The job ends with exit 0 and the plain loop's
// checksum. Killed: ranks 2 and 3's host on one of rank 0's step lines,
// rank 0's host (rank 0 held the TCPStore, and MASTER_ADDR moves to the
// spare) right after rank 0's save of a step (--report-steps prints its
// line after the save), and ranks 2 and 3's host frozen (SIGSTOP: a silent
// peer) with a process group timeout of 10 s: the survivors' collective
// fails only at that timeout, long after gorun's new epoch (torchFreeze
// logs both), and the host is killed once they rejoined.
func TestTorchInPlace(t *testing.T) {
	python, script := torchTrain(t)
	args := []string{"--steps", "100", "--seed", "5"}
	want := torchReference(t, 4, args...)
	for _, tc := range []struct {
		name   string
		kill   int // the host killed
		at     *regexp.Regexp
		freeze bool // stopped (SIGSTOP) and killed only once the survivors rejoined
		flags  []string
		extra  []string
	}{
		{name: "ranks 2,3's host on a step line", kill: 1, at: regexp.MustCompile(`(?m)^\[0\] step 29 loss `)},
		{name: "rank 0's host after a save", kill: 0, at: regexp.MustCompile(`(?m)^\[0\] step 29 done `), extra: []string{"--report-steps"}},
		{name: "ranks 2,3's host frozen", kill: 1, at: regexp.MustCompile(`(?m)^\[0\] step 29 loss `), freeze: true,
			flags: []string{"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5"}, extra: []string{"--timeout", "10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newHSCluster(t, 2, 1)
			ev := filepath.Join(t.TempDir(), "events.jsonl")
			full := []string{"-np", "4", "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr,
				"-v", "--events", ev, "--recovery", "in-place", "--kill-grace", "2"}
			full = append(full, tc.flags...)
			full = append(full, "--", "sh", "-c", printJobID, python, script, "--protect", "--in-place")
			full = append(append(full, args...), tc.extra...)
			start := time.Now()
			r := &hsRun{job: startProtectedJob(t, full...), events: ev}
			r.waitFor(tc.at, 1, 90*time.Second)
			if tc.freeze {
				torchFreeze(t, c, r, tc.kill)
			} else if err := c.hosts.KillAll(tc.kill); err != nil {
				t.Fatal(err)
			}
			res := r.finish(t, 0)
			for _, m := range torchFailedRE.FindAllString(res.stderr, -1) {
				t.Logf("%.300s", m)
			}
			t.Logf("gorun -np 4 --recovery in-place on 2+1 namespace hosts, host %d killed: %v", tc.kill, time.Since(start).Round(time.Millisecond))
			evs := readEvents(t, r.events)
			if sp := ofKind[events.Splice](evs); len(sp) != 1 || sp[0].With != c.hosts.Names[2] {
				t.Errorf("splices %+v, want one with the spare %s", sp, c.hosts.Names[2])
			}
			if rs := ofKind[events.Restart](evs); len(rs) > 0 {
				t.Errorf("in-place recovery restarted the ranks: %+v", rs)
			}
			moved := map[int]bool{2 * tc.kill: true, 2*tc.kill + 1: true}
			// Every rank printed its pid at start: the survivors once (in
			// epoch 0), the moved ranks twice (epoch 0, then on the spare).
			pids := map[int][]string{}
			for _, m := range torchPidRE.FindAllStringSubmatch(res.stdout, -1) {
				rk, _ := strconv.Atoi(m[1])
				if m[1] != m[2] {
					t.Errorf("rank %s printed %q", m[1], m[0])
				}
				pids[rk] = append(pids[rk], m[3]+"@"+m[4])
			}
			rejoined := map[int][]int{}
			epochs := map[string]bool{}
			for _, m := range torchRejoinedRE.FindAllStringSubmatch(res.stdout, -1) {
				rk, _ := strconv.Atoi(m[1])
				s, _ := strconv.Atoi(m[4])
				rejoined[rk] = append(rejoined[rk], s)
				epochs[m[3]] = true
			}
			resumed := torchResumed(t, res.stdout)
			var g int = -1
			for rk := range 4 {
				if moved[rk] {
					s, ok := resumed[rk]
					if len(pids[rk]) != 2 || !ok || s == 0 || len(rejoined[rk]) != 0 {
						t.Errorf("moved rank %d: pids %v, resumed at %d (%v) from gorun, rejoined %v; want 2 pids, resumed after step 0, no rejoin", rk, pids[rk], s, ok, rejoined[rk])
					}
					if g < 0 {
						g = s
					}
					if s != g {
						t.Errorf("rank %d resumed at step %d, another at %d", rk, s, g)
					}
					continue
				}
				if len(pids[rk]) != 1 || len(rejoined[rk]) != 1 {
					t.Errorf("surviving rank %d: pids %v, rejoined at steps %v; want one pid (not restarted), one rejoin", rk, pids[rk], rejoined[rk])
					continue
				}
				if _, ok := resumed[rk]; ok {
					t.Errorf("surviving rank %d resumed as a new process", rk)
				}
				if g < 0 {
					g = rejoined[rk][0]
				}
				if rejoined[rk][0] != g {
					t.Errorf("rank %d rejoined at step %d, another rank went on from %d", rk, rejoined[rk][0], g)
				}
			}
			if len(epochs) != 1 {
				t.Errorf("the survivors rejoined epochs %v, want one", epochs)
			}
			t.Logf("the survivors rejoined epoch %v and the moved ranks resumed at step %d; pids %v", epochs, g, pids)
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
			}
			if got := torchChecksum(t, res); got != want {
				t.Errorf("after losing host %d in place: checksum %s, the plain loop's %s\nstdout:\n%s\nstderr:\n%s", tc.kill, got, want, res.stdout, res.stderr)
			}
		})
	}
}

// torchFailedRE matches train.py --in-place's line when a step failed and
// the rank rejoins.
var torchFailedRE = regexp.MustCompile(`(?m)^\[\d+\] rank \d+: step \d+ failed .*; rejoining$`)

// torchFreeze stops (SIGSTOP) every process of host h, a silent host, and
// reports how long it took until the launcher published the new epoch
// (its splice event) and until a surviving rank's step failed (its
// "rejoining" line): the survivors' collective waits for the frozen peers
// until the process group's timeout. Then the host is killed.
func torchFreeze(t *testing.T, c *hsCluster, r *hsRun, h int) {
	t.Helper()
	if err := c.hosts.StopAll(h); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	defer func() {
		if err := c.hosts.KillAll(h); err != nil {
			t.Error(err)
		}
	}()
	var spliced, failed time.Duration
	for deadline := frozen.Add(90 * time.Second); spliced == 0 || failed == 0; {
		if spliced == 0 {
			if b, _ := os.ReadFile(r.events); bytes.Contains(b, []byte(`"event":"splice"`)) {
				spliced = time.Since(frozen)
			}
		}
		if failed == 0 && torchFailedRE.MatchString(r.stderr.String()) {
			failed = time.Since(frozen)
		}
		if time.Now().After(deadline) {
			t.Fatalf("90 s after host %d froze: splice after %v, a step failed after %v (0: not yet)\nstderr:\n%s", h, spliced, failed, r.stderr.String())
		}
		select {
		case <-r.done:
			t.Fatalf("gorun exited (code %d) while host %d was frozen\nstdout:\n%s\nstderr:\n%s", r.res.code, h, r.res.stdout, r.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Logf("host %d frozen: the new epoch's splice after %v, the first survivor's failed step after %v", h, spliced.Round(time.Millisecond), failed.Round(time.Millisecond))
}
