package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/testcluster"
)

// End-to-end tests of host replacement (issue 14): a job of examples/dptrain
// on namespace hosts loses a host (every process killed, its link taken
// down, frozen and then killed, or a rank stopped) at a random step; gorun fences the host, splices
// a spare in, publishes the next epoch and restores the lost ranks' state
// from their replicas. The job must end as a run without the failure ends:
// exit 0 and bitwise the same final hashes.

func TestHotSwapHostLoss(t *testing.T) {
	c := newHSCluster(t, 4, 1)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	for _, dg := range []bool{false, true} {
		var extra []string
		if dg {
			extra = []string{"--device-grad"}
		}
		wantP, wantO := hsReference(t, c, extra...)
		for _, mode := range []string{"restart", "in-place"} {
			for _, f := range faults {
				t.Run(fmt.Sprintf("%s/%s/device-grad=%v", mode, f.name, dg), func(t *testing.T) {
					hostLoss(t, c, rng, mode, f, nil, extra, wantP, wantO)
				})
			}
		}
	}
}

// TestHotSwapDiffMode loses a host (killed, or frozen first so that the
// loss lands on survivors waiting for it) under --protect-mode diff, in
// both recovery modes: the lost ranks' state is rebuilt on the spare from
// their holders' bases and differentials, and the job ends with the
// hashes of a run without failure.
func TestHotSwapDiffMode(t *testing.T) {
	c := newHSCluster(t, 4, 1)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	extra := []string{"--device-grad"}
	wantP, wantO := hsReference(t, c, extra...)
	diff := []string{"--protect-mode", "diff", "--base-every", "6", "--diff-fold", "4"}
	for _, mode := range []string{"restart", "in-place"} {
		for _, f := range faults {
			if f.name != "kill" && f.name != "freeze" {
				continue
			}
			t.Run(mode+"/"+f.name, func(t *testing.T) {
				hostLoss(t, c, rng, mode, f, diff, extra, wantP, wantO)
			})
		}
	}
}

// hostLoss runs one case of the host-loss matrix: the job with
// --recovery mode and flags, dptrain with --protect and args; fault f on
// a random working host after a random step; then checks the hashes
// (wantP, wantO), the steps run again, the recovery timeline and the
// splice.
func hostLoss(t *testing.T, c *hsCluster, rng *rand.Rand, mode string, f fault, flags, args []string, wantP, wantO string) {
	dg := slices.Contains(args, "--device-grad")
	h := rng.IntN(c.work)
	step := 5 + rng.IntN(hsSteps-15)
	t.Logf("%s on host %d (%s) after step %d", f.name, h, c.hosts.Names[h], step)
	flags = append(append([]string{"--recovery", mode, "--max-restarts", "2"}, f.flags...), flags...)
	r := c.start(t, flags, append([]string{"--protect"}, args...)...)
	r.waitStep(t, step)
	killAt := time.Since(r.start).Seconds()
	f.inject(t, c, r, h)
	res := r.finish(t, 0)
	defer func() {
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		}
	}()
	checkHashes(t, res, wantP, wantO)
	if f.name == "freeze" && mode == "in-place" && dg && !strings.Contains(res.stderr, "to be recoverable everywhere") {
		// With --device-grad the survivors wait for the
		// frozen host's replicas at the overwrite rule.
		t.Errorf("no survivor says it waited at the overwrite rule when the epoch changed")
	}
	// Rank 0 logs step s once its own update is done, before
	// every rank committed s: the step in flight, and G's lag
	// of at most one step behind the committed ones (the
	// overwrite rule), may be run again; nothing older.
	if n := reexecuted(res.stdout); n > 2 {
		t.Errorf("%d steps executed again, want at most 2 (the step in flight and G's lag)", n)
	}
	evs := readEvents(t, r.events)
	tl := ofKind[events.Timeline](evs)
	if len(tl) == 0 || tl[len(tl)-1].Resumed == nil {
		t.Fatalf("no recovery timeline that resumed: %+v", evs)
	}
	last := tl[len(tl)-1]
	t.Logf("recovery: detected %.3fs after the fault, published %+.3fs, resumed %+.3fs after detection; %d steps run again; %s",
		*last.Detected-killAt, *last.Published-*last.Detected, *last.Resumed-*last.Detected, reexecuted(res.stdout), last.Cause)
	sp := ofKind[events.Splice](evs)
	if f.host {
		if len(sp) != 1 || !sp[0].Spare || sp[0].With != c.hosts.Names[c.work] || sp[0].Lost != c.hosts.Names[h] {
			t.Errorf("splices %+v, want one of host %s with the spare %s", sp, c.hosts.Names[h], c.hosts.Names[c.work])
		}
		if mode == "in-place" && len(ofKind[events.Restart](evs)) > 0 {
			t.Errorf("in-place recovery restarted the ranks: %+v", ofKind[events.Restart](evs))
		}
	}
}

