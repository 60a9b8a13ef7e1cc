package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// startRank starts prog as rank 3 on host 2 and returns it with the
// channel its end is reported on. The error is start's.
func startRank(t *testing.T, dir, prog string, args ...string) (*rankProc, <-chan *rankProc, error) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	exits := make(chan *rankProc, 1)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	p := &rankProc{place: wire.Placement{Rank: 3, Host: 2, LocalRank: 1, LocalSize: 2}}
	spec := &wire.JobSpec{Prog: prog, Args: args, Dir: dir}
	err := p.start(spec, baseEnv(os.Environ(), nil), false, discardBatcher(), exits, done, nil)
	if err == nil {
		t.Cleanup(func() { p.signal(syscall.SIGKILL) })
	}
	return p, exits, err
}

func waitExit(t *testing.T, exits <-chan *rankProc) *rankProc {
	t.Helper()
	select {
	case p := <-exits:
		return p
	case <-time.After(30 * time.Second):
		t.Fatal("rank end not reported")
		return nil
	}
}

func TestExitEventCode(t *testing.T) {
	for _, code := range []int{0, 1, 7, 255} {
		p, exits, err := startRank(t, "", "sh", "-c", "exit "+itoa(code))
		if err != nil {
			t.Fatal(err)
		}
		if got := waitExit(t, exits); got != p {
			t.Fatal("another rank reported")
		}
		e := p.exitEvent(2)
		want := wire.Event{Kind: wire.EventExited, Host: 2, Rank: 3, Pid: p.pid, Code: code}
		if !reflect.DeepEqual(*e, want) {
			t.Errorf("exit %d: event %+v, want %+v", code, *e, want)
		}
		if e.ExitStatus() != code {
			t.Errorf("exit %d: ExitStatus %d", code, e.ExitStatus())
		}
		if p.pid <= 0 {
			t.Errorf("pid %d", p.pid)
		}
	}
}

func TestExitEventSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGSEGV, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			p, exits, err := startRank(t, "", "sh", "-c", "kill -"+itoa(int(sig))+" $$; sleep 30")
			if err != nil {
				t.Fatal(err)
			}
			waitExit(t, exits)
			e := p.exitEvent(2)
			if e.Code != -1 || e.Signal != int(sig) || e.ExitStatus() != 128+int(sig) || e.Stopped {
				t.Errorf("event %+v, want code -1, signal %d, status %d, not stopped", *e, sig, 128+int(sig))
			}
			if !strings.Contains(e.Msg, "signal") {
				t.Errorf("message %q does not name the signal", e.Msg)
			}
		})
	}
}

func TestExitEventStopped(t *testing.T) {
	p, exits, err := startRank(t, "", "sleep", "30")
	if err != nil {
		t.Fatal(err)
	}
	p.stopped.Store(true)
	p.signal(syscall.SIGTERM)
	waitExit(t, exits)
	e := p.exitEvent(0)
	if !e.Stopped || e.Signal != int(syscall.SIGTERM) || e.ExitStatus() != 143 {
		t.Errorf("event %+v, want stopped by SIGTERM", *e)
	}
}

// signal reaches the rank's whole process group, not only its leader.
func TestSignalReachesProcessGroup(t *testing.T) {
	dir := t.TempDir()
	p, exits, err := startRank(t, dir, "sh", "-c", `sleep 30 & echo $! > child; wait`)
	if err != nil {
		t.Fatal(err)
	}
	var child int
	deadline := time.Now().Add(10 * time.Second)
	for child == 0 && time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(dir, "child"))
		child = atoi(strings.TrimSpace(string(b)))
		if child == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if child == 0 {
		t.Fatal("the rank did not start its child")
	}
	p.signal(syscall.SIGKILL)
	waitExit(t, exits)
	// The child, re-parented to init (or to this process if a test made it a
	// subreaper), dies from the signal sent to the group.
	for time.Now().Before(deadline) {
		if !alive(child) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Errorf("child %d of the rank survived SIGKILL of its group", child)
}

