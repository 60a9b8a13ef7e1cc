package plan

import (
	"math"
	"sync"
	"time"

	"github.com/gorun/gorun/topology"
)

// Inputs are everything a plan is computed from. Times are in seconds and
// sizes in bytes (float64: the models are arithmetic, and the CLI parses
// units into these).
type Inputs struct {
	// MTTFHost is one host's mean time to failure (s). The system's,
	// MTTF_sys = MTTFHost/Hosts, assumes independent exponential failures.
	MTTFHost float64
	// Hosts is the number of hosts that run ranks (spares not counted).
	Hosts int
	// RanksPerHost is the number of ranks on each host.
	RanksPerHost int
	// Step is t_step, the time of one training step (s).
	Step float64
	// StateBytes is m, one rank's protected state (bytes).
	StateBytes float64
	// MemBW, NetBW and DurableBW are bandwidths in bytes/s: the local
	// memory copy (the per-step snapshot), the network between two hosts
	// (replicas, parity, the state a spare fetches), and durable storage
	// as one host sees it while every host writes (T_S).
	MemBW, NetBW, DurableBW float64
	// Restart is E[T_restart] of checkpoint-restart before the restore:
	// stopping the job, getting a host, starting every rank (s).
	Restart float64
	// Replace is gorun's host replacement before the state transfer:
	// detecting the loss, attaching a spare, the new epoch's rendezvous (s).
	Replace float64
	// Interval is K (PCcheck's f), steps between durable checkpoints.
	Interval int
	// Concurrency is PCcheck's N, durable checkpoints in flight (>= 1).
	Concurrency int
	// Overhead is the fraction of the time checkpointing may cost;
	// PCcheck's slowdown is q = 1 + Overhead (as in gorun's --ckpt-overhead).
	Overhead float64
	// Spares is the number of spare hosts.
	Spares int
	// Redundancy is how each rank's in-memory state survives lost hosts.
	Redundancy topology.Redundancy
	// JobLength is the failure-free length of the job (s).
	JobLength float64
}

// HostBytes is the protected state of one host: RanksPerHost·m.
func (in Inputs) HostBytes() float64 { return float64(in.RanksPerHost) * in.StateBytes }

// MTTFSys is MTTF_sys = MTTF_host/Hosts (s): the mean time between
// failures of any of the job's hosts, failures being independent and
// exponential (DEADPOOL §IV's λ = 1/MTTF_sys).
func (in Inputs) MTTFSys() float64 { return in.MTTFHost / float64(in.Hosts) }

// WriteTime is T_w, the time to write one host's checkpoint to durable
// storage, PCcheck §3.4's T_w = m/T_S for N = 1 (with N > 1 this assumes
// the saves in flight do not share the bandwidth, an optimistic figure).
func (in Inputs) WriteTime() float64 { return in.HostBytes() / in.DurableBW }

// Cost is the expected disruption per failure, E[C], in its terms
// (DEADPOOL §IV), all in seconds.
type Cost struct {
	// Overhead is C_overhead: what keeping the job recoverable costs in
	// failure-free time, per failure (its rate times MTTF_sys).
	Overhead float64 `json:"overhead_s"`
	// Recover is the latency before training resumes: E[T_restart] or
	// E[T_hotswap], without the state transfer.
	Recover float64 `json:"recover_s"`
	// Restore is the time to bring the lost state back: from durable
	// storage (checkpoint-restart) or from peers' memory (gorun).
	Restore float64 `json:"restore_s"`
	// Replay is t_step·E[replay]: the work done again after recovery.
	Replay float64 `json:"replay_s"`
}

// Total is E[C], the sum of the terms.
func (c Cost) Total() float64 { return c.Overhead + c.Recover + c.Restore + c.Replay }

// ExpectedReplaySteps is the expected work lost to a failure under
// checkpoint-restart with a checkpoint every K steps, in steps, under
// DEADPOOL §IV's uniform-failure approximation: E[R] = (K−1)/2 whole steps
// since the last checkpoint, plus the interrupted step's progress
// E[φ] = 1/2, so K/2 — the paper's worked example, (K/2)·t_step ≈ 16.7 min
// for K = 100, t_step = 20 s.
func ExpectedReplaySteps(k int) float64 { return float64(k-1)/2 + 0.5 }

