package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/testcluster"
	"github.com/gorun/gorun/topology"
)

// The harness of the host-replacement tests (hotswap_test.go,
// hotswap_ec_test.go).

// hsSteps and hsArgs are the trainer's run here: steps slow enough (an
// emulated accelerator time) that a failure lands in the middle of one,
// and every step logged so that the test can aim at a step.
const hsSteps = 40

var hsArgs = []string{"--params", "200K", "--steps", strconv.Itoa(hsSteps), "--seed", "7", "--log-every", "1", "--device-ms", "20"}

// hsCluster is work namespace hosts with 2 slots each followed by spares
// (the hostfile's last hosts, named by --spares).
type hsCluster struct {
	hosts        *testcluster.Hosts
	work, spares int
	hostfile     string
}

// ecGroup returns the one ec:2+m group of c as the launcher plans it:
// the hostfile's hosts in order (two slots each, the last ones spares),
// ranks by slot, topology.PlanEC; with the ranks' assignment.
func (c *hsCluster) ecGroup(t *testing.T, m int) (topology.ECGroup, []topology.Assignment) {
	t.Helper()
	hosts := make([]topology.Host, len(c.hosts.Names))
	for i, n := range c.hosts.Names {
		hosts[i] = topology.Host{Name: n, Slots: 2, Spare: i >= c.work}
	}
	asg, err := topology.MapRanks(hosts, topology.MapOptions{NP: 2 * c.work, By: topology.MapBySlot})
	if err != nil {
		t.Fatal(err)
	}
	groups, err := topology.PlanEC(hosts, asg, topology.ECOptions{K: 2, M: m})
	if err != nil || len(groups) != 1 {
		t.Fatalf("PlanEC = %v, %v; want one group", groups, err)
	}
	g := groups[0]
	t.Logf("data hosts %v, parity hosts %v", g.Data, g.Parity)
	return g, asg
}

func newHSCluster(t *testing.T, work, spares int) *hsCluster {
	t.Helper()
	h := testcluster.NetnsHosts(t, work+spares)
	return &hsCluster{hosts: h, work: work, spares: spares, hostfile: h.WriteHostfile(t, t.TempDir(), 2)}
}

// hsRun is one job of the tests here.
type hsRun struct {
	*job
	events string        // the --events file
	limit  time.Duration // how long finish waits (0: 2 minutes)
}

// start runs `gorun -np 2*work --spares K -v --events F FLAGS -- dptrain
// hsArgs ARGS` on c.
func (c *hsCluster) start(t *testing.T, flags []string, args ...string) *hsRun {
	t.Helper()
	return c.startEnv(t, nil, flags, args...)
}

