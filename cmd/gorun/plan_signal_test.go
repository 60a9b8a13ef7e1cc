package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/plan"
)

func init() { helpers["plansignal"] = helperPlanSignal }

// helperPlanSignal is gorun plan under planSignals, as planMain runs it,
// measuring the durable directory $GORUNTEST_PLANDIR through a file that
// prints "writing" at its second chunk and then stalls until the context
// ends, so that the test signals it in the middle of the measurement.
func helperPlanSignal() int {
	ctx, stop := planSignals()
	defer stop()
	deps := planDeps{now: time.Now, fs: stallFS{ctx}, stdout: os.Stdout,
		memBW: func() (float64, error) { return 1e9, nil }}
	args := []string{"--hosts", "4", "--mttf", "365d", "--job-length", "1d", "--step", "1s", "--state", "1GB",
		"--net-bw", "1GB/s", "--durable-dir", os.Getenv("GORUNTEST_PLANDIR"), "--measure-size", "64MiB", "--runs", "10"}
	return runPlan(ctx, args, deps, os.Stderr)
}

type stallFS struct{ ctx context.Context }

func (s stallFS) CreateTemp(dir, pattern string) (plan.File, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &stallFile{File: f, ctx: s.ctx}, nil
}

func (stallFS) Remove(name string) error { return os.Remove(name) }

type stallFile struct {
	*os.File
	ctx    context.Context
	writes int
}

func (f *stallFile) Write(p []byte) (int, error) {
	if f.writes++; f.writes == 2 {
		fmt.Println("writing")
		<-f.ctx.Done()
	}
	return f.File.Write(p)
}

// SIGINT or SIGTERM in the middle of the durable measurement: gorun plan
// removes its file and exits 1 saying why, instead of dying with the
// file left behind.
func TestPlanSignalDurable(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), helperEnv+"=plansignal", "GORUNTEST_PLANDIR="+dir)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(out).ReadString('\n')
			if line != "writing\n" {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("helper said %q, stderr %s", line, stderr.String())
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("while measuring, %s holds %v, want the probe's file", dir, ents)
			}
			cmd.Process.Signal(sig)
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitError || !strings.Contains(stderr.String(), "context canceled") {
				t.Errorf("after %v: %v, stderr %q; want exit %d saying the measurement was cancelled", sig, err, stderr.String(), exitError)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("left in %s: %v", dir, ents)
			}
		})
	}
}

// A cancelled measurement job is stopped with its whole process group:
// here a shell and the sleep it started, which exec.CommandContext alone
// would leave running (it kills the shell only).
func TestRunGroupCancel(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runGroup(ctx, "sh", "-c", `sleep 600 & echo $! > "$0.tmp" && mv "$0.tmp" "$0"; wait`, pidFile)
		done <- err
	}()
	pid := 0
	deadline := time.Now().Add(30 * time.Second)
	for pid == 0 { // polling an external process to a deadline
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the shell never started its sleep")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("runGroup returned no error after its context ended")
	}
	for deadline = time.Now().Add(20 * time.Second); procRunning(pid); {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the job's child %d outlived the cancelled job", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling an external process to a deadline
	}
}

// procRunning reports whether pid runs (a zombie does not).
func procRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
