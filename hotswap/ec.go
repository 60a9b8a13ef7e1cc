package hotswap

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gorun/gorun/topology"
)

// Erasure coding (Config.EC, --redundancy ec:K+M).
//
// Each group of K data and M parity hosts protects its ranks in stripes:
// stripe i is the K ranks DataGroups[0..K)[i], member x of it is
// DataGroups[x][i]. Member x's shard (its optimizer shard and meta) is in
// three kinds of places: its own slot, a clear copy on data host Data[x]
// (an ordinary replica, holders[r]; none when the rank runs on Data[x]),
// and in each parity row j on Parity[j], as one of the K shares XORed
// into it. A stripe decodes while any K of its K+M shards are valid: a
// member's when its own slot or its clear copy is, row j's when its host
// is alive and every member's share of it is in (shareOK).
//
// Roles stay with places: after a splice the replacement takes the lost
// host's place and role (topology.ECGroup.Replace). It holds nothing yet:
// its clear copies and shares were marked invalid when the host was lost,
// and become valid once their owners report Replicated (which, under EC
// in full mode, means the clear copy and every parity share of G are in,
// in the new epoch; in diff mode, that H reached the epoch's G: see
// ecdiff.go). Until then the shards they stand for do not count toward K.
//
// The decision is exact per stripe, where topology.ECLoss is the same
// decision by hosts: both agree while no host holds two places of a
// group, and only the count by shards stays right when one does (a
// free-slots splice into the lost host's own group).

// ecState is the machine's view of the erasure code.
type ecState struct {
	groups []topology.ECGroup // the current groups (Replace'd by each splice)
	k, m   int
	at     []ecPos  // per rank: its group, member index and stripe
	share  [][]bool // share[r][j]: rank r's share is in parity row j of its group
	// standsFor[h]: the lost host whose places host h took (-1: none).
	standsFor []int
}

// ecPos is a rank's place in the code.
type ecPos struct{ group, member, stripe int }

// newECState returns the state of groups (valid: Config.validate), every
// share in.
func newECState(groups []topology.ECGroup, world, hosts int) *ecState {
	e := &ecState{groups: make([]topology.ECGroup, len(groups)), at: make([]ecPos, world), share: make([][]bool, world),
		standsFor: make([]int, hosts)}
	for h := range e.standsFor {
		e.standsFor[h] = -1
	}
	for gi, g := range groups {
		e.groups[gi] = cloneGroup(g)
		e.k, e.m = len(g.Data), len(g.Parity)
		for x, dg := range g.DataGroups {
			for i, r := range dg {
				e.at[r] = ecPos{group: gi, member: x, stripe: i}
				e.share[r] = make([]bool, len(g.Parity))
				for j := range e.share[r] {
					e.share[r][j] = true
				}
			}
		}
	}
	return e
}

func cloneGroup(g topology.ECGroup) topology.ECGroup {
	c := g
	c.Hosts, c.Data, c.Parity = slices.Clone(g.Hosts), slices.Clone(g.Data), slices.Clone(g.Parity)
	c.Workers, c.DataGroups = cloneRows(g.Workers), cloneRows(g.DataGroups)
	return c
}

func cloneRows[T any](rows [][]T) [][]T {
	out := make([][]T, len(rows))
	for i, r := range rows {
		out[i] = slices.Clone(r)
	}
	return out
}

// stripe returns the members of stripe i of group g, member order.
func (e *ecState) stripe(g, i int) []int {
	dg := e.groups[g].DataGroups
	out := make([]int, len(dg))
	for x := range dg {
		out[x] = dg[x][i]
	}
	return out
}

// ecHolder is the rank that keeps rank r's clear copy: the lowest rank on
// r's data host, or -1 when r runs there itself.
func (m *Machine) ecHolder(r int) int {
	p := m.ec.at[r]
	d := m.ec.groups[p.group].Data[p.member]
	if m.rankHost[r] == d {
		return -1
	}
	low := -1
	for _, x := range m.hostRanks[d] {
		if low < 0 || x < low {
			low = x
		}
	}
	return low
}

// ecHolders returns every rank's clear-copy holders (Config.Holders under
// EC) for the current placement.
func (m *Machine) ecHolders() [][]int {
	hs := make([][]int, len(m.rankHost))
	for r := range hs {
		if x := m.ecHolder(r); x >= 0 {
			hs[r] = []int{x}
		}
	}
	return hs
}

// direct reports whether rank r's state at G is somewhere in the clear:
// in its own slot on a live host, or in a valid clear copy on a live host.
func (m *Machine) direct(r int) bool {
	if m.localOK[r] && m.alive[m.rankHost[r]] {
		return true
	}
	return m.copyHolder(r) >= 0
}

