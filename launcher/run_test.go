package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gordump"
	"github.com/gorun/gorun/internal/gortest"

	"github.com/gorun/gorun/topology"
)

// syncBuffer is safe for concurrent use.
type syncBuffer = gortest.SyncBuffer

// run is one in-process launcher.Run.
type run struct {
	t       *testing.T
	tag     string // value of tagVar in every rank's environment
	signals chan os.Signal
	stdout  syncBuffer
	stderr  syncBuffer
	log     syncBuffer
	cancel  context.CancelFunc
	done    chan struct{}
	start   time.Time

	code int
	err  error
}

const tagVar = "LAUNCHERTEST_TAG"

var runSeq int

// startRun runs script with sh -c as np ranks on localhost (4 slots),
// after change has adjusted the configuration.
func startRun(t *testing.T, np int, script string, change func(*Config)) *run {
	t.Helper()
	runSeq++
	r := &run{
		t:       t,
		tag:     fmt.Sprintf("%d-%d-%d", os.Getpid(), runSeq, time.Now().UnixNano()),
		signals: make(chan os.Signal, 4),
		done:    make(chan struct{}),
	}
	cfg := Config{
		Hosts:     []topology.Host{{Name: "localhost", Slots: 4}},
		NP:        np,
		Prog:      "sh",
		Args:      []string{"-c", script},
		Env:       []string{tagVar + "=" + r.tag},
		Dir:       t.TempDir(),
		TagOutput: true,
		KillGrace: 5 * time.Second,
		Signals:   r.signals,
		Stdout:    &r.stdout,
		Stderr:    &r.stderr,
		Logger:    slog.New(slog.NewTextHandler(&r.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if change != nil {
		change(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r.cancel = cancel
	r.start = time.Now()
	go func() {
		defer close(r.done)
		r.code, r.err = Run(ctx, cfg)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s\nlog:\n%s", r.stdout.String(), r.stderr.String(), r.log.String())
		}
	})
	return r
}

// wait waits for Run to return; the limit is generous: it only tells a
// hang.
func (r *run) wait() {
	r.t.Helper()
	select {
	case <-r.done:
	case <-time.After(25 * time.Second):
		r.t.Fatalf("Run did not return within 25 s\nstdout:\n%s\nstderr:\n%s", r.stdout.String(), r.stderr.String())
	}
	if r.err != nil {
		r.t.Fatalf("Run: %v", r.err)
	}
	checkNoLeftovers(r.t, r.tag)
}

// waitLines waits until stdout holds n lines matching re.
func (r *run) waitLines(re *regexp.Regexp, n int) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(re.FindAllString(r.stdout.String(), -1)) < n {
		select {
		case <-r.done:
			r.t.Fatalf("Run returned (%d, %v) before %d lines matched %s\nstdout:\n%s\nstderr:\n%s",
				r.code, r.err, n, re, r.stdout.String(), r.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d lines do not match %s after 20 s\nstdout:\n%s", n, re, r.stdout.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkNoLeftovers fails the test if a live process carries tagVar=tag in
// its environment.
func checkNoLeftovers(t *testing.T, tag string) {
	t.Helper()
	needle := []byte(tagVar + "=" + tag + "\x00")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append(env, 0), needle) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		t.Errorf("process %d of the job is still there after Run returned: %s", pid, stat)
	}
}

var readyRE = regexp.MustCompile(`(?m)^\[\d+\] ready$`)

func TestRunAllRanksSucceed(t *testing.T) {
	r := startRun(t, 4, `echo "hello from $RANK of $WORLD_SIZE"; echo "err $RANK" >&2`, nil)
	r.wait()
	if r.code != 0 {
		t.Fatalf("exit %d, want 0", r.code)
	}
	for rank := range 4 {
		if want := fmt.Sprintf("[%d] hello from %d of 4\n", rank, rank); !strings.Contains(r.stdout.String(), want) {
			t.Errorf("stdout lacks %q", want)
		}
		if want := fmt.Sprintf("[%d] err %d\n", rank, rank); !strings.Contains(r.stderr.String(), want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if strings.Contains(r.stderr.String(), "gorun:") {
		t.Errorf("reports on a job that went well:\n%s", r.stderr.String())
	}
}

func TestRunFirstFailureStopsTheOthers(t *testing.T) {
	r := startRun(t, 4, `if [ "$RANK" = 2 ]; then exit 3; fi; exec sleep 30`, nil)
	r.wait()
	if r.code != 3 {
		t.Fatalf("exit %d, want 3", r.code)
	}
	errs := r.stderr.String()
	if !strings.Contains(errs, "gorun: rank 2 on host localhost") || !strings.Contains(errs, "exited with code 3; stopping the job") {
		t.Errorf("report does not name the rank, host and cause:\n%s", errs)
	}
	if n := strings.Count(errs, "gorun: "); n != 1 {
		t.Errorf("%d reports, want 1 (the stopped ranks are no failures):\n%s", n, errs)
	}
}

func TestRunSignalledRank(t *testing.T) {
	r := startRun(t, 2, `if [ "$RANK" = 1 ]; then kill -KILL $$; fi; exec sleep 30`, nil)
	r.wait()
	if r.code != 128+int(syscall.SIGKILL) {
		t.Fatalf("exit %d, want %d", r.code, 128+int(syscall.SIGKILL))
	}
	if !strings.Contains(r.stderr.String(), "rank 1 on host localhost") || !strings.Contains(r.stderr.String(), "was killed by SIGKILL") {
		t.Errorf("report:\n%s", r.stderr.String())
	}
}

func TestRunStopSignal(t *testing.T) {
	r := startRun(t, 4, `trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.1; done`, nil)
	r.waitLines(readyRE, 4)
	r.signals <- syscall.SIGTERM
	r.wait()
	if r.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, want 143", r.code)
	}
	if got := regexp.MustCompile(`(?m)^\[\d+\] got TERM$`).FindAllString(r.stdout.String(), -1); len(got) != 4 {
		t.Errorf("%d ranks got SIGTERM, want 4", len(got))
	}
	if !strings.Contains(r.stderr.String(), "gorun: SIGTERM; stopping 4 ranks") {
		t.Errorf("report:\n%s", r.stderr.String())
	}
}

func TestRunSecondSignalKills(t *testing.T) {
	// The ranks ignore SIGTERM (and so does their sleep), and the grace is
	// longer than the test: only the second signal ends them.
	r := startRun(t, 2, `trap '' TERM; echo ready; while :; do sleep 0.1; done`, func(c *Config) { c.KillGrace = time.Hour })
	r.waitLines(readyRE, 2)
	r.signals <- syscall.SIGTERM
	r.signals <- syscall.SIGINT
	r.wait()
	if r.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, want 143 (the first signal's)", r.code)
	}
	if !strings.Contains(r.stderr.String(), "gorun: killing every rank") {
		t.Errorf("report:\n%s", r.stderr.String())
	}
}

// TestRunKillReportedWhileStderrHeld: the report of the second signal is
// written though the ranks end, and gorun abandons their output, before
// the stderr lane gets to it (here it is held in the write of the first
// signal's report until Run has returned).
func TestRunKillReportedWhileStderrHeld(t *testing.T) {
	stderr := &holdWriter{release: make(chan struct{}), held: make(chan struct{})}
	defer stderr.releaseOnce()
	r := startRun(t, 2, `trap '' TERM; echo ready; while :; do sleep 0.1; done`, func(c *Config) {
		c.KillGrace = time.Hour
		c.Stderr = stderr
	})
	r.waitLines(readyRE, 2)
	stderr.holding.Store(true)
	r.signals <- syscall.SIGTERM
	<-stderr.held // the lane is in its write of the first report
	r.signals <- syscall.SIGINT
	r.wait()
	if r.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, want 143 (the first signal's)", r.code)
	}
	stderr.releaseOnce()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.buf.String(), "gorun: killing every rank") {
		if time.Now().After(deadline) {
			t.Fatalf("stderr lacks the kill report once released:\n%s", stderr.buf.String())
		}
		time.Sleep(time.Millisecond)
	}
}

// holdWriter writes through to buf until holding is set; from then on
// every write waits until release is closed.
type holdWriter struct {
	holding  atomic.Bool
	release  chan struct{}
	held     chan struct{} // closed at the first write held
	heldOnce sync.Once
	relOnce  sync.Once
	buf      syncBuffer
}

func (w *holdWriter) Write(p []byte) (int, error) {
	if w.holding.Load() {
		w.heldOnce.Do(func() { close(w.held) })
		<-w.release
	}
	return w.buf.Write(p)
}

func (w *holdWriter) releaseOnce() { w.relOnce.Do(func() { close(w.release) }) }

func TestRunForwardsSIGUSR1(t *testing.T) {
	r := startRun(t, 3, `trap 'echo got USR1; exit 0' USR1; echo ready; while :; do sleep 0.1; done`, nil)
	r.waitLines(readyRE, 3)
	r.signals <- syscall.SIGUSR1
	r.wait()
	if r.code != 0 {
		t.Fatalf("exit %d, want 0 (the ranks exit 0 on SIGUSR1)", r.code)
	}
	if got := regexp.MustCompile(`(?m)^\[\d+\] got USR1$`).FindAllString(r.stdout.String(), -1); len(got) != 3 {
		t.Errorf("%d ranks got SIGUSR1, want 3", len(got))
	}
}

func TestRunTimeout(t *testing.T) {
	r := startRun(t, 2, `echo ready; exec sleep 30`, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	r.wait()
	if r.code != ExitTimeout {
		t.Fatalf("exit %d, want %d", r.code, ExitTimeout)
	}
	if !strings.Contains(r.stderr.String(), "time limit of 300ms") {
		t.Errorf("report:\n%s", r.stderr.String())
	}
}

func TestRunContextCancelled(t *testing.T) {
	r := startRun(t, 2, `echo ready; exec sleep 30`, nil)
	r.waitLines(readyRE, 2)
	r.cancel()
	r.wait()
	if r.code != ExitFailure {
		t.Fatalf("exit %d, want %d", r.code, ExitFailure)
	}
	if !strings.Contains(r.stderr.String(), "gorun: stopped: context canceled") {
		t.Errorf("report:\n%s", r.stderr.String())
	}
}

func TestRunKillGraceEndsWithSIGKILL(t *testing.T) {
	r := startRun(t, 2, `if [ "$RANK" = 0 ]; then exit 5; fi; trap '' TERM; while :; do sleep 0.1; done`,
		func(c *Config) { c.KillGrace = 200 * time.Millisecond })
	r.wait()
	if r.code != 5 {
		t.Fatalf("exit %d, want 5", r.code)
	}
}

func TestRunProgramNotFound(t *testing.T) {
	r := startRun(t, 2, "", func(c *Config) { c.Prog, c.Args = "gorun-no-such-program", nil })
	r.wait()
	if r.code != 127 {
		t.Fatalf("exit %d, want 127", r.code)
	}
	if !strings.Contains(r.stderr.String(), "exited with code 127 (cannot start: ") {
		t.Errorf("report:\n%s", r.stderr.String())
	}
}

func TestRunOutputToFiles(t *testing.T) {
	dir := t.TempDir()
	r := startRun(t, 3, `echo "out $RANK"; echo "err $RANK" >&2`, func(c *Config) { c.OutputDir = dir })
	r.wait()
	if r.code != 0 || r.stdout.String() != "" {
		t.Fatalf("exit %d, stdout %q", r.code, r.stdout.String())
	}
	for rank := range 3 {
		for _, s := range []string{"out", "err"} {
			b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank.%d", rank), "std"+s))
			if err != nil || string(b) != fmt.Sprintf("%s %d\n", s, rank) {
				t.Errorf("rank %d std%s: %q, %v", rank, s, b, err)
			}
		}
	}
}

// Two host entries that are both this machine get an in-process agent
// each, with their own node ranks.
func TestRunTwoLocalHosts(t *testing.T) {
	r := startRun(t, 4, `echo "node $GROUP_RANK of $GROUP_WORLD_SIZE local $LOCAL_RANK"`, func(c *Config) {
		c.Hosts = []topology.Host{{Name: "localhost", Slots: 2}, {Name: "127.0.0.1", Slots: 2}}
	})
	r.wait()
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for rank, want := range []string{"node 0 of 2 local 0", "node 0 of 2 local 1", "node 1 of 2 local 0", "node 1 of 2 local 1"} {
		if l := fmt.Sprintf("[%d] %s\n", rank, want); !strings.Contains(r.stdout.String(), l) {
			t.Errorf("stdout lacks %q", l)
		}
	}
}

// Without --bind, a remote host whose name does not resolve, or resolves
// to a loopback address, is refused naming it and --bind.
func TestRunRemoteHostWithoutBind(t *testing.T) {
	loopback := func(ctx context.Context, name string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.1.1")}, nil
	}
	for _, tt := range []struct {
		hosts   []topology.Host
		resolve resolveFunc // nil: the system's
		want    string
	}{
		{hosts: []topology.Host{{Name: "far-away-host.invalid", Slots: 1}},
			want: "cannot choose the control plane's address: host far-away-host.invalid: cannot resolve its name: "},
		{hosts: []topology.Host{{Name: "localhost", Slots: 1}, {Name: "node01", Slots: 1}}, resolve: loopback,
			want: "cannot choose the control plane's address: host node01: resolves to loopback (127.0.1.1) but is not a name gorun recognises as this host; pass --bind with an address the hosts can reach"},
	} {
		c := Config{Hosts: tt.hosts, NP: len(tt.hosts), Prog: "true", resolve: tt.resolve}
		code, err := Run(context.Background(), c)
		if err == nil {
			t.Fatalf("Run(%v) = %d, no error", tt.hosts, code)
		}
		if !errors.Is(err, ErrConfig) {
			t.Errorf("errors.Is(%v, ErrConfig) = false", err)
		}
		if msg := err.Error(); code != 0 || !strings.HasPrefix(msg, tt.want) || !strings.HasSuffix(msg, "; pass --bind with an address the hosts can reach") {
			t.Errorf("Run = %d, %q\nwant %q", code, msg, tt.want)
		}
	}
}

func TestRunTooManyRanks(t *testing.T) {
	c := Config{Hosts: []topology.Host{{Name: "localhost", Slots: 4}}, NP: 5, Prog: "true"}
	code, err := Run(context.Background(), c)
	checkConfigError(t, err, "too many ranks: 5 ranks requested but only 4 slots on 1 host; use --oversubscribe or add hosts")
	if code != 0 || !errors.Is(err, topology.ErrTooManyRanks) {
		t.Errorf("Run = %d, %v; want the topology error wrapped", code, err)
	}
}

func TestRunBadConfig(t *testing.T) {
	_, err := Run(context.Background(), Config{Hosts: []topology.Host{{Name: "localhost", Slots: 1}}, NP: 0, Prog: "true"})
	checkConfigError(t, err, "-np must be at least 1")
}

// Run leaves no goroutine behind.
func TestRunGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	was, err := gordump.Leftover(gordump.Take())
	if err != nil {
		t.Fatal(err)
	}
	r := startRun(t, 2, `echo hi`, nil)
	r.wait()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines before Run, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
	// gorun's own, by the rule the chaos suite judges gorun's exit with
	// (GORUN_DEBUG_GOROUTINES): none but those there before.
	left, err := gordump.Leftover(gordump.Take())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range left {
		if !slices.ContainsFunc(was, func(w gordump.Goroutine) bool { return w.ID == g.ID }) {
			t.Errorf("a goroutine of gorun's left after Run:\n%s", g.Stack)
		}
	}
}

// A stop (signal, --timeout, a failed rank, a cancelled context) that comes
// before an agent has subscribed to the control subject must still reach
// it: before the epoch table is out the rendezvous is cancelled, so no rank
// starts, rather than ranks starting after the stop and running until the
// give-up deadline (KillGrace + HeartbeatTimeout).
func TestStopBeforeAgentsRegister(t *testing.T) {
	r := startRun(t, 2, `echo started; exec sleep 30`, func(c *Config) {
		c.KillGrace = time.Second
		c.HeartbeatInterval = 100 * time.Millisecond
	})
	r.signals <- syscall.SIGTERM // pending before any agent is up
	r.wait()
	if r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want 143", r.code)
	}
	if strings.Contains(r.stderr.String(), "did not report their end") {
		t.Errorf("the stop never reached the ranks:\n%s", r.stderr.String())
	}
}

// errWriter fails every write.
type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

// When gorun's stdout goes away (gorun ... | head), the job stops: 141 as
// a shell reports SIGPIPE for a closed pipe, 1 for any other error.
func TestRunStdoutFails(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		code int
	}{
		{"EPIPE", syscall.EPIPE, 128 + int(syscall.SIGPIPE)},
		{"other error", errors.New("disk full"), ExitFailure},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := startRun(t, 2, `echo hello; exec sleep 30`, func(c *Config) { c.Stdout = errWriter{tt.err} })
			r.wait()
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d", r.code, tt.code)
			}
			if !strings.Contains(r.stderr.String(), "gorun: cannot write the job's output") {
				t.Errorf("report:\n%s", r.stderr.String())
			}
		})
	}
}
