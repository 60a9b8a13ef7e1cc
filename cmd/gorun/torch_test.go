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

// torchNetnsIface makes gloo use the namespace hosts' interface: by
// default it takes the address the host name resolves to, a loopback
// address here (the namespaces share the host name), which the other
// hosts cannot reach.
const torchNetnsIface = "GLOO_SOCKET_IFNAME=eth0"

// TestTorchHostLoss: on namespace hosts with one spare, the host of ranks
// 0 and 1 (and of MASTER_ADDR) of a protected run is killed mid-run; with
// --recovery restart the spare takes its ranks, every rank restores from
// gorun (the replacement from its replica holder) and the job ends with
// exit 0 and the checksum of the plain loop's run.
func TestTorchHostLoss(t *testing.T) {
	python, script := torchTrain(t)
	// BatchNorm: buffers that differ per rank, which a replacement must
	// not take from a data-parallel peer.
	args := []string{"--steps", "300", "--seed", "5", "--norm", "batch"}
	want := torchReference(t, 4, args...)
	c := newHSCluster(t, 2, 1)
	ev := filepath.Join(t.TempDir(), "events.jsonl")
	full := []string{"-np", "4", "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr,
		"-v", "--events", ev, "--recovery", "restart", "--kill-grace", "2", "-x", torchNetnsIface,
		"--", "sh", "-c", printJobID, python, script, "--protect"}
	start := time.Now()
	r := &hsRun{job: startProtectedJob(t, append(full, args...)...), events: ev}
	r.waitFor(regexp.MustCompile(`(?m)^\[0\] step 49 `), 1, 90*time.Second)
	if err := c.hosts.KillAll(0); err != nil {
		t.Fatal(err)
	}
	res := r.finish(t, 0, 1)
	t.Logf("gorun -np 4 on 2+1 namespace hosts, host 0 killed after step 49: %v", time.Since(start).Round(time.Millisecond))
	if sp := ofKind(readEvents(t, r.events), "splice"); len(sp) != 1 || sp[0].With != c.hosts.Names[2] {
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