// StallPerCheckpoint is what one durable checkpoint stalls training (s):
// PCcheck §3.4's runtime₂ stalls by T_w − N·f·t every N checkpoints when
// T_w > N·f·t, and not at all otherwise.
func StallPerCheckpoint(writeTime, step float64, k, n int) float64 {
	return math.Max(0, writeTime-float64(n)*float64(k)*step) / float64(n)
}

// WriteLag is the expected extra loss of a failure that strikes while the
// newest checkpoint is still being written, so that the one before it is
// the newest durable one (s): a checkpoint takes T_w to become durable,
// and at most N·K steps' worth of them are in flight (PCcheck Eq. (4),
// t·min(N·f, T_w/t)).
func WriteLag(writeTime, step float64, k, n int) float64 {
	return math.Min(writeTime, float64(n)*float64(k)*step)
}

// CkptCost is E[C_ckpt] (DEADPOOL §IV): checkpoint-restart with durable
// checkpoints every K steps.
//
//	C_overhead = StallPerCheckpoint · MTTF_sys/(K·t_step)
//	Recover    = E[T_restart]
//	Restore    = host state / T_S            (every host reads its state back)
//	Replay     = t_step·K/2 + WriteLag
func CkptCost(in Inputs) Cost {
	tw := in.WriteTime()
	stall := StallPerCheckpoint(tw, in.Step, in.Interval, in.Concurrency)
	return Cost{
		Overhead: stall * in.MTTFSys() / (float64(in.Interval) * in.Step),
		Recover:  in.Restart,
		Restore:  tw,
		Replay:   in.Step*ExpectedReplaySteps(in.Interval) + WriteLag(tw, in.Step, in.Interval, in.Concurrency),
	}
}

// ProtectTime is the time of one step's in-memory protection (s): the
// snapshot copy of the host's state (host bytes / memory bandwidth) and
// the network transfer of what gorun sends, at the busier end of a link
// (a host sends and receives at once, each at NetBW): k whole copies of
// the host's state each way under replicas:k; under ec:K+M what [Flows]
// counts over the group topology.PlanEC plans — M shares per rank, each
// as long as its shard, and clear copies to data hosts, with a parity
// host receiving every other member's share — not ECHECK's (K+M)/K
// memory factor, which is what the rows hold, not what goes to them.
func ProtectTime(in Inputs) float64 {
	hb := in.HostBytes()
	if in.Redundancy.EC() {
		f, err := ecFlows(in)
		if err != nil {
			return math.NaN() // Validate refuses such inputs
		}
		return hb/in.MemBW + float64(max(f.Sent, f.Received))*in.StateBytes/in.NetBW
	}
	return hb/in.MemBW + hb*float64(in.Redundancy.Replicas)/in.NetBW
}

// RestoreTime is the time a spare takes to fetch a lost host's state
// from its peers (s): the host's state under replicas:k; under ec:K+M the
// mean over the group's hosts of what [Flows] counts (a rank whose data
// host was its own host is decoded from K shards).
func RestoreTime(in Inputs) float64 {
	if in.Redundancy.EC() {
		f, err := ecFlows(in)
		if err != nil {
			return math.NaN()
		}
		return f.Restore * in.StateBytes / in.NetBW
	}
	return in.HostBytes() / in.NetBW
}

// ecFlows is [Flows] of in's group. The last answer is kept: a plan asks
// for the same layout several times, and a wide group of many ranks per
// host takes a while to plan.
func ecFlows(in Inputs) (ECFlows, error) {
	key := ecKey{in.Hosts, in.RanksPerHost, in.Redundancy.ECK, in.Redundancy.ECM}
	ecLast.Lock()
	defer ecLast.Unlock()
	if ecLast.ok && ecLast.key == key {
		return ecLast.flows, ecLast.err
	}
	var f ECFlows
	g, err := ecGroup(in)
	if err == nil {
		f = Flows(g)
	}
	ecLast.key, ecLast.flows, ecLast.err, ecLast.ok = key, f, err, true
	return f, err
}

