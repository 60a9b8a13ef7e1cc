package hotswap

import (
	"fmt"
	"slices"

	"github.com/gorun/gorun/topology"
)

// Diff mode under erasure coding (Config.Diff with Config.EC).
//
// Parity cannot absorb a differential, so only base steps are coded: the
// rows hold the stripe's shares of H, the newest base every rank has
// coded, and member x's shard at H is kept on its data host Data[x] (its
// clear copy's holder's store, pinned at H, or, for a rank that runs on
// its data host, its own retained snapshot of H). The differentials after
// H are kept on M hosts other than the rank's own: its clear copy's holder
// and its log-only holders (logs). A lost rank whose clear copy is gone
// too is decoded at H and replays its differentials (H, G] from a copy of
// its log, so its decode needs both K valid shards of its stripe at H and
// one live, valid copy of its log.
//
// Validity follows the same rule as the other roles: a copy on a lost
// host is gone; a replacement's copies (the spare takes the lost host's
// place in every role, logs included) are invalid until the owner
// reports Replicated. A replacement holds each owner's state only from
// the epoch's G on (the new placement codes its first base there), and
// decodes happen at H, which stays at the old placement's base until the
// last rank codes G: so under diff mode and EC the caller reports
// Replicated for its under-protected owners only once H >= the epoch's G
// (every rank coded its base at G under the epoch's placement; the
// launcher: job.reprotected), never for one owner whose own base reached
// G. Until then the roles at H are the old placement's, on the surviving
// old hosts. With free slots (no spare), a lost host's log roles become
// vacant: the rank keeps fewer copies of its log, and its group survives
// fewer losses (tolerance).

// diffEC reports whether the job runs diff mode under erasure coding.
func (m *Machine) diffEC() bool { return m.ec != nil && m.cfg.Diff }

// initDiff sets up the log-only holders (c.Logs, or as topology.ECLogHolders
// places them), every copy valid.
func (m *Machine) initDiff(c Config) {
	logs := c.Logs
	if logs == nil {
		logs = topology.ECLogHolders(c.EC, m.rankHost, m.hostRanks)
	}
	n := len(m.rankHost)
	m.logs, m.logOK, m.retained = make([][]int, n), make([][]bool, n), make([]bool, n)
	for r := range n {
		m.logs[r] = slices.Clone(logs[r])
		m.logOK[r] = make([]bool, len(logs[r]))
		for i := range m.logOK[r] {
			m.logOK[r][i] = true
		}
		m.retained[r] = true
	}
}

// dataHost is rank r's data host: Data[x] of its group, x its member
// index.
func (m *Machine) dataHost(r int) int {
	p := m.ec.at[r]
	return m.ec.groups[p.group].Data[p.member]
}

// setLog marks rank o's log copy at log-only holder i valid or not.
func (m *Machine) setLog(o, i int, ok bool) {
	if m.logOK[o][i] == ok {
		return
	}
	m.logOK[o][i] = ok
	m.countMissing(o, ok)
}

// setRetained marks rank r's own retained base snapshot (kept when it
// runs on its data host) valid or not.
func (m *Machine) setRetained(r int, ok bool) {
	if m.retained[r] == ok {
		return
	}
	m.retained[r] = ok
	m.countMissing(r, ok)
}

// memberShard reports whether member y's shard at H is valid: its data
// host is alive and keeps it (y's clear copy there is valid, or y runs
// there and its retained snapshot is). Its own slot does not count: it
// holds G, not H.
func (m *Machine) memberShard(y int) bool {
	d := m.dataHost(y)
	switch {
	case !m.alive[d]:
		return false
	case m.rankHost[y] == d:
		return m.retained[y]
	case len(m.holders[y]) == 0:
		return false // a vacant data place keeps nothing
	}
	return m.copyOK[y][0] && m.rankHost[m.holders[y][0]] == d
}

// logCopy reports whether a live host keeps a valid copy of rank r's
// differentials after H: its clear copy's holder, or a log-only holder.
func (m *Machine) logCopy(r int) bool {
	if m.copyHolder(r) >= 0 {
		return true
	}
	for i, x := range m.logs[r] {
		if m.logOK[r][i] && m.alive[m.rankHost[x]] {
			return true
		}
	}
	return false
}

