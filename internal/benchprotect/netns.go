package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gorun/gorun/internal/testcluster"
)

// The namespace hosts come from testcluster.NetnsHosts, which wants a
// testing.TB for its cleanups and failures. Reusing it (rather than
// repeating its ip netns, bridge and veth set-up here) keeps the subnet
// choice under the machine-wide lock the test suites take, so this
// benchmark and concurrently running multi-host tests never pick the same
// /24, and a benchmark killed before its clean-up leaves objects that the
// next NetnsHosts call (from here or from any test) removes: they are named
// after our pid, which is then dead.

// tb is the testing.TB NetnsHosts is given. It implements the methods
// testcluster calls; the embedded nil interface stands for the rest (and
// for TB's unexported method) and panics if one of them is ever called.
// Fatal, FailNow and Skip end the calling goroutine, as in a test, so
// NetnsHosts must run in a goroutine of its own (see newHosts).
type tb struct {
	testing.TB
	log io.Writer

	mu       sync.Mutex // guards the fields below
	cleanups []func()
	errs     []error
}

func (t *tb) Helper()      {}
func (t *tb) Name() string { return "benchprotect" }
func (t *tb) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}
func (t *tb) Log(args ...any) { fmt.Fprintln(t.log, append([]any{"benchprotect:"}, args...)...) }
func (t *tb) Logf(format string, args ...any) {
	fmt.Fprintf(t.log, "benchprotect: "+format+"\n", args...)
}
func (t *tb) Error(args ...any) { t.fail(errors.New(strings.TrimSuffix(fmt.Sprintln(args...), "\n"))) }
func (t *tb) Errorf(format string, args ...any) {
	t.fail(fmt.Errorf(format, args...))
}
func (t *tb) Fatal(args ...any)                 { t.Error(args...); runtime.Goexit() }
func (t *tb) Fatalf(format string, args ...any) { t.Errorf(format, args...); runtime.Goexit() }
func (t *tb) Skip(args ...any)                  { t.Fatal(args...) }
func (t *tb) Skipf(format string, args ...any)  { t.Fatalf(format, args...) }
func (t *tb) SkipNow()                          { t.Fatal("skipped") }
func (t *tb) FailNow()                          { t.Fatal("failed") }
func (t *tb) Fail()                             { t.fail(errors.New("failed")) }
func (t *tb) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.errs) > 0
}

func (t *tb) TempDir() string {
	dir, err := os.MkdirTemp("", "benchprotect-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (t *tb) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.errs = append(t.errs, err)
}

// err returns the errors reported so far, or nil.
func (t *tb) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return errors.Join(t.errs...)
}

// cleanup runs the registered clean-ups, last first, and returns the
// errors they reported.
func (t *tb) cleanup() error {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		f()
	}
	return t.err()
}

// cluster is the benchmark's namespace hosts.
type cluster struct {
	*testcluster.Hosts
	t *tb
}

// newHosts creates n namespace hosts. The caller must call close, also
// when newHosts fails (it removes whatever was created).
func newHosts(n int, log io.Writer) (*cluster, error) {
	c := &cluster{t: &tb{log: log}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Hosts = testcluster.NetnsHosts(c.t, n)
	}()
	<-done
	if err := c.t.err(); err != nil || c.Hosts == nil {
		return c, fmt.Errorf("creating %d namespace hosts (needs root and iproute2): %w", n, err)
	}
	return c, nil
}

// writeHostfile writes a hostfile naming every host with slots slots into
// dir and returns its path.
func (c *cluster) writeHostfile(dir string, slots int) (string, error) {
	var b strings.Builder
	for _, name := range c.Names {
		fmt.Fprintf(&b, "%s slots=%d\n", name, slots)
	}
	path := filepath.Join(dir, "hostfile")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// close kills every process in the hosts and removes them.
func (c *cluster) close() error {
	return c.t.cleanup()
}

// wireBytes returns the bytes every host has sent onto the bridge so far:
// the sum of the receive counters of the hosts' veths at the root
// namespace's end (what leaves a host crosses its veth there). Everything
// counts: replication, the control plane, the ranks' collectives. It is
// the measure of "bytes on the wire" independent of gorun's own figures.
func (c *cluster) wireBytes() (uint64, error) {
	var sum uint64
	for _, v := range c.Veths {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", v, "statistics", "rx_bytes"))
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s's rx_bytes: %w", v, err)
		}
		sum += n
	}
	return sum, nil
}