type ecKey struct{ hosts, perHost, k, m int }

var ecLast struct {
	sync.Mutex
	ok    bool
	key   ecKey
	flows ECFlows
	err   error
}

// HostReplaceCost is E[C_DEADPOOL] (DEADPOOL §IV) for gorun's host
// replacement, with the durable tier kept as a fallback at the same K:
//
//	C_overhead = (max(0, protect − t_step)/t_step
//	              + StallPerCheckpoint/(K·t_step)) · MTTF_sys
//	Recover    = E[T_hotswap] (Replace)
//	Restore    = RestoreTime (the spare fetches the state from peers)
//	Replay     = t_step·E[φ] = t_step/2
//
// The protection overlaps the step (DEADPOOL §V, one wait before the
// optimizer step), so it stalls only by what it takes beyond t_step.
// With replicas:0 nothing is kept in memory and a lost host costs what
// checkpoint-restart does.
func HostReplaceCost(in Inputs) Cost {
	if !in.Redundancy.EC() && in.Redundancy.Replicas == 0 {
		return CkptCost(in)
	}
	stepStall := math.Max(0, ProtectTime(in)-in.Step)
	ckptStall := StallPerCheckpoint(in.WriteTime(), in.Step, in.Interval, in.Concurrency)
	rate := stepStall/in.Step + ckptStall/(float64(in.Interval)*in.Step) // stall per second of training
	return Cost{
		Overhead: rate * in.MTTFSys(),
		Recover:  in.Replace,
		Restore:  RestoreTime(in),
		Replay:   in.Step / 2,
	}
}

// Efficiency is DEADPOOL §IV's η ≈ MTTF_sys/(MTTF_sys + E[C]).
func Efficiency(mttfSys, cost float64) float64 { return mttfSys / (mttfSys + cost) }

// ExpectedLost is the expected time a job of failure-free length L loses
// to failures and their protection: λ·L·E[C], λ = 1/MTTF_sys (DEADPOOL
// §IV's E[C_rate] = λ·E[C] over L).
func ExpectedLost(jobLength, mttfSys, cost float64) float64 { return jobLength / mttfSys * cost }

// IntervalFor is PCcheck §3.4 Eq. (3), f* = ceil(T_w/(N·q·t)): the
// smallest checkpoint interval, in steps, at which N checkpoints in flight
// of write time T_w each keep training within the slowdown q (q = 1 +
// the overhead fraction) at step time t. It is at least 1.
func IntervalFor(writeTime float64, n int, q, step float64) int {
	f := math.Ceil(writeTime / (float64(n) * q * step))
	if !(f >= 1) {
		return 1
	}
	if f > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(f)
}

// FailureProb is p, the probability that one host fails within a window
// of w seconds given its MTTF: 1 − e^(−w/MTTF).
func FailureProb(w, mttfHost float64) float64 { return -math.Expm1(-w / mttfHost) }

// ReplicaLossBound is DEADPOOL §V-a Eq. (1): with each of D shards held by
// its owner and k replicas on distinct hosts, and hosts failing
// independently with probability p in a window, some shard loses every
// copy in that window with probability P_loss ≤ D·p^(k+1) (a union bound).
// D = 128, k = 1, p = 1e−6 gives 1.28e−10.
func ReplicaLossBound(d, k int, p float64) float64 {
	return float64(d) * math.Pow(p, float64(k+1))
}

// ECLossBound is the same bound for an erasure code ec:K+M over groups of
// K+M hosts: a group loses state only when more than M of its K+M hosts
// fail in the window, which for independent failures with probability p is
// the binomial tail
//
//	P_group = Σ_{j=M+1}^{K+M} C(K+M, j) p^j (1−p)^(K+M−j)  ≤  C(K+M, M+1)·p^(M+1)
//
// and a union bound over the G groups gives P_loss ≤ G·P_group. (ec:1+M is
// replicas:M: C(M+1, M+1) = 1, and the bound is G·p^(M+1).)
func ECLossBound(groups, k, m int, p float64) float64 {
	n := k + m
	var tail float64
	for j := m + 1; j <= n; j++ {
		tail += binom(n, j) * math.Pow(p, float64(j)) * math.Pow(1-p, float64(n-j))
	}
	return float64(groups) * tail
}

