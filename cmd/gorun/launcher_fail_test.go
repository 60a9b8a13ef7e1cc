package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// restartScript is a rank for TestHostLostAfterRestart: in generation 0
// rank 0 ends well at once and rank 1 fails once the file $GO exists; in
// generation 1 every rank runs until it is stopped.
const restartScript = `
if [ "$GORUN_RESTART_COUNT" = 0 ]; then
	if [ "$GORUN_RANK" = 0 ]; then echo "job $GORUN_JOB_ID"; echo first done; exit 0; fi
	while [ ! -e "$GO" ]; do sleep 0.05; done
	echo failing; exit 3
fi
echo "generation $GORUN_RESTART_COUNT running"
exec sleep 600
`

// TestHostLostAfterRestart: a host whose ranks all ended before a restart
// takes part in the restart, and its loss afterwards (crash or partition)
// is noticed and stops the job.
func TestHostLostAfterRestart(t *testing.T) {
	killAll := func(h *testcluster.Hosts, i int) error { return h.KillAll(i) }
	tests := []struct {
		name      string
		fail      func(h *testcluster.Hosts, i int) error
		before    bool // fail host 0 before the restart, once its ranks are done
		partition bool
		code      int    // gorun's exit code
		want      string // in the report
	}{
		{"crash", killAll, false, false, 1, "agent on host %s ended unexpectedly"},
		{"partition", (*testcluster.Hosts).LinkDown, false, true, 1, "host %s lost: no heartbeat"},
		// A restart cannot start ranks on a host whose agent is gone.
		{"crash before", killAll, true, false, 3, "cannot restart the ranks: the agent on host %s has ended"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hosts := testcluster.NetnsHosts(t, 2)
			hf := hosts.WriteHostfile(t, t.TempDir(), 1)
			goFile := filepath.Join(t.TempDir(), "go")
			timeout := 1500 * time.Millisecond
			j := startJob(t, "", []string{"GO=" + goFile},
				"--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr,
				"--max-restarts", "1", "--kill-grace", "1",
				"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5",
				"sh", "-c", restartScript)
			j.waitFor(regexp.MustCompile(`(?m)^\[0\] first done$`), 1, 60*time.Second)
			if tt.before {
				if err := tt.fail(hosts, 0); err != nil {
					t.Fatal(err)
				}
				waitStderr(t, j, regexp.MustCompile(`agent ended after its ranks`), 30*time.Second)
			}
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if !tt.before {
				j.waitFor(regexp.MustCompile(`(?m)^\[\d\] generation 1 running$`), 2, 60*time.Second)
				if err := tt.fail(hosts, 0); err != nil {
					t.Fatal(err)
				}
			}
			// Unfixed, gorun waited for ever: bound the wait generously
			// beyond the heartbeat timeout.
			res := j.wait(timeout + 30*time.Second)
			if !tt.partition {
				// The crashed host's agent could not remove its files (a
				// real host's /tmp goes with it); the other's did, and
				// swept the crashed one's as it ended: a loose bound
				// here, TestMultiHostCrashStopsTheJob asserts none.
				left, _ := filepath.Glob(filepath.Join(os.TempDir(), "gorun-"+j.jobID()+"-*"))
				if len(left) > 1 {
					t.Errorf("job directories left: %v, want at most the crashed host's", left)
				}
				for _, d := range left {
					os.RemoveAll(d)
				}
			} else {
				checkNoJobFiles(t, j.jobID())
			}
			if want := fmt.Sprintf(tt.want, hosts.Names[0]); res.code != tt.code || !strings.Contains(res.stderr, want) {
				t.Fatalf("exit %d, want %d and %q\nstdout:\n%s\nstderr:\n%s", res.code, tt.code, want, res.stdout, res.stderr)
			}
		})
	}
}