// copyHolder returns a live holder of a valid copy of rank r's optimizer
// shard, or -1.
func (m *Machine) copyHolder(r int) int {
	if m.holders == nil {
		return -1
	}
	for i, x := range m.holders[r] {
		if m.copyOK[r][i] && m.alive[m.rankHost[x]] {
			return x
		}
	}
	return -1
}

// rowOK reports whether parity row j of stripe members is valid: its
// host is alive and every member's share is in.
func (m *Machine) rowOK(g int, members []int, j int) bool {
	if !m.alive[m.ec.groups[g].Parity[j]] {
		return false
	}
	for _, r := range members {
		if !m.ec.share[r][j] {
			return false
		}
	}
	return true
}

// decodable says whether rank r's state can be rebuilt from its stripe
// (at least K of the stripe's K+M shards valid), and if not why, naming
// the group, the stripe and the hosts lost or not yet re-protected.
func (m *Machine) decodable(r int) (bool, string) {
	p := m.ec.at[r]
	members := m.ec.stripe(p.group, p.stripe)
	have := 0
	for _, x := range members {
		if m.diffEC() && m.memberShard(x) || !m.diffEC() && m.direct(x) {
			have++
		}
	}
	for j := range m.ec.m {
		if m.rowOK(p.group, members, j) {
			have++
		}
	}
	if have >= m.ec.k {
		if m.diffEC() && !m.logCopy(r) {
			return false, m.noLogText(r)
		}
		return true, ""
	}
	return false, fmt.Sprintf("rank %d's optimizer shard has no valid copy left in memory and cannot be decoded: stripe %d (ranks %s) of erasure-coding group %d (hosts %s) has %d of the %d shards it needs; %s (I3)",
		r, p.stripe, ints(members), p.group, m.hostNames(m.ec.groups[p.group].Hosts), have, m.ec.k, m.ecLostText(p.group))
}

// ecLostText names the hosts of group g that are lost, or that hold a
// place whose copies or shares are not re-sent yet.
func (m *Machine) ecLostText(g int) string {
	var lost []int
	var stale []string
	for _, h := range m.ec.groups[g].Hosts {
		switch {
		case !m.alive[h]:
			lost = append(lost, h)
		case !m.placeValid(g, h):
			// A replacement stands for the hosts lost before it.
			for x := m.ec.standsFor[h]; x >= 0 && !slices.Contains(lost, x); x = m.ec.standsFor[x] {
				lost = append(lost, x)
			}
			stale = append(stale, m.names[h])
		}
	}
	var parts []string
	if len(lost) > 0 {
		parts = append(parts, "lost: "+m.hostNames(lost))
	}
	if len(stale) > 0 {
		parts = append(parts, "their replacements not yet re-protected: "+strings.Join(stale, ","))
	}
	if len(parts) == 0 {
		return "no host of it is lost"
	}
	return strings.Join(parts, "; ")
}

func (m *Machine) hostNames(hs []int) string {
	ns := make([]string, len(hs))
	for i, h := range hs {
		ns[i] = hostName(m.names, h)
	}
	return strings.Join(ns, ",")
}

// placeValid reports whether every place host h holds in group g holds
// what it stands for: as data host x, a valid clear copy of each member
// of DataGroups[x] that runs elsewhere; as parity host j, every share of
// row j.
func (m *Machine) placeValid(g, h int) bool {
	gr := m.ec.groups[g]
	for x, d := range gr.Data {
		if d != h {
			continue
		}
		for _, r := range gr.DataGroups[x] {
			if len(m.holders[r]) > 0 && !m.copyOK[r][0] || m.diffEC() && len(m.holders[r]) == 0 && !m.retained[r] {
				return false
			}
		}
	}
	for j, ph := range gr.Parity {
		if ph != h {
			continue
		}
		for _, dg := range gr.DataGroups {
			for _, r := range dg {
				if !m.ec.share[r][j] {
					return false
				}
			}
		}
	}
	return true
}

// setShare marks rank r's share in parity row j in or not.
func (m *Machine) setShare(r, j int, ok bool) {
	if m.ec.share[r][j] == ok {
		return
	}
	m.ec.share[r][j] = ok
	m.countMissing(r, ok)
}

// countMissing counts one of r's copies or shares back in (ok) or out.
func (m *Machine) countMissing(r int, ok bool) {
	if ok {
		m.missing[r]--
		if m.missing[r] == 0 {
			m.under--
		}
	} else {
		m.missing[r]++
		if m.missing[r] == 1 {
			m.under++
		}
	}
}

// ecHostLost marks the parity rows host h held lost: every share of them
// must be sent again.
func (m *Machine) ecHostLost(h int) {
	if m.diffEC() {
		m.diffHostLost(h)
	}
	for gi, g := range m.ec.groups {
		for j, ph := range g.Parity {
			if ph != h {
				continue
			}
			for _, dg := range m.ec.groups[gi].DataGroups {
				for _, r := range dg {
					m.setShare(r, j, false)
				}
			}
		}
	}
}

