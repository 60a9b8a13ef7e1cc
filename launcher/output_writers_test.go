package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"

	"github.com/gorun/gorun/internal/wire"
)

// failingWriter fails every write with err after the first n bytes.
type failingWriter struct {
	n, written int
	err        error
	calls      int
}

func (w *failingWriter) Write(p []byte) (int, error) {
	w.calls++
	if w.written+len(p) > w.n {
		k := max(0, w.n-w.written)
		w.written += k
		return k, w.err
	}
	w.written += len(p)
	return len(p), nil
}

func TestOutputStdoutFailureIsReportedOnce(t *testing.T) {
	out := &failingWriter{n: 10, err: syscall.EPIPE}
	var stderr bytes.Buffer
	m := newOutputMux(out, &stderr, 2, true, false, "")
	for i := range 5 {
		mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, fmt.Sprintf("line %d\n", i)}, rec{1, wire.Stderr, fmt.Sprintf("err %d\n", i)}))
		m.drain(nil) // a write, and its failure, at a time
	}
	select {
	case err := <-m.failed:
		if !errors.Is(err, syscall.EPIPE) {
			t.Errorf("failed carries %v, want EPIPE", err)
		}
	default:
		t.Fatal("no failure reported on failed")
	}
	select {
	case err := <-m.failed:
		t.Errorf("a second failure reported: %v", err)
	default:
	}
	calls := out.calls
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "after\n"}))
	m.report("still %s", "here")
	m.drain(nil)
	if out.calls != calls {
		t.Errorf("stdout written to after it failed")
	}
	// stderr goes on.
	want := "[1] err 0\n[1] err 1\n[1] err 2\n[1] err 3\n[1] err 4\ngorun: still here\n"
	if stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
	m.close()
}

// stalledWriter blocks every write until release is closed, like a pipe
// whose reader paused.
type stalledWriter struct {
	release chan struct{}
	started chan struct{} // closed at the first write
	once    sync.Once
	buf     gortest.SyncBuffer
}

func (w *stalledWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.started) })
	<-w.release
	return w.buf.Write(p)
}

// A stalled stdout holds back stdout only: frames are taken at once, the
// launcher's reports and the ranks' stderr go on, drain can be given up,
// and once the reader reads again everything arrives in order.
func TestOutputStalledStdoutHoldsOnlyItsLane(t *testing.T) {
	out := &stalledWriter{release: make(chan struct{}), started: make(chan struct{})}
	var stderr gortest.SyncBuffer
	m := newOutputMux(out, &stderr, 2, true, false, "")
	var want strings.Builder
	for i := range 1000 {
		line := fmt.Sprintf("line %d %s\n", i, strings.Repeat("x", 200))
		want.WriteString("[0] " + line)
		mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, line}))
	}
	<-out.started
	mustFrame(t, m, frameOf(0, rec{1, wire.Stderr, "rank 1 says\n"}))
	m.report("host %s lost", "h")
	stop := make(chan struct{})
	gaveUp := make(chan bool, 1)
	go func() { gaveUp <- !m.drain(stop) }()
	deadline := time.Now().Add(10 * time.Second)
	for stderr.String() != "[1] rank 1 says\ngorun: host h lost\n" {
		if time.Now().After(deadline) {
			t.Fatalf("stderr %q while stdout is stalled", stderr.String())
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	if !<-gaveUp {
		t.Error("drain did not give up when told to")
	}
	close(out.release)
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if got := out.buf.String(); got != want.String() {
		t.Errorf("stdout: %d bytes, want %d in order", len(got), want.Len())
	}
}

// After abandon, close returns though a write never ends: on stdout, or
// on stderr (one destination or not) with gorun's own reports queued
// behind the write.
func TestOutputAbandonDoesNotWait(t *testing.T) {
	tests := []struct {
		name           string
		stdout, stderr bool // stalled
	}{
		{"stdout", true, false},
		{"stderr with reports queued", false, true},
		{"one destination with reports queued", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &stalledWriter{release: make(chan struct{}), started: make(chan struct{})}
			defer close(w.release) // lets the lanes' goroutines end
			var stdout, stderr io.Writer = io.Discard, io.Discard
			if tt.stdout {
				stdout = w
			}
			if tt.stderr {
				stderr = w
			}
			m := newOutputMux(stdout, stderr, 1, false, false, "")
			if tt.stdout {
				mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "stuck\n"}))
			} else {
				m.report("stuck")
			}
			<-w.started
			m.report("queued")
			m.abandon()
			done := make(chan struct{})
			go func() { m.close(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("close waited for a stalled writer after abandon")
			}
			m.report("dropped")
		})
	}
}

