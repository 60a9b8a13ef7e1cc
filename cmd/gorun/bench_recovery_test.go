package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/events"
)

// TestBenchRecovery is `make bench-recovery` (issue 14's benchmark; it runs
// only with GORUN_BENCH_RECOVERY=1, for some minutes): examples/dptrain, 8
// ranks on 4 namespace hosts plus a spare, 64 MiB of optimizer state per
// rank, steps of 500 ms of emulated accelerator time; one host is killed
// at a uniformly random step. It prints the recovery's phases from the
// --events timeline and the time the failure cost the job, beside the
// baseline a torchrun user has, measured in the same run: the job ends, is
// started again and reloads every rank's state from a checkpoint file
// written every 100 steps, replaying the steps since. Both are reported as
// time lost per failure as DEADPOOL's disruption model counts it (restart
// + replay): the wall time of the run with the failure minus that of the
// same run without one.
func TestBenchRecovery(t *testing.T) {
	if os.Getenv("GORUN_BENCH_RECOVERY") == "" {
		t.Skip("a benchmark: set GORUN_BENCH_RECOVERY=1 (make bench-recovery)")
	}
	const (
		steps     = 200
		ckptEvery = 100
		deviceMs  = 500
	)
	// 64 MiB of optimizer state per rank: m, v and master weights (12
	// bytes per parameter) of an eighth of the parameters.
	params := 8 * (64 << 20) / 12
	args := []string{"--params", strconv.Itoa(params), "--steps", strconv.Itoa(steps), "--seed", "11",
		"--device-grad", "--device-ms", strconv.Itoa(deviceMs), "--log-every", "1"}
	c := newHSCluster(t, 4, 1)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	failAt := 1 + rng.IntN(steps-2)
	t.Logf("seed %d: the failure after step %d", seed, failAt)

	run := func(flags []string, args []string) (*hsRun, time.Time) {
		ev := filepath.Join(t.TempDir(), "events.jsonl")
		full := []string{"-np", "8", "--hostfile", c.hostfile, "--rsh", "ip netns exec", "--bind", c.hosts.BridgeAddr, "--events", ev}
		full = append(full, flags...)
		full = append(full, "--", "sh", "-c", printJobID, dptrainBin(t))
		return &hsRun{job: startProtectedJob(t, append(full, args...)...), events: ev, limit: 15 * time.Minute}, time.Now()
	}

	// Failure-free, protected, with the spare idle: the reference time.
	r, t0 := run([]string{"--spares", "1"}, append(args, "--protect"))
	res := r.finish(t, 0)
	free := time.Since(t0)
	wantP, wantO := dptrainHashes(t, res)

	// gorun: the host of ranks 2 and 3 killed after step failAt.
	r, t0 = run([]string{"--spares", "1", "--recovery", "in-place"}, append(args, "--protect"))
	r.waitFor(stepLine(failAt), 1, 10*time.Minute)
	kill := time.Now()
	if err := c.hosts.KillAll(1); err != nil {
		t.Fatal(err)
	}
	killAt := kill.Sub(r.start).Seconds()
	res = r.finish(t, 0)
	hot := time.Since(t0)
	if p, o := dptrainHashes(t, res); p != wantP || o != wantO {
		t.Errorf("the recovered run ended with other hashes than the run without a failure")
	}
	tl := ofKind[events.Timeline](readEvents(t, r.events))
	if len(tl) != 1 || tl[0].Resumed == nil {
		t.Fatalf("no recovery timeline that resumed\nstderr:\n%s", res.stderr)
	}
	e := tl[0]
	again := reexecuted(res.stdout)
	at := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.3fs", *p-killAt)
	}

	// The baseline: the job (unprotected, checkpointing to files every
	// ckptEvery steps) ends when the host is lost, and is started again.
	dir := t.TempDir()
	ckpt := append(args, "--ckpt-dir", dir, "--ckpt-every", strconv.Itoa(ckptEvery))
	r, t0 = run(nil, ckpt)
	r.waitFor(stepLine(failAt), 1, 10*time.Minute)
	kill = time.Now()
	if err := c.hosts.KillAll(1); err != nil {
		t.Fatal(err)
	}
	r.finish(t, -1)
	r, _ = run(nil, ckpt)
	// The restart's cost: from the kill to the restarted job's first
	// step, less that step.
	first := (failAt + 1) / ckptEvery * ckptEvery
	r.waitFor(stepLine(first), 1, 10*time.Minute)
	stepTime := free.Seconds() / steps
	restart := time.Since(kill).Seconds() - stepTime
	res = r.finish(t, 0)
	base := time.Since(t0)
	if p, o := dptrainHashes(t, res); p != wantP || o != wantO {
		t.Errorf("the run restarted from its checkpoint ended with other hashes than the run without a failure")
	}
	replayed := failAt + 1 - (failAt+1)/ckptEvery*ckptEvery

	// Time lost per failure as DEADPOOL counts it (restart + replay): the
	// run time beyond the failure-free run's. For gorun that difference
	// is within the noise of a shared machine, so the figure taken is the
	// larger of it and the time from the kill to the first step after the
	// resume (which includes the steps run again).
	lostHot, lostBase := (hot - free).Seconds(), (base - free).Seconds()
	resumed := *e.Resumed - killAt
	lost := max(lostHot, resumed)
	fmt.Printf("bench-recovery: 8 ranks on 4 hosts + 1 spare, 64 MiB optimizer state per rank, %d ms steps, host killed after step %d\n", deviceMs, failAt)
	fmt.Printf("  gorun (in-place, spare spliced in), since the kill: detected %s, classified %s, replaced %s, published %s, restored %s, resumed %s; steps re-executed %d\n",
		at(e.Detected), at(e.Classified), at(e.Replaced), at(e.Published), at(e.Restored), at(e.Resumed), again)
	fmt.Printf("  time lost per failure: gorun %.2fs (run time beyond the failure-free run %.2fs, kill to resumed %.2fs), checkpoint-restart baseline %.2fs (%d steps replayed from the checkpoint of every %d): %.1fx less\n",
		lost, lostHot, resumed, lostBase, replayed, ckptEvery, lostBase/max(lost, 0.001))
	fmt.Printf("  run times: without a failure %.2fs, gorun %.2fs, baseline %.2fs\n", free.Seconds(), hot.Seconds(), base.Seconds())
	// One failure at a random step is one sample of the baseline's replay;
	// over a uniformly random failure step it replays ckptEvery/2 steps
	// on average. gorun's loss does not depend on the step.
	expBase := restart + float64(ckptEvery)/2*stepTime
	fmt.Printf("  expected over a uniformly random failure step: baseline %.2fs (restart and reload %.2fs + %d steps of %.3fs replayed), gorun %.2fs: %.1fx less\n",
		expBase, restart, ckptEvery/2, stepTime, lost, expBase/max(lost, 0.001))
}
