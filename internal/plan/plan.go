package plan

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/topology"
)

// Strategy is one way of surviving failures, as a plan reports it.
type Strategy struct {
	Name       string  `json:"name"`
	Cost       Cost    `json:"cost_per_failure"`
	CostTotal  float64 `json:"cost_per_failure_s"`
	Efficiency float64 `json:"efficiency"`
	// CostBlended and EfficiencyBlended count the failures that find no
	// spare at checkpoint-restart's price (host replacement; the same as
	// CostTotal and Efficiency for checkpoint-restart): ExpectedLost is
	// CostBlended times the expected failures.
	CostBlended       float64 `json:"cost_per_failure_with_fallback_s"`
	EfficiencyBlended float64 `json:"efficiency_with_fallback"`
	ExpectedLost      float64 `json:"expected_lost_s"`
	// NoSpare is the expected number of failures over the job that find
	// no spare and pay checkpoint-restart instead (host replacement only;
	// ExpectedLost counts them so).
	NoSpare    float64 `json:"expected_failures_without_spare"`
	MonteCarlo Dist    `json:"monte_carlo"`
}

// Result is a whole plan.
type Result struct {
	MTTFSys       float64    `json:"mttf_sys_s"`
	ProtectTime   float64    `json:"protect_time_s"` // per step
	WriteTime     float64    `json:"write_time_s"`   // T_w
	Checkpoint    Strategy   `json:"checkpoint_restart"`
	HostReplace   Strategy   `json:"host_replacement"`
	Failures      float64    `json:"expected_failures"`
	MonteCarlo    MonteCarlo `json:"monte_carlo"`
	IntervalFStar int        `json:"recommended_interval_steps"`
	Interval      int        `json:"interval_steps"` // K the costs are computed at
	// StallFraction is the fraction of training time checkpointing at
	// Interval stalls it (T_w > N·K·t: PCcheck §3.4), 0 otherwise.
	StallFraction float64 `json:"checkpoint_stall_fraction"`
	Survives      string  `json:"survives"`
	LossWindow    float64 `json:"loss_window_s"` // max(step, replace + restore)
	LossPerWindow float64 `json:"loss_bound_per_window"`
	LossPerJob    float64 `json:"loss_bound_per_job"`
	LossUnits     int     `json:"loss_bound_units"`
	SparesNeeded  int     `json:"spares_needed"`
	SpareRisk     float64 `json:"spare_risk_threshold"`
	PRunOut       float64 `json:"p_run_out_of_spares"`
}

// Bounds of the inputs, so that every model runs in bounded time.
const (
	MaxHosts        = 1 << 20 // hosts, and spares
	MaxRanksPerHost = 1 << 10 // ranks on one host (an EC group is planned rank by rank)
	MaxRanks        = 1 << 24 // hosts × ranks per host: what gorun run places (topology.MapRanks)
	// MaxConcurrency is the most durable checkpoints gorun run keeps in
	// flight (launcher.MaxCkptConcurrency, --ckpt-concurrency).
	MaxConcurrency = 8
)

// Validate checks in, naming the field that is wrong: errors are
// *[FieldError] values wrapping [ErrInput]. An erasure code is checked by
// topology.PlanEC, as gorun run checks it, with every host running
// RanksPerHost ranks: the hosts must form whole groups of K+M and each
// group's ranks must divide by K.
func (in Inputs) Validate() error {
	for _, c := range []struct {
		name string
		v    float64
	}{
		{"MTTFHost", in.MTTFHost}, {"Step", in.Step}, {"StateBytes", in.StateBytes},
		{"MemBW", in.MemBW}, {"NetBW", in.NetBW}, {"DurableBW", in.DurableBW}, {"JobLength", in.JobLength},
	} {
		if !(c.v > 0) || math.IsInf(c.v, 0) {
			return fieldf(c.name, "must be positive, not %v", c.v)
		}
	}
	switch {
	case in.Hosts < 1 || in.Hosts > MaxHosts:
		return fieldf("Hosts", "must be 1 to %d, not %d", MaxHosts, in.Hosts)
	case in.RanksPerHost < 1 || in.RanksPerHost > MaxRanksPerHost:
		return fieldf("RanksPerHost", "must be 1 to %d, not %d", MaxRanksPerHost, in.RanksPerHost)
	case in.Hosts*in.RanksPerHost > MaxRanks:
		return fieldf("RanksPerHost", "%d on %d hosts: more than the %d ranks gorun places", in.RanksPerHost, in.Hosts, MaxRanks)
	case in.Interval < 1 || in.Interval > math.MaxInt32:
		return fieldf("Interval", "must be 1 to 2^31, not %d", in.Interval)
	case in.Concurrency < 1 || in.Concurrency > MaxConcurrency:
		return fieldf("Concurrency", "must be 1 to %d, not %d", MaxConcurrency, in.Concurrency)
	case !(in.Overhead > 0 && in.Overhead < 1):
		return fieldf("Overhead", "must be between 0 and 1, not %v", in.Overhead)
	case in.Spares < 0 || in.Spares > MaxHosts:
		return fieldf("Spares", "must be 0 to %d, not %d", MaxHosts, in.Spares)
	case !(in.Restart >= 0) || math.IsInf(in.Restart, 0):
		return fieldf("Restart", "must be 0 or more, not %v", in.Restart)
	case !(in.Replace >= 0) || math.IsInf(in.Replace, 0):
		return fieldf("Replace", "must be 0 or more, not %v", in.Replace)
	case in.Step > in.JobLength:
		return fieldf("Step", "%v s is longer than the job's %v s", in.Step, in.JobLength)
	}
	if r := in.Redundancy; r.EC() {
		if _, err := ecFlows(in); err != nil {
			return &FieldError{Field: "Redundancy", Msg: fmt.Sprintf("%s over %d hosts of %d rank(s) each: gorun run refuses it: %v", r, in.Hosts, in.RanksPerHost, err), Err: err}
		}
	} else if r.Replicas >= in.Hosts {
		return fieldf("Redundancy", "%s needs at least %d hosts, not %d", r, r.Replicas+1, in.Hosts)
	}
	return nil
}

