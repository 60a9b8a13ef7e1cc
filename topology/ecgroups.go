package topology

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Erasure-coding groups, after ECHECK (Qi et al., "ECHECK: Enhancing
// In-Memory Checkpoint with Erasure Coding in Distributed DNN Training").
//
// The hosts that have ranks are cut into groups of K data hosts and M
// parity hosts. In a group of W ranks the ranks, in worker order (host by
// host in group order, each host's ranks ascending), are cut into K equal
// data groups; data group j is stored in the clear by data host Data[j].
// Reduction group i is the K ranks at index i of the K data groups; each of
// its M parity packets (one per parity row) is the XOR of the members'
// encoded packets, reduced onto a target member and then sent to the parity
// host of that row. Any M failed hosts of a group can then be recovered
// from the others.

// ErrECGroups: hosts and ranks cannot be planned into erasure-coding groups
// as asked (bad K or M, a host count or rank count that does not divide,
// a malformed assignment).
var ErrECGroups = errors.New("topology: erasure-coding groups")

// ECOptions: K data hosts and M parity hosts per group (K >= 1, M >= 1).
// Spread: when true, the hosts of a group are taken from distinct racks as far as
// possible (hosts ordered round-robin over racks, by first appearance of each rack,
// before being cut into groups), so that a rack failure costs each group as few hosts
// as possible; when false, groups are consecutive hosts in hostfile order.
//
// Hosts without a rack label count as one rack of their own (the rack "").
type ECOptions struct {
	K, M   int
	Spread bool
}

// ECGroup is one erasure-coding group of K+M hosts.
type ECGroup struct {
	Hosts      []int       // host indices (into the hosts slice), the group's nodes, in group order
	Workers    [][]int     // Workers[i]: ranks on Hosts[i], ascending (ECHECK's origin_group)
	DataGroups [][]int     // K equal consecutive slices of the group's ranks in worker order (ECHECK's data_group)
	Data       []int       // Data[j]: host index that stores DataGroups[j] (a data node)
	Parity     []int       // Parity[j]: host index that stores parity row j (the M parity nodes, ascending as PlanEC plans them; Replace keeps each row's place)
	Reductions []Reduction // W/K reduction groups, W = number of ranks in the group
}

// Reduction is one reduction group: the K ranks at the same relative index in the K data groups.
type Reduction struct {
	Members []int // Members[j] = DataGroups[j][i]
	Targets []int // Targets[j]: the member rank where the XOR reduction of parity row j lands (§IV-B2)
}

// PlanEC partitions the hosts that have ranks (per assign; hosts with no
// rank, spares among them, are skipped) into groups of opt.K+opt.M hosts
// and plans each group. It plans a job at its start: after a hot swap,
// [ECGroup.Replace] keeps every group as it was with the spare in the lost
// host's place, where planning again would reorder the hosts.
//
// Groups are consecutive hosts in hostfile order, or with opt.Spread the
// hosts dealt round-robin over their racks first. In each group the data
// hosts are chosen by [SelectDataNodes] from the group's per-host rank
// counts, the other M hosts are the parity hosts (Parity ascending), and
// the target of parity row j in each reduction group is: the lowest member
// living on Parity[j] if there is one; otherwise, when K >= M,
// Members[j*(K/M) % K] (M targets at an interval of K/M); when K < M,
// Members[j % K] (round robin).
//
// Errors wrap [ErrECGroups]: K or M below 1; an assignment with a negative
// rank, a host index out of range, or a rank given twice; no ranks at all;
// fewer hosts with ranks than K+M, or a number that is not a multiple of
// K+M; a group whose rank count is not a multiple of K.
func PlanEC(hosts []Host, assign []Assignment, opt ECOptions) ([]ECGroup, error) {
	k, m := opt.K, opt.M
	if k < 1 {
		return nil, fmt.Errorf("%w: K = %d data hosts per group; need at least 1", ErrECGroups, k)
	}
	if m < 1 {
		return nil, fmt.Errorf("%w: M = %d parity hosts per group; need at least 1", ErrECGroups, m)
	}
	if len(assign) == 0 {
		return nil, fmt.Errorf("%w: no ranks to protect: the assignment is empty", ErrECGroups)
	}

	// Ranks per host, validated.
	ranks := make([][]int, len(hosts))
	for i, a := range assign {
		if a.Host < 0 || a.Host >= len(hosts) {
			return nil, fmt.Errorf("%w: assignment %d puts rank %d on host %d, out of range for %s",
				ErrECGroups, i, a.Rank, a.Host, plural(len(hosts), "host"))
		}
		if a.Rank < 0 {
			return nil, fmt.Errorf("%w: assignment %d has negative rank %d", ErrECGroups, i, a.Rank)
		}
		ranks[a.Host] = append(ranks[a.Host], a.Rank)
	}
	sorted := make([]Assignment, len(assign))
	copy(sorted, assign)
	slices.SortFunc(sorted, func(a, b Assignment) int { return a.Rank - b.Rank }) // ranks are >= 0: no overflow
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Rank == sorted[i-1].Rank {
			a, b := sorted[i-1], sorted[i]
			if a.Host > b.Host {
				a, b = b, a
			}
			return nil, fmt.Errorf("%w: rank %d is assigned twice (to host %d %s and host %d %s)",
				ErrECGroups, a.Rank, a.Host, ecName(hosts[a.Host]), b.Host, ecName(hosts[b.Host]))
		}
	}
	var active []int // hosts with ranks, in hostfile order
	for i := range hosts {
		if len(ranks[i]) == 0 {
			continue
		}
		slices.Sort(ranks[i])
		active = append(active, i)
	}

	n := len(active)
	if k > n || m > n-k { // k+m > n without overflow
		return nil, fmt.Errorf("%w: only %s with ranks; a group needs %d data + %d parity hosts",
			ErrECGroups, plural(n, "host"), k, m)
	}
	size := k + m
	if left := n % size; left != 0 {
		return nil, fmt.Errorf("%w: %d hosts with ranks cannot form groups of %d data + %d parity hosts: %d left over",
			ErrECGroups, n, k, m, left)
	}
	if opt.Spread {
		active = ecSpread(hosts, active)
	}

	groups := make([]ECGroup, 0, n/size)
	for start := 0; start < n; start += size {
		members := active[start : start+size]
		w := 0
		for _, h := range members {
			w += len(ranks[h])
		}
		if w%k != 0 {
			return nil, fmt.Errorf("%w: group %d has %d ranks on hosts %s: not a multiple of K = %d, so they cannot be cut into %d equal data groups",
				ErrECGroups, len(groups), w, ecCounts(hosts, members, ranks), k, k)
		}
		g, err := ecPlanGroup(members, ranks, k, m)
		if err != nil {
			return nil, err
		}
		groups = append(groups, g)
	}
	return groups, nil
}

