package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/testcluster"
	"github.com/gorun/gorun/topology"
)

// End-to-end tests of host replacement (issue 14): a job of examples/dptrain
// on namespace hosts loses a host (every process killed, its link taken
// down, frozen and then killed, or a rank stopped) at a random step; gorun fences the host, splices
// a spare in, publishes the next epoch and restores the lost ranks' state
// from their replicas. The job must end as a run without the failure ends:
// exit 0 and bitwise the same final hashes.

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

// hsEvent is a line of the --events file (its schema: package internal/events).
type hsEvent struct {
	T          float64  `json:"t"`
	Event      string   `json:"event"`
	Epoch      uint64   `json:"epoch"`
	Gen        uint64   `json:"gen"`
	G          int64    `json:"g"`
	Host       string   `json:"host"`
	Lost       string   `json:"lost"`
	With       string   `json:"with"`
	Ranks      []int    `json:"ranks"`
	Spare      bool     `json:"spare"`
	Code       int      `json:"code"`
	Msg        string   `json:"msg"`
	Cause      string   `json:"cause"`
	Decision   string   `json:"decision"`
	Superseded bool     `json:"superseded"`
	Detected   *float64 `json:"detected"`
	Classified *float64 `json:"classified"`
	Replaced   *float64 `json:"replaced"`
	Published  *float64 `json:"published"`
	Restored   *float64 `json:"restored"`
	Resumed    *float64 `json:"resumed"`
}

// readEvents reads the --events file: every line one JSON object.
func readEvents(t *testing.T, path string) []hsEvent {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the events file: %v", err)
	}
	var evs []hsEvent
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var e hsEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("events file line %q: %v", sc.Text(), err)
		}
		evs = append(evs, e)
	}
	return evs
}

