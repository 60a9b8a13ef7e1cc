package plan

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Bounds of a Monte Carlo's work and memory: at most MaxRuns runs (each
// keeps two float64s), and runs × max(1, expected failures per run) at
// most MaxSimulatedFailures.
const (
	MaxRuns              = 1_000_000
	MaxSimulatedFailures = 50_000_000
)

// Dist is a distribution of the time a job loses (s) over Monte Carlo runs.
type Dist struct {
	Mean float64 `json:"mean_s"`
	P50  float64 `json:"p50_s"`
	P99  float64 `json:"p99_s"`
	// Fallbacks is the mean number of failures per run that host
	// replacement met with no spare left and paid checkpoint-restart for
	// (always 0 for checkpoint-restart itself).
	Fallbacks float64 `json:"fallbacks"`
}

// MonteCarlo is the lost time of each strategy over runs simulated jobs.
type MonteCarlo struct {
	Runs      int     `json:"runs"`
	Seed      uint64  `json:"seed"`
	Failures  float64 `json:"mean_failures"` // per run
	Ckpt      Dist    `json:"-"`             // reported in the strategies
	Replace   Dist    `json:"-"`
	FromTrace bool    `json:"from_trace"`
}

// Simulate runs a seeded Monte Carlo of the time a job of failure-free
// length JobLength loses under checkpoint-restart and under host
// replacement: the same seed gives the same result. Each run draws the
// failures (with trace nil: a Poisson process of rate Hosts/MTTF_host,
// replaced hosts as good as new; with a trace: its failures before
// JobLength, inclusive) and, uniformly, where the checkpoint schedule and the step
// boundaries fall relative to them. With a trace the failures are the
// same in every run and only those phases vary: the distribution is of
// where checkpoints and steps fall, not of the failures. Failure times are taken in training
// time (failures during a recovery are not modelled). A failure costs:
//
//   - checkpoint-restart: E[T_restart] + restore + the work since the
//     newest durable checkpoint (one that started at least
//     min(T_w, N·K·t) of training earlier: [WriteLag]);
//   - host replacement, while spares last: Replace + restore from peers +
//     the interrupted step's progress φ·t_step; with none left,
//     checkpoint-restart's cost (counted in Fallbacks).
//
// Each run adds the failure-free overhead over JobLength (the stalls of
// [CkptCost] and [HostReplaceCost]). In-memory state lost beyond the
// redundancy is not simulated: [LossBound] bounds it.
func Simulate(in Inputs, trace []Failure, runs int, seed uint64) (MonteCarlo, error) {
	if runs < 1 || runs > MaxRuns {
		return MonteCarlo{}, fieldf("Runs", "must be 1 to %d, not %d", MaxRuns, runs)
	}
	mttfSys := in.MTTFSys()
	expected := in.JobLength / mttfSys
	if trace != nil {
		expected = float64(len(trace))
	}
	if expected > MaxSimulatedFailures {
		// the failure inputs, not the runs, are what is wrong
		return MonteCarlo{}, fieldf("MTTFHost", "%v s over %d hosts and a job of %v s: %.3g failures expected in one job, more than the %d a Monte Carlo simulates", in.MTTFHost, in.Hosts, in.JobLength, expected, MaxSimulatedFailures)
	}
	if max(1, expected)*float64(runs) > MaxSimulatedFailures {
		return MonteCarlo{}, fieldf("Runs", "%d of %.3g expected failures each: more than %d failures to simulate; give fewer runs", runs, expected, MaxSimulatedFailures)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	k := float64(in.Interval) * in.Step // seconds between checkpoints
	tw := in.WriteTime()
	// A checkpoint is durable T_w after it starts, but at most N·K·t of
	// training later: with T_w > N·K·t training stalls until the oldest
	// of the N in flight is durable (PCcheck §3.4), and failure times are
	// training time — the closed form's WriteLag.
	lag := WriteLag(tw, in.Step, in.Interval, in.Concurrency)
	ckpt, repl := CkptCost(in), HostReplaceCost(in)
	// failure-free overhead over the job: the per-failure overhead is
	// rate·MTTF_sys, so the rate is Overhead/MTTF_sys.
	ckptBase := ckpt.Overhead / mttfSys * in.JobLength
	replBase := repl.Overhead / mttfSys * in.JobLength
	inMemory := in.Redundancy.EC() || in.Redundancy.Replicas > 0

	ckptLost := make([]float64, runs)
	replLost := make([]float64, runs)
	var failures, fallbacks float64
	times := make([]float64, 0, int(expected)+16)
	for r := range runs {
		times = times[:0]
		if trace == nil {
			for t := rng.ExpFloat64() * mttfSys; t < in.JobLength; t += rng.ExpFloat64() * mttfSys {
				times = append(times, t)
			}
		} else {
			for _, f := range trace {
				if s := f.At.Seconds(); s <= in.JobLength {
					times = append(times, s)
				}
			}
		}
		ckptPhase := rng.Float64() * k       // first checkpoint starts here
		stepPhase := rng.Float64() * in.Step // first step boundary
		spares := in.Spares
		cl, rl := ckptBase, replBase
		for _, t := range times {
			c := in.Restart + tw + sinceDurable(t, ckptPhase, k, lag)
			cl += c
			switch {
			case inMemory && spares > 0:
				spares--
				phi := math.Mod(t-stepPhase+in.Step, in.Step)
				rl += in.Replace + repl.Restore + phi
			default:
				rl += c
				if inMemory {
					fallbacks++
				}
			}
		}
		failures += float64(len(times))
		ckptLost[r], replLost[r] = cl, rl
	}
	n := float64(runs)
	return MonteCarlo{
		Runs: runs, Seed: seed, Failures: failures / n, FromTrace: trace != nil,
		Ckpt:    dist(ckptLost, 0),
		Replace: dist(replLost, fallbacks/n),
	}, nil
}

// sinceDurable is the work lost to a failure at t (s) when checkpoints
// start every k seconds from phase and each is durable tw (the lag) after it starts:
// the time since the start of the newest durable one, or since the job
// began when none is.
func sinceDurable(t, phase, k, tw float64) float64 {
	if t < phase+tw {
		return t
	}
	// newest checkpoint start s ≤ t − tw on the grid phase + i·k
	i := math.Floor((t - tw - phase) / k)
	return t - (phase + i*k)
}

// dist summarises xs (which it sorts).
func dist(xs []float64, fallbacks float64) Dist {
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Dist{
		Mean:      sum / float64(len(xs)),
		P50:       quantile(xs, 0.50),
		P99:       quantile(xs, 0.99),
		Fallbacks: fallbacks,
	}
}

// quantile is the nearest-rank q-quantile of sorted xs.
func quantile(xs []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}
