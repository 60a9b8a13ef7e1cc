package agent

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func itoa(n int) string { return strconv.Itoa(n) }

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// procState is the state letter of pid from /proc/pid/stat, or 0 when the
// process does not exist.
func procState(pid int) byte {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	s := procState(pid)
	return s != 0 && s != 'Z'
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// orphan starts `sleep 30` through a shell that exits at once, so that the
// sleep is re-parented to this process (a subreaper), with env added to
// the test's environment (GORUN_ variables removed). It returns the sleep's
// pid and kills and reaps it at the end of the test.
func orphan(t *testing.T, env ...string) int {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 30 </dev/null >/dev/null 2>&1 & echo $!")
	cmd.Env = append(baseEnv(os.Environ(), nil), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("shell printed %q", out)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
	})
	// The shell has been waited for: its orphan is ours by now.
	if pp := ppid(pid); pp != os.Getpid() {
		t.Fatalf("orphan %d has parent %d, not this process %d (not a subreaper?)", pid, pp, os.Getpid())
	}
	return pid
}

func ppid(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	f := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	return atoi(string(f[1]))
}

func TestKillOrphans(t *testing.T) {
	becomeSubreaper(testLogger(t))
	job := fmt.Sprintf("orphans%d", os.Getpid())
	ours := orphan(t, "GORUN_JOB_ID="+job)
	oursToo := orphan(t, "A=1", "GORUN_JOB_ID="+job, "Z=2") // not the last variable
	supervised := orphan(t, "GORUN_JOB_ID="+job)
	otherJob := orphan(t, "GORUN_JOB_ID="+job+"x")
	noJob := orphan(t)

	needle := []byte("GORUN_JOB_ID=" + job + "\x00")
	exclude := map[int]bool{supervised: true}
	got := childrenWithEnv(os.Getpid(), needle, exclude)
	slices.Sort(got)
	want := []int{ours, oursToo}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("childrenWithEnv = %v, want %v (supervised %d, other job %d, no job %d)", got, want, supervised, otherJob, noJob)
	}

	start := time.Now()
	killOrphans(job, exclude, time.Now().Add(10*time.Second), testLogger(t))
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("killOrphans took %v", el)
	}
	for _, pid := range []int{ours, oursToo} {
		if alive(pid) {
			t.Errorf("orphan %d of the job survived", pid)
		}
	}
	for _, pid := range []int{supervised, otherJob, noJob} {
		if !alive(pid) {
			t.Errorf("process %d was killed, but it is not an orphan of the job", pid)
		}
	}
	if got := childrenWithEnv(os.Getpid(), needle, exclude); len(got) != 0 {
		t.Errorf("after killOrphans, childrenWithEnv = %v", got)
	}
}

// killOrphans reaps what it kills: as their new parent, only the agent can,
// and an agent whose ranks leave many daemons behind would otherwise keep
// one zombie per daemon (so would gorun itself, for its own host).
func TestKillOrphansReapsThem(t *testing.T) {
	becomeSubreaper(testLogger(t))
	job := fmt.Sprintf("zombies%d", os.Getpid())
	var pids []int
	for range 5 {
		pids = append(pids, orphan(t, "GORUN_JOB_ID="+job))
	}
	killOrphans(job, nil, time.Now().Add(10*time.Second), testLogger(t))
	for _, pid := range pids {
		if s := procState(pid); s != 0 {
			t.Errorf("orphan %d left in state %c, want reaped", pid, s)
		}
	}
}

func TestKillOrphansWithNothingToKill(t *testing.T) {
	start := time.Now()
	killOrphans("nosuchjob", nil, time.Now().Add(time.Minute), testLogger(t))
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("killOrphans with no orphans took %v", el)
	}
}

func TestChildren(t *testing.T) {
	var cmds []*exec.Cmd
	for range 3 {
		cmd := exec.Command("sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	})
	got := children(os.Getpid())
	for _, c := range cmds {
		if !slices.Contains(got, c.Process.Pid) {
			t.Errorf("children() = %v, misses %d", got, c.Process.Pid)
		}
	}
}