// ofKind returns the events of kind k.
func ofKind(evs []hsEvent, k string) []hsEvent {
	var out []hsEvent
	for _, e := range evs {
		if e.Event == k {
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
	if evs := readEvents(t, r.events); len(ofKind(evs, "splice"))+len(ofKind(evs, "restart")) > 0 {
		t.Errorf("a run without a failure recovered: %+v", evs)
	}
	return dptrainHashes(t, res)
}

func TestHotSwapHostLoss(t *testing.T) {
	c := newHSCluster(t, 4, 1)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	for _, dg := range []bool{false, true} {
		var extra []string
		if dg {
			extra = []string{"--device-grad"}
		}
		wantP, wantO := hsReference(t, c, extra...)
		for _, mode := range []string{"restart", "in-place"} {
			for _, f := range faults {
				t.Run(fmt.Sprintf("%s/%s/device-grad=%v", mode, f.name, dg), func(t *testing.T) {
					hostLoss(t, c, rng, mode, f, nil, extra, wantP, wantO)
				})
			}
		}
	}
}

// TestHotSwapDiffMode loses a host (killed, or frozen first so that the
// loss lands on survivors waiting for it) under --protect-mode diff, in
// both recovery modes: the lost ranks' state is rebuilt on the spare from
// their holders' bases and differentials, and the job ends with the
// hashes of a run without failure.
func TestHotSwapDiffMode(t *testing.T) {
	c := newHSCluster(t, 4, 1)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	extra := []string{"--device-grad"}
	wantP, wantO := hsReference(t, c, extra...)
	diff := []string{"--protect-mode", "diff", "--base-every", "6", "--diff-fold", "4"}
	for _, mode := range []string{"restart", "in-place"} {
		for _, f := range faults {
			if f.name != "kill" && f.name != "freeze" {
				continue
			}
			t.Run(mode+"/"+f.name, func(t *testing.T) {
				hostLoss(t, c, rng, mode, f, diff, extra, wantP, wantO)
			})
		}
	}
}

// hostLoss runs one case of the host-loss matrix: the job with
// --recovery mode and flags, dptrain with --protect and args; fault f on
// a random working host after a random step; then checks the hashes
// (wantP, wantO), the steps run again, the recovery timeline and the
// splice.
func hostLoss(t *testing.T, c *hsCluster, rng *rand.Rand, mode string, f fault, flags, args []string, wantP, wantO string) {
	dg := slices.Contains(args, "--device-grad")
	h := rng.IntN(c.work)
	step := 5 + rng.IntN(hsSteps-15)
	t.Logf("%s on host %d (%s) after step %d", f.name, h, c.hosts.Names[h], step)
	flags = append(append([]string{"--recovery", mode, "--max-restarts", "2"}, f.flags...), flags...)
	r := c.start(t, flags, append([]string{"--protect"}, args...)...)
	r.waitStep(t, step)
	killAt := time.Since(r.start).Seconds()
	f.inject(t, c, r, h)
	res := r.finish(t, 0)
	defer func() {
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		}
	}()
	checkHashes(t, res, wantP, wantO)
	if f.name == "freeze" && mode == "in-place" && dg && !strings.Contains(res.stderr, "to be recoverable everywhere") {
		// With --device-grad the survivors wait for the
		// frozen host's replicas at the overwrite rule.
		t.Errorf("no survivor says it waited at the overwrite rule when the epoch changed")
	}
	// Rank 0 logs step s once its own update is done, before
	// every rank committed s: the step in flight, and G's lag
	// of at most one step behind the committed ones (the
	// overwrite rule), may be run again; nothing older.
	if n := reexecuted(res.stdout); n > 2 {
		t.Errorf("%d steps executed again, want at most 2 (the step in flight and G's lag)", n)
	}
	evs := readEvents(t, r.events)
	tl := ofKind(evs, "timeline")
	if len(tl) == 0 || tl[len(tl)-1].Resumed == nil {
		t.Fatalf("no recovery timeline that resumed: %+v", evs)
	}
	last := tl[len(tl)-1]
	t.Logf("recovery: detected %.3fs after the fault, published %+.3fs, resumed %+.3fs after detection; %d steps run again; %s",
		*last.Detected-killAt, *last.Published-*last.Detected, *last.Resumed-*last.Detected, reexecuted(res.stdout), last.Cause)
	sp := ofKind(evs, "splice")
	if f.host {
		if len(sp) != 1 || !sp[0].Spare || sp[0].With != c.hosts.Names[c.work] || sp[0].Lost != c.hosts.Names[h] {
			t.Errorf("splices %+v, want one of host %s with the spare %s", sp, c.hosts.Names[h], c.hosts.Names[c.work])
		}
		if mode == "in-place" && len(ofKind(evs, "restart")) > 0 {
			t.Errorf("in-place recovery restarted the ranks: %+v", ofKind(evs, "restart"))
		}
	}
}

// TestHotSwapTwoLosses loses two hosts one after the other, with two
// spares: both are used, and the job ends as one without failures.
func TestHotSwapTwoLosses(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	wantP, wantO := hsReference(t, c)
	for _, mode := range []string{"restart", "in-place"} {
		t.Run(mode, func(t *testing.T) {
			r := c.start(t, []string{"--recovery", mode}, "--protect")
			r.waitStep(t, 8)
			if err := c.hosts.KillAll(1); err != nil {
				t.Fatal(err)
			}
			// The second loss once the first recovery is over and the
			// replicas the lost host held are in place again.
			waitEvents(t, r, func(evs []hsEvent) bool {
				return len(ofKind(evs, "timeline")) == 1 && len(ofKind(evs, "protected")) >= 1
			})
			if err := c.hosts.KillAll(2); err != nil {
				t.Fatal(err)
			}
			res := r.finish(t, 0)
			checkHashes(t, res, wantP, wantO)
			sp := ofKind(readEvents(t, r.events), "splice")
			var with []string
			for _, s := range sp {
				with = append(with, s.With)
			}
			slices.Sort(with)
			if want := c.hosts.Names[4:6]; !slices.Equal(with, want) {
				t.Errorf("spliced in %v, want both spares %v", with, want)
			}
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
			}
		})
	}
}

