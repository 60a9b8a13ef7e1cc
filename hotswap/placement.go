package hotswap

import (
	"fmt"
	"slices"
)

// Where a lost host's ranks and their copies go: the replacement host
// (replacement, canHold), holders re-placed off their owner's host
// (fixHolders), and the restore plan of an epoch with the invariants it
// must keep (plan, violation).

// replacement chooses the host that takes over the ranks of lost host h:
// a registered idle spare with room, preferring one outside the failure
// domains of the ranks' replica holders, else (free-slots) a surviving
// host with room where every rank can keep its replicas on other hosts.
// Under EC the domains avoided are those of the surviving hosts of h's
// groups, and a free-slots host outside h's groups is preferred (inside,
// it holds two places, and the group survives one loss less).
func (m *Machine) replacement(h int, moved []int) (int, bool, string) {
	avoid := map[string]bool{}
	inGroup := map[int]bool{}
	if m.ec != nil {
		for _, g := range m.ec.groups {
			if !slices.Contains(g.Hosts, h) {
				continue
			}
			for _, x := range g.Hosts {
				inGroup[x] = true
				if d := m.domain[x]; d != "" && x != h && m.alive[x] {
					avoid[d] = true
				}
			}
		}
	} else if m.holders != nil {
		for _, r := range moved {
			for _, x := range m.holders[r] {
				if d := m.domain[m.rankHost[x]]; d != "" {
					avoid[d] = true
				}
			}
		}
	}
	best, bestOut := -1, false
	for s := range m.spare {
		if !m.spare[s] || !m.healthy(s) || !m.cfg.fits(s, 0, len(moved)) {
			continue
		}
		out := m.domain[s] == "" || !avoid[m.domain[s]]
		if best < 0 || out && !bestOut {
			best, bestOut = s, out
		}
	}
	if best >= 0 {
		return best, true, ""
	}
	noSpare := "no spare host is left"
	if n := m.spares(); n > 0 {
		noSpare = fmt.Sprintf("no healthy registered spare has %d free slots", len(moved))
	}
	if m.cfg.OnNoSpare == OnNoSpareAbort {
		return -1, false, noSpare + " (--on-no-spare abort)"
	}
	room, fit, bestApart := false, false, false
	var faulty []int // hosts with room but a GPU fault kept (onGPU)
	for s := range m.alive {
		if s == h || m.spare[s] || !m.cfg.fits(s, len(m.hostRanks[s]), len(moved)) {
			continue
		}
		if !m.healthy(s) {
			if m.alive[s] && m.faulty[s] != nil {
				faulty = append(faulty, s)
			}
			continue
		}
		room = true
		if !m.canHold(s, h, moved) {
			continue
		}
		out := m.domain[s] == "" || !avoid[m.domain[s]]
		apart := !inGroup[s]
		if !fit || apart && !bestApart || apart == bestApart && out && !bestOut {
			best, bestOut, bestApart, fit = s, out, apart, true
		}
	}
	switch {
	case fit:
		return best, false, ""
	case room:
		return -1, false, noSpare + fmt.Sprintf("; the hosts with %d free slots could not keep every rank's replicas on another host", len(moved))
	}
	if len(faulty) > 0 {
		return -1, false, noSpare + fmt.Sprintf(" and no surviving host has %d free slots but %s, whose GPU failed", len(moved), m.hostList(faulty))
	}
	return -1, false, noSpare + fmt.Sprintf(" and no surviving host has %d free slots", len(moved))
}

// canHold reports whether, with moved (from lost host h) on host s, every
// moved rank and every owner on s whose holder moves there can have its
// copies on hosts other than its own.
func (m *Machine) canHold(s, h int, moved []int) bool {
	if m.holders == nil || m.ec != nil {
		return true // under EC the clear copies follow the data hosts (ecSplice)
	}
	need := func(r int) bool {
		k := len(m.holders[r])
		return k == 0 || m.peerHosts(r, s, h, k) >= k
	}
	for _, r := range moved {
		if !need(r) {
			return false
		}
		for _, o := range m.heldBy[r] {
			if m.rankHost[o] == s && !need(o) {
				return false
			}
		}
	}
	return true
}

// peerHosts counts, up to k, the distinct live hosts other than s and h
// that rank r's data-parallel peers run on (peers on h count as on s).
func (m *Machine) peerHosts(r, s, h, k int) int {
	m.stampN++
	if m.stampN == 0 { // wrapped: old stamps could match
		clear(m.stamp)
		m.stampN = 1
	}
	n := 0
	m.eachPeer(r, func(p int) bool {
		ph := m.rankHost[p]
		if ph == h {
			ph = s
		}
		if ph != s && m.alive[ph] && m.stamp[ph] != m.stampN {
			m.stamp[ph] = m.stampN
			n++
		}
		return n < k
	})
	return n
}

// eachPeer calls f for rank r's data-parallel peers in ring order from r
// (same TP/PP coordinate), until f returns false.
func (m *Machine) eachPeer(r int, f func(p int) bool) {
	c := m.layout.Coord(r)
	for i := 1; i < m.layout.DP; i++ {
		c2 := c
		c2.DP = (c.DP + i) % m.layout.DP
		if !f(m.layout.Rank(c2)) {
			return
		}
	}
}

// fixHolders re-places the holders that now share a host with their owner
// or another holder of it, for the moved ranks and the owners whose
// holders moved. A re-placed copy is invalid until re-sent. It returns
// how many were re-placed.
func (m *Machine) fixHolders(moved []int) int {
	if m.holders == nil || m.ec != nil {
		return 0
	}
	n := 0
	for _, r := range moved {
		n += m.fixOwner(r)
		for _, o := range slices.Clone(m.heldBy[r]) {
			n += m.fixOwner(o)
		}
	}
	return n
}