// ecSpread orders the hosts round-robin over their racks: the first host of
// each rack (racks in order of first appearance), then the second of each,
// and so on. It takes O(len(active)) time whatever the rack sizes.
func ecSpread(hosts []Host, active []int) []int {
	index := make(map[string]int)
	var racks [][]int
	for _, h := range active {
		r, ok := index[hosts[h].Rack]
		if !ok {
			r = len(racks)
			index[hosts[h].Rack] = r
			racks = append(racks, nil)
		}
		racks[r] = append(racks[r], h)
	}
	out := make([]int, 0, len(active))
	live := make([]int, len(racks))
	for r := range live {
		live[r] = r
	}
	for pass := 0; len(live) > 0; pass++ {
		j := 0
		for _, r := range live {
			out = append(out, racks[r][pass])
			if len(racks[r]) > pass+1 {
				live[j] = r
				j++
			}
		}
		live = live[:j]
	}
	return out
}

// ecPlanGroup plans one group: members are its hosts in group order, each
// with at least one rank in ranks (ascending), and their total is a
// multiple of k.
func ecPlanGroup(members []int, ranks [][]int, k, m int) (ECGroup, error) {
	g := ECGroup{Hosts: slices.Clone(members)}
	origin := make([]int, len(members))
	var order, hostOf []int // ranks in worker order, and the host of each
	for i, h := range members {
		g.Workers = append(g.Workers, slices.Clone(ranks[h]))
		origin[i] = len(ranks[h])
		order = append(order, ranks[h]...)
		for range ranks[h] {
			hostOf = append(hostOf, h)
		}
	}
	sel, err := SelectDataNodes(origin, k)
	if err != nil {
		return ECGroup{}, err
	}
	isData := make([]bool, len(members))
	for _, i := range sel {
		g.Data = append(g.Data, members[i])
		isData[i] = true
	}
	for i, h := range members {
		if !isData[i] {
			g.Parity = append(g.Parity, h)
		}
	}
	slices.Sort(g.Parity)
	row := make(map[int]int, m) // parity host -> its row
	for j, h := range g.Parity {
		row[h] = j
	}

	l := len(order) / k
	for j := range k {
		g.DataGroups = append(g.DataGroups, slices.Clone(order[j*l:(j+1)*l]))
	}
	g.Reductions = make([]Reduction, l)
	for i := range l {
		r := Reduction{Members: make([]int, k), Targets: make([]int, m)}
		for j := range m {
			r.Targets[j] = -1
		}
		for j := range k {
			p := j*l + i
			r.Members[j] = order[p]
			if t, ok := row[hostOf[p]]; ok && (r.Targets[t] < 0 || order[p] < r.Targets[t]) {
				r.Targets[t] = order[p]
			}
		}
		for j := range m {
			if r.Targets[j] >= 0 {
				continue
			}
			if k >= m {
				r.Targets[j] = r.Members[(j*(k/m))%k]
			} else {
				r.Targets[j] = r.Members[j%k]
			}
		}
		g.Reductions[i] = r
	}
	return g, nil
}