// waitEvents polls r's events file until ok says it holds what the test
// waits for.
func waitEvents(t *testing.T, r *hsRun, ok func([]hsEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(r.events); err == nil && len(b) > 0 && b[len(b)-1] == '\n' && ok(readEvents(t, r.events)) {
			return
		}
		select {
		case <-r.done:
			t.Fatalf("gorun exited (code %d) before the events awaited\nstderr:\n%s", r.res.code, r.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(r.events)
	t.Fatalf("the events awaited did not come within 60s; events:\n%s\nstderr:\n%s", b, r.stderr.String())
}

// TestHotSwapFailureDuringRecovery loses a second host while the first
// loss is being recovered: the next epoch starts after it, and the job
// ends as one without failures.
func TestHotSwapFailureDuringRecovery(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	wantP, wantO := hsReference(t, c)
	for _, mode := range []string{"restart", "in-place"} {
		t.Run(mode, func(t *testing.T) {
			r := c.start(t, []string{"--recovery", mode}, "--protect")
			r.waitStep(t, 8)
			if err := c.hosts.KillAll(1); err != nil {
				t.Fatal(err)
			}
			// As soon as the first recovery epoch is published, before it
			// resumed. Host 3's ranks hold no replica of host 1's, nor
			// host 1 of theirs (ring holders: the next host).
			waitEvents(t, r, func(evs []hsEvent) bool { return len(ofKind(evs, "publish")) >= 1 })
			if err := c.hosts.KillAll(3); err != nil {
				t.Fatal(err)
			}
			res := r.finish(t, 0)
			checkHashes(t, res, wantP, wantO)
			evs := readEvents(t, r.events)
			if n := len(ofKind(evs, "splice")); n != 2 {
				t.Errorf("%d splices, want 2: %+v", n, evs)
			}
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
			}
		})
	}
}

// TestHotSwapNoSpare loses a host when no spare is left: with
// --on-no-spare free-slots a surviving host with free slots takes its
// ranks; with abort the job stops with a report. Host 0 has 4 slots, the
// others 2; ranks go round-robin (2 per host), so host 0 has room for the
// 2 ranks of a lost host.
func TestHotSwapNoSpare(t *testing.T) {
	h := testcluster.NetnsHosts(t, 4)
	hf := filepath.Join(t.TempDir(), "hostfile")
	lines := fmt.Sprintf("%s slots=4\n%s slots=2\n%s slots=2\n%s slots=2\n", h.Names[0], h.Names[1], h.Names[2], h.Names[3])
	if err := os.WriteFile(hf, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, flags ...string) *hsRun {
		ev := filepath.Join(t.TempDir(), "events.jsonl")
		full := []string{"-np", "8", "--hostfile", hf, "--map-by", "node", "--rsh", "ip netns exec", "--bind", h.BridgeAddr,
			"-v", "--events", ev, "--kill-grace", "2"}
		full = append(full, flags...)
		full = append(full, "--", "sh", "-c", printJobID, dptrainBin(t))
		full = append(full, hsArgs...)
		return &hsRun{job: startProtectedJob(t, append(full, "--protect")...), events: ev}
	}
	ref := start(t)
	wantP, wantO := dptrainHashes(t, ref.finish(t, 0))

	t.Run("free-slots", func(t *testing.T) {
		r := start(t, "--on-no-spare", "free-slots")
		r.waitStep(t, 10)
		if err := h.KillAll(2); err != nil {
			t.Fatal(err)
		}
		res := r.finish(t, 0)
		checkHashes(t, res, wantP, wantO)
		sp := ofKind(readEvents(t, r.events), "splice")
		if len(sp) == 0 {
			t.Fatalf("no splice\nstderr:\n%s", res.stderr)
		}
		for _, s := range sp {
			if s.Spare || s.Lost != h.Names[2] || s.With != h.Names[0] {
				t.Errorf("splice %+v, want host %s's ranks moved to the free slots of host %s", s, h.Names[2], h.Names[0])
			}
		}
	})
	t.Run("abort", func(t *testing.T) {
		r := start(t, "--on-no-spare", "abort")
		r.waitStep(t, 10)
		if err := h.KillAll(2); err != nil {
			t.Fatal(err)
		}
		res := r.finish(t, -1)
		if res.code == 0 {
			t.Fatalf("exit 0 though a host was lost with no spare and --on-no-spare abort\nstderr:\n%s", res.stderr)
		}
		if !strings.Contains(res.stderr, h.Names[2]) || !strings.Contains(res.stderr, "spare") {
			t.Errorf("the report does not name the lost host %s and the missing spare\nstderr:\n%s", h.Names[2], res.stderr)
		}
	})
}

// TestHotSwapCrashLoop runs a rank that fails at once every time it
// starts: the job stops with a report naming it instead of restarting it
// for ever.
func TestHotSwapCrashLoop(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	const crash = `echo "job $GORUN_JOB_ID"; if [ "$GORUN_RANK" = 3 ]; then echo "rank 3 cannot start" >&2; exit 3; fi; exec "$0" "$@"`
	full := []string{"-np", "4", "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr,
		"--max-restarts", "5", "--", "sh", "-c", crash, dptrainBin(t)}
	j := startProtectedJob(t, append(full, append(hsArgs, "--protect")...)...)
	res := j.wait(120 * time.Second)
	if res.code != 3 {
		t.Fatalf("exit %d, want 3 (rank 3's status)\nstderr:\n%s", res.code, res.stderr)
	}
	if !regexp.MustCompile(`rank 3 on host \S+ .*exit(ed)? (with )?(status|code) 3`).MatchString(res.stderr) {
		t.Errorf("the report does not name rank 3 and its status\nstderr:\n%s", res.stderr)
	}
	if !strings.Contains(res.stderr, "stopping the job rather than restarting it in a loop") {
		t.Errorf("the report does not say the job stopped a crash loop\nstderr:\n%s", res.stderr)
	}
	// Its peers fail with it, and which is reported first varies: the
	// loop is caught once the same rank failed twice in a row, or the job
	// failed hotswap.CrashLoopFailures times, without progress.
	if n := strings.Count(res.stderr, "restarting every rank"); n > hotswap.CrashLoopFailures-1 {
		t.Errorf("restarted %d times a rank that fails at once every time", n)
	}
	checkJobCleanedUp(t, j)
}

// TestHotSwapPython loses the host of rank 0 of examples/pytrain (its
// state protected through the Python client): with --recovery restart the
// spare takes the ranks and the final hash is that of a run without a
// failure.
func TestHotSwapPython(t *testing.T) {
	python, script := pytrain(t)
	c := newHSCluster(t, 2, 1)
	run := func(t *testing.T, kill bool) string {
		ev := filepath.Join(t.TempDir(), "events.jsonl")
		full := []string{"-np", "4", "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr,
			"-v", "--events", ev, "--recovery", "restart", "--kill-grace", "2",
			"--", "sh", "-c", printJobID, python, script, "--steps", "400", "--seed", "3", "--protect"}
		r := &hsRun{job: startProtectedJob(t, full...), events: ev}
		if kill {
			r.waitFor(regexp.MustCompile(`(?m)^\[0\] step 99 `), 1, 60*time.Second)
			if err := c.hosts.KillAll(0); err != nil {
				t.Fatal(err)
			}
		}
		res := r.finish(t, 0)
		m := pytrainHashRE.FindStringSubmatch(res.stdout)
		if m == nil {
			t.Fatalf("no final hash\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		}
		if kill {
			if sp := ofKind(readEvents(t, r.events), "splice"); len(sp) != 1 || sp[0].With != c.hosts.Names[2] {
				t.Errorf("splices %+v, want one with the spare %s", sp, c.hosts.Names[2])
			}
		}
		return m[1]
	}
	want := run(t, false)
	if got := run(t, true); got != want {
		t.Errorf("final hash %s after losing rank 0's host, %s without", got, want)
	}
}

// TestHotSwapStdin: the rank that reads gorun's stdin (rank 0) is on the
// lost host; its replacement on the spare reads on: a line sent after the
// loss reaches it, and a stdin that ended before the loss is at its end
// for the replacement too (rather than leaving it waiting for input).
func TestHotSwapStdin(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	// Rank 0 echoes its stdin, says when it ends, then waits for the file
	// named go; the other ranks end at once.
	const reader = `echo "job $GORUN_JOB_ID"
if [ "$GORUN_RANK" = 0 ]; then
	while read l; do echo "got $l"; done
	echo "stdin ended"
	while [ ! -e "$1/go" ]; do sleep 0.05; done
fi`
	for _, tc := range []struct {
		name      string
		eofBefore bool // stdin ends before the loss
		stream    bool // lines keep coming through the loss
	}{{"line after the loss", false, false}, {"end of stdin before the loss", true, false}, {"lines through the loss", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pr, pw := io.Pipe()
			defer pw.Close()
			ev := filepath.Join(t.TempDir(), "events.jsonl")
			j := startJobWithStdin(t, pr, "", nil, "-np", "4", "--hostfile", c.hostfile, "--spares", "1",
				"--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr, "--events", ev, "--kill-grace", "2",
				"--", "sh", "-c", reader, "reader", dir)
			r := &hsRun{job: j, events: ev}
			if _, err := io.WriteString(pw, "one\n"); err != nil {
				t.Fatal(err)
			}
			r.waitFor(regexp.MustCompile(`(?m)^\[0\] got one$`), 1, time.Minute)
			if tc.eofBefore {
				pw.Close()
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 1, time.Minute)
			}
			var streamed sync.WaitGroup
			stop := make(chan struct{})
			if tc.stream {
				// Lines go on while the host dies: the chunk in flight
				// goes to the replacement once it has started.
				streamed.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := fmt.Fprintf(pw, "s%d\n", i); err != nil {
							return
						}
					}
				})
			}
			if err := c.hosts.KillAll(0); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.stream:
				// The replacement (its job line is rank 0's second)
				// reads lines that were sent after it started.
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] job \S+$`), 2, time.Minute)
				after := strings.LastIndex(r.stdout.String(), "[0] job ")
				deadline := time.Now().Add(time.Minute)
				for !regexp.MustCompile(`(?m)^\[0\] got s\d+$`).MatchString(r.stdout.String()[after:]) {
					if time.Now().After(deadline) {
						t.Fatalf("the replacement of rank 0 read no line within a minute\nstdout:\n%s\nstderr:\n%s", r.stdout.String(), r.stderr.String())
					}
					time.Sleep(10 * time.Millisecond)
				}
				close(stop)
				pw.Close()
				streamed.Wait()
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 1, time.Minute)
			case tc.eofBefore:
				// The replacement sees the end at once.
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 2, time.Minute)
			default:
				if _, err := io.WriteString(pw, "two\n"); err != nil {
					t.Fatal(err)
				}
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] got two$`), 1, time.Minute)
				pw.Close()
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 1, time.Minute)
			}
			if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			res := r.finish(t, 0)
			if strings.Contains(res.stderr, "under-protected") {
				t.Errorf("a job that protects no state reported itself under-protected\nstderr:\n%s", res.stderr)
			}
			if sp := ofKind(readEvents(t, ev), "splice"); len(sp) != 1 || sp[0].Lost != c.hosts.Names[0] || !slices.Contains(sp[0].Ranks, 0) {
				t.Errorf("splices %+v, want rank 0's host %s replaced\nstderr:\n%s", sp, c.hosts.Names[0], res.stderr)
			}
		})
	}
}