// startEnv is start with env (NAME=VALUE) added to gorun's environment,
// which its agents inherit.
func (c *hsCluster) startEnv(t *testing.T, env, flags []string, args ...string) *hsRun {
	t.Helper()
	ev := filepath.Join(t.TempDir(), "events.jsonl")
	full := []string{"-np", strconv.Itoa(2 * c.work), "--hostfile", c.hostfile, "--spares", strconv.Itoa(c.spares),
		"--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr, "-v", "--events", ev, "--kill-grace", "2"}
	full = append(full, flags...)
	full = append(full, "--", "sh", "-c", printJobID, dptrainBin(t))
	full = append(full, hsArgs...)
	return &hsRun{job: startProtectedJobEnv(t, env, append(full, args...)...), events: ev}
}

// finish waits for the job, checks that it left nothing behind and, when
// want >= 0, its exit code. Nothing of a crashed host (every process
// killed) is left either: its agent could not remove its job directory
// or Open MPI's, but the namespace hosts share /tmp and /dev/shm, and the
// job's surviving agents sweep their job's unheld ones as they end. (A
// real host's /tmp goes with it, or stays for the next agent there or
// gorun clean.) Only a job none of whose agents ended normally (gorun
// itself killed with every host) would leave them.
func (r *hsRun) finish(t *testing.T, want int) result {
	t.Helper()
	res := r.wait(cmp.Or(r.limit, 120*time.Second))
	id := r.jobID()
	checkNoSlotFiles(t, id)
	checkNoJobFiles(t, id)
	if want >= 0 && res.code != want {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", res.code, want, res.stdout, res.stderr)
	}
	return res
}

// rank0StepRE matches rank 0's step lines (with --device-grad, no loss).
var rank0StepRE = regexp.MustCompile(`(?m)^\[0\] step (\d+)(?: loss \S+)?$`)

// stepLine matches rank 0's line of step s.
func stepLine(s int) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^\[0\] step ` + strconv.Itoa(s) + `(?: loss \S+)?$`)
}

// waitStep waits until rank 0 has logged step s.
func (r *hsRun) waitStep(t *testing.T, s int) {
	t.Helper()
	r.waitFor(stepLine(s), 1, 60*time.Second)
}

// waitStalled waits until rank 0 has logged no step for quiet: the job
// waits for something (a frozen host). It fails the test if the job
// still makes progress after a minute.
func (r *hsRun) waitStalled(t *testing.T, quiet time.Duration) {
	t.Helper()
	n, since := -1, time.Now()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		if m := len(rank0StepRE.FindAllString(r.stdout.String(), -1)); m != n {
			n, since = m, time.Now()
		} else if time.Since(since) >= quiet {
			t.Logf("rank 0 waits after %d steps", n)
			return
		}
		select {
		case <-r.done:
			t.Fatalf("gorun exited while the job was to wait (code %d)\nstdout:\n%s\nstderr:\n%s", r.res.code, r.res.stdout, r.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("rank 0 still logs steps a minute after a host froze\nstdout:\n%s", r.stdout.String())
}

// reexecuted counts the steps rank 0 logged more than once: the steps a
// recovery ran again.
func reexecuted(stdout string) int {
	seen := map[string]int{}
	for _, m := range rank0StepRE.FindAllStringSubmatch(stdout, -1) {
		seen[m[1]]++
	}
	n := 0
	for _, c := range seen {
		n += c - 1
	}
	return n
}

// readEvents reads the --events file with events.ReadAll, the schema's
// own reader: a line it does not read fails the test.
func readEvents(t *testing.T, path string) []events.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("reading the events file: %v", err)
	}
	defer f.Close()
	recs, err := events.ReadAll(f)
	if err != nil {
		t.Fatalf("reading the events file: %v", err)
	}
	return recs
}

// ofKind returns the bodies of the records of kind E.
func ofKind[E events.Event](recs []events.Record) []E {
	var out []E
	for _, r := range recs {
		if e, ok := r.Event.(E); ok {
			out = append(out, e)
		}
	}
	return out
}

// rankPid finds the pid of rank r's trainer, the process of the job
// marked mark whose command line names prog (dptrain, train.py).
func rankPid(t *testing.T, mark string, r int, prog string) int {
	t.Helper()
	needle := []byte("GORUN_RANK=" + strconv.Itoa(r) + "\x00")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, []byte("GORUNTEST_MARK="+mark)) || !bytes.Contains(env, needle) {
			continue
		}
		if cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); bytes.Contains(cmd, []byte(prog)) {
			return pid
		}
	}
	t.Fatalf("no %s process of rank %d found", prog, r)
	return 0
}

// A fault is a failure injected into a running job: on host h (of the
// cluster's work hosts), or its rank 2h.
type fault struct {
	name   string
	inject func(t *testing.T, c *hsCluster, r *hsRun, h int)
	flags  []string // gorun flags the fault needs detected
	host   bool     // the host is lost (a spare takes its ranks)
}

var faults = []fault{
	{name: "kill", host: true, inject: func(t *testing.T, c *hsCluster, r *hsRun, h int) {
		if err := c.hosts.KillAll(h); err != nil {
			t.Fatal(err)
		}
	}},
	// The host freezes first: the survivors go on until they wait for it
	// (in a collective with its ranks, or at the overwrite rule for its
	// replicas), and only then does it die: the loss lands on ranks that
	// are waiting, not computing.
	{name: "freeze", host: true, inject: func(t *testing.T, c *hsCluster, r *hsRun, h int) {
		if err := c.hosts.StopAll(h); err != nil {
			t.Fatal(err)
		}
		r.waitStalled(t, time.Second)
		if err := c.hosts.KillAll(h); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "partition", host: true, inject: func(t *testing.T, c *hsCluster, r *hsRun, h int) {
		if err := c.hosts.LinkDown(h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { linkUp(t, c, h) })
	}, flags: []string{"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5"}},
	{name: "stop", flags: []string{"--hang-timeout", "2"}, inject: func(t *testing.T, c *hsCluster, r *hsRun, h int) {
		pid := rankPid(t, r.mark, 2*h, "dptrain")
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Logf("rank %d (pid %d) stopped", 2*h, pid)
	}},
}

// linkUp undoes a partition of host h and waits until the host reaches the
// bridge again (the next test's agent must be able to connect).
func linkUp(t *testing.T, c *hsCluster, h int) {
	if err := c.hosts.LinkUp(h); err != nil {
		t.Errorf("undoing the partition: %v", err)
		return
	}
	l, err := net.Listen("tcp", net.JoinHostPort(c.hosts.BridgeAddr, "0"))
	if err != nil {
		t.Errorf("undoing the partition: %v", err)
		return
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	dial := fmt.Sprintf("import socket; socket.create_connection((%q, %d), 0.5)", c.hosts.BridgeAddr, l.Addr().(*net.TCPAddr).Port)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.hosts.Exec(ctx, h, "python3", "-c", dial).Run()
		cancel()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("host %d does not reach the bridge 20s after its link came up", h)
}

// hsReference runs the job without a failure and returns rank 0's hashes.
func hsReference(t *testing.T, c *hsCluster, args ...string) (params, optimizer string) {
	t.Helper()
	r := c.start(t, nil, append([]string{"--protect"}, args...)...)
	res := r.finish(t, 0)
	if evs := readEvents(t, r.events); len(ofKind[events.Splice](evs))+len(ofKind[events.Restart](evs)) > 0 {
		t.Errorf("a run without a failure recovered: %+v", evs)
	}
	return dptrainHashes(t, res)
}