// TestHotSwapTwoLosses loses two hosts one after the other, with two
// spares: both are used, and the job ends as one without failures.
func TestHotSwapTwoLosses(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	wantP, wantO := hsReference(t, c)
	for _, mode := range []string{"restart", "in-place"} {
		t.Run(mode, func(t *testing.T) {
			r := c.start(t, []string{"--recovery", mode}, "--protect")
			r.waitStep(t, 8)
			if err := c.hosts.KillAll(1); err != nil {
				t.Fatal(err)
			}
			// The second loss once the first recovery is over and the
			// replicas the lost host held are in place again.
			waitEvents(t, r, func(evs []events.Record) bool {
				return len(ofKind[events.Timeline](evs)) == 1 && len(ofKind[events.Protected](evs)) >= 1
			})
			if err := c.hosts.KillAll(2); err != nil {
				t.Fatal(err)
			}
			res := r.finish(t, 0)
			checkHashes(t, res, wantP, wantO)
			sp := ofKind[events.Splice](readEvents(t, r.events))
			var with []string
			for _, s := range sp {
				with = append(with, s.With)
			}
			slices.Sort(with)
			if want := c.hosts.Names[4:6]; !slices.Equal(with, want) {
				t.Errorf("spliced in %v, want both spares %v", with, want)
			}
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
			}
		})
	}
}