// Plan computes the whole plan: both strategies' cost per failure,
// efficiency, expected and simulated lost time, f*, the redundancy's loss
// bound and the spares needed so that running out is less likely than
// spareRisk. trace, when not nil, replaces the exponential failures in the
// Monte Carlo (in.MTTFHost should then be the trace's).
func Plan(in Inputs, trace []Failure, runs int, seed uint64, spareRisk float64) (Result, error) {
	if err := in.Validate(); err != nil {
		return Result{}, err
	}
	if !(spareRisk > 0 && spareRisk < 1) {
		return Result{}, fieldf("SpareRisk", "must be between 0 and 1, not %v", spareRisk)
	}
	mc, err := Simulate(in, trace, runs, seed)
	if err != nil {
		return Result{}, err
	}
	mttf := in.MTTFSys()
	strat := func(name string, c Cost, d Dist) Strategy {
		return Strategy{Name: name, Cost: c, CostTotal: c.Total(), Efficiency: Efficiency(mttf, c.Total()),
			CostBlended: c.Total(), EfficiencyBlended: Efficiency(mttf, c.Total()),
			ExpectedLost: ExpectedLost(in.JobLength, mttf, c.Total()), MonteCarlo: d}
	}
	// Host replacement's expected loss over the job counts the failures
	// that find no spare at checkpoint-restart's price.
	ck, hr := CkptCost(in), HostReplaceCost(in)
	replace := strat("host replacement", hr, mc.Replace)
	if mu := in.JobLength / mttf; in.Redundancy.EC() || in.Redundancy.Replicas > 0 {
		b := ExpectedBeyondSpares(mu, in.Spares)
		replace.NoSpare = b
		replace.CostBlended = hr.Overhead + ((mu-b)*(hr.Total()-hr.Overhead)+b*(ck.Total()-ck.Overhead))/mu
		replace.EfficiencyBlended = Efficiency(mttf, replace.CostBlended)
		replace.ExpectedLost = mu * replace.CostBlended
	}
	perWindow, units, window := LossBound(in)
	need, pOut := SparesNeeded(in, spareRisk)
	return Result{
		MTTFSys:       mttf,
		ProtectTime:   ProtectTime(in),
		WriteTime:     in.WriteTime(),
		Checkpoint:    strat("checkpoint-restart", ck, mc.Ckpt),
		HostReplace:   replace,
		Failures:      in.JobLength / mttf,
		MonteCarlo:    mc,
		IntervalFStar: IntervalFor(in.WriteTime(), in.Concurrency, 1+in.Overhead, in.Step),
		Interval:      in.Interval,
		StallFraction: StallPerCheckpoint(in.WriteTime(), in.Step, in.Interval, in.Concurrency) / (float64(in.Interval) * in.Step),
		Survives:      Survives(in.Redundancy, in.Hosts),
		LossWindow:    window,
		LossPerWindow: perWindow,
		LossPerJob:    math.Min(1, perWindow*in.JobLength/window),
		LossUnits:     units,
		SparesNeeded:  need,
		SpareRisk:     spareRisk,
		PRunOut:       pOut,
	}, nil
}

// Survives says in words what r survives over hosts hosts.
func Survives(r topology.Redundancy, hosts int) string {
	if r.EC() {
		g := hosts / (r.ECK + r.ECM)
		return fmt.Sprintf("%s over %d hosts (%d group(s) of %d): any %d host(s) of each group", r, hosts, g, r.ECK+r.ECM, r.ECM)
	}
	if r.Replicas == 0 {
		return "replicas:0: no in-memory copy; any lost host costs a checkpoint-restart"
	}
	return fmt.Sprintf("replicas:%d: any %d of the %d hosts holding a host's state (the host and its %d holder(s))", r.Replicas, r.Replicas, r.Replicas+1, r.Replicas)
}
