package testcluster

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// killTimeout bounds how long killNetns waits for a namespace to empty.
const killTimeout = 10 * time.Second

// errNoNetns is returned by killNetns for a namespace that does not exist.
var errNoNetns = errors.New("testcluster: no such network namespace")

// netnsID returns the device and inode that identify the named namespace,
// as ip netns identify does.
func netnsID(ns string) (dev, ino uint64, err error) {
	var st syscall.Stat_t
	for _, dir := range []string{"/run/netns", "/var/run/netns"} {
		if err = syscall.Stat(filepath.Join(dir, ns), &st); err == nil {
			return st.Dev, st.Ino, nil
		}
	}
	if errors.Is(err, syscall.ENOENT) {
		return 0, 0, fmt.Errorf("%w: %s", errNoNetns, ns)
	}
	return 0, 0, fmt.Errorf("testcluster: stat netns %s: %w", ns, err)
}

// killNetns sends SIGKILL to every process in the network namespaces
// nss, again and again until none is left in any (processes may fork
// meanwhile) or killTimeout passes. Each pass signals every namespace's
// processes before it waits, so that several namespaces die together (two
// hosts lost at once), not one after the other. Each pid from ip netns
// pids is opened (a pidfd on Linux) and then checked to still be in its
// namespace before it is signalled, so a pid reused by a process
// elsewhere is never hit.
func killNetns(nss ...string) error {
	type ns struct {
		name     string
		dev, ino uint64
	}
	all := make([]ns, 0, len(nss))
	for _, n := range nss {
		dev, ino, err := netnsID(n)
		if err != nil {
			return err
		}
		all = append(all, ns{n, dev, ino})
	}
	deadline := time.Now().Add(killTimeout)
	for {
		left := 0
		for _, n := range all {
			pids, err := nsPids(n.name)
			if err != nil {
				if _, _, err2 := netnsID(n.name); errors.Is(err2, errNoNetns) {
					return err2 // deleted meanwhile
				}
				return err
			}
			if len(pids) == 0 {
				continue
			}
			left += len(pids)
			if time.Now().After(deadline) {
				return fmt.Errorf("testcluster: processes %v still in %s after SIGKILL for %v", pids, n.name, killTimeout)
			}
			for _, pid := range pids {
				if err := signalIn(pid, n.dev, n.ino, syscall.SIGKILL); err != nil {
					return fmt.Errorf("testcluster: killing pid %d in %s: %w", pid, n.name, err)
				}
			}
		}
		if left == 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // let the kernel finish the exits
	}
}

// stopNetns sends SIGSTOP to every process in network namespace ns (a
// host frozen: its processes keep their sockets open and answer nothing),
// again until a pass finds no process it had not stopped (one may fork
// meanwhile: an agent starting a rank), and returns once every one of
// them is stopped (waitStopped): a signal is delivered asynchronously,
// and a thread in a system call finishes it first. SIGKILL (killNetns)
// still ends them; SIGCONT (contNetns) resumes them.
func stopNetns(ns string) error {
	dev, ino, err := netnsID(ns)
	if err != nil {
		return err
	}
	stopped := map[int]bool{}
	deadline := time.Now().Add(killTimeout)
	for {
		pids, err := nsPids(ns)
		if err != nil {
			return err
		}
		fresh := 0
		for _, pid := range pids {
			if stopped[pid] {
				continue
			}
			if err := signalIn(pid, dev, ino, syscall.SIGSTOP); err != nil {
				return fmt.Errorf("testcluster: stopping pid %d in %s: %w", pid, ns, err)
			}
			stopped[pid] = true
			fresh++
		}
		if fresh == 0 {
			for pid := range stopped {
				if err := waitStopped(pid, deadline); err != nil {
					return fmt.Errorf("testcluster: in %s: %w", ns, err)
				}
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testcluster: processes still appearing in %s after SIGSTOP for %v", ns, killTimeout)
		}
	}
}

// contNetns sends SIGCONT to every process in network namespace ns: the
// processes stopNetns stopped go on.
func contNetns(ns string) error {
	dev, ino, err := netnsID(ns)
	if err != nil {
		return err
	}
	pids, err := nsPids(ns)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := signalIn(pid, dev, ino, syscall.SIGCONT); err != nil {
			return fmt.Errorf("testcluster: continuing pid %d in %s: %w", pid, ns, err)
		}
	}
	return nil
}

// StopProcess sends SIGSTOP to p and returns once all its threads are
// stopped (or it is gone): from then on it makes no system call until
// it gets SIGCONT. For a process outside the hosts' namespaces (the
// launcher a test started); StopAll stops a host's.
func StopProcess(p *os.Process) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("testcluster: stopping pid %d: %w", p.Pid, err)
	}
	return waitStopped(p.Pid, time.Now().Add(killTimeout))
}

// waitStopped polls, until deadline, for every thread of pid to be
// stopped by a signal (state T or t in /proc/PID/task/TID/stat), or to
// have exited (state Z or X, or gone).
func waitStopped(pid int, deadline time.Time) error {
	for {
		running, err := runningThread(pid)
		if err != nil || running == "" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testcluster: pid %d: thread %s not stopped after SIGSTOP", pid, running)
		}
		time.Sleep(time.Millisecond) // polling /proc: no event says a thread stopped
	}
}

// runningThread returns a thread of pid that is neither stopped nor
// exited ("" if none).
func runningThread(pid int) (string, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return "", nil // gone
	}
	if err != nil {
		return "", fmt.Errorf("testcluster: %w", err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		// tid (comm) S ...: the state follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return "", fmt.Errorf("testcluster: cannot parse %s/%s/stat: %q", dir, e.Name(), b)
		}
		switch b[i+2] {
		case 'T', 't', 'Z', 'X':
		default:
			return e.Name(), nil
		}
	}
	return "", nil
}

// signalIn sends sig to pid if it is in the network namespace (dev, ino).
func signalIn(pid int, dev, ino uint64, sig syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	defer p.Release()
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return nil // exited (or exiting) already
	}
	if st.Dev != dev || st.Ino != ino {
		return nil // pid now belongs to a process elsewhere
	}
	if err := p.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}
