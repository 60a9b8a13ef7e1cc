package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Kind is a kind of fault.
type Kind string

// The fault kinds, in the summary's order.
const (
	RankKill       Kind = "rank-kill"       // SIGKILL of one rank's trainer
	HostKill       Kind = "host-kill"       // every process of a host killed (testcluster KillAll)
	AgentKill      Kind = "agent-kill"      // SIGKILL of a host's gorun agent
	RankStop       Kind = "rank-stop"       // SIGSTOP of one rank: a hang (--hang-timeout)
	Partition      Kind = "partition"       // a host's link down, up again once it was fenced
	TwoHosts       Kind = "two-hosts"       // two hosts killed at once
	DuringRecovery Kind = "during-recovery" // a second host killed once the first one's recovery epoch is published
	LauncherTerm   Kind = "launcher-term"   // SIGTERM to gorun
	LauncherUsr1   Kind = "launcher-usr1"   // SIGUSR1 to gorun (Slurm's preemption notice), forwarded to every rank
	StdoutStall    Kind = "stdout-stall"    // gorun's standard output not read for 3 s
	SlotFlip       Kind = "slot-flip"       // a byte flipped in a stopped rank's committed slots, then the rank killed
	Resume         Kind = "resume"          // the whole job killed once a version is committed on disk, then gorun --resume
	CkptFlip       Kind = "ckpt-flip"       // the same, with a byte flipped in a rank's committed base file before the resume
	GPUFault       Kind = "gpu-fault"       // an XID on a host's GPU through the fake backend (gpufault.go)
	ReplicaFlip    Kind = "replica-flip"    // a byte flipped in the replicas a host holds, then a host whose ranks' replicas it holds lost (replflip.go)
)

// Kinds are every fault kind, in the summary's order.
var Kinds = []Kind{RankKill, HostKill, AgentKill, RankStop, Partition, TwoHosts, DuringRecovery, LauncherTerm, LauncherUsr1, StdoutStall, SlotFlip, Resume, CkptFlip, GPUFault, ReplicaFlip}

// Fault is one fault to inject: its kind, where, and after which
// committed step (G, read from the events file).
type Fault struct {
	Kind  Kind
	Host  int    // the host (an index among the work hosts); host faults and the rank faults' rank's host
	Host2 int    // the second host of TwoHosts and DuringRecovery, ReplicaFlip's lost host (set by RunOne: replicaOwner), -1 otherwise
	Rank  int    // the rank of rank faults, -1 otherwise
	After int    // inject once G >= After
	GPU   int    // GPUFault: the GPU (its index on the host)
	XID   uint64 // GPUFault: the XID it reports; 0 for the other kinds
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s after step %d", f.Kind, f.After)
	if f.Kind == GPUFault {
		return s + fmt.Sprintf(" on GPU %d of host %d (XID %d, %s)", f.GPU, f.Host, f.XID, gpuXIDs[f.XID])
	}
	switch {
	case f.Kind == ReplicaFlip:
		s += fmt.Sprintf(": the replicas held on host %d flipped, host %d lost", f.Host, f.Host2)
	case f.Rank >= 0:
		s += fmt.Sprintf(" on rank %d (host %d)", f.Rank, f.Host)
	case f.Host2 >= 0:
		s += fmt.Sprintf(" on hosts %d and %d", f.Host, f.Host2)
	case f.Host >= 0:
		s += fmt.Sprintf(" on host %d", f.Host)
	}
	return s
}

// Lost returns the hosts the fault loses (indices into the
// configuration's hosts).
func (f Fault) Lost() []int {
	switch f.Kind {
	case HostKill, AgentKill, Partition:
		return []int{f.Host}
	case TwoHosts, DuringRecovery:
		return []int{f.Host, f.Host2}
	case GPUFault:
		if gpuPermanent(f) {
			return []int{f.Host}
		}
	case ReplicaFlip:
		if f.Host2 >= 0 {
			return []int{f.Host2}
		}
	}
	return nil
}

// Crashes is how many hosts the fault leaves with a SIGKILLed agent.
func (f Fault) Crashes() int {
	switch f.Kind {
	case HostKill, AgentKill, ReplicaFlip:
		return 1
	case TwoHosts, DuringRecovery:
		return 2
	}
	return 0
}

// Applies reports whether fault kind k can hit a job of c: the MPICH
// workload reports no progress through gorun's rank client, so a
// stopped rank is never seen to hang (--hang-timeout needs progress
// reported) and it has no slots to flip.
// Resume and CkptFlip need the durable tier. ReplicaFlip needs whole
// replicas (replicaFlipApplies).
func Applies(k Kind, c Config) bool {
	switch k {
	case RankStop, SlotFlip:
		return c.Workload != MPICH
	case Resume, CkptFlip:
		return c.Durable && c.Workload != MPICH
	case ReplicaFlip:
		return replicaFlipApplies(c)
	}
	return true
}

// drawFault draws a fault for c, of one of kinds (one that applies; a
// kind that does not is drawn again, from the same stream).
func drawFault(r *rand.Rand, c Config, kinds []Kind) Fault {
	var ok []Kind
	for _, k := range kinds {
		if Applies(k, c) {
			ok = append(ok, k)
		}
	}
	if len(ok) == 0 {
		ok = []Kind{RankKill}
	}
	f := Fault{Kind: pick(r, ok...), Host2: -1, Rank: -1}
	f.Host = r.IntN(c.Hosts)
	switch f.Kind {
	case RankKill, RankStop, SlotFlip, CkptFlip:
		f.Rank = f.Host*c.RanksPerHost + r.IntN(c.RanksPerHost)
	case TwoHosts, DuringRecovery:
		f.Host2 = (f.Host + 1 + r.IntN(c.Hosts-1)) % c.Hosts
	case GPUFault:
		drawGPUFault(r, c, &f)
	}
	f.After = 3 + r.IntN(max(1, c.Steps*2/3-3)) // in the first two thirds: the job must still run
	return f
}

// Draw draws run index's configuration and fault from seed alone: the
// same (seed, index, kinds) always gives the same run, whatever ran
// before. The fault is of one of kinds (nil: any of Kinds).
func Draw(seed uint64, index int, kinds []Kind) (Config, Fault) {
	if len(kinds) == 0 {
		kinds = Kinds
	}
	r := rand.New(rand.NewPCG(seed, uint64(index)))
	c := drawConfig(r)
	// A configuration no kind applies to (KINDS=resume and no durable
	// tier) is drawn again.
	for range 100 {
		if slices.ContainsFunc(kinds, func(k Kind) bool { return Applies(k, c) }) {
			break
		}
		c = drawConfig(r)
	}
	return c, drawFault(r, c, kinds)
}

// ParseKinds parses a comma-separated list of fault kinds ("" is nil:
// every kind).
func ParseKinds(s string) ([]Kind, error) {
	if s == "" {
		return nil, nil
	}
	var out []Kind
	for _, f := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(f))
		if !slices.Contains(Kinds, k) {
			return nil, fmt.Errorf("chaos: unknown fault kind %q (want one of %v)", k, Kinds)
		}
		out = append(out, k)
	}
	return out, nil
}
