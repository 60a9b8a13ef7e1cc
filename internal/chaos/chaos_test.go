package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// The chaos suite's knobs (make chaos passes them through).
const (
	envSeed    = "GORUN_CHAOS_SEED"    // the seed (default: derived from the commit, logged: a CI failure replays)
	envRuns    = "GORUN_CHAOS_RUNS"    // how many runs (default 3: the short mode)
	envOnly    = "GORUN_CHAOS_ONLY"    // run only these indices, comma-separated (replay)
	envJSON    = "GORUN_CHAOS_JSON"    // write the summary as JSON to this file
	envKinds   = "GORUN_CHAOS_KINDS"   // draw only these fault kinds, comma-separated
	envVerbose = "GORUN_CHAOS_VERBOSE" // 1: log every faulty run's whole stderr
)

// shortRuns is the short mode's number of runs (CI).
const shortRuns = 3

// Against go test's -timeout (its panic loses the summary and the replay
// lines): the jobs' context ends stopMargin before the test's deadline
// (a job then running is sent SIGQUIT and fails launcher-exits; the run
// ends within its leak checks' waits), and no run is started with less
// than runBudget left before that (a run's reference, faulty job and
// resumed one may take jobLimit each: a run started later would most
// likely be cut).
const (
	stopMargin = 2 * time.Minute
	runBudget  = jobLimit
)

// buildBinaries builds gorun and dptrain into dir, and finds python3 and
// examples/pytrain.
func buildBinaries(t *testing.T, dir string) Binaries {
	t.Helper()
	b := Binaries{Gorun: filepath.Join(dir, "gorun"), Dptrain: filepath.Join(dir, "dptrain")}
	for bin, pkg := range map[string]string{b.Gorun: "github.com/gorun/gorun/cmd/gorun", b.Dptrain: "github.com/gorun/gorun/examples/dptrain"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, out)
		}
	}
	if py, err := exec.LookPath("python3"); err == nil {
		script, err := filepath.Abs("../../examples/pytrain/pytrain.py")
		if err != nil {
			t.Fatal(err)
		}
		b.Python, b.Pytrain = py, script
	} else {
		t.Logf("no python3: the pytrain workload is not drawn")
	}
	if cc, err := exec.LookPath("mpicc.mpich"); err == nil {
		b.MPI = filepath.Join(dir, "mpisteps")
		if out, err := exec.Command(cc, "-O1", "-o", b.MPI, "testdata/mpisteps.c").CombinedOutput(); err != nil {
			t.Fatalf("mpicc.mpich testdata/mpisteps.c: %v\n%s", err, out)
		}
	} else {
		t.Logf("no mpicc.mpich (apt-get install mpich libmpich-dev): the MPICH workload is not drawn")
	}
	return b
}

// commitSeed is the default seed: the first 16 hex digits of HEAD's
// commit, so that CI's short mode draws the same runs for the same
// commit (a failure there replays); 1 outside a git checkout. Inside
// one (the module's root has .git), git failing (say, "dubious
// ownership" for root in a checkout of another user) fails the test:
// seed 1 for every commit would test the same runs forever.
func commitSeed(t *testing.T) uint64 {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil || len(out) < 16 {
		if _, serr := os.Stat("../../.git"); serr == nil {
			msg := ""
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				msg = strings.TrimSpace(string(ee.Stderr))
			}
			t.Fatalf("chaos: git rev-parse HEAD in a git checkout: %v (%s, output %q): set %s", err, msg, out, envSeed)
		}
		t.Logf("chaos: no git checkout (%v): seed 1", err)
		return 1
	}
	n, err := strconv.ParseUint(string(out[:16]), 16, 64)
	if err != nil {
		t.Fatalf("chaos: git rev-parse HEAD gave %q: %v", out, err)
	}
	return n
}

// envInt reads an integer knob, def when unset.
func envInt(t *testing.T, name string, def uint64) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

