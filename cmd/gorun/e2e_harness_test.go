package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
)

// gorunBin is the gorun binary built once for the end-to-end tests.
var gorunBin string

func TestMain(m *testing.M) {
	gortest.RunHelper(helperEnv, helpers)
	dir, err := os.MkdirTemp("", "gorun-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gorunBin = filepath.Join(dir, "gorun")
	// The jobs' registry (gorun status) in the test's own directory: a
	// launcher a test SIGKILLs leaves its entry there, not in /tmp.
	os.Setenv("XDG_RUNTIME_DIR", filepath.Join(dir, "run"))
	os.Mkdir(filepath.Join(dir, "run"), 0o700)
	args := []string{"build", "-o", gorunBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building gorun:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one gorun run gave.
type result struct {
	stdout, stderr string
	code           int
	elapsed        time.Duration
}

// job is a gorun run under test, started with a unique marker variable so
// that its processes can be found in /proc.
type job struct {
	t      *testing.T
	mark   string
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	start  time.Time
	done   chan struct{}
	res    result
}

// syncBuffer is safe for concurrent use.
type syncBuffer = gortest.SyncBuffer

func newMark() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// startJob starts `gorun ARGS...` with the helper env: GORUNTEST_MARK and
// the helper given (if any) are exported to the ranks with -x.
func startJob(t *testing.T, helper string, env []string, args ...string) *job {
	t.Helper()
	return startJobWithStdin(t, nil, helper, env, args...)
}

// startJobWithStdin is startJob with stdin as gorun's standard input (nil:
// none).
func startJobWithStdin(t *testing.T, stdin io.Reader, helper string, env []string, args ...string) *job {
	t.Helper()
	return startJobUnder(t, nil, nil, stdin, helper, env, args...)
}

// startJobUnder is startJobWithStdin with gorun run by the command wrap
// (e.g. salloc and its flags; nil: none) in environment cmdEnv (nil: this
// process's).
func startJobUnder(t *testing.T, wrap, cmdEnv []string, stdin io.Reader, helper string, env []string, args ...string) *job {
	t.Helper()
	j := &job{t: t, mark: newMark(), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	full := []string{"-x", "GORUNTEST_MARK=" + j.mark}
	if helper != "" {
		full = append(full, "-x", helperEnv+"="+helper)
	}
	for _, e := range env {
		full = append(full, "-x", e)
	}
	// Flags go first; a "--" in args separates the program.
	full = append(full, args...)
	full = append(append(slices.Clone(wrap), gorunBin), full...)
	j.cmd = exec.Command(full[0], full[1:]...)
	j.cmd.Stdin, j.cmd.Stdout, j.cmd.Stderr = stdin, j.stdout, j.stderr
	if cmdEnv == nil {
		cmdEnv = os.Environ()
	}
	j.cmd.Env = append(slices.Clone(cmdEnv), "GORUNTEST_MARK="+j.mark)
	j.start = time.Now()
	if err := j.cmd.Start(); err != nil {
		t.Fatalf("starting gorun: %v", err)
	}
	go func() {
		err := j.cmd.Wait()
		j.res = result{stdout: j.stdout.String(), stderr: j.stderr.String(), elapsed: time.Since(j.start), code: j.cmd.ProcessState.ExitCode()}
		if ee, ok := err.(*exec.ExitError); ok && j.res.code < 0 {
			j.res.code = 128 + int(ee.Sys().(syscall.WaitStatus).Signal())
		}
		close(j.done)
	}()
	t.Cleanup(func() {
		select {
		case <-j.done:
		default:
			j.cmd.Process.Kill()
			<-j.done
		}
	})
	return j
}

// wait waits for gorun to exit, failing the test after limit, and then
// checks that none of the job's processes is left.
func (j *job) wait(limit time.Duration) result {
	j.t.Helper()
	select {
	case <-j.done:
	case <-time.After(limit):
		j.cmd.Process.Signal(syscall.SIGQUIT)
		<-j.done
		j.t.Fatalf("gorun did not exit within %v\nstdout:\n%s\nstderr:\n%s", limit, j.res.stdout, j.res.stderr)
	}
	j.checkNoOrphans()
	return j.res
}

// waitFor polls gorun's stdout until it holds n lines matching re.
func (j *job) waitFor(re *regexp.Regexp, n int, limit time.Duration) {
	j.t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if len(re.FindAllString(j.stdout.String(), -1)) >= n {
			return
		}
		select {
		case <-j.done:
			j.t.Fatalf("gorun exited early (code %d)\nstdout:\n%s\nstderr:\n%s", j.res.code, j.res.stdout, j.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	j.t.Fatalf("no %d lines matching %v within %v\nstdout:\n%s\nstderr:\n%s", n, re, limit, j.stdout.String(), j.stderr.String())
}

// markedProcs lists the processes whose environment holds mark, except gorun itself.
func markedProcs(mark string) []string {
	ents, _ := os.ReadDir("/proc")
	needle := []byte("GORUNTEST_MARK=" + mark)
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, needle) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		out = append(out, fmt.Sprintf("pid %d %q %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), stat))
	}
	return out
}

// checkNoOrphans fails if a process of the job outlives gorun. Processes
// killed with SIGKILL may take a moment to vanish, so it polls briefly.
func (j *job) checkNoOrphans() {
	j.t.Helper()
	var left []string
	for range 100 {
		if left = markedProcs(j.mark); len(left) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range left {
		j.t.Errorf("left behind: %s", l)
	}
}

// jobID is the job id a helper printed ("job <id>").
func (j *job) jobID() string {
	j.t.Helper()
	m := regexp.MustCompile(`(?m)^\[\d+\] job (\S+)$`).FindStringSubmatch(j.stdout.String())
	if m == nil {
		j.t.Fatalf("no job id printed:\n%s", j.stdout.String())
	}
	return m[1]
}

// checkNoJobFiles fails if a job directory of id is left under the
// temporary directory, or an Open MPI directory of it in /dev/shm (agents
// remove theirs as they exit; it polls briefly).
func checkNoJobFiles(t *testing.T, id string) {
	t.Helper()
	var left []string
	for range 250 {
		left, _ = filepath.Glob(filepath.Join(os.TempDir(), "gorun-"+id+"-*"))
		shm, _ := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+id+"-*"))
		if left = append(left, shm...); len(left) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("job files left behind: %v", left)
}

func runJob(t *testing.T, helper string, env []string, args ...string) result {
	t.Helper()
	return startJob(t, helper, env, args...).wait(60 * time.Second)
}
