package launcher

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// placeRedundancy plans how every rank's protected state survives lost
// hosts, once, at the job's start (a hot swap keeps the plan, changing
// only the lost host): with --redundancy ec:K+M the erasure-coding groups
// (placeEC), otherwise --replicas holders on other hosts of each rank's
// data-parallel group (topology.Place). It runs after j.hosts and
// j.rankHost are set.
func (j *job) placeRedundancy(assign []topology.Assignment) error {
	if j.cfg.ECK > 0 {
		return j.placeEC()
	}
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

// placeEC plans the erasure-coding groups of --redundancy ec:K+M over the
// hosts that run ranks (topology.PlanEC, with job host indices; across
// racks when the hostfile names any) into j.ecGroups, and their clear
// copies into j.holders (clearCopyHolders); in diff mode also every
// rank's log-only holders into j.logs (topology.ECLogHolders), which a hot
// swap keeps with the places (the machine's splice), never re-plans. A
// plan that cannot be made is a ConfigError that says why: it was asked
// for explicitly.
func (j *job) placeEC() error {
	hosts := make([]topology.Host, len(j.hosts))
	spread := false
	for i, h := range j.hosts {
		hosts[i] = h.topo
		spread = spread || h.topo.Rack != ""
	}
	assign := make([]topology.Assignment, len(j.rankHost))
	for r, h := range j.rankHost {
		assign[r] = topology.Assignment{Rank: r, Host: h}
	}
	code := topology.Redundancy{ECK: j.cfg.ECK, ECM: j.cfg.ECM}
	groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: j.cfg.ECK, M: j.cfg.ECM, Spread: spread})
	if err != nil {
		why := strings.TrimPrefix(err.Error(), topology.ErrECGroups.Error()+": ")
		return &ConfigError{Msg: fmt.Sprintf("--redundancy %s: %s", code, why), Err: err}
	}
	j.ecGroups = groups
	j.holders = clearCopyHolders(groups, j.rankHost, j.placement())
	if j.diffEC() {
		j.logs = topology.ECLogHolders(groups, j.rankHost, j.placement())
	}
	return nil
}

// diffEC reports whether the job runs --protect-mode diff under an
// erasure code: only base steps are coded, H is tracked beside G, and
// every table carries the log-only holders and H.
func (j *job) diffEC() bool {
	return j.cfg.ECK > 0 && j.cfg.ProtectMode == ModeDiff
}

// epochH is H for an epoch table resuming from g in diff mode under EC:
// the newest coded base every rank has that is not above g (-1: none);
// 0 in other modes. It is always a base step every rank coded, never g
// itself when H is above it (progress.hAtMost).
func (j *job) epochH(g int64) int64 {
	if !j.diffEC() {
		return 0
	}
	return j.prog.hAtMost(max(g, -1))
}

// clearCopyHolders returns the holders of the clear copies of an
// erasure-coded job (wire.EpochTable.EC): each rank of data group j of a
// group is held by the lowest rank on the group's data host Data[j],
// unless it runs there itself (then it has no holder). rankHost maps a
// rank to its host, hostRanks a host to its ranks. A data host without
// ranks (a vacant role) holds nothing.
func clearCopyHolders(groups []topology.ECGroup, rankHost []int, hostRanks [][]int) [][]int {
	holders := make([][]int, len(rankHost))
	for _, g := range groups {
		for d, dg := range g.DataGroups {
			host := g.Data[d]
			if host < 0 || host >= len(hostRanks) || len(hostRanks[host]) == 0 {
				continue
			}
			holder := slices.Min(hostRanks[host])
			for _, r := range dg {
				if rankHost[r] != host {
					holders[r] = []int{holder}
				}
			}
		}
	}
	return holders
}

// reportSurvives says, with -v, what the job's redundancy survives: on
// the terminal where its state has copies on other hosts, in the log
// otherwise (a one-host job).
func (j *job) reportSurvives() {
	if !j.verbose {
		return
	}
	if j.ecGroups == nil && !slices.ContainsFunc(j.holders, func(hs []int) bool { return len(hs) > 0 }) {
		j.log.Debug("state protection", "survives", j.survives())
		return
	}
	j.out.report("state protection: %s", j.survives())
}

// survives states what the job's redundancy in place survives
// (redundancyText): topology.SurvivesEC or topology.SurvivesReplicas.
func (j *job) survives() string {
	if j.ecGroups != nil {
		return topology.SurvivesEC(j.ecGroups, nil)
	}
	return topology.SurvivesReplicas(j.replicasInPlace(), j.rankHost, j.holders)
}

// ecTable returns the epoch table's erasure-coding layout, from j.ecGroups
// (nil without EC): every table the job publishes takes it from here.
func (j *job) ecTable() *wire.ECTable {
	return ecTable(j.cfg.ECK, j.cfg.ECM, j.ecGroups)
}

// ecTable returns groups as an epoch table carries them (nil for none).
func ecTable(k, m int, groups []topology.ECGroup) *wire.ECTable {
	if len(groups) == 0 {
		return nil
	}
	t := &wire.ECTable{K: k, M: m, Groups: make([]wire.ECGroupRow, len(groups))}
	for i, g := range groups {
		row := &t.Groups[i]
		row.Hosts, row.Data, row.Parity = slices.Clone(g.Hosts), slices.Clone(g.Data), slices.Clone(g.Parity)
		row.DataGroups = make([][]int, len(g.DataGroups))
		for d, dg := range g.DataGroups {
			row.DataGroups[d] = slices.Clone(dg)
		}
	}
	return t
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