func (m *Machine) fixOwner(o int) int {
	n := 0
	hs := m.holders[o]
	for i, x := range hs {
		if !m.clash(o, i, m.rankHost[x]) {
			continue
		}
		y := -1
		m.eachPeer(o, func(p int) bool {
			if !slices.Contains(hs, p) && m.alive[m.rankHost[p]] && !m.clash(o, i, m.rankHost[p]) {
				y = p
				return false
			}
			return true
		})
		if y < 0 {
			continue // left in place: I3 or the plan reports it
		}
		m.setCopy(o, i, false)
		hs[i] = y
		m.heldBy[x] = slices.DeleteFunc(m.heldBy[x], func(v int) bool { return v == o })
		m.heldBy[y] = append(m.heldBy[y], o)
		n++
	}
	return n
}

// clash reports whether holder i of owner o may not be on host xh: it is
// o's host, or another holder's.
func (m *Machine) clash(o, i, xh int) bool {
	if xh == m.rankHost[o] {
		return true
	}
	for j, y := range m.holders[o] {
		if j != i && m.rankHost[y] == xh {
			return true
		}
	}
	return false
}

// plan says where every rank restores step G from: its own slot when it
// holds its state, else the optimizer shard from a valid copy at a live
// holder (under EC, a decode of its stripe when no copy survives) and
// the parameters from a live data-parallel peer. It returns why a rank
// cannot be restored from memory, if one cannot.
func (m *Machine) plan() ([]Source, string) {
	src := make([]Source, len(m.rankHost))
	for r, h := range m.rankHost {
		src[r] = Source{Rank: r, Local: true, OptRank: r, OptHost: h, ParamsRank: r, ParamsHost: h}
		if m.localOK[r] && m.alive[h] || m.g < 0 {
			continue
		}
		src[r].Local = false
		opt := m.copyHolder(r)
		if opt < 0 && m.ec != nil {
			ok, why := m.decodable(r)
			if !ok {
				return nil, why
			}
			src[r].Decode = true
		}
		if opt < 0 && !src[r].Decode {
			if m.holders == nil {
				return nil, fmt.Sprintf("rank %d's optimizer shard has no copy in memory (no replicas) (I3)", r)
			}
			return nil, m.noValidCopy(r)
		}
		par := -1
		m.eachPeer(r, func(p int) bool {
			if m.localOK[p] && m.alive[m.rankHost[p]] {
				par = p
				return false
			}
			return true
		})
		if par < 0 {
			return nil, fmt.Sprintf("no data-parallel peer of rank %d holds its parameters", r)
		}
		src[r].OptRank, src[r].OptHost = -1, -1
		if opt >= 0 {
			src[r].OptRank, src[r].OptHost = opt, m.rankHost[opt]
		}
		src[r].ParamsRank, src[r].ParamsHost = par, m.rankHost[par]
	}
	return src, ""
}

// violation checks invariants I1–I4 for the epoch about to be published,
// restored from sources, and says which one fails, or "".
func (m *Machine) violation(sources []Source) string {
	n := len(m.rankHost)
	// I1: every rank on one live host, no host over its room.
	load := make([]int, len(m.names))
	for r, h := range m.rankHost {
		if h < 0 || h >= len(m.names) || !m.alive[h] {
			return fmt.Sprintf("I1: rank %d is on a host that is not alive", r)
		}
		load[h]++
	}
	for h, l := range load {
		if room := m.cfg.room(h); room > 0 && l > room {
			return fmt.Sprintf("I1: host %s has %d ranks for %d slots", m.names[h], l, room)
		}
	}
	// I2: the host lists and the table agree: one owner per shard.
	seen := make([]bool, n)
	total := 0
	for h, rs := range m.hostRanks {
		for _, r := range rs {
			if r < 0 || r >= n || seen[r] || m.rankHost[r] != h {
				return fmt.Sprintf("I2: rank %d's shard has no single owner", r)
			}
			seen[r] = true
			total++
		}
	}
	if total != n {
		return fmt.Sprintf("I2: %d of %d shards have an owner", total, n)
	}
	// I3: every optimizer shard recoverable from memory: the plan's
	// sources are live and hold the state.
	if m.g >= 0 {
		for r, src := range sources {
			h := m.rankHost[r]
			switch {
			case src.Rank != r:
				return fmt.Sprintf("I3: rank %d has no restore source", r)
			case src.Local && (!m.localOK[r] || !m.alive[h]):
				return fmt.Sprintf("I3: rank %d's own slot does not hold its state", r)
			case src.Decode:
				if m.ec == nil {
					return fmt.Sprintf("I3: rank %d decodes without erasure coding", r)
				}
				if ok, why := m.decodable(r); !ok {
					return "I3: " + why
				}
				if !m.alive[src.ParamsHost] || m.rankHost[src.ParamsRank] != src.ParamsHost || !m.localOK[src.ParamsRank] {
					return fmt.Sprintf("I3: rank %d's parameters are not recoverable from memory", r)
				}
			case !src.Local && (!m.alive[src.OptHost] || m.rankHost[src.OptRank] != src.OptHost || !m.alive[src.ParamsHost] || !m.localOK[src.ParamsRank]):
				return fmt.Sprintf("I3: rank %d's optimizer shard is not recoverable from memory", r)
			}
		}
	}
	// I4: no rank resumes past what it committed.
	for r, s := range m.lastStep {
		if s >= 0 && m.g > s {
			return fmt.Sprintf("I4: resume step %d is past rank %d's committed step %d", m.g, r, s)
		}
	}
	return ""
}
