package plan

import (
	"fmt"

	"github.com/gorun/gorun/topology"
)

// ECFlows is what gorun's erasure coding moves for one group of K+M hosts,
// each running RanksPerHost ranks, in units of one rank's shard m, as the
// wire protocol does it (protect/PROTOCOL.md "Erasure coding" and "Restore"):
//
//   - per committed step, each rank computes its share of each of the M
//     parity rows, every share as long as its shard (ckpt.Codec.Share),
//     and sends it to the row's host (internal/keeper/ecsend.go: the M senders, one
//     per row, each on its own link) unless that host is its own; and it
//     sends a clear copy of its shard to its data group's data host
//     unless it runs there (the row's host receives every other member's
//     share: a parity host receives the most);
//   - a rank on a lost host is restored directly from its clear copy (m)
//     when that copy lives on another host, and rebuilt from K shards of
//     its stripe (K·m into the spare) when its own host was its data host
//     ("Decode").
//
// The hosts' roles are those topology.PlanEC plans, as gorun run plans
// them.
type ECFlows struct {
	// Sent and Received are the most any host of the group sends and
	// receives per step (shards).
	Sent, Received int
	// Restore is the mean over the group's hosts of the shards the spare
	// of a lost host reads (a failure strikes any host alike);
	// RestoreMax the most.
	Restore    float64
	RestoreMax int
}

// ecGroup plans in's layout as gorun run would (topology.PlanEC), every
// host running in.RanksPerHost ranks: all groups are then alike, so it
// returns the first. A host count that does not form whole groups is
// refused by PlanEC over all the hosts (one rank each: PlanEC checks the
// host count before any group's ranks); a group whose ranks do not cut
// into K equal data groups by PlanEC over that group. Errors wrap
// topology.ErrECGroups.
func ecGroup(in Inputs) (topology.ECGroup, error) {
	r := in.Redundancy
	opt := topology.ECOptions{K: r.ECK, M: r.ECM}
	size := r.ECK + r.ECM
	if in.Hosts < size || in.Hosts%size != 0 {
		hosts, assign := layout(in.Hosts, 1)
		_, err := topology.PlanEC(hosts, assign, opt)
		if err == nil { // PlanEC refuses such a count
			err = fmt.Errorf("%w: %d hosts do not form groups of %d", topology.ErrECGroups, in.Hosts, size)
		}
		return topology.ECGroup{}, err
	}
	hosts, assign := layout(size, in.RanksPerHost)
	groups, err := topology.PlanEC(hosts, assign, opt)
	if err != nil {
		return topology.ECGroup{}, err
	}
	return groups[0], nil
}

// layout is n hosts running r ranks each, ranks host by host.
func layout(n, r int) ([]topology.Host, []topology.Assignment) {
	hosts := make([]topology.Host, n)
	assign := make([]topology.Assignment, 0, n*r)
	for h := range hosts {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: r}
		for l := range r {
			assign = append(assign, topology.Assignment{Rank: h*r + l, Host: h, LocalRank: l})
		}
	}
	return hosts, assign
}

// Flows counts g's traffic per step and restores, as [ECFlows] says.
func Flows(g topology.ECGroup) ECFlows {
	m := len(g.Parity)
	k := len(g.Data)
	dataHost := map[int]int{}
	for j, dg := range g.DataGroups {
		for _, r := range dg {
			dataHost[r] = g.Data[j]
		}
	}
	sent, recv, restore := map[int]int{}, map[int]int{}, map[int]int{}
	for i, ws := range g.Workers {
		h := g.Hosts[i]
		for _, r := range ws {
			for j := range m {
				if p := g.Parity[j]; p != h {
					sent[h]++
					recv[p]++
				}
			}
			if d := dataHost[r]; d != h {
				sent[h]++
				recv[d]++
				restore[h]++ // direct, from the clear copy
			} else {
				restore[h] += k // decode from K shards
			}
		}
	}
	var f ECFlows
	total := 0
	for _, h := range g.Hosts {
		f.Sent = max(f.Sent, sent[h])
		f.Received = max(f.Received, recv[h])
		f.RestoreMax = max(f.RestoreMax, restore[h])
		total += restore[h]
	}
	f.Restore = float64(total) / float64(len(g.Hosts))
	return f
}