// SelectDataNodes is ECHECK's §IV-B1 rule, exposed for tests: origin[i] is the number of
// workers on node i (consecutive worker indices, node 0 first); the W workers are cut into
// k equal consecutive data groups; for each data group, in order, the node whose worker
// interval overlaps it most becomes its data node. Computed with a sweep line over the
// interval endpoints, O((n+k) log(n+k)). Returns data[j] = node index for data group j.
// Ties go to the lower node index. A node is never chosen twice: if the best node is taken,
// the next best untaken node is chosen (by overlap, then lower index). Errors (wrapping
// ErrECGroups) if k < 1, k > len(origin), W == 0, or W % k != 0.
//
// A negative worker count, or a total too large for an int, is an error too.
// A node with no workers overlaps nothing; it is chosen only when every
// node overlapping a data group is taken already.
func SelectDataNodes(origin []int, k int) ([]int, error) {
	n := len(origin)
	if k < 1 {
		return nil, fmt.Errorf("%w: k = %d data nodes; need at least 1", ErrECGroups, k)
	}
	if k > n {
		return nil, fmt.Errorf("%w: k = %d data nodes but only %s", ErrECGroups, k, plural(n, "node"))
	}
	w := 0
	for i, c := range origin {
		if c < 0 {
			return nil, fmt.Errorf("%w: node %d has %d workers", ErrECGroups, i, c)
		}
		if c > math.MaxInt-w {
			return nil, fmt.Errorf("%w: too many workers: the total overflows at node %d", ErrECGroups, i)
		}
		w += c
	}
	if w == 0 {
		return nil, fmt.Errorf("%w: the %s have no workers", ErrECGroups, plural(n, "node"))
	}
	if w%k != 0 {
		return nil, fmt.Errorf("%w: %d workers cannot be cut into %d equal data groups: %d is not a multiple of %d",
			ErrECGroups, w, k, w, k)
	}
	size := w / k

	// The sweep: both interval lists are sorted by construction (prefix
	// sums), so the line advances over the node endpoints (node, start) and
	// the data-group endpoints (lo, hi) together. The nodes whose intervals
	// are open while the line crosses [lo, hi) are the candidates; each node
	// is a candidate of at most the groups it overlaps plus one, so the
	// candidate lists hold O(n+k) entries in all and sorting them costs
	// O((n+k) log(n+k)).
	type cand struct{ node, overlap int }
	var cands []cand
	data := make([]int, k)
	taken := make([]bool, n)
	free := 0 // every node below free is taken
	node, start := 0, 0
	for j := range k {
		lo, hi := j*size, j*size+size // j*size+size <= w: no overflow
		for node < n && start+origin[node] <= lo {
			start += origin[node]
			node++
		}
		cands = cands[:0]
		for i, s := node, start; i < n && s < hi; i++ {
			end := s + origin[i]
			if ov := min(end, hi) - max(s, lo); ov > 0 {
				cands = append(cands, cand{i, ov})
			}
			s = end
		}
		slices.SortFunc(cands, func(a, b cand) int {
			if a.overlap != b.overlap {
				return b.overlap - a.overlap
			}
			return a.node - b.node
		})
		pick := -1
		for _, c := range cands {
			if !taken[c.node] {
				pick = c.node
				break
			}
		}
		if pick < 0 { // every overlapping node is taken: the lowest untaken node (overlap 0)
			for taken[free] {
				free++
			}
			pick = free
		}
		taken[pick] = true
		data[j] = pick
	}
	return data, nil
}