// TestHotSwapEC loses two of four hosts at once under --redundancy ec:2+2
// (one group: two data hosts, two parity hosts; two spares), while the
// survivors compute, in both recovery modes: both data hosts (the lost
// ranks have no clear copy left: every one of them is decoded from the
// parity rows and the surviving members), and a data host with a parity
// host (decode from the other parity row). The job must end as a run
// without failure: exit 0, the same final hashes, both spares spliced in.
func TestHotSwapEC(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	ec := []string{"--redundancy", "ec:2+2"}
	g, asg := c.ecGroup(t, 2)
	// The ranks of a lost data host have no clear copy left, nor have
	// the ranks whose clear copy it held: they are decoded.
	decoded := func(lost []int) []int {
		var rs []int
		for x, dg := range g.DataGroups {
			if !slices.Contains(lost, g.Data[x]) {
				continue
			}
			for _, r := range dg {
				if slices.Contains(lost, asg[r].Host) {
					rs = append(rs, r)
				}
			}
		}
		return rs
	}
	// The failure-free run's hashes, which the protection does not change.
	wantP, wantO := hsReference(t, c)
	for _, mode := range []string{"restart", "in-place"} {
		for _, tc := range []struct {
			name string
			lost []int
		}{
			{"data+data", []int{g.Data[0], g.Data[1]}},
			{"data+parity", []int{g.Data[0], g.Parity[0]}},
		} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				r := c.start(t, append([]string{"--recovery", mode}, ec...), "--protect")
				r.waitStep(t, 8)
				for _, h := range tc.lost {
					if err := c.hosts.KillAll(h); err != nil {
						t.Fatal(err)
					}
				}
				res := r.finish(t, 0)
				defer func() {
					if t.Failed() {
						t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
					}
				}()
				checkHashes(t, res, wantP, wantO)
				evs := readEvents(t, r.events)
				var with []string
				for _, s := range ofKind(evs, "splice") {
					with = append(with, s.With)
				}
				slices.Sort(with)
				if want := c.hosts.Names[c.work:]; !slices.Equal(with, want) {
					t.Errorf("spliced in %v, want both spares %v", with, want)
				}
				// -v logs the machine's restore plans. The ranks of the
				// data host lost first have no copy but their own slot:
				// some plan decodes. Whether the others do depends on
				// whether the second loss is seen before the first's
				// copies are re-sent; no plan decodes a rank that keeps
				// a clear copy whatever the timing.
				decodes := regexp.MustCompile(` r(\d+)<-decode,`)
				n := 0
				for _, l := range strings.Split(res.stderr, "\n") {
					if !strings.Contains(l, "hot-swap") || !strings.Contains(l, "restore epoch=") {
						continue
					}
					for _, m := range decodes.FindAllStringSubmatch(l, -1) {
						n++
						if x, _ := strconv.Atoi(m[1]); !slices.Contains(decoded(tc.lost), x) {
							t.Errorf("rank %d decoded, but its clear copy survives (ranks without one: %v): %s", x, decoded(tc.lost), l)
						}
					}
				}
				if n == 0 {
					t.Errorf("no restore plan decodes (ranks without a clear copy: %v)", decoded(tc.lost))
				}
				if mode == "in-place" && len(ofKind(evs, "restart")) > 0 {
					t.Errorf("in-place recovery restarted the ranks: %+v", ofKind(evs, "restart"))
				}
			})
		}
	}
}

