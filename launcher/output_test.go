package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"

	"github.com/gorun/gorun/internal/wire"
)

type rec struct {
	rank   int
	stream wire.Stream
	data   string
}

// frameOf encodes records as an agent would.
func frameOf(host int, recs ...rec) []byte {
	f := wire.NewOutputFrame(host)
	for _, r := range recs {
		f.Add(r.rank, r.stream, []byte(r.data))
	}
	return bytes.Clone(f.Bytes())
}

// frameHost is the host b names, which the launcher takes from the
// subject a frame came on.
func frameHost(t *testing.T, b []byte) int {
	t.Helper()
	host := 0
	_ = wire.DecodeOutputFrame(b, wire.MaxWorld, func(h int, _ wire.OutputRecord) { host = h })
	return host
}

func mustFrame(t *testing.T, m *outputMux, b []byte) {
	t.Helper()
	if err := m.frame(frameHost(t, b), b); err != nil {
		t.Fatalf("frame: %v", err)
	}
}

func TestOutputTagsEveryLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 16, true, false, "")
	mustFrame(t, m, frameOf(0,
		rec{3, wire.Stdout, "a\nbb\n\nccc\n"},
		rec{1, wire.Stderr, "err1\nerr2\n"},
		rec{12, wire.Stdout, "x\n"},
	))
	mustFrame(t, m, frameOf(1, rec{3, wire.Stdout, "again\n"}))
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if want := "[3] a\n[3] bb\n[3] \n[3] ccc\n[12] x\n[3] again\n"; stdout.String() != want {
		t.Errorf("stdout %q, want %q", stdout.String(), want)
	}
	if want := "[1] err1\n[1] err2\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}

func TestOutputUntaggedIsRaw(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 4, false, false, "")
	mustFrame(t, m, frameOf(0,
		rec{0, wire.Stdout, "plain\nlines\n"},
		rec{2, wire.Stderr, "e\n"},
		rec{1, wire.Stdout, "[not a tag]\n"},
	))
	m.close()
	if stdout.String() != "plain\nlines\n[not a tag]\n" || stderr.String() != "e\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

const stampLayout = "2006-01-02T15:04:05.000000"

