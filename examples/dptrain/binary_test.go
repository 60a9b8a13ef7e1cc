package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// dptrainBin builds the command once per test binary.
func dptrainBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build dptrain with")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dptrain-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "dptrain")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err == nil {
			// gorun too, beside it, for the runs under gorun.
			out, err = exec.Command("go", "build", "-o", filepath.Join(dir, "gorun"), "../../cmd/gorun").CombinedOutput()
		}
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("building dptrain: %v", buildErr)
	}
	return binPath
}

// crashEnv makes the test binary play a crashing rank: it calls crash with
// the named signal ("" for none) instead of running the tests.
const crashEnv = "DPTRAIN_TEST_CRASH"

func TestMain(m *testing.M) {
	if sig, ok := os.LookupEnv(crashEnv); ok {
		crash(signals[sig])
		os.Exit(99) // not reached
	}
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// runBin runs cmd and returns its output and exit code.
func runBin(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("running %v: %v", cmd.Args, err)
	}
	return o.String(), e.String(), code
}

func TestBinaryUsage(t *testing.T) {
	bin := dptrainBin(t)
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"-h"}, 0, "Usage: dptrain"},
		{[]string{"--params", "0"}, 2, "dptrain: usage: --params 0"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--fail-signal", "HUP"}, 2, "--fail-signal"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, tc.args...)
			_, stderr, code := runBin(t, cmd)
			if code != tc.code || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.code, tc.stderr)
			}
		})
	}
}

// TestBinaryOutsideGorun checks that dptrain started by hand says so.
func TestBinaryOutsideGorun(t *testing.T) {
	bin := dptrainBin(t)
	cmd := exec.CommandContext(t.Context(), bin, "--params", "1K", "--steps", "2")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no gorun environment
	_, stderr, code := runBin(t, cmd)
	if code == 0 || !strings.Contains(stderr, "dptrain: ") {
		t.Errorf("outside gorun: exit %d, stderr %q; want a clear error", code, stderr)
	}
}

// TestCrash checks how --fail-at-step ends the process: exit code 1, or
// death by the --fail-signal signal (the test binary plays the rank).
func TestCrash(t *testing.T) {
	for _, name := range []string{"", "KILL", "ABRT", "TERM", "INT"} {
		t.Run("sig"+name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashEnv+"="+name, "GOTRACEBACK=none")
			_, _, code := runBin(t, cmd)
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			switch {
			case name == "":
				if code != 1 {
					t.Errorf("exit code %d, want 1", code)
				}
			case !ws.Signaled() || ws.Signal() != signals[name]:
				t.Errorf("process ended with %v, want death by SIG%s", cmd.ProcessState, name)
			}
		})
	}
}

var hashLine = regexp.MustCompile(`(?m)(params|optimizer) sha256 ([0-9a-f]{64})$`)

// TestUnderGorun runs dptrain under gorun with 1, 2 and 4 ranks: the same
// seed must give the same hashes, another seed others. It needs the gorun
// binary: GORUN_BIN, or one built from this repository.
func TestUnderGorun(t *testing.T) {
	bin := dptrainBin(t)
	gorun := os.Getenv("GORUN_BIN")
	if gorun == "" {
		gorun = filepath.Join(filepath.Dir(bin), "gorun")
	}
	hashes := func(np, seed string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), gorun, "-np", np, "--oversubscribe", "--",
			bin, "--params", "100K", "--steps", "20", "--batch", "16", "--compute", "2", "--seed", seed)
		stdout, stderr, code := runBin(t, cmd)
		m := hashLine.FindAllStringSubmatch(stdout, -1)
		if code != 0 || len(m) != 2 {
			t.Fatalf("gorun -np %s: exit %d\nstdout:\n%s\nstderr:\n%s", np, code, stdout, stderr)
		}
		return m[0][2] + " " + m[1][2]
	}
	want := hashes("1", "1")
	for _, np := range []string{"2", "4"} {
		if got := hashes(np, "1"); got != want {
			t.Errorf("-np %s: hashes %s, want %s (-np 1)", np, got, want)
		}
	}
	if other := hashes("2", "2"); other == want {
		t.Errorf("seeds 1 and 2 gave the same hashes %s", want)
	}
}

// TestUnderGorunUsr1 sends gorun SIGUSR1 (Slurm's preemption notice)
// once rank 0 has printed step 2 of 60 (gorun prefixes "[0] "): gorun forwards it to both ranks,
// each prints one line naming it and goes on, and the job ends 0 with the
// hashes of a run without it. Without a handler the Go runtime ignores
// SIGUSR1 and no line comes.
func TestUnderGorunUsr1(t *testing.T) {
	bin := dptrainBin(t)
	gorun := os.Getenv("GORUN_BIN")
	if gorun == "" {
		gorun = filepath.Join(filepath.Dir(bin), "gorun")
	}
	args := []string{"-np", "2", "--oversubscribe", "--", bin, "--params", "100K", "--steps", "60", "--batch", "16",
		"--compute", "2", "--seed", "1", "--log-every", "1", "--device-ms", "20"}
	stdout, stderr, code := runBin(t, exec.CommandContext(t.Context(), gorun, args...))
	want := hashLine.FindAllStringSubmatch(stdout, -1)
	if code != 0 || len(want) != 2 {
		t.Fatalf("without SIGUSR1: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	cmd := exec.CommandContext(t.Context(), gorun, args...)
	var e bytes.Buffer
	cmd.Stderr = &e
	cmd.WaitDelay = 10 * time.Second
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var o strings.Builder
	sc := bufio.NewScanner(pipe)
	sent := false
	for sc.Scan() {
		o.WriteString(sc.Text() + "\n")
		if !sent && strings.HasPrefix(sc.Text(), "[0] step 2 ") {
			if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
				t.Fatalf("signalling gorun: %v", err)
			}
			sent = true
		}
	}
	err = cmd.Wait()
	stdout, stderr = o.String(), e.String()
	if err != nil || !sent {
		t.Fatalf("with SIGUSR1 (sent: %v): %v\nstdout:\n%s\nstderr:\n%s", sent, err, stdout, stderr)
	}
	if got := hashLine.FindAllStringSubmatch(stdout, -1); len(got) != 2 || got[0][2] != want[0][2] || got[1][2] != want[1][2] {
		t.Errorf("hashes %v, want %v (without SIGUSR1)", got, want)
	}
	notes := regexp.MustCompile(`dptrain: rank (\d+): got SIGUSR1 at step (\d+)`).FindAllStringSubmatch(stderr, -1)
	var ranks []string
	for _, m := range notes {
		ranks = append(ranks, m[1])
	}
	slices.Sort(ranks)
	if strings.Join(ranks, " ") != "0 1" {
		t.Errorf("ranks noting SIGUSR1: %v, want one line from each of 0 and 1\nstderr:\n%s", ranks, stderr)
	}
}