// TestHotSwapECDiff is TestHotSwapEC in diff mode: --protect-mode diff
// --redundancy ec:2+2 --base-every 8 (dptrain with --device-grad, the
// replay optimizer), two of four hosts lost at once while the survivors
// compute, in both recovery modes. Only the bases are coded: a lost rank
// without a clear copy is decoded at H, the newest base every rank has,
// and replays its differentials (H, G] from a log holder. Both data hosts
// (decode + replay), and a data with a parity host (mixed): the job must
// end as a run without failure, exit 0 with the same final hashes.
func TestHotSwapECDiff(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	flags := []string{"--redundancy", "ec:2+2", "--protect-mode", "diff", "--base-every", "8"}
	extra := []string{"--device-grad"}
	g, _ := c.ecGroup(t, 2)
	wantP, wantO := hsReference(t, c, extra...)
	for _, mode := range []string{"restart", "in-place"} {
		for _, tc := range []struct {
			name string
			lost []int
		}{
			{"data+data", []int{g.Data[0], g.Data[1]}},
			{"data+parity", []int{g.Data[0], g.Parity[0]}},
		} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				r := c.start(t, append([]string{"--recovery", mode}, flags...), append([]string{"--protect"}, extra...)...)
				// Past the second base (H >= 8 once coded): the decode
				// has differentials to replay.
				r.waitStep(t, 20)
				for _, h := range tc.lost {
					if err := c.hosts.KillAll(h); err != nil {
						t.Fatal(err)
					}
				}
				res := r.finish(t, 0)
				defer func() {
					if t.Failed() {
						t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
					}
				}()
				checkHashes(t, res, wantP, wantO)
				evs := readEvents(t, r.events)
				var with []string
				for _, s := range ofKind(evs, "splice") {
					with = append(with, s.With)
				}
				slices.Sort(with)
				if want := c.hosts.Names[c.work:]; !slices.Equal(with, want) {
					t.Errorf("spliced in %v, want both spares %v", with, want)
				}
				// The ranks of the data host lost first keep no clear copy
				// but their own slot, lost with it: some plan decodes.
				if !regexp.MustCompile(` r\d+<-decode,`).MatchString(res.stderr) {
					t.Errorf("no restore plan decodes")
				}
				if !strings.Contains(res.stderr, "H = ") {
					t.Errorf("-v does not show H beside G")
				}
				if mode == "in-place" && len(ofKind(evs, "restart")) > 0 {
					t.Errorf("in-place recovery restarted the ranks: %+v", ofKind(evs, "restart"))
				}
			})
		}
	}
}
