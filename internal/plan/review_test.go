package plan

import (
	"testing"

	"github.com/gorun/gorun/topology"
)

// Host replacement's E[C] and η with spares running out count the
// failures that fall back to checkpoint-restart, as its expected lost
// time does (review finding 6: 1000 hosts, 8 spares, 8.45 of 16.4
// failures fall back).
func TestPlanBlendedCost(t *testing.T) {
	in := baseInputs()
	in.Hosts, in.RanksPerHost, in.StateBytes = 1000, 1, 10<<30
	in.MTTFHost, in.JobLength, in.Step = 5*365*24*3600, 30*24*3600, 20
	for _, spares := range []int{0, 8, 1000} {
		in.Spares = spares
		res, err := Plan(in, nil, 100, 1, 0.01)
		if err != nil {
			t.Fatal(err)
		}
		hr := res.HostReplace
		mu := res.Failures
		near(t, "blended E[C] × failures = expected lost", hr.CostBlended*mu, hr.ExpectedLost, 1e-9)
		near(t, "blended η", hr.EfficiencyBlended, Efficiency(res.MTTFSys, hr.CostBlended), 1e-12)
		if spares < 100 && !(hr.EfficiencyBlended < hr.Efficiency) {
			t.Errorf("%d spares: blended η %v not below η %v with spares running out", spares, hr.EfficiencyBlended, hr.Efficiency)
		}
		if spares == 0 {
			// every failure pays checkpoint-restart's recovery
			near(t, "0 spares", hr.CostBlended, hr.Cost.Overhead+res.Checkpoint.CostTotal-res.Checkpoint.Cost.Overhead, 1e-9)
		}
	}
}

// The loss bound's window is what a lost host stays exposed for:
// max(step, replace + restore) (review finding 9); replicas:1's bound
// over the job scales with it.
func TestLossWindow(t *testing.T) {
	in := baseInputs() // replace 20 s, 4 GiB per host over 1.25 GB/s: 3.4 s; step 2 s
	w := in.Replace + RestoreTime(in)
	perWindow, units, window := LossBound(in)
	near(t, "window", window, w, 1e-12)
	p := FailureProb(w, in.MTTFHost)
	near(t, "replicas:1 per window", perWindow, float64(units)*p*p, 1e-12)
	long := in
	long.Replace = 10 * in.Replace
	res1, _ := Plan(in, nil, 10, 1, 0.01)
	res2, _ := Plan(long, nil, 10, 1, 0.01)
	ratio := res2.LossPerJob / res1.LossPerJob
	wantRatio := (long.Replace + RestoreTime(long)) / w
	near(t, "per-job bound grows with the window", ratio, wantRatio, 0.01)

	fast := in
	fast.Replace, fast.NetBW = 0, 1e15
	if _, _, window := LossBound(fast); window != fast.Step {
		t.Errorf("window %v, want the step %v when recovery is quicker", window, fast.Step)
	}
}

// When T_w > N·K·t the Monte Carlo and the closed form agree: a failure
// loses K·t/2 + N·K·t (WriteLag), the newest checkpoint being durable at
// most N·K·t of training after it started since training stalls for it
// (review finding 7).
func TestSimulateStallRegime(t *testing.T) {
	in := baseInputs()
	in.Spares = 0
	in.Redundancy = topology.Redundancy{}
	in.DurableBW = 2e6 // T_w = 4 GiB / 2 MB/s ≈ 2147 s > N·K·t = 200 s
	if tw := in.WriteTime(); !(tw > float64(in.Concurrency*in.Interval)*in.Step) {
		t.Fatalf("T_w %v not beyond N·K·t", tw)
	}
	mc, err := Simulate(in, nil, 4000, 1)
	if err != nil {
		t.Fatal(err)
	}
	// the stalls, the same in both, would hide a per-failure difference
	c := CkptCost(in)
	stalls := c.Overhead / in.MTTFSys() * in.JobLength
	near(t, "checkpoint-restart mean less the stalls", mc.Ckpt.Mean-stalls, ExpectedLost(in.JobLength, in.MTTFSys(), c.Total()-c.Overhead), 0.03)
}