// waitEvents polls r's events file until ok says it holds what the test
// waits for.
func waitEvents(t *testing.T, r *hsRun, ok func([]events.Record) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(r.events); err == nil && len(b) > 0 && b[len(b)-1] == '\n' && ok(readEvents(t, r.events)) {
			return
		}
		select {
		case <-r.done:
			t.Fatalf("gorun exited (code %d) before the events awaited\nstderr:\n%s", r.res.code, r.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(r.events)
	t.Fatalf("the events awaited did not come within 60s; events:\n%s\nstderr:\n%s", b, r.stderr.String())
}

// TestHotSwapFailureDuringRecovery loses a second host while the first
// loss is being recovered: the next epoch starts after it, and the job
// ends as one without failures.
func TestHotSwapFailureDuringRecovery(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	wantP, wantO := hsReference(t, c)
	for _, mode := range []string{"restart", "in-place"} {
		t.Run(mode, func(t *testing.T) {
			r := c.start(t, []string{"--recovery", mode}, "--protect")
			r.waitStep(t, 8)
			if err := c.hosts.KillAll(1); err != nil {
				t.Fatal(err)
			}
			// As soon as the first recovery epoch is published, before it
			// resumed. Host 3's ranks hold no replica of host 1's, nor
			// host 1 of theirs (ring holders: the next host).
			waitEvents(t, r, func(evs []events.Record) bool { return len(ofKind[events.Publish](evs)) >= 1 })
			if err := c.hosts.KillAll(3); err != nil {
				t.Fatal(err)
			}
			res := r.finish(t, 0)
			checkHashes(t, res, wantP, wantO)
			evs := readEvents(t, r.events)
			if n := len(ofKind[events.Splice](evs)); n != 2 {
				t.Errorf("%d splices, want 2: %+v", n, evs)
			}
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
			}
		})
	}
}

// TestHotSwapNoSpare loses a host when no spare is left: with
// --on-no-spare free-slots a surviving host with free slots takes its
// ranks; with abort the job stops with a report. Host 0 has 4 slots, the
// others 2; ranks go round-robin (2 per host), so host 0 has room for the
// 2 ranks of a lost host.
func TestHotSwapNoSpare(t *testing.T) {
	h := testcluster.NetnsHosts(t, 4)
	hf := filepath.Join(t.TempDir(), "hostfile")
	lines := fmt.Sprintf("%s slots=4\n%s slots=2\n%s slots=2\n%s slots=2\n", h.Names[0], h.Names[1], h.Names[2], h.Names[3])
	if err := os.WriteFile(hf, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, flags ...string) *hsRun {
		ev := filepath.Join(t.TempDir(), "events.jsonl")
		full := []string{"-np", "8", "--hostfile", hf, "--map-by", "node", "--rsh", "ip netns exec", "--bind", h.BridgeAddr,
			"-v", "--events", ev, "--kill-grace", "2"}
		full = append(full, flags...)
		full = append(full, "--", "sh", "-c", printJobID, dptrainBin(t))
		full = append(full, hsArgs...)
		return &hsRun{job: startProtectedJob(t, append(full, "--protect")...), events: ev}
	}
	ref := start(t)
	wantP, wantO := dptrainHashes(t, ref.finish(t, 0))

	t.Run("free-slots", func(t *testing.T) {
		r := start(t, "--on-no-spare", "free-slots")
		r.waitStep(t, 10)
		if err := h.KillAll(2); err != nil {
			t.Fatal(err)
		}
		res := r.finish(t, 0)
		checkHashes(t, res, wantP, wantO)
		sp := ofKind[events.Splice](readEvents(t, r.events))
		if len(sp) == 0 {
			t.Fatalf("no splice\nstderr:\n%s", res.stderr)
		}
		for _, s := range sp {
			if s.Spare || s.Lost != h.Names[2] || s.With != h.Names[0] {
				t.Errorf("splice %+v, want host %s's ranks moved to the free slots of host %s", s, h.Names[2], h.Names[0])
			}
		}
	})
	t.Run("abort", func(t *testing.T) {
		r := start(t, "--on-no-spare", "abort")
		r.waitStep(t, 10)
		if err := h.KillAll(2); err != nil {
			t.Fatal(err)
		}
		res := r.finish(t, -1)
		if res.code == 0 {
			t.Fatalf("exit 0 though a host was lost with no spare and --on-no-spare abort\nstderr:\n%s", res.stderr)
		}
		if !strings.Contains(res.stderr, h.Names[2]) || !strings.Contains(res.stderr, "spare") {
			t.Errorf("the report does not name the lost host %s and the missing spare\nstderr:\n%s", h.Names[2], res.stderr)
		}
	})
}

// TestHotSwapCrashLoop runs a rank that fails at once every time it
// starts: the job stops with a report naming it instead of restarting it
// for ever.
func TestHotSwapCrashLoop(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	const crash = `echo "job $GORUN_JOB_ID"; if [ "$GORUN_RANK" = 3 ]; then echo "rank 3 cannot start" >&2; exit 3; fi; exec "$0" "$@"`
	full := []string{"-np", "4", "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr,
		"--max-restarts", "5", "--", "sh", "-c", crash, dptrainBin(t)}
	j := startProtectedJob(t, append(full, append(hsArgs, "--protect")...)...)
	res := j.wait(120 * time.Second)
	if res.code != 3 {
		t.Fatalf("exit %d, want 3 (rank 3's status)\nstderr:\n%s", res.code, res.stderr)
	}
	if !regexp.MustCompile(`rank 3 on host \S+ .*exit(ed)? (with )?(status|code) 3`).MatchString(res.stderr) {
		t.Errorf("the report does not name rank 3 and its status\nstderr:\n%s", res.stderr)
	}
	if !strings.Contains(res.stderr, "stopping the job rather than restarting it in a loop") {
		t.Errorf("the report does not say the job stopped a crash loop\nstderr:\n%s", res.stderr)
	}
	// Its peers fail with it, and which is reported first varies: the
	// loop is caught once the same rank failed twice in a row, or the job
	// failed hotswap.CrashLoopFailures times, without progress.
	if n := strings.Count(res.stderr, "restarting every rank"); n > hotswap.CrashLoopFailures-1 {
		t.Errorf("restarted %d times a rank that fails at once every time", n)
	}
	checkJobCleanedUp(t, j)
}

// TestHotSwapPython loses the host of rank 0 of examples/pytrain (its
// state protected through the Python client): with --recovery restart the
// spare takes the ranks and the final hash is that of a run without a
// failure.
func TestHotSwapPython(t *testing.T) {
	python, script := pytrain(t)
	c := newHSCluster(t, 2, 1)
	run := func(t *testing.T, kill bool) string {
		ev := filepath.Join(t.TempDir(), "events.jsonl")
		full := []string{"-np", "4", "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr,
			"-v", "--events", ev, "--recovery", "restart", "--kill-grace", "2",
			"--", "sh", "-c", printJobID, python, script, "--steps", "400", "--seed", "3", "--protect"}
		r := &hsRun{job: startProtectedJob(t, full...), events: ev}
		if kill {
			r.waitFor(regexp.MustCompile(`(?m)^\[0\] step 99 `), 1, 60*time.Second)
			if err := c.hosts.KillAll(0); err != nil {
				t.Fatal(err)
			}
		}
		res := r.finish(t, 0)
		m := pytrainHashRE.FindStringSubmatch(res.stdout)
		if m == nil {
			t.Fatalf("no final hash\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		}
		if kill {
			if sp := ofKind[events.Splice](readEvents(t, r.events)); len(sp) != 1 || sp[0].With != c.hosts.Names[2] {
				t.Errorf("splices %+v, want one with the spare %s", sp, c.hosts.Names[2])
			}
		}
		return m[1]
	}
	want := run(t, false)
	if got := run(t, true); got != want {
		t.Errorf("final hash %s after losing rank 0's host, %s without", got, want)
	}
}

// TestHotSwapStdin: the rank that reads gorun's stdin (rank 0) is on the
// lost host; its replacement on the spare reads on: a line sent after the
// loss reaches it, and a stdin that ended before the loss is at its end
// for the replacement too (rather than leaving it waiting for input).
func TestHotSwapStdin(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	// Rank 0 echoes its stdin, says when it ends, then waits for the file
	// named go; the other ranks end at once.
	const reader = `echo "job $GORUN_JOB_ID"
if [ "$GORUN_RANK" = 0 ]; then
	while read l; do echo "got $l"; done
	echo "stdin ended"
	while [ ! -e "$1/go" ]; do sleep 0.05; done
fi`
	for _, tc := range []struct {
		name      string
		eofBefore bool // stdin ends before the loss
		stream    bool // lines keep coming through the loss
	}{{"line after the loss", false, false}, {"end of stdin before the loss", true, false}, {"lines through the loss", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pr, pw := io.Pipe()
			defer pw.Close()
			ev := filepath.Join(t.TempDir(), "events.jsonl")
			j := startJobWithStdin(t, pr, "", nil, "-np", "4", "--hostfile", c.hostfile, "--spares", "1",
				"--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr, "--events", ev, "--kill-grace", "2",
				"--", "sh", "-c", reader, "reader", dir)
			r := &hsRun{job: j, events: ev}
			if _, err := io.WriteString(pw, "one\n"); err != nil {
				t.Fatal(err)
			}
			r.waitFor(regexp.MustCompile(`(?m)^\[0\] got one$`), 1, time.Minute)
			if tc.eofBefore {
				pw.Close()
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 1, time.Minute)
			}
			var streamed sync.WaitGroup
			stop := make(chan struct{})
			if tc.stream {
				// Lines go on while the host dies: the chunk in flight
				// goes to the replacement once it has started.
				streamed.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := fmt.Fprintf(pw, "s%d\n", i); err != nil {
							return
						}
					}
				})
			}
			if err := c.hosts.KillAll(0); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.stream:
				// The replacement (its job line is rank 0's second)
				// reads lines that were sent after it started.
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] job \S+$`), 2, time.Minute)
				after := strings.LastIndex(r.stdout.String(), "[0] job ")
				deadline := time.Now().Add(time.Minute)
				for !regexp.MustCompile(`(?m)^\[0\] got s\d+$`).MatchString(r.stdout.String()[after:]) {
					if time.Now().After(deadline) {
						t.Fatalf("the replacement of rank 0 read no line within a minute\nstdout:\n%s\nstderr:\n%s", r.stdout.String(), r.stderr.String())
					}
					time.Sleep(10 * time.Millisecond)
				}
				close(stop)
				pw.Close()
				streamed.Wait()
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 1, time.Minute)
			case tc.eofBefore:
				// The replacement sees the end at once.
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 2, time.Minute)
			default:
				if _, err := io.WriteString(pw, "two\n"); err != nil {
					t.Fatal(err)
				}
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] got two$`), 1, time.Minute)
				pw.Close()
				r.waitFor(regexp.MustCompile(`(?m)^\[0\] stdin ended$`), 1, time.Minute)
			}
			if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			res := r.finish(t, 0)
			if strings.Contains(res.stderr, "under-protected") {
				t.Errorf("a job that protects no state reported itself under-protected\nstderr:\n%s", res.stderr)
			}
			if sp := ofKind[events.Splice](readEvents(t, ev)); len(sp) != 1 || sp[0].Lost != c.hosts.Names[0] || !slices.Contains(sp[0].Ranks, 0) {
				t.Errorf("splices %+v, want rank 0's host %s replaced\nstderr:\n%s", sp, c.hosts.Names[0], res.stderr)
			}
		})
	}
}