// binom is C(n, j) as a float64.
func binom(n, j int) float64 {
	r := 1.0
	for i := 1; i <= j; i++ {
		r = r * float64(n-j+i) / float64(i)
	}
	return r
}

// LossBound is the loss bound of in's redundancy per window, the window,
// and the number of independent units D it is taken over: hosts for
// replicas (each host's state and its k holders), groups for ec.
// replicas:0 loses a host's in-memory state with any failure: D·p.
//
// DEADPOOL §V-a takes the window to be one step (owner and holders fail
// "within the same step"). In gorun a lost host's state has fewer copies
// until the spare has it back: the window is max(t_step, Replace +
// [RestoreTime]). (Once spares run out a lost host's state stays exposed
// until a checkpoint-restart; the bound does not cover that.)
func LossBound(in Inputs) (perWindow float64, units int, window float64) {
	window = math.Max(in.Step, in.Replace+RestoreTime(in))
	p := FailureProb(window, in.MTTFHost)
	r := in.Redundancy
	if r.EC() {
		g := in.Hosts / (r.ECK + r.ECM) // whole groups: Validate
		return ECLossBound(g, r.ECK, r.ECM, p), g, window
	}
	return ReplicaLossBound(in.Hosts, r.Replicas, p), in.Hosts, window
}

// SparesNeeded returns the smallest number of spares S for which the
// probability of more than S host failures during the job is below
// threshold, and that probability for the spares the plan has. Failures
// are Poisson with mean μ = Hosts·JobLength/MTTF_host: the job keeps
// Hosts hosts running (each lost one replaced), a replaced host does not
// come back, and idle spares do not fail. It takes O(μ) time.
func SparesNeeded(in Inputs, threshold float64) (need int, pOut float64) {
	mu := float64(in.Hosts) * in.JobLength / in.MTTFHost
	need = -1
	limit := int(mu+12*math.Sqrt(mu)) + 64 // far beyond any threshold a user gives
	cdf := 0.0
	for s := 0; s <= limit; s++ {
		cdf += poissonPMF(mu, s)
		tail := math.Max(0, 1-cdf)
		if s == in.Spares {
			pOut = tail
		}
		if need < 0 && tail < threshold {
			need = s
		}
		if need >= 0 && s >= in.Spares {
			break
		}
	}
	if need < 0 {
		need = limit
	}
	if in.Spares > limit {
		pOut = 0
	}
	return need, pOut
}

// ExpectedBeyondSpares is E[(N−S)+], the expected number of failures
// that find no spare left, N being Poisson with mean mu (as in
// [SparesNeeded]) and S the spares: μ − E[min(N, S)], where
// E[min(N, S)] = Σ_{j<S} j·P(N=j) + S·P(N≥S).
func ExpectedBeyondSpares(mu float64, spares int) float64 {
	if spares > int(mu+12*math.Sqrt(mu))+64 {
		return 0 // P(N ≥ S) is below 1e−30: no failure finds no spare
	}
	var within, below float64 // E[min(N,S)] so far, P(N < S)
	for j := 0; j < spares; j++ {
		pj := poissonPMF(mu, j)
		within += float64(j) * pj
		below += pj
	}
	within += float64(spares) * math.Max(0, 1-below)
	return math.Max(0, mu-within)
}

// poissonPMF is e^−μ μ^s / s!, in logs so that large μ does not underflow
// e^−μ alone.
func poissonPMF(mu float64, s int) float64 {
	if mu == 0 {
		if s == 0 {
			return 1
		}
		return 0
	}
	lg, _ := math.Lgamma(float64(s) + 1)
	return math.Exp(-mu + float64(s)*math.Log(mu) - lg)
}

// Seconds converts a duration to the models' seconds.
func Seconds(d time.Duration) float64 { return d.Seconds() }