func TestOutputTimestamps(t *testing.T) {
	for _, tag := range []bool{true, false} {
		t.Run(fmt.Sprintf("tag=%v", tag), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			m := newOutputMux(&stdout, &stderr, 8, tag, true, "")
			before := time.Now().Truncate(time.Microsecond)
			mustFrame(t, m, frameOf(0, rec{5, wire.Stdout, "one\ntwo\n"}, rec{6, wire.Stderr, "three\n"}))
			after := time.Now()
			m.close()
			tagRE := ""
			if tag {
				tagRE = `\[(5|6)\] `
			}
			re := regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}) ` + tagRE + `(one|two|three)$`)
			lines := strings.Split(strings.TrimSuffix(stdout.String()+stderr.String(), "\n"), "\n")
			if len(lines) != 3 {
				t.Fatalf("lines %q", lines)
			}
			for _, l := range lines {
				sm := re.FindStringSubmatch(l)
				if sm == nil {
					t.Fatalf("line %q does not match %s", l, re)
				}
				ts, err := time.ParseInLocation(stampLayout, sm[1], time.Local)
				if err != nil {
					t.Fatal(err)
				}
				if ts.Before(before) || ts.After(after) {
					t.Errorf("timestamp %v not between %v and %v (local time expected)", ts, before, after)
				}
			}
			if !strings.HasSuffix(stdout.String(), "two\n") || !strings.HasSuffix(stderr.String(), "three\n") {
				t.Errorf("streams mixed up: stdout %q stderr %q", stdout.String(), stderr.String())
			}
		})
	}
}

func TestOutputToFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out") // created on demand
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 4, true, true, dir) // tags and stamps do not go to files
	mustFrame(t, m, frameOf(0,
		rec{0, wire.Stdout, "out 0 a\n"},
		rec{0, wire.Stderr, "err 0\n"},
		rec{3, wire.Stdout, "out 3\n"},
	))
	mustFrame(t, m, frameOf(1, rec{0, wire.Stdout, "out 0 b\nout 0 c\n"}))
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if stdout.Len() != 0 || stderr.Len() != 0 {
		t.Errorf("terminal got stdout %q stderr %q", stdout.String(), stderr.String())
	}
	want := map[string]string{
		"rank.0/stdout": "out 0 a\nout 0 b\nout 0 c\n",
		"rank.0/stderr": "err 0\n",
		"rank.3/stdout": "out 3\n",
	}
	for name, w := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != w {
			t.Errorf("%s: %q, %v; want %q", name, b, err, w)
		}
	}
	// A stream a rank never wrote on gets no file.
	for _, name := range []string{"rank.3/stderr", "rank.1", "rank.2"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists (%v)", name, err)
		}
	}
}

func TestOutputToFilesTruncates(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "rank.0"), 0o755)
	os.WriteFile(filepath.Join(dir, "rank.0", "stdout"), []byte("an older, longer run\n"), 0o644)
	m := newOutputMux(&bytes.Buffer{}, &bytes.Buffer{}, 1, false, false, dir)
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "new\n"}))
	m.close()
	if b, _ := os.ReadFile(filepath.Join(dir, "rank.0", "stdout")); string(b) != "new\n" {
		t.Errorf("stdout file %q, want %q", b, "new\n")
	}
}

func TestOutputFileThatCannotBeCreated(t *testing.T) {
	dir := t.TempDir()
	// rank.1 is a file, so rank 1's directory cannot be made.
	if err := os.WriteFile(filepath.Join(dir, "rank.1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 4, true, false, dir)
	for i := range 5 {
		mustFrame(t, m, frameOf(0,
			rec{1, wire.Stdout, fmt.Sprintf("lost %d\n", i)},
			rec{1, wire.Stderr, fmt.Sprintf("lost too %d\n", i)},
			rec{0, wire.Stdout, fmt.Sprintf("kept %d\n", i)},
		))
	}
	err := m.close()
	if err == nil {
		t.Error("close reports no error after output was lost")
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout %q", stdout.String())
	}
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "gorun: cannot write output of rank 1: ") {
		t.Errorf("stderr %q, want one report about rank 1", stderr.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "rank.0", "stdout")); string(b) != "kept 0\nkept 1\nkept 2\nkept 3\nkept 4\n" {
		t.Errorf("rank 0's output %q", b)
	}
}

func TestOutputDirIsAFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(dir, nil, 0o644)
	var stderr bytes.Buffer
	m := newOutputMux(&bytes.Buffer{}, &stderr, 2, true, false, dir)
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, "a\n"}, rec{1, wire.Stderr, "b\n"}))
	if m.close() == nil {
		t.Error("no error")
	}
	if n := strings.Count(stderr.String(), "\n"); n != 1 || !strings.Contains(stderr.String(), "cannot write output") {
		t.Errorf("stderr %q, want one report line", stderr.String())
	}
}

func TestOutputReportAndAgentLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := newOutputMux(&stdout, &stderr, 1, true, true, "")
	m.report("rank %d on host %s %s", 2, "h", "exited with code 3")
	m.agentLine("node7", []byte("something broke\n\n"))
	m.agentLine("node7", []byte("no newline"))
	m.close()
	want := "gorun: rank 2 on host h exited with code 3\n" +
		"gorun agent node7: something broke\n" +
		"gorun agent node7: no newline\n"
	if stderr.String() != want || stdout.Len() != 0 {
		t.Errorf("stderr %q, want %q; stdout %q", stderr.String(), want, stdout.String())
	}
}

func TestOutputInvalidFrame(t *testing.T) {
	good := frameOf(0, rec{0, wire.Stdout, "fine\n"}, rec{1, wire.Stdout, "also fine\n"})
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"bad magic", append([]byte("X"), good[1:]...)},
		{"bad version", append([]byte{'O', 9}, good[2:]...)},
		{"truncated", good[:len(good)-3]},
		{"rank out of world", frameOf(0, rec{0, wire.Stdout, "ok\n"}, rec{2, wire.Stdout, "rank 2 of 2\n"})},
		{"bad stream", frameOf(0, rec{0, wire.Stdout, "ok\n"}, rec{1, 3, "?\n"})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			m := newOutputMux(&stdout, &stderr, 2, true, false, "")
			err := m.frame(0, tt.b)
			if !errors.Is(err, wire.ErrMalformed) {
				t.Errorf("frame = %v, want ErrMalformed", err)
			}
			m.drain(nil)
			// Nothing of a bad frame is written, not even its valid first records.
			if stdout.Len() != 0 || stderr.Len() != 0 {
				t.Errorf("wrote stdout %q stderr %q", stdout.String(), stderr.String())
			}
			// The mux goes on working.
			mustFrame(t, m, good)
			m.close()
			if stdout.String() != "[0] fine\n[1] also fine\n" {
				t.Errorf("after a bad frame: %q", stdout.String())
			}
		})
	}
}

// lineChecker records everything written to it, from both streams, as a
// terminal does.
type lineChecker = gortest.SyncBuffer

// checkWholeLines checks every line of out against re.
func checkWholeLines(t *testing.T, out string, re *regexp.Regexp) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	if out != "" && !strings.HasSuffix(out, "\n") {
		t.Errorf("output does not end in a newline: …%q", out[max(0, len(out)-80):])
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			if len(l) > 200 {
				l = l[:100] + "…" + l[len(l)-100:]
			}
			t.Fatalf("line not whole: %q", l)
		}
		kinds[m[1]]++
	}
	return kinds
}

// Reports and agent lines written while agents' frames arrive on other
// goroutines never land inside a rank's line, with stdout and stderr on
// the same terminal.
func TestOutputConcurrentWritersKeepLinesWhole(t *testing.T) {
	term := &lineChecker{}
	const agents, frames, world = 6, 100, 24
	m := newOutputMux(term, term, world, true, false, "")
	var wg sync.WaitGroup
	for a := range agents {
		wg.Go(func() {
			for i := range frames {
				var recs []rec
				for k := range 4 {
					r := a*4 + k
					var sb strings.Builder
					for l := range 1 + (i+k)%7 {
						fmt.Fprintf(&sb, "r%d-f%d-l%d-%s\n", r, i, l, strings.Repeat("x", (i*31+l*17)%500))
					}
					s := wire.Stdout
					if (i+k)%3 == 0 {
						s = wire.Stderr
					}
					recs = append(recs, rec{r, s, sb.String()})
				}
				if err := m.frame(a, frameOf(a, recs...)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for g := range 3 {
		wg.Go(func() {
			for i := range frames {
				m.report("report %d from %d with %s", i, g, strings.Repeat("y", i%50))
			}
		})
		wg.Go(func() {
			for i := range frames {
				m.agentLine(fmt.Sprintf("host%d", g), []byte(fmt.Sprintf("agent says %d %s\n", i, strings.Repeat("z", i%70))))
			}
		})
	}
	wg.Wait()
	m.close()
	re := regexp.MustCompile(`^(?:\[(\d+)\] r(\d+)-f\d+-l\d+-x*|gorun: (report) \d+ from \d with y*|gorun agent host\d: (agent) says \d+ z*)$`)
	total := 0
	for _, l := range strings.Split(strings.TrimSuffix(term.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line not whole: %.200q", l)
		}
		if m[1] != "" && m[1] != m[2] {
			t.Fatalf("line of rank %s tagged %s: %.200q", m[2], m[1], l)
		}
		total++
	}
	want := 3 * frames * 2 // reports and agent lines
	for i := range frames {
		for k := range 4 {
			want += agents * (1 + (i+k)%7)
		}
	}
	if total != want {
		t.Errorf("%d lines, want %d", total, want)
	}
}

// Each stream has its own 64 KiB buffer; a frame with more than that for
// stdout and then for stderr must not make either writer flush part of a
// line, or, with both streams on one terminal (the usual case), stderr
// lands inside a stdout line. Agents send frames of 256 KiB and more.
func TestLargeFrameKeepsLinesWhole(t *testing.T) {
	term := &lineChecker{}
	m := newOutputMux(term, term, 2, true, false, "")
	var out, errs strings.Builder
	for i := range 100 {
		fmt.Fprintf(&out, "out-%d-%s\n", i, strings.Repeat("o", 1000))
		fmt.Fprintf(&errs, "err-%d-%s\n", i, strings.Repeat("e", 1000))
	}
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, out.String()}, rec{1, wire.Stderr, errs.String()}))
	m.close()
	checkWholeLines(t, term.String(), regexp.MustCompile(`^\[\d\] ((out)-\d+-o+|(err)-\d+-e+)$`))
}

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

// wholeWrites fails the test when a write does not end a line: the unit a
// terminal shared by stdout and stderr can interleave.
type wholeWrites struct {
	t      *testing.T
	mu     sync.Mutex // the two streams' lanes write at once
	writes int
}

func (w *wholeWrites) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	if len(p) > 0 && p[len(p)-1] != '\n' {
		w.t.Errorf("write %d of %d bytes ends mid-line: …%q", w.writes, len(p), p[max(0, len(p)-40):])
	}
	return len(p), nil
}

// A line longer than a stream's whole buffer goes out in one write, and
// no write ends mid-line.
func TestLineLongerThanBufferStaysWhole(t *testing.T) {
	w := &wholeWrites{t: t}
	m := newOutputMux(w, w, 2, true, false, "")
	long := "long-" + strings.Repeat("l", 200<<10) + "\n"
	var many strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&many, "out-%d-%s\n", i, strings.Repeat("o", i%300))
	}
	mustFrame(t, m, frameOf(0, rec{1, wire.Stderr, "err-1-e\n"}, rec{0, wire.Stdout, long}, rec{0, wire.Stdout, many.String()}, rec{1, wire.Stderr, "err-2-e\n"}))
	m.close()
	if w.writes < 3 {
		t.Fatalf("only %d writes", w.writes)
	}
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