func TestExitEventStartFailure(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		prog string
		code int
	}{
		{"not found by path", filepath.Join(dir, "missing"), 127},
		{"not found in PATH", "gorun-no-such-program", 127},
		{"not executable", notExec, 126},
		{"a directory", dir, 126},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, exits, err := startRank(t, dir, tt.prog)
			if err == nil {
				t.Fatal("start succeeded")
			}
			if got := waitExit(t, exits); got != p {
				t.Fatal("another rank reported")
			}
			e := p.exitEvent(1)
			if e.Kind != wire.EventExited || e.Host != 1 || e.Rank != 3 || e.Code != tt.code || e.Signal != 0 || e.ExitStatus() != tt.code {
				t.Errorf("event %+v, want code %d", *e, tt.code)
			}
			if !strings.HasPrefix(e.Msg, "cannot start: ") {
				t.Errorf("message %q", e.Msg)
			}
			p.stopped.Store(true)
			if !p.exitEvent(1).Stopped {
				t.Error("Stopped not reported for a rank that failed to start")
			}
		})
	}
}

// Once done is closed (the agent stopped listening), ends are dropped and
// no goroutine is left blocked on exits.
func TestStartReportsDroppedAfterDone(t *testing.T) {
	before := runtime.NumGoroutine()
	exits := make(chan *rankProc) // unbuffered, never read
	done := make(chan struct{})
	close(done)
	p := &rankProc{}
	if err := p.start(&wire.JobSpec{Prog: "gorun-no-such-program", Dir: t.TempDir()}, nil, false, discardBatcher(), exits, done, nil); err == nil {
		t.Fatal("start succeeded")
	}
	q := &rankProc{}
	if err := q.start(&wire.JobSpec{Prog: "true", Dir: t.TempDir()}, nil, false, discardBatcher(), exits, done, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

func TestExitEventWithoutStatus(t *testing.T) {
	p := &rankProc{place: wire.Placement{Rank: 1}}
	e := p.exitEvent(0)
	if e.Code != 1 || e.Signal != 0 || e.Msg == "" {
		t.Errorf("event %+v, want code 1 with a message", *e)
	}
}

func TestSignalBeforeStartIsHarmless(t *testing.T) {
	p := &rankProc{}
	p.signal(syscall.SIGKILL) // pid 0 would be this process group
}

// A missing working directory is reported as such (with SysProcAttr set,
// os/exec would say "fork/exec /usr/bin/sh: no such file or directory").
func TestMissingWorkDirIsNamed(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	p, exits, err := startRank(t, missing, "sh", "-c", "true")
	if err == nil {
		t.Fatal("start succeeded in a missing directory")
	}
	waitExit(t, exits)
	if e := p.exitEvent(0); !strings.Contains(e.Msg, missing) {
		t.Errorf("report %q does not name the missing directory %s", e.Msg, missing)
	}
}

// TestRankCommand: the command of a rank whose program lookProg resolved
// once for the launch is the one exec.Command makes searching PATH
// itself: the same Path, argv (argv[0] the program as given) and error.
func TestRankCommand(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "gorun-test-prog")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, tt := range []struct {
		prog     string
		resolved bool // lookProg finds a path
	}{
		{"gorun-test-prog", true},
		{"sh", true},
		{script, false},                  // a path: nothing to search
		{"gorun-no-such-program", false}, // left to exec.Command, which fails
	} {
		t.Run(tt.prog, func(t *testing.T) {
			spec := &wire.JobSpec{Prog: tt.prog, Args: []string{"a", "b c"}}
			lp := lookProg(tt.prog)
			if (lp != "") != tt.resolved {
				t.Fatalf("lookProg(%q) = %q, want resolved %v", tt.prog, lp, tt.resolved)
			}
			got, want := rankCommand(lp, spec), exec.Command(tt.prog, spec.Args...)
			if got.Path != want.Path || !slices.Equal(got.Args, want.Args) || fmt.Sprint(got.Err) != fmt.Sprint(want.Err) {
				t.Errorf("rankCommand: Path %q Args %q Err %v; exec.Command: Path %q Args %q Err %v",
					got.Path, got.Args, got.Err, want.Path, want.Args, want.Err)
			}
		})
	}
}

// readChildPid waits for the pid a rank wrote to file (by a rename, so
// that it is read whole).
func readChildPid(t *testing.T, file string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(file); err == nil {
			if pid := atoi(strings.TrimSpace(string(b))); pid > 0 {
				return pid
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the rank did not write its child's pid")
	return 0
}

// A rank that ends on its own leaves nothing behind: what it started in
// its process group is killed when its end is seen, before it is reaped
// (its pid, and so the group's id, cannot be reused before).
func TestRankEndKillsItsGroup(t *testing.T) {
	dir := t.TempDir()
	// The child does not hold the rank's output open, so that the end is
	// reported without waiting for the pipes' drain.
	p, exits, err := startRank(t, dir, "sh", "-c", `sleep 300 >/dev/null 2>&1 & echo $! > child.tmp && mv child.tmp child`)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitExit(t, exits); got != p {
		t.Fatal("another rank reported")
	}
	if e := p.exitEvent(0); e.Code != 0 || e.Signal != 0 {
		t.Errorf("the rank's own end: %+v, want exit 0", *e)
	}
	child := readChildPid(t, filepath.Join(dir, "child"))
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	deadline := time.Now().Add(30 * time.Second)
	for alive(child) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if alive(child) {
		t.Errorf("child %d outlived the rank that started it", child)
	}
}

// A kill that races the rank's own end: the end is reported once, with
// whichever came first, and a signal after the reaping goes nowhere.
func TestRankExitRacesKill(t *testing.T) {
	for i := range 20 {
		p, exits, err := startRank(t, "", "true")
		if err != nil {
			t.Fatal(err)
		}
		p.signal(syscall.SIGKILL)
		waitExit(t, exits)
		if e := p.exitEvent(0); !(e.Code == 0 && e.Signal == 0) && !(e.Code == -1 && e.Signal == int(syscall.SIGKILL)) {
			t.Errorf("run %d: %+v, want exit 0 or SIGKILL", i, *e)
		}
		p.mu.Lock()
		reaped := p.reaped
		p.mu.Unlock()
		if !reaped {
			t.Errorf("run %d: reported before it was reaped", i)
		}
		p.signal(syscall.SIGKILL) // reaped: not sent (the group id may be reused)
		select {
		case q := <-exits:
			t.Errorf("run %d: a second end reported (rank %d)", i, q.place.Rank)
		default:
		}
	}
}

// The rank's standard descriptors and its PMI descriptor are blocking, as
// a program expects them: the agent's ends of the same pipes and socket
// are non-blocking (the poller serves them), the rank's must not be.
func TestRankDescriptorsBlock(t *testing.T) {
	dir := t.TempDir()
	exits := make(chan *rankProc, 1)
	done := make(chan struct{})
	defer close(done)
	mine, theirs, err := pmiSocketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	p := &rankProc{place: wire.Placement{Rank: 0}, pmi: theirs}
	script := `exec 9>flags.tmp; for fd in 0 1 2 ` + itoa(wire.PMIFD) + `; do echo "$fd $(grep ^flags: /proc/$$/fdinfo/$fd)" >&9; done; mv flags.tmp flags`
	spec := &wire.JobSpec{Prog: "sh", Args: []string{"-c", script}, Dir: dir}
	if err := p.start(spec, baseEnv(os.Environ(), nil), true, discardBatcher(), exits, done, nil); err != nil {
		t.Fatal(err)
	}
	defer p.stdin.Close()
	waitExit(t, exits)
	b, err := os.ReadFile(filepath.Join(dir, "flags"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 4 {
		t.Fatalf("flags of the rank's descriptors:\n%s", b)
	}
	for _, l := range lines {
		f := strings.Fields(l) // "1 flags: 0100001"
		if len(f) != 3 {
			t.Fatalf("line %q", l)
		}
		flags, err := strconv.ParseUint(f[2], 8, 64)
		if err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if flags&syscall.O_NONBLOCK != 0 {
			t.Errorf("the rank's descriptor %s is non-blocking (flags %s)", f[0], f[2])
		}
	}
}