// Traffic is the communication volume of one checkpoint of the group, in units of one
// rank's shard: xor = transfers of the XOR reduction (each reduction of K members moves
// K-1 packets to its target, for each of the M parity rows); p2p = data packets a data node
// must receive (ranks of its data group living on other hosts) plus parity packets whose
// reduction target is not on the parity node of that row.
//
// As in the paper, an XOR transfer counts even when the member and the
// target share a host. Traffic does not check g; on a malformed group
// (Data or Parity shorter than the rows it has, ranks not in Workers) a
// packet without a known host or destination counts as a transfer.
func (g ECGroup) Traffic() (xor, p2p int) {
	host := make(map[int]int)
	for i, ws := range g.Workers {
		if i >= len(g.Hosts) {
			break
		}
		for _, r := range ws {
			host[r] = g.Hosts[i]
		}
	}
	on := func(rank, h int) bool {
		at, ok := host[rank]
		return ok && at == h
	}
	for j, dg := range g.DataGroups {
		for _, r := range dg {
			if j >= len(g.Data) || !on(r, g.Data[j]) {
				p2p++
			}
		}
	}
	for _, red := range g.Reductions {
		if len(red.Members) > 1 {
			xor += len(red.Targets) * (len(red.Members) - 1)
		}
		for j, t := range red.Targets {
			if j >= len(g.Parity) || !on(t, g.Parity[j]) {
				p2p++
			}
		}
	}
	return xor, p2p
}

// ECLoss returns the ranks whose shard is unrecoverable when the given
// hosts fail, sorted ascending. A rank's shard lives in its own memory, in
// the clear on the data host of its data group, and in the group's parity:
// a group decodes whatever it lost while at most M of its hosts failed;
// beyond that, a rank is lost when its own host and its data host both
// failed. Hosts not in any group are ignored; a host listed twice counts
// once. The answer is nil when nothing is lost.
//
// M is len(Parity) of each group.
func ECLoss(groups []ECGroup, failed []int) []int {
	down := make(map[int]bool, len(failed))
	for _, h := range failed {
		down[h] = true
	}
	var lost []int
	for _, g := range groups {
		seen := make(map[int]bool)
		for _, h := range g.Hosts {
			if down[h] {
				seen[h] = true
			}
		}
		if len(seen) <= len(g.Parity) {
			continue
		}
		host := make(map[int]int)
		for i, ws := range g.Workers {
			if i < len(g.Hosts) {
				for _, r := range ws {
					host[r] = g.Hosts[i]
				}
			}
		}
		for j, dg := range g.DataGroups {
			if j < len(g.Data) && !down[g.Data[j]] {
				continue // the clear copy survives
			}
			for _, r := range dg {
				if h, ok := host[r]; !ok || down[h] {
					lost = append(lost, r)
				}
			}
		}
	}
	if len(lost) == 0 {
		return nil
	}
	slices.Sort(lost)
	return slices.Compact(lost)
}

// Replace returns the group with host lost replaced by host spare, as a
// hot swap does: the spare takes the lost host's place, its ranks and its
// role (data host of data group j, or parity host of row j: Parity keeps
// its order, which may then no longer be ascending), so no other host's
// share of the group moves.
func (g ECGroup) Replace(lost, spare int) ECGroup {
	swap := func(hs []int) []int {
		out := slices.Clone(hs)
		for i, h := range out {
			if h == lost {
				out[i] = spare
			}
		}
		return out
	}
	r := g
	r.Hosts, r.Data, r.Parity = swap(g.Hosts), swap(g.Data), swap(g.Parity)
	return r
}

// ecName quotes a host's name for a message, cutting very long names.
func ecName(h Host) string {
	const limit = 64
	if len(h.Name) > limit {
		return fmt.Sprintf("%q...", h.Name[:limit])
	}
	return fmt.Sprintf("%q", h.Name)
}

// ecCounts lists a group's hosts with their rank counts: `"a" (2), "b" (1)`,
// at most 8 of them.
func ecCounts(hosts []Host, members []int, ranks [][]int) string {
	const limit = 8
	var b strings.Builder
	for i, h := range members {
		if i == limit {
			fmt.Fprintf(&b, ", ... (%d more)", len(members)-limit)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%d)", ecName(hosts[h]), len(ranks[h]))
	}
	return b.String()
}
