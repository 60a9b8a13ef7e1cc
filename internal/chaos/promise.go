package chaos

import (
	"fmt"
	"slices"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/topology"
)

// Plan is what a configuration promises, worked out with the launcher's
// own planning functions before the job runs.
type Plan struct {
	// Err is why gorun must refuse the configuration (exit 2), nil when
	// it must run it.
	Err error
	// HostOf[r] is rank r's host (an index into the configuration's
	// hosts, work hosts first).
	HostOf []int
	// Holders[r] are the ranks whose hosts keep copies of rank r's state
	// (replicas: topology.Place; erasure coding: the clear copy's holder).
	Holders [][]int
	// Groups are the erasure-coding groups, nil for replicas.
	Groups     []topology.ECGroup
	Redundancy topology.Redundancy
	Spares     int
}

// Precheck plans c as the launcher does (launcher.MarkSpares,
// topology.MapRanks by slot, topology.ParseRedundancy, then
// topology.PlanEC or topology.NewLayout and topology.Place), on hosts
// named names (at least c.Hosts + c.Spares of them).
func Precheck(c Config, names []string) Plan {
	p := Plan{Spares: c.Spares}
	n := c.Hosts + c.Spares
	if len(names) < n {
		p.Err = fmt.Errorf("chaos: %d hosts wanted, %d built", n, len(names))
		return p
	}
	hosts := make([]topology.Host, n)
	for i := range hosts {
		hosts[i] = topology.Host{Name: names[i], Slots: c.RanksPerHost}
	}
	hosts, err := launcher.MarkSpares(hosts, c.Spares)
	if err != nil {
		p.Err = err
		return p
	}
	assign, err := topology.MapRanks(hosts, topology.MapOptions{NP: c.NP(), By: topology.MapBySlot})
	if err != nil {
		p.Err = err
		return p
	}
	p.HostOf = make([]int, len(assign))
	for _, a := range assign {
		p.HostOf[a.Rank] = a.Host
	}
	red, err := topology.ParseRedundancy(c.Redundancy)
	if err != nil {
		p.Err = err
		return p
	}
	p.Redundancy = red
	l, err := topology.NewLayout(c.NP(), max(c.TP, 1), max(c.PP, 1))
	if err != nil {
		p.Err = err
		return p
	}
	switch {
	case red.EC():
		groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: red.ECK, M: red.ECM})
		if err != nil {
			p.Err = err
			return p
		}
		p.Groups = groups
	case red.Replicas > 0:
		pl, err := topology.Place(l, hosts, assign, topology.PlacementOptions{K: red.Replicas})
		if err != nil {
			p.Err = err
			return p
		}
		p.Holders = pl.Holders
	}
	return p
}

// SurvivesFromMemory reports whether the state of every rank outlives
// losing the hosts lost at once (indices into the configuration's
// hosts): README, --redundancy: "replicas:K: whole copies on K other
// hosts" (a rank survives while its host or one of its holders' is up);
// "ec:K+M: ... any M hosts of a group may be lost".
func (p Plan) SurvivesFromMemory(lost []int) bool {
	if p.Err != nil {
		return false
	}
	if p.Redundancy.EC() {
		for _, g := range p.Groups {
			n := 0
			for _, h := range g.Hosts {
				if slices.Contains(lost, h) {
					n++
				}
			}
			if n > len(g.Parity) {
				return false
			}
		}
		return true
	}
	for r, h := range p.HostOf {
		if !slices.Contains(lost, h) {
			continue
		}
		ok := false
		if r < len(p.Holders) {
			for _, x := range p.Holders[r] {
				if !slices.Contains(lost, p.HostOf[x]) {
					ok = true
				}
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// HasCopyElsewhere reports whether every rank's state has a copy on
// another host: what a rank whose own slots are corrupt restores from
// (internal/keeper/restore.go: "not here ..., and not from other hosts").
func (p Plan) HasCopyElsewhere() bool {
	if p.Err != nil {
		return false
	}
	if p.Redundancy.EC() {
		return len(p.Groups) > 0
	}
	for r := range p.HostOf {
		if r >= len(p.Holders) || len(p.Holders[r]) == 0 {
			return false
		}
	}
	return len(p.HostOf) > 0
}

// Replaceable reports whether lost hosts at once find a place to go: a
// spare each (README, --spares). The hostfile gives every host exactly
// its ranks' slots, so no surviving host has free slots for
// --on-no-spare free-slots.
func (p Plan) Replaceable(lost int) bool { return lost <= p.Spares }

// Within reports whether the configuration planned as p promises to
// survive f, which lost the hosts lost (indices into c's hosts: f.Lost(),
// or fewer when the job ended before the rest could be), durable saying whether the durable tier had a committed
// version when f was injected (a roll-back from disk is then promised
// where memory cannot serve), with the README sentence that says so.
func Within(f Fault, lost []int, p Plan, c Config, durable bool) (bool, string) {
	if p.Err != nil {
		return false, "gorun refuses the configuration"
	}
	switch f.Kind {
	case GPUFault:
		return withinGPUFault(f, lost, p, c, durable)
	case RankKill, RankStop:
		return true, `README, --max-restarts: "after a rank fails, restart every rank in place up to N times, resuming from the globally recoverable step"`
	case LauncherUsr1:
		return true, `README, Signals: "SIGUSR1 and SIGUSR2 (Slurm's preemption notices) are forwarded to every rank, and the job goes on" (dptrain and MPICH ranks note it and go on; pytrain's die of it: every rank fails, and --max-restarts restarts them from G)`
	case StdoutStall:
		return true, `README, "A slow reader of gorun's output ... never delays failure detection ... and no byte is lost or reordered"`
	case LauncherTerm:
		return false, `README, Signals: "SIGINT, SIGTERM and SIGHUP stop every rank with the same signal, and gorun exits 128+N"`
	case Resume:
		return true, `README, --resume: "the same command line plus --resume starts a job that died whole (launcher, agents and ranks) again from DIR: from its committed version"`
	case CkptFlip:
		return false, `README, Checkpoints on disk: "A rank whose state cannot be rebuilt (its base missing or corrupt) stops the job, naming it"`
	case SlotFlip:
		if p.HasCopyElsewhere() {
			return true, `README, Protecting training state: "Restoring chooses step G: from the rank's own slots ... or from a replica holder" (a slot that fails its CRC32C is not used: ckpt.ErrCorrupt)`
		}
		return false, "no copy of the rank's state on another host: a corrupt local slot cannot be restored"
	}
	if !p.Replaceable(len(lost)) {
		return false, fmt.Sprintf(`README, --spares / --on-no-spare: %d hosts lost, %d spares, no free slots`, len(lost), p.Spares)
	}
	if c.Workload == MPICH {
		return true, `README, --spares: "a lost host ... is fenced and its ranks move to a spare, and the job goes on" (a program without protected state restarts from its start: --recovery restart)`
	}
	if p.SurvivesFromMemory(lost) {
		return true, fmt.Sprintf(`README, --redundancy %s and "Losing a host": "a spare host takes its ranks, which restore their state from the other hosts"`, c.Redundancy)
	}
	if c.Durable && durable {
		return true, `README, Checkpoints on disk: "When a host and all the holders of one of its ranks are lost, the job does not stop: ... rolling the job back to step T from --ckpt-dir"`
	}
	return false, fmt.Sprintf("README, --redundancy %s: the lost hosts %v hold every copy of some rank's state", c.Redundancy, lost)
}
