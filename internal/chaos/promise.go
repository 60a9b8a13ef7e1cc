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
// (rank/restore.go: "not here ..., and not from other hosts").
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