// TestOutputAbandonWritesReports: abandon drops the ranks' output not
// written yet, but not gorun's own reports posted before it: the lane
// writes them once the write under way returns (here, held until after
// abandon, as a lane not yet scheduled holds them).
func TestOutputAbandonWritesReports(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			w := &stalledWriter{release: make(chan struct{}), started: make(chan struct{})}
			var stdout io.Writer = io.Discard
			if shared {
				stdout = w
			}
			m := newOutputMux(stdout, w, 1, false, false, "")
			m.report("SIGTERM; stopping 1 ranks")
			<-w.started // the lane is in its write
			mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "rank out\n"}, rec{0, wire.Stderr, "rank err\n"}))
			m.report("killing every rank")
			mustFrame(t, m, frameOf(0, rec{0, wire.Stderr, "rank err after\n"}))
			m.abandon()
			close(w.release)
			m.close()
			<-m.err.exited
			want := "gorun: SIGTERM; stopping 1 ranks\ngorun: killing every rank\n"
			if got := w.buf.String(); got != want {
				t.Errorf("written %q, want %q", got, want)
			}
		})
	}
}

// TestOutputSharedDestinationKeepsOrder: with stdout and stderr one
// destination (a terminal, "> log 2>&1"), the ranks' stdout and stderr
// lines and the launcher's reports come out in the order they were posted.
func TestOutputSharedDestinationKeepsOrder(t *testing.T) {
	var term bytes.Buffer
	m := newOutputMux(&term, &term, 2, true, false, "")
	mustFrame(t, m, frameOf(0,
		rec{0, wire.Stdout, "out1\n"},
		rec{1, wire.Stderr, "err1\n"},
		rec{0, wire.Stdout, "out2\n"},
	))
	m.report("rank 1 exited with code 3")
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "out3\n"}))
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	want := "[0] out1\n[1] err1\n[0] out2\ngorun: rank 1 exited with code 3\n[0] out3\n"
	if term.String() != want {
		t.Errorf("output %q, want %q", term.String(), want)
	}
}

func TestSameDestination(t *testing.T) {
	dir := t.TempDir()
	f1, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	f2, err := os.OpenFile(f1.Name(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	other, err := os.Create(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var b1, b2 bytes.Buffer
	for _, tc := range []struct {
		name string
		a, b io.Writer
		want bool
	}{
		{"one writer", &b1, &b1, true},
		{"two buffers", &b1, &b2, false},
		{"one file opened twice", f1, f2, true},
		{"two files", f1, other, false},
		{"file and buffer", f1, &b1, false},
	} {
		if got := sameDestination(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: sameDestination = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestOutputAgentLinesBounded: agents' log lines waiting for a stalled
// stderr are bounded; what is dropped is counted and said.
func TestOutputAgentLinesBounded(t *testing.T) {
	release := make(chan struct{})
	var stderr bytes.Buffer
	w := &gatedWriter{w: &stderr, gate: release}
	m := newOutputMux(io.Discard, w, 1, false, false, "")
	line := bytes.Repeat([]byte("x"), 1000)
	const lines = 2 * maxAgentBacklog / 1000
	for range lines {
		m.agentLine("h1", line)
	}
	if got := m.agentBacklog.Load(); got > maxAgentBacklog {
		t.Fatalf("%d bytes of agent lines queued, bound %d", got, maxAgentBacklog)
	}
	close(release)
	m.agentLine("h1", []byte("last"))
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	out := stderr.String()
	written := strings.Count(out, "gorun agent h1: x")
	if written == 0 || written >= lines {
		t.Fatalf("%d of %d lines written: want some dropped", written, lines)
	}
	want := fmt.Sprintf("gorun: %d lines of the agents' logs dropped", lines-written)
	if !strings.Contains(out, want) || !strings.HasSuffix(out, "gorun agent h1: last\n") {
		t.Errorf("stderr lacks %q before the last line; its end: %q", want, out[max(0, len(out)-200):])
	}
}

// gatedWriter blocks every write until gate is closed.
type gatedWriter struct {
	w    io.Writer
	gate chan struct{}
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	<-g.gate
	return g.w.Write(b)
}