// logHosts counts the live hosts that keep a valid copy of rank r's log.
func (m *Machine) logHosts(r int) int {
	var hs []int
	if x := m.copyHolder(r); x >= 0 {
		hs = append(hs, m.rankHost[x])
	}
	for i, x := range m.logs[r] {
		if h := m.rankHost[x]; m.logOK[r][i] && m.alive[h] && !slices.Contains(hs, h) {
			hs = append(hs, h)
		}
	}
	return len(hs)
}

// noLogText says why rank r cannot replay after a decode (I3).
func (m *Machine) noLogText(r int) string {
	clear := "none"
	if len(m.holders[r]) > 0 {
		clear = ints(m.holders[r])
	}
	return fmt.Sprintf("rank %d's differentials after the newest coded base have no valid copy left in memory (clear copy's holder %s, log holders %s) (I3)",
		r, clear, ints(m.logs[r]))
}

// diffHostLost marks what lost host h kept of diff mode's: the log copies
// of its ranks as log-only holders, and the retained snapshots of its
// ranks that run on their data host. Called before its ranks move.
func (m *Machine) diffHostLost(h int) {
	for o, ls := range m.logs {
		for i, x := range ls {
			if m.rankHost[x] == h {
				m.setLog(o, i, false)
			}
		}
	}
	for _, r := range m.hostRanks[h] {
		if len(m.holders[r]) == 0 {
			m.setRetained(r, false)
		}
	}
}

// diffSplice follows a splice of lost host h's ranks, moved, onto host
// with (ecSplice has moved the places and the clear copies' holders): a
// moved rank that now runs on its data host has no retained snapshot
// yet; with free slots (not spare) the lost host's log roles become
// vacant; and a log copy left on the owner's own host, or on a host that
// keeps another copy of its log, is dropped (it would not survive apart).
func (m *Machine) diffSplice(h, with int, moved []int, spare bool) {
	for _, r := range moved {
		if len(m.holders[r]) == 0 {
			m.setRetained(r, false)
		}
	}
	for r := range m.rankHost {
		if len(m.holders[r]) > 0 {
			m.setRetained(r, true) // it has a clear copy's holder: nothing of its own to keep
		}
	}
	for o := range m.logs {
		taken := []int{m.rankHost[o]}
		if len(m.holders[o]) > 0 {
			taken = append(taken, m.rankHost[m.holders[o][0]])
		}
		keep := m.logs[o][:0]
		keepOK := m.logOK[o][:0]
		for i, x := range m.logs[o] {
			hx := m.rankHost[x]
			if !spare && slices.Contains(moved, x) || slices.Contains(taken, hx) {
				if !m.logOK[o][i] {
					m.countMissing(o, true) // a vacant role is not missing
				}
				continue
			}
			taken = append(taken, hx)
			keep, keepOK = append(keep, x), append(keepOK, m.logOK[o][i])
		}
		m.logs[o], m.logOK[o] = keep, keepOK
	}
}

// diffReplicated marks every role of owner o on a live host valid: H
// reached the epoch's G, so every role holds o's state at H (see the top
// of this file).
func (m *Machine) diffReplicated(o int) {
	for i, x := range m.logs[o] {
		if m.alive[m.rankHost[x]] {
			m.setLog(o, i, true)
		}
	}
	if len(m.holders[o]) == 0 && m.alive[m.rankHost[o]] {
		m.setRetained(o, true)
	}
}

// logTolerance is how many more host losses the logs of group g's ranks
// survive: the fewest live hosts keeping a valid copy of one rank's log
// (its decode needs one; losing them all and its own host loses it), and
// the ranks with that few.
func (m *Machine) logTolerance(g int) (int, []int) {
	low := m.ec.m
	var short []int
	for _, dg := range m.ec.groups[g].DataGroups {
		for _, r := range dg {
			n := m.logHosts(r)
			switch {
			case n < low:
				low, short = n, []int{r}
			case n == low && n < m.ec.m:
				short = append(short, r)
			}
		}
	}
	slices.Sort(short)
	return low, short
}
