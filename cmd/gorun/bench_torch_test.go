package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
)

// TestBenchTorch is `make bench-torch` (issue 18's benchmark; it runs only
// with GORUN_BENCH_TORCH=1, a few minutes, root and ip netns):
// examples/torch/train.py, 4 ranks on 2 namespace hosts plus a spare, a
// model whose parameters and AdamW state are tens of MB per rank. In one
// run it prints
//
//   - the mean step time of the protected script (--protect) beside the
//     plain one, same world and hosts, and their ratio;
//   - the time from a host loss (the host of ranks 0 and 1 killed after
//     rank 0 reported step killAfter) to the first step after resume under
//     gorun (--recovery restart, the spare takes the ranks, the state comes
//     from gorun's memory), beside the standard practice: the plain script
//     writing a torch.save checkpoint every 10 steps, rank 0's process
//     SIGKILLed after the same step (its host is not lost: nothing to
//     detect, no spare to move to, which favours this baseline; the
//     printed label says so), the job restarted as `torchrun
//     --max-restarts 1` would (gorun --max-restarts 1), every rank
//     reloading the checkpoint and training the lost steps again.
//
// Both recoveries are measured the same way: from the kill until rank 0
// reports (--report-steps) the step after the last one it had completed
// before the kill, so replayed work counts.
func TestBenchTorch(t *testing.T) {
	if os.Getenv("GORUN_BENCH_TORCH") == "" {
		t.Skip("a benchmark: set GORUN_BENCH_TORCH=1 (make bench-torch)")
	}
	python, script := torchTrain(t)
	const (
		world     = 4
		steps     = 50
		killAfter = 35 // a checkpoint of step 29 exists: 6 steps to replay
		saveEvery = 10
	)
	// Width 1024, 3 blocks: 3.2M parameters, 38 MB of parameters and
	// AdamW state per rank.
	model := []string{"--width", "1024", "--layers", "3", "--steps", strconv.Itoa(steps), "--seed", "9"}
	c := newHSCluster(t, 2, 1)
	run := func(flags []string, args ...string) *hsRun {
		t.Helper()
		ev := filepath.Join(t.TempDir(), "events.jsonl")
		full := []string{"-np", strconv.Itoa(world), "--hostfile", c.hostfile, "--spares", "1", "--rsh", "ip netns exec",
			"--bind", c.hosts.BridgeAddr, "--events", ev, "--kill-grace", "2"}
		full = append(full, flags...)
		full = append(full, "--", "sh", "-c", printJobID, python, script)
		full = append(full, model...)
		return &hsRun{job: startProtectedJob(t, append(full, args...)...), events: ev, limit: 10 * time.Minute}
	}
	meanStep := func(res result) float64 {
		t.Helper()
		m := regexp.MustCompile(`(?m)^\[0\] mean step time (\S+)$`).FindStringSubmatch(res.stdout)
		if m == nil {
			t.Fatalf("no mean step time\nstdout:\n%s", res.stdout)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// (a) Step time, plain and protected, alternating (the box's load
	// drifts): rounds of one run each.
	const rounds = 3
	var want string
	var plain, prot []float64
	for range rounds {
		res := run(nil).finish(t, 0)
		if want == "" {
			want = torchChecksum(t, res)
		} else if got := torchChecksum(t, res); got != want {
			t.Errorf("plain run: checksum %s, the first plain run's %s", got, want)
		}
		plain = append(plain, meanStep(res))
		res = run(nil, "--protect").finish(t, 0)
		if got := torchChecksum(t, res); got != want {
			t.Errorf("protected run: checksum %s, the plain run's %s", got, want)
		}
		prot = append(prot, meanStep(res))
	}

	// (b) Recovery: gorun with a spare, then the checkpoint-restart
	// baseline.
	r := run([]string{"--recovery", "restart"}, "--protect", "--report-steps")
	killed := waitReport(t, r, killAfter, func() error { return c.hosts.KillAll(0) })
	res := r.finish(t, 0)
	hot := torchRecovery(t, res, killed, "gorun")
	phases := "no recovery timeline"
	if tl := ofKind[events.Timeline](readEvents(t, r.events)); len(tl) == 1 {
		killAt := killed.Sub(r.start).Seconds()
		at := func(p *float64) string {
			if p == nil {
				return "-"
			}
			return fmt.Sprintf("%.2fs", *p-killAt)
		}
		e := tl[0]
		phases = fmt.Sprintf("since the kill: detected %s, replaced %s, published %s, restored %s, resumed %s",
			at(e.Detected), at(e.Replaced), at(e.Published), at(e.Restored), at(e.Resumed))
	}
	if got := torchChecksum(t, res); got != want {
		t.Errorf("gorun's recovered run: checksum %s, the plain run's %s", got, want)
	}

	dir := t.TempDir()
	r = run([]string{"--max-restarts", "1"}, "--save-every", strconv.Itoa(saveEvery), "--save-dir", dir, "--report-steps")
	killed = waitReport(t, r, killAfter, func() error { return syscall.Kill(rankPid(t, r.mark, 0, "train.py"), syscall.SIGKILL) })
	res = r.finish(t, 0)
	base := torchRecovery(t, res, killed, dir)
	if got := torchChecksum(t, res); got != want {
		t.Errorf("the checkpoint-restart run: checksum %s, the plain run's %s", got, want)
	}

	fmt.Printf("train.py --width 1024 --layers 3 (3.2M parameters, 38 MB of parameters and AdamW state per rank), %d ranks on 2 namespace hosts + 1 spare, %d steps\n", world, steps)
	fmt.Printf("(a) mean step time (rank 0, steps 3 on), plain and protected (--protect, every step) alternating:\n")
	var sp, sq float64
	for i := range rounds {
		fmt.Printf("    round %d: plain %.1f ms, protected %.1f ms: ratio %.3f\n", i+1, plain[i]*1e3, prot[i]*1e3, prot[i]/plain[i])
		sp, sq = sp+plain[i], sq+prot[i]
	}
	fmt.Printf("    mean: plain %.1f ms, protected %.1f ms: ratio %.3f\n", sp/rounds*1e3, sq/rounds*1e3, sq/sp)
	fmt.Printf("(b) a loss after step %d to the first new step after resume (rank 0's report):\n", killAfter)
	fmt.Printf("    gorun, host of ranks 0 and 1 killed, spare host, state from memory (--recovery restart): %6.2f s  (%s)\n", hot.took.Seconds(), hot)
	fmt.Printf("      gorun's timeline (--events), %s\n", phases)
	fmt.Printf("    torchrun-style restart, torch.save every %d steps (--max-restarts 1), only rank 0's process SIGKILLed (no host lost: no detection, no spare; favours this baseline): %6.2f s  (%s)\n", saveEvery, base.took.Seconds(), base)
	fmt.Printf("    ratio (checkpoint-restart / gorun): %.2f\n", base.took.Seconds()/hot.took.Seconds())
}

// torchReportRE matches rank 0's --report-steps line.
var torchReportRE = regexp.MustCompile(`^\[0\] step (\d+) done (\d+\.\d+)$`)

// waitReport waits until rank 0 reports step s done, then calls kill and
// returns when it did so.
func waitReport(t *testing.T, r *hsRun, s int, kill func() error) time.Time {
	t.Helper()
	r.waitFor(regexp.MustCompile(`(?m)^\[0\] step `+strconv.Itoa(s)+` done `), 1, 5*time.Minute)
	at := time.Now()
	if err := kill(); err != nil {
		t.Fatal(err)
	}
	return at
}

// torchRec is one recovery measured from rank 0's reports.
type torchRec struct {
	last, resumedAt, first int // last step done before the kill, step resumed at, first step reported ≥ last+1 after it
	took                   time.Duration
}

func (r torchRec) String() string {
	return fmt.Sprintf("last step done before the kill %d, resumed at step %d, step %d reported", r.last, r.resumedAt, r.first)
}

// torchRecovery reads rank 0's reports in stdout: the last step done
// before killed, then, after rank 0's line saying it resumed from from,
// the first step after that one; it returns the time between killed and
// that step's report.
func torchRecovery(t *testing.T, res result, killed time.Time, from string) torchRec {
	t.Helper()
	kt := float64(killed.UnixNano()) / 1e9
	rec := torchRec{last: -1, resumedAt: -1, first: -1}
	resumed := "[0] rank 0: resumed at step "
	after := false
	for line := range strings.SplitSeq(res.stdout, "\n") {
		if s, ok := strings.CutPrefix(line, resumed); ok {
			n, rest, _ := strings.Cut(s, " ")
			if rest != "from "+from {
				t.Fatalf("rank 0 resumed %q, want from %s", s, from)
			}
			rec.resumedAt, _ = strconv.Atoi(n)
			after = true
			continue
		}
		m := torchReportRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		step, _ := strconv.Atoi(m[1])
		at, _ := strconv.ParseFloat(m[2], 64)
		switch {
		case !after && at < kt:
			rec.last = max(rec.last, step)
		case after && step > rec.last:
			rec.first = step
			rec.took = time.Duration((at - kt) * 1e9)
			return rec
		}
	}
	t.Fatalf("no step after %d reported after a resume from %s\nstdout:\n%s", rec.last, from, res.stdout)
	return rec
}
