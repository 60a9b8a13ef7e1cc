package agent

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from linux/prctl.h.
const prSetChildSubreaper = 36

var subreaperOnce sync.Once

// becomeSubreaper makes this process the subreaper of everything it
// starts: a descendant whose parent dies is re-parented here instead of to
// init, so that a rank's daemonized children (setsid escapes the process
// group) can still be found and killed.
func becomeSubreaper(log *slog.Logger) {
	subreaperOnce.Do(func() {
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
			log.Warn("cannot become child subreaper; daemonized rank children may outlive the job", "err", errno)
		}
	})
}

// killOrphans kills and reaps the processes re-parented to this process
// that belong to job (their environment holds GORUN_JOB_ID=job), until none
// is left or the deadline passes. Ranks still supervised (exclude) are left
// to their own waiters.
func killOrphans(job string, exclude map[int]bool, deadline time.Time, log *slog.Logger) {
	needle := []byte("GORUN_JOB_ID=" + job + "\x00")
	self := os.Getpid()
	killed := map[int]bool{} // killed, not reaped yet
	for {
		for _, pid := range childrenWithEnv(self, needle, exclude) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed[pid] = true
		}
		// Reap what has died: as its new parent only we can. Only pids we
		// killed are waited for; the children os/exec waits for are not.
		for pid := range killed {
			var ws syscall.WaitStatus
			switch got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); {
			case got == pid, errors.Is(err, syscall.ECHILD):
				delete(killed, pid)
			case err != nil:
				log.Debug("reaping orphan", "pid", pid, "err", err)
			}
		}
		if len(killed) == 0 && len(childrenWithEnv(self, needle, exclude)) == 0 {
			return
		}
		if time.Now().After(deadline) {
			log.Error("processes of the job survive SIGKILL; leaving them", "pids", slices.Collect(maps.Keys(killed)))
			return
		}
		time.Sleep(5 * time.Millisecond) // SIGKILL takes effect asynchronously
	}
}

// childrenWithEnv lists the live children of parent whose environment
// contains needle, except those in exclude. Zombies are left alone: they
// may be children that os/exec is about to wait for.
func childrenWithEnv(parent int, needle []byte, exclude map[int]bool) []int {
	var out []int
	for _, pid := range children(parent) {
		if exclude[pid] {
			continue
		}
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses and may hold spaces.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 2 || string(f[0]) == "Z" {
			continue
		}
		if pp, _ := strconv.Atoi(string(f[1])); pp != parent {
			continue
		}
		env, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err == nil && bytes.Contains(append(env, 0), needle) {
			out = append(out, pid)
		}
	}
	return out
}

// children lists the children of process pid from
// /proc/pid/task/*/children, or, where the kernel lacks that file, by
// scanning every process.
func children(pid int) []int {
	base := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(base)
	var out []int
	if err == nil {
		ok := true
		for _, t := range tasks {
			b, err := os.ReadFile(filepath.Join(base, t.Name(), "children"))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					ok = false
					break
				}
				continue // the thread ended meanwhile
			}
			for _, f := range bytes.Fields(b) {
				if c, err := strconv.Atoi(string(f)); err == nil {
					out = append(out, c)
				}
			}
		}
		if ok {
			return out
		}
	}
	out = out[:0]
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if c, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, c) // childrenWithEnv checks the parent
		}
	}
	return out
}