// waitStderr polls gorun's stderr until it matches re.
func waitStderr(t *testing.T, j *job, re *regexp.Regexp, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if re.MatchString(j.stderr.String()) {
			return
		}
		select {
		case <-j.done:
			t.Fatalf("gorun exited early (code %d)\nstdout:\n%s\nstderr:\n%s", j.res.code, j.res.stdout, j.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("stderr does not match %v within %v\nstderr:\n%s", re, limit, j.stderr.String())
}

// stalledLines is how many lines outputScript writes (about 3.4 MB, far
// beyond what the pipes on the way hold).
const stalledLines = 70000

// outputScript writes stalledLines numbered lines, then runs rest.
func outputScript(rest string) string {
	return fmt.Sprintf("seq -f 'line %%06g of the job, long enough to fill pipes' 1 %d; %s", stalledLines, rest)
}

func wantStalledOutput() string {
	var b bytes.Buffer
	for i := 1; i <= stalledLines; i++ {
		fmt.Fprintf(&b, "[0] line %06d of the job, long enough to fill pipes\n", i)
	}
	return b.String()
}

// startStalled starts gorun with its stdout on a pipe that the test reads
// only when it decides to, like a paused pager.
func startStalled(t *testing.T, env []string, args ...string) (*exec.Cmd, io.ReadCloser, *syncBuffer, string) {
	t.Helper()
	mark := newMark()
	full := []string{"-x", "GORUNTEST_MARK=" + mark}
	for _, e := range env {
		full = append(full, "-x", e)
	}
	cmd := exec.Command(gorunBin, append(full, args...)...)
	cmd.Env = append(os.Environ(), "GORUNTEST_MARK="+mark)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, out, stderr, mark
}

// waitExit waits for cmd to exit within limit and returns its exit code.
func waitExit(t *testing.T, cmd *exec.Cmd, stderr *syncBuffer, limit time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		cmd.Process.Signal(syscall.SIGQUIT)
		<-done
		t.Fatalf("gorun did not exit within %v\nstderr:\n%s", limit, stderr.String())
	}
	return cmd.ProcessState.ExitCode()
}

// TestStalledStdoutIsNotAFailure: a reader of gorun's output that pauses
// for three heartbeat timeouts (as 30 s does to the default 10 s) holds
// the output back, but neither the heartbeats nor the job's end: the job
// ends well and every byte arrives, in order.
func TestStalledStdoutIsNotAFailure(t *testing.T) {
	const timeout = 2 * time.Second
	const pause = 3 * timeout
	want := wantStalledOutput()
	tests := []struct {
		name, rest string
	}{
		{"mid-job", "sleep 4"}, // the job runs on while its output is stalled
		{"at the end", "true"}, // the job ends while its output waits
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, out, stderr, mark := startStalled(t, nil, "--heartbeat-interval", "0.2", "--heartbeat-timeout", fmt.Sprint(timeout.Seconds()),
				"-np", "1", "sh", "-c", outputScript(tt.rest))
			time.Sleep(pause) // the reader's pause, the condition under test
			got, err := io.ReadAll(out)
			if err != nil {
				t.Fatal(err)
			}
			code := waitExit(t, cmd, stderr, 60*time.Second)
			if code != 0 {
				t.Fatalf("exit %d, want 0\nstderr:\n%s", code, stderr.String())
			}
			if string(got) != want {
				t.Errorf("got %d bytes of output, want %d, every line in order", len(got), len(want))
			}
			if stderr.String() != "" {
				t.Errorf("stderr:\n%s", stderr.String())
			}
			(&job{t: t, mark: mark}).checkNoOrphans()
		})
	}
}

// TestInterruptWhileStdoutIsStalled: with gorun's stdout stalled, SIGINT
// still stops the ranks and is reported at once on stderr, and a second one
// ends gorun without waiting for the reader.
func TestInterruptWhileStdoutIsStalled(t *testing.T) {
	written := filepath.Join(t.TempDir(), "written")
	// The rank writes about 1 MB, then marks it, then goes on until flow
	// control stops it in write(): what it wrote past gorun's stdout pipe
	// and buffer (128 KiB) already holds gorun's stdout lane in a write.
	cmd, out, stderr, mark := startStalled(t, []string{"WRITTEN=" + written}, "-np", "1", "sh", "-c",
		fmt.Sprintf("seq -f 'line %%06g of the job, long enough to fill pipes' 1 20000; touch \"$WRITTEN\"; %s", outputScript("exec sleep 600")))
	defer out.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(written); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rank did not write its output\nstderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	stopping := regexp.MustCompile(`gorun: SIGINT; stopping 1 ranks`)
	deadline = time.Now().Add(30 * time.Second)
	for !stopping.MatchString(stderr.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no report of the interrupt within 30 s\nstderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	if code := waitExit(t, cmd, stderr, 30*time.Second); code != 130 {
		t.Fatalf("exit %d, want 130\nstderr:\n%s", code, stderr.String())
	}
	(&job{t: t, mark: mark}).checkNoOrphans()
}