// TestChaos runs the chaos suite: GORUN_CHAOS_RUNS runs (3 by default)
// of seed GORUN_CHAOS_SEED (by default derived from the commit), or only
// the runs GORUN_CHAOS_ONLY names, and fails for every run that broke a
// rule, printing the line that replays it, and when no run's fault was
// injected and landed (it tested nothing).
func TestChaos(t *testing.T) {
	if raceEnabled {
		t.Skip("chaos: not under -race (its binaries are built without it: the plain run covers it)")
	}
	if testing.Short() && os.Getenv("GORUN_TESTCLUSTER_REQUIRE") != "1" {
		t.Skip("chaos: namespace jobs; not with -short (unless GORUN_TESTCLUSTER_REQUIRE=1)")
	}
	hosts := testcluster.NetnsHosts(t, MaxHosts) // skips without root and ip netns, unless GORUN_TESTCLUSTER_REQUIRE=1
	start := time.Now()
	seed := envInt(t, envSeed, 0)
	if os.Getenv(envSeed) == "" {
		seed = commitSeed(t)
	}
	runs := int(envInt(t, envRuns, shortRuns))
	var only []int
	if v := os.Getenv(envOnly); v != "" {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want run indices, comma-separated", envOnly, v)
			}
			only = append(only, n)
		}
	} else {
		for i := range runs {
			only = append(only, i)
		}
	}
	kindsText := os.Getenv(envKinds)
	kinds, err := ParseKinds(kindsText)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("chaos: seed %d, runs %v (replay one: %s)", seed, only, ReplayLine(seed, only[0], kindsText))
	// On standard error as well, at once: t.Logf's lines are lost if the
	// test binary times out.
	fmt.Fprintf(os.Stderr, "chaos: seed %d, runs %v (replay one: %s)\n", seed, only, ReplayLine(seed, only[0], kindsText))
	ctx := t.Context()
	deadline, hasDeadline := t.Deadline()
	if hasDeadline {
		deadline = deadline.Add(-stopMargin)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}

	dir := t.TempDir()
	registry := filepath.Join(dir, "run")
	if err := os.Mkdir(registry, 0o700); err != nil {
		t.Fatal(err)
	}
	s := &Suite{Hosts: hosts, Bins: buildBinaries(t, dir), Dir: dir, Registry: registry,
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)), Kinds: kinds}
	var recs []Run
	var verdicts []Verdict
	for n, i := range only {
		if left := time.Until(deadline); hasDeadline && left < runBudget {
			t.Logf("chaos: %v left before the jobs' deadline (%v before the test's), less than a run may take (%v): runs %v not run", left.Round(time.Second), stopMargin, runBudget, only[n:])
			fmt.Fprintf(os.Stderr, "chaos: runs %v not run: too near the test's deadline\n", only[n:])
			break
		}
		r := s.RunOne(ctx, seed, i)
		v := Judge(r)
		recs, verdicts = append(recs, r), append(verdicts, v)
		fmt.Fprintf(os.Stderr, "chaos: run %d: %s %s\n", i, v.Class, strings.Join(v.Failures, "; "))
		if v.Class == Failed {
			fmt.Fprintf(os.Stderr, "chaos: run %d FAILED, replay: %s\n", i, ReplayLine(seed, i, kindsText))
		}
		t.Logf("run %d: %s | %s | within=%v | exit %d | %s | %.1fs (reference %.1fs) | recovery %s s after detection %s s",
			i, r.Config, r.Fault, r.Within, r.Code, v.Class, r.Seconds, r.ReferenceSeconds, secs(r.DetectToResume), secs(r.FaultToDetect))
		if r.Injected != "" {
			t.Logf("run %d injected: %s", i, r.Injected)
		}
		if r.NotInjected != "" {
			t.Logf("run %d not injected: %s", i, r.NotInjected)
		}
		if r.InjectErr != "" {
			t.Logf("run %d: injecting failed: %s", i, r.InjectErr)
		}
		if r.Skipped != "" {
			t.Logf("run %d skipped: %s", i, r.Skipped)
		}
		if os.Getenv(envVerbose) == "1" {
			t.Logf("run %d stderr:\n%s", i, r.Stderr)
		}
		if r.Reported != "" {
			t.Logf("run %d reported: %s", i, r.Reported)
		}
		for _, l := range r.Leaks {
			t.Logf("run %d leak: %s", i, l)
		}
		for _, c := range r.Cleaned {
			t.Logf("run %d: gorun clean %s", i, c)
		}
		if v.Class == KnownDefect {
			t.Logf("run %d shows a known defect (not counted as a failure): %s\n  replay: %s", i, strings.Join(v.Failures, "; "), ReplayLine(seed, i, kindsText))
		}
		if v.Class == Failed {
			t.Errorf("run %d broke %d rules:\n  %s\n  config: %s\n  fault: %s (%s)\n  promise: %s\n  gorun: %s\n  stderr:\n%s\n  replay: %s",
				i, len(v.Failures), strings.Join(v.Failures, "\n  "), r.Config, r.Fault, r.Injected, r.Promise, r.Config.flagsText(), r.StderrTail, ReplayLine(seed, i, kindsText))
			if r.Dump != "" {
				t.Logf("run %d: the launcher's goroutine dump (SIGQUIT):\n%s", i, r.Dump)
			}
		}
	}
	sum := Summarize(seed, kindsText, recs, verdicts, time.Since(start))
	var b bytes.Buffer
	sum.WriteTable(&b)
	t.Logf("\n%s", b.String())
	if len(recs) == 0 {
		t.Errorf("chaos: no run was started before the test's deadline: the suite tested nothing")
	}
	if sum.Total.Injected == 0 && sum.Total.Skipped < len(recs) {
		t.Errorf("chaos: no run's fault was injected and landed (%d runs): the suite tested nothing", len(recs))
	}
	if path := os.Getenv(envJSON); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := sum.WriteJSON(f); err != nil {
			t.Error(err)
		}
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
}
