package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// launcher is one command under test. In args, the word "N" stands for the
// rank count.
type launcher struct {
	name    string
	path    string   // program; resolved with exec.LookPath
	args    []string // arguments, "N" replaced by the rank count
	version []string // arguments that make it print its version; nil to skip
}

// launchers lists the commands compared, gorun first. Neither MPI needs ssh
// here: both start local ranks by fork when every rank is on this host, and
// Hydra is told so explicitly.
//
// prog is the program every launcher runs ("true", or an MPI program built
// with mpi, "mpich" or "openmpi"). An MPICH-built program cannot run under
// Open MPI's mpirun, which speaks PMIx, not PMI-1, nor an Open MPI one
// under Hydra: the other MPI is left out then.
func launchers(gorun string, skipMPI bool, prog string, mpi string) []launcher {
	ls := []launcher{
		{name: "gorun", path: gorun, args: []string{"-np", "N", "--oversubscribe", prog}},
		{name: "openmpi", path: "mpirun.openmpi", args: []string{"--oversubscribe", "--allow-run-as-root", "-np", "N", prog}, version: []string{"--version"}},
		{name: "hydra", path: "mpiexec.hydra", args: []string{"-launcher", "fork", "-n", "N", prog}, version: []string{"--version"}},
	}
	switch {
	case skipMPI:
		return ls[:1]
	case mpi == "mpich":
		return []launcher{ls[0], ls[2]}
	case mpi == "openmpi":
		return ls[:2]
	}
	return ls
}

func (l launcher) argv(n int) []string {
	args := slices.Clone(l.args)
	for i, a := range args {
		if a == "N" {
			args[i] = strconv.Itoa(n)
		}
	}
	return args
}

type outcome int

const (
	ok     outcome = iota // exited 0 within the timeout
	hung                  // killed at the timeout
	failed                // could not start, or exited non-zero
)

type result struct {
	outcome outcome
	elapsed time.Duration // launch to exit; meaningful only when ok
	err     error         // why it failed or hung
}

// runOnce runs path with args in a process group of its own and times it
// from start to exit. If it is still running after timeout, it and all its
// descendants are killed and the run counts as hung.
func runOnce(path string, args []string, timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stderr bytes.Buffer
	killed := false // set by Cancel, read after Wait
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		killed = true
		killTree(cmd.Process.Pid)
		return nil
	}
	// Also bounds the wait for a stray descendant holding stderr open.
	cmd.WaitDelay = time.Second

	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	msg := lastLine(stderr.String())
	switch {
	case killed:
		err = fmt.Errorf("killed after %v", timeout)
		if msg != "" {
			err = fmt.Errorf("%w; last stderr line: %s", err, msg)
		}
		return result{outcome: hung, err: err}
	case err != nil:
		if msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return result{outcome: failed, err: err}
	}
	return result{outcome: ok, elapsed: elapsed}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// killTree SIGKILLs the process group led by pid and every descendant of pid,
// whatever its process group: both MPIs put each rank in a group of its own,
// so killing the launcher's group alone would orphan them. The tree is
// stopped first, from the root down, so nothing forks while it is walked.
func killTree(pid int) {
	stopped := map[int]bool{}
	for {
		fresh := false
		for _, p := range descendants(pid) {
			if !stopped[p] {
				stopped[p] = true
				fresh = true
				_ = syscall.Kill(p, syscall.SIGSTOP)
			}
		}
		if !fresh {
			break
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for p := range stopped {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// descendants returns root and, where /proc is readable, all its descendants,
// parents before children.
func descendants(root int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	tree := []int{root}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	return tree
}

// parentOf reads the parent pid from /proc/pid/stat, whose second field (the
// command name, in parentheses) may itself contain spaces and parentheses.
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:])) // state ppid pgrp ...
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// versionOf returns the first line of path's version output that contains a
// digit, with runs of blanks collapsed, or "" if there is none.
func versionOf(path string, args []string) string {
	if args == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil && !errors.As(err, new(*exec.ExitError)) {
		return ""
	}
	for line := range strings.Lines(string(out)) {
		if strings.ContainsAny(line, "0123456789") {
			return strings.Join(strings.Fields(line), " ")
		}
	}
	return ""
}
