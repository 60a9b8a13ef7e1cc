package testcluster

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The test binary plays the processes that run inside the hosts: TestMain
// runs helper $GORUN_TESTCLUSTER_HELPER with the arguments after the binary.
const helperEnv = "GORUN_TESTCLUSTER_HELPER"

var helpers = map[string]func(args []string) int{
	"listen": helperListen, // listen ID ADDR...: serve "ID\n" on each ADDR; "ready"; exit at stdin EOF
	"dial":   helperDial,   // dial ADDR=ID|ADDR=- ...: expect ID from ADDR, or no connection
	"sleep":  helperSleep,  // sleep: "ready", then block until killed
	"spawn":  helperSpawn,  // spawn: start "sleep" in a new session, print its pid, "ready", block
}

var (
	helperUsed sync.Map    // helper name -> true, set when a test builds its command
	skipped    atomic.Bool // some test skipped for want of namespace hosts
)

func TestMain(m *testing.M) {
	if name := os.Getenv(helperEnv); name != "" {
		f, ok := helpers[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "testcluster test: unknown helper %q\n", name)
			os.Exit(2)
		}
		os.Exit(f(os.Args[1:]))
	}
	code := m.Run()
	// As in os/exec's tests: a helper no test uses is dead code; say so, but
	// only after a full run that did not skip.
	full := flag.Lookup("test.run").Value.String() == "" && flag.Lookup("test.skip").Value.String() == ""
	if code == 0 && full && !testing.Short() && !skipped.Load() {
		for name := range helpers {
			if _, ok := helperUsed.Load(name); !ok {
				fmt.Fprintf(os.Stderr, "helper %q is unused\n", name)
				code = 1
			}
		}
	}
	os.Exit(code)
}

func helperListen(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: listen ID ADDR...")
		return 2
	}
	id := args[0]
	for _, addr := range args[1:] {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go func() { // lives as long as the process
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, id)
				c.Close()
			}
		}()
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

func helperDial(args []string) int {
	// All targets at once; a partitioned one costs its timeout, not more.
	results := make([]string, len(args))
	var failed atomic.Bool
	var wg sync.WaitGroup
	for i, arg := range args {
		wg.Go(func() {
			addr, want, _ := strings.Cut(arg, "=")
			timeout := 5 * time.Second
			if want == "-" {
				timeout = 500 * time.Millisecond // the timeout is the evidence
			}
			got, err := dialID(addr, timeout)
			switch {
			case want == "-" && err == nil:
				results[i] = fmt.Sprintf("FAIL %s: reached %q, want no connection", addr, got)
			case want == "-":
				results[i] = fmt.Sprintf("ok %s: unreachable (%v)", addr, err)
				return
			case err != nil:
				results[i] = fmt.Sprintf("FAIL %s: %v", addr, err)
			case got != want:
				results[i] = fmt.Sprintf("FAIL %s: reached %q, want %q", addr, got, want)
			default:
				results[i] = fmt.Sprintf("ok %s: %s", addr, got)
				return
			}
			failed.Store(true)
		})
	}
	wg.Wait()
	for _, r := range results {
		fmt.Println(r)
	}
	if failed.Load() {
		return 1
	}
	return 0
}

func helperSleep([]string) int {
	fmt.Println("ready")
	select {}
}

func helperSpawn([]string) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command(exe)
	cmd.Env = helperEnviron("sleep")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // out of our process group
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		fmt.Fprintf(os.Stderr, "grandchild: %q, %v\n", line, err)
		return 1
	}
	fmt.Println(cmd.Process.Pid)
	fmt.Println("ready")
	select {}
}

// dialID connects to addr and returns the line its server sends.
func dialID(addr string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading from %s: %w", addr, err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// proc is a helper process started in a host. Its owner goroutine reads
// stdout up to "ready", then waits for the process and closes done.
type proc struct {
	cmd    *exec.Cmd
	lines  []string        // stdout lines before "ready"; read after ready
	stderr strings.Builder // read only after done is closed
	done   chan struct{}
	err    error // Wait's result, valid after done is closed
}

// exited reports whether the process has exited (and been waited for).
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// helperCmd returns the command running helper name with args in host,
// killed when ctx is done.
func helperCmd(ctx context.Context, t *testing.T, h *Hosts, host int, name string, args ...string) *exec.Cmd {
	t.Helper()
	if _, ok := helpers[name]; !ok {
		t.Fatalf("no helper %q", name)
	}
	helperUsed.Store(name, true)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := h.Exec(ctx, host, exe, args...)
	cmd.Env = helperEnviron(name)
	return cmd
}

// helperEnviron is the environment for helper name.
func helperEnviron(name string) []string {
	return append(os.Environ(), helperEnv+"="+name, raceEnv())
}

// raceEnv drops the race runtime's default 1s sleep at exit, which every
// short-lived child would otherwise pay under -race; os/exec keeps the last
// GORACE if the environment has one already.
func raceEnv() string {
	return "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")
}

// startHelper starts helper name in host and waits for its "ready" line.
// The process is killed when the test ends (t.Context is cancelled) and
// waited for in cleanup.
func startHelper(t *testing.T, h *Hosts, host int, name string, args ...string) *proc {
	t.Helper()
	cmd := helperCmd(t.Context(), t, h, host, name, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	go func() {
		defer close(p.done)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				ready <- err
				break
			}
			if line == "ready\n" {
				ready <- nil
				break
			}
			p.lines = append(p.lines, strings.TrimSuffix(line, "\n"))
		}
		p.err = cmd.Wait() // all reads are done, as Wait requires
	}()
	t.Cleanup(func() {
		stdin.Close()
		<-p.done
	})
	select {
	case err := <-ready:
		if err != nil {
			<-p.done
			t.Fatalf("helper %s in %s exited before ready: %v (%v); stderr:\n%s", name, h.Names[host], err, p.err, p.stderr.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-p.done
		t.Fatalf("helper %s in %s not ready after 20s; stderr:\n%s", name, h.Names[host], p.stderr.String())
	}
	return p
}

// waitFor polls f until it returns nil, failing the test with f's last
// error after timeout.
func waitFor(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newHosts is NetnsHosts for this package's tests, noting skips so that
// TestMain's unused-helper check stays quiet on machines without netns.
func newHosts(t *testing.T, n int) *Hosts {
	t.Helper()
	t.Cleanup(func() {
		if t.Skipped() {
			skipped.Store(true)
		}
	})
	return NetnsHosts(t, n)
}
