package launcher

import (
	"fmt"

	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// placeReplicas chooses every rank's replica holders (topology.Place):
// --replicas holders on other hosts of its data-parallel group.
func (j *job) placeReplicas(assign []topology.Assignment) error {
	k := j.cfg.Replicas
	if k <= 0 {
		return nil
	}
	l, err := topology.NewLayout(j.cfg.NP, max(j.cfg.TP, 1), max(j.cfg.PP, 1))
	if err != nil {
		return &ConfigError{Msg: err.Error(), Err: err}
	}
	p, err := topology.Place(l, j.cfg.Hosts, assign, topology.PlacementOptions{K: k})
	if err != nil {
		if j.cfg.ReplicasSet {
			return &ConfigError{Msg: fmt.Sprintf("--replicas %d: %v", k, err), Err: err}
		}
		// The default asks for a replica where there is a host for it;
		// a one-host job protects on its host only.
		j.log.Debug("state protection without replicas", "why", err)
		return nil
	}
	j.holders = p.Holders
	for _, s := range p.Shortfalls {
		j.log.Debug("replica placement", "shortfall", s.String())
	}
	return nil
}

// holderRows returns the epoch table's holder rows for holders: one per
// rank that has holders, in rank order (nil without replicas).
func holderRows(holders [][]int) []wire.HolderRow {
	var rows []wire.HolderRow
	for r, hs := range holders {
		if len(hs) > 0 {
			rows = append(rows, wire.HolderRow{Rank: r, Holders: hs})
		}
	}
	return rows
}

// goneHost returns a host whose agent has ended or that is lost, whose
// ranks a restart in place could therefore not start again, or nil.
func (j *job) goneHost() *agentHost {
	for _, h := range j.hosts {
		if h.ended || h.lost {
			return h
		}
	}
	return nil
}

// restartRanks restarts every rank in place after a failure (why): a new
// generation and epoch, in which the ranks resume from G.
func (j *job) restartRanks(why string) {
	j.gen++
	g := j.prog.restart(j.gen)
	j.epoch++
	from := fmt.Sprintf("resuming from step %d", g)
	if g < 0 {
		from = "from the start (no step was protected on every rank)"
	}
	j.out.report("%s; restarting every rank (restart %d of %d), %s", why, j.gen, j.cfg.MaxRestarts, from)
	if j.verbose {
		j.out.report("%s", j.prog.table())
	}
	// Every host runs ranks again: its heartbeats are watched again
	// (checkHosts skips hosts whose ranks are done) and its agent's end is
	// a failure again (onAgentExit).
	for r := range j.rankEnded {
		j.rankEnded[r] = false
	}
	j.ranksEnded = 0
	j.fences.SetEpoch(j.epoch)
	j.broadcast(&wire.Control{Op: wire.OpRestart, Gen: j.gen, Epoch: j.epoch, G: g})
	if j.rv.Advance(j.epoch) == nil {
		j.log.Warn("could not publish the restart's epoch table")
	}
}
