package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

func init() { helpers["flood"] = helperFlood }

// floodLine is line i of a flood rank's output in generation gen; every
// line is floodLineLen bytes, newline included.
func floodLine(gen, i int) string {
	return fmt.Sprintf("gen %d line %010d %s\n", gen, i, strings.Repeat("x", 41))
}

const floodLineLen = 64

// helperFlood writes FLOOD_BYTES bytes of floodLines on stdout, 64 KiB per
// write(), and after each write stores the count of bytes written so far
// in the file FLOOD_COUNT. With FLOOD_STOP set it exits with FLOOD_CODE
// as soon as that file exists, whether its writes are done or blocked.
// A restarted rank (generation 1 on) writes 1,000 lines and exits 0.
func helperFlood() int {
	gen := envInt(wire.EnvRestartCount)
	total := envInt("FLOOD_BYTES")
	if gen > 0 {
		total = 1000 * floodLineLen
	}
	counter := os.Getenv("FLOOD_COUNT")
	var written atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 0, 64<<10)
		for i := 0; i*floodLineLen < total; {
			buf = buf[:0]
			for ; len(buf)+floodLineLen <= cap(buf) && i*floodLineLen < total; i++ {
				buf = append(buf, floodLine(gen, i)...)
			}
			if _, err := os.Stdout.Write(buf); err != nil {
				fmt.Fprintln(os.Stderr, "flood:", err)
				os.Exit(98)
			}
			n := written.Add(int64(len(buf)))
			if counter != "" && gen == 0 {
				tmp := counter + ".tmp"
				if os.WriteFile(tmp, []byte(strconv.FormatInt(n, 10)), 0o644) != nil || os.Rename(tmp, counter) != nil {
					os.Exit(97)
				}
			}
		}
	}()
	stop := os.Getenv("FLOOD_STOP")
	if stop == "" || gen > 0 {
		<-done
		return 0
	}
	for {
		if _, err := os.Stat(stop); err == nil {
			return envInt("FLOOD_CODE")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// floodCount reads a flood rank's counter file (0 before it exists).
func floodCount(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatalf("counter file: %v", err)
	}
	return n
}

// floodBound is the most a rank may write while nobody reads gorun's
// stdout: the window, a frame beyond it, and the buffers on the way (the
// rank's pipe, the agent's line buffer, the frame being filled, gorun's
// stdout buffer and pipe), with room to spare; far below what the tests
// write.
const floodBound = 4 << 20

// checkFloodOutput reads gorun's stdout to its end and checks it: the
// first generation's lines in order, at least min bytes of them (all of
// them when min is total), then, with restarted, generation 1's 1,000.
func checkFloodOutput(t *testing.T, out io.Reader, min, total int, restarted bool) {
	t.Helper()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	gen, i, n := 0, 0, 0
	for sc.Scan() {
		line := sc.Text() + "\n"
		if gen == 0 && restarted && strings.HasPrefix(line, "[0] gen 1 ") {
			gen, i = 1, 0
		}
		if want := "[0] " + floodLine(gen, i); line != want {
			t.Fatalf("line %d of generation %d: got %q, want %q", i, gen, line, want)
		}
		if gen == 0 {
			n += floodLineLen
		}
		i++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	switch {
	case n < min || n > total:
		t.Errorf("generation 0 output: %d bytes, want %d to %d", n, min, total)
	case restarted && (gen != 1 || i != 1000):
		t.Errorf("generation 1 output: %d lines, want 1000", i)
	}
}

// pauseReader is how long the tests leave gorun's stdout unread once the
// rank is under way: the condition under test (a paused pager).
const pauseReader = 2 * time.Second

// waitFlooding waits until the rank has written something, then leaves
// the reader paused, checking all along that the rank stays below
// floodBound: it must be blocked in write().
func waitFlooding(t *testing.T, counter string, stderr *syncBuffer) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for floodCount(t, counter) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the rank wrote nothing within 30 s\nstderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	end := time.Now().Add(pauseReader)
	n := 0
	for time.Now().Before(end) {
		if n = floodCount(t, counter); n > floodBound {
			t.Fatalf("the rank wrote %d bytes with nobody reading gorun's output, want at most %d: no backpressure", n, floodBound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

// TestOutputBackpressure: with gorun's stdout not read, a rank writing
// 64 MB is held in write() after about the flow-control window, so gorun
// holds that much, not the whole; once the reader resumes, the job ends
// well with every byte in order.
func TestOutputBackpressure(t *testing.T) {
	const total = 64 << 20
	counter := filepath.Join(t.TempDir(), "count")
	cmd, out, stderr, mark := startStalled(t, []string{helperEnv + "=flood", "FLOOD_BYTES=" + strconv.Itoa(total), "FLOOD_COUNT=" + counter},
		"-np", "1", os.Args[0])
	paused := waitFlooding(t, counter, stderr)
	t.Logf("written while the reader was paused: %d bytes", paused)
	checkFloodOutput(t, out, total, total, false)
	if code := waitExit(t, cmd, stderr, 120*time.Second); code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", code, stderr.String())
	}
	if stderr.String() != "" {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	(&job{t: t, mark: mark}).checkNoOrphans()
}

// TestOutputBlockedRankFails: a rank that ends in failure while its
// output is held back by flow control (nobody reads gorun's stdout) is
// acted on at once, without waiting for the reader: the job stops, or
// with --max-restarts restarts the rank. Everything the rank wrote before
// its end still arrives, in order (and after it, the restarted rank's).
func TestOutputBlockedRankFails(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		report *regexp.Regexp // on stderr while stdout is stalled
		code   int
	}{
		{"stop", nil, regexp.MustCompile(`rank 0 on host \S+ \(pid \d+\) exited with code 3`), 3},
		{"restart", []string{"--max-restarts", "1"}, regexp.MustCompile(`exited with code 3; restarting every rank \(restart 1 of 1\)`), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const total = 64 << 20
			dir := t.TempDir()
			counter, stop := filepath.Join(dir, "count"), filepath.Join(dir, "stop")
			args := append(tt.args, "-np", "1", os.Args[0])
			cmd, out, stderr, mark := startStalled(t, []string{helperEnv + "=flood", "FLOOD_BYTES=" + strconv.Itoa(total),
				"FLOOD_COUNT=" + counter, "FLOOD_STOP=" + stop, "FLOOD_CODE=3"}, args...)
			waitFlooding(t, counter, stderr)
			if err := os.WriteFile(stop, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			// The failure is reported (and acted on) with the reader still paused.
			waitStalledStderr(t, stderr, tt.report, 30*time.Second)
			written := floodCount(t, counter)
			checkFloodOutput(t, out, written, total, tt.code == 0)
			if code := waitExit(t, cmd, stderr, 60*time.Second); code != tt.code {
				t.Fatalf("exit %d, want %d\nstderr:\n%s", code, tt.code, stderr.String())
			}
			(&job{t: t, mark: mark}).checkNoOrphans()
		})
	}
}

// waitStalledStderr polls gorun's stderr until it matches re, failing if
// it does not within limit.
func waitStalledStderr(t *testing.T, stderr *syncBuffer, re *regexp.Regexp, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !re.MatchString(stderr.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr does not match %v within %v, with gorun's stdout not read\nstderr:\n%s", re, limit, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
