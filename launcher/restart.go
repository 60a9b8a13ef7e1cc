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