// ecSplice gives host with the places of lost host h in every group
// (topology.ECGroup.Replace) and moves the clear-copy holders where the
// placement now puts them (a free-slots host may run a rank on its own
// data host, or have a lower rank than the moved ones). A new holder
// holds nothing yet. In diff mode the log roles follow (diffSplice):
// moved are the ranks that moved, spare whether with is a spare. It
// returns how many holders moved.
func (m *Machine) ecSplice(h, with int, moved []int, spare bool) int {
	for gi, g := range m.ec.groups {
		if slices.Contains(g.Hosts, h) {
			m.ec.groups[gi] = g.Replace(h, with)
		}
	}
	if m.ec.standsFor[with] < 0 { // a free-slots host keeps its own story
		m.ec.standsFor[with] = h
	}
	n := 0
	for r := range m.rankHost {
		want := m.ecHolder(r)
		old := m.holders[r]
		if len(old) == 1 && old[0] == want || len(old) == 0 && want < 0 {
			continue
		}
		for i, x := range old {
			m.setCopy(r, i, true) // the dropped copy is no longer missing
			m.heldBy[x] = slices.DeleteFunc(m.heldBy[x], func(v int) bool { return v == r })
		}
		m.holders[r], m.copyOK[r] = nil, nil
		if want >= 0 {
			m.holders[r], m.copyOK[r] = []int{want}, []bool{true}
			m.heldBy[want] = append(m.heldBy[want], r)
			m.setCopy(r, 0, false)
		}
		n++
	}
	if m.diffEC() {
		m.diffSplice(h, with, moved, spare)
	}
	return n
}

// tolerance is how many more host losses group g survives whichever
// hosts they are: M less its places that hold nothing valid yet (a lost
// host's, or a replacement's before its copies and shares are re-sent),
// less the extra places of hosts holding more than one; in diff mode no
// more than its ranks' logs survive (logTolerance).
func (m *Machine) tolerance(g int) int {
	gr := m.ec.groups[g]
	left := m.ec.m
	places := map[int]int{}
	for _, h := range gr.Hosts {
		places[h]++
	}
	var counts []int
	for h, n := range places {
		if !m.alive[h] || !m.placeValid(g, h) {
			left -= n
			continue
		}
		counts = append(counts, n)
	}
	slices.Sort(counts)
	t := 0
	for i := len(counts) - 1; i >= 0 && counts[i] <= left; i-- {
		left -= counts[i]
		t++
	}
	if m.diffEC() {
		lt, _ := m.logTolerance(g)
		t = min(t, lt)
	}
	return t
}

// ecReport describes the groups that survive fewer than M more host
// losses, or "" if none does.
func (m *Machine) ecReport() string {
	var parts []string
	for g, gr := range m.ec.groups {
		t := m.tolerance(g)
		if t >= m.ec.m {
			continue
		}
		msg := fmt.Sprintf("erasure-coding group %d (hosts %s) survives %s, not %d", g, m.hostNames(gr.Hosts), losses(t), m.ec.m)
		var twice []string
		for i, h := range gr.Hosts {
			if n := count(gr.Hosts, h); n > 1 && slices.Index(gr.Hosts, h) == i {
				twice = append(twice, fmt.Sprintf("host %s holds %d of its places", m.names[h], n))
			}
		}
		if m.diffEC() {
			if n, short := m.logTolerance(g); len(short) > 0 {
				twice = append(twice, keepLogs(short, n))
			}
		}
		if len(twice) > 0 {
			msg += " (" + strings.Join(twice, ", ") + ")"
		}
		parts = append(parts, msg)
	}
	return strings.Join(parts, "; ")
}

func losses(n int) string {
	switch n {
	case 0:
		return "no more host loss"
	case 1:
		return "1 more host loss"
	}
	return fmt.Sprintf("%d more host losses", n)
}

// keepLogs says that ranks keep their differentials after the newest
// coded base on only n live hosts: "rank 3 keeps its differentials on 1
// host", "ranks 1, 3 keep their differentials on 2 hosts".
func keepLogs(ranks []int, n int) string {
	hosts := "hosts"
	if n == 1 {
		hosts = "host"
	}
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d keeps its differentials on %d %s", ranks[0], n, hosts)
	}
	return fmt.Sprintf("ranks %s keep their differentials on %d %s", ints(ranks), n, hosts)
}

// ecString prints groups for a PublishEpoch: group:data/parity hosts.
func ecString(groups []topology.ECGroup, names []string) string {
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = fmt.Sprintf("%d:d=%s,p=%s", i, hostList(g.Data, names), hostList(g.Parity, names))
	}
	return strings.Join(parts, " ")
}

func hostList(hs []int, names []string) string {
	ns := make([]string, len(hs))
	for i, h := range hs {
		ns[i] = hostName(names, h)
	}
	return strings.Join(ns, "+")
}

func count(xs []int, x int) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}
