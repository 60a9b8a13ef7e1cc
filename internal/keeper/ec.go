package keeper

import (
	"fmt"
	"slices"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/topology"
)

// Erasure coding (gorun --redundancy ec:K+M; ECHECK, DESIGN.md §5): the
// layout a placement's EC groups give each rank, and the targets its
// replicator sends to. The owner's pipeline is in ecsend.go, the parity
// hosts' store in ecstore.go, the wire formats in replica.go's header and
// PROTOCOL.md ("Erasure coding").
//
// A rank's data shard is its replicated regions (every region but params,
// service.repl order) concatenated. Stripe i of group g is the K ranks
// DataGroups[0..K)[i]; its member x is DataGroups[x][i]. Parity row j of
// every stripe of g is kept on host Parity[j], addressed by its parity
// holder rank, the lowest rank that host runs in the placement. Each
// member sends, for each row, its share (ckpt.Codec.Share) straight to
// the row's host, which XORs the K members' shares into the row: the
// parity of the members' shards padded with zeros to the longest.
//
// A host may hold several places (a hot swap without a spare gives the
// host that takes a lost host's ranks its places too, ECGroup.Replace):
// several rows of a group, a data place and rows, places in two groups.
// Each place keeps its role: each row is a target of its own (holderKey
// row) with the host's one holder rank, the parity store keys rows by
// (group, stripe, row), a member's shares of two rows on one host go
// over two links side by side (ecSend's lanes), and a share to a row on
// the owner's own host over the in-process link (linkPool.pipe). A rank
// that runs on its data host has no clear copy (Placement.Holders).
//
// A place is vacant when its host runs no rank in the placement (the
// epoch table allows it: internal/wire checkEC). A vacant data place
// keeps no clear copy (the holders name none there); a vacant parity row
// has no holder rank (ecRowPlace.holder -1): it is no target, so no share
// goes to it and Replicated does not wait for it, nothing is stored for
// it, and it is no source of a decode. The group survives one host loss
// fewer for each vacant place until a hot swap fills it.

// ecPos is where a rank's shard is in the EC layout.
type ecPos struct{ group, stripe, x int }

// ecRowPlace is one parity row of a stripe: its host and holder rank
// (-1: the place is vacant, its host runs no rank).
type ecRowPlace struct{ host, holder int }

// vacant reports whether the row's place is vacant: nothing is kept there.
func (rp ecRowPlace) vacant() bool { return rp.holder < 0 }

// ecLayout is a placement's EC layout, derived once (placement.ec). It is
// never changed once built.
type ecLayout struct {
	k, m   int
	codec  *ckpt.Codec
	groups []topology.ECGroup
	pos    map[int]ecPos  // by rank
	rows   [][]ecRowPlace // by group: row j's host and holder rank
}

// newECLayout derives the layout of groups for a job whose rank r runs
// on host hostOf(r), for ranks 0 to world-1 (world < 0: the ranks of the
// groups). The groups are checked (checkEC); nil groups give a nil
// layout.
func newECLayout(groups []topology.ECGroup, world int, hostOf func(int) int) (*ecLayout, error) {
	if len(groups) == 0 {
		return nil, nil
	}
	if world < 0 {
		world = 0
		for _, g := range groups {
			for _, dg := range g.DataGroups {
				for _, r := range dg {
					world = max(world, r+1)
				}
			}
		}
	}
	if err := checkEC(groups, world, hostOf); err != nil {
		return nil, err
	}
	l := &ecLayout{k: len(groups[0].Data), m: len(groups[0].Parity), pos: map[int]ecPos{}}
	codec, err := ckpt.NewCodec(l.k, l.m)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPlacement, err)
	}
	l.codec = codec
	lowest := map[int]int{} // host -> its lowest rank
	for r := range world {
		h := hostOf(r)
		if lr, ok := lowest[h]; !ok || r < lr {
			lowest[h] = r
		}
	}
	for gi, g := range groups {
		l.groups = append(l.groups, cloneGroup(g))
		for x, dg := range g.DataGroups {
			for i, r := range dg {
				l.pos[r] = ecPos{group: gi, stripe: i, x: x}
			}
		}
		rows := make([]ecRowPlace, len(g.Parity))
		for j, h := range g.Parity {
			rows[j] = ecRowPlace{host: h, holder: -1}
			if lr, ok := lowest[h]; ok {
				rows[j].holder = lr
			}
		}
		l.rows = append(l.rows, rows)
	}
	return l, nil
}

// checkEC checks groups against a world of ranks placed by hostOf: the
// same K and M in every group (1 ≤ K, M; K+M ≤ ckpt.MaxShards); each
// group's Data (K) and Parity (M) places together its Hosts, counted with
// repeats (a host may hold several places, of one group or of several);
// K data groups of one length ≥ 1; every rank of the world in exactly one
// data group. A place whose host runs no rank is vacant (see the top of
// this file). The hosts' range is Placement.check's.
func checkEC(groups []topology.ECGroup, world int, hostOf func(int) int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: erasure coding: "+format, append([]any{ErrPlacement}, args...)...)
	}
	k, m := len(groups[0].Data), len(groups[0].Parity)
	if k < 1 || m < 1 || k+m > ckpt.MaxShards {
		return bad("%d data + %d parity hosts per group (1 to %d in all)", k, m, ckpt.MaxShards)
	}
	seen := make([]bool, world)
	for gi, g := range groups {
		if len(g.Data) != k || len(g.Parity) != m || len(g.DataGroups) != k {
			return bad("group %d has %d data hosts, %d parity hosts and %d data groups; the first group %d+%d", gi, len(g.Data), len(g.Parity), len(g.DataGroups), k, m)
		}
		roles := append(slices.Clone(g.Data), g.Parity...)
		hosts := slices.Clone(g.Hosts)
		slices.Sort(roles)
		slices.Sort(hosts)
		if !slices.Equal(roles, hosts) {
			return bad("group %d: data hosts %v and parity hosts %v are not its hosts %v, place for place", gi, g.Data, g.Parity, g.Hosts)
		}
		n := len(g.DataGroups[0])
		for x, dg := range g.DataGroups {
			if len(dg) != n || n == 0 {
				return bad("group %d: data group %d has %d ranks, data group 0 %d", gi, x, len(dg), n)
			}
			for _, r := range dg {
				if r < 0 || r >= world || seen[r] {
					return bad("group %d: rank %d out of range or in two data groups (world %d)", gi, r, world)
				}
				seen[r] = true
			}
		}
	}
	if i := slices.Index(seen, false); i >= 0 {
		return bad("rank %d is in no group", i)
	}
	return nil
}

func cloneGroup(g topology.ECGroup) topology.ECGroup {
	c := topology.ECGroup{Hosts: slices.Clone(g.Hosts), Data: slices.Clone(g.Data), Parity: slices.Clone(g.Parity)}
	for _, w := range g.Workers {
		c.Workers = append(c.Workers, slices.Clone(w))
	}
	for _, dg := range g.DataGroups {
		c.DataGroups = append(c.DataGroups, slices.Clone(dg))
	}
	for _, r := range g.Reductions {
		c.Reductions = append(c.Reductions, topology.Reduction{Members: slices.Clone(r.Members), Targets: slices.Clone(r.Targets)})
	}
	return c
}

// sameEC reports whether two layouts are the same: the wire's fields of
// every group (Hosts, Data, Parity, DataGroups).
func sameEC(a, b []topology.ECGroup) bool {
	return slices.EqualFunc(a, b, func(x, y topology.ECGroup) bool {
		return slices.Equal(x.Hosts, y.Hosts) && slices.Equal(x.Data, y.Data) && slices.Equal(x.Parity, y.Parity) &&
			slices.EqualFunc(x.DataGroups, y.DataGroups, slices.Equal)
	})
}

// members returns the K ranks of stripe of group.
func (l *ecLayout) members(group, stripe int) []int {
	g := l.groups[group]
	out := make([]int, len(g.DataGroups))
	for x, dg := range g.DataGroups {
		out[x] = dg[stripe]
	}
	return out
}

// stripes returns how many stripes group has (-1: no such group).
func (l *ecLayout) stripes(group int) int {
	if group < 0 || group >= len(l.groups) {
		return -1
	}
	return len(l.groups[group].DataGroups[0])
}

// ecTargets returns the parity targets of rank's shard: one per row that
// is not vacant, the row's holder rank on its host, row j as
// holderKey.row j+1 (none without EC). Rows on one host are targets
// each. In full mode every committed step goes to them; in diff mode
// only the base steps, from the owner's snapshot (ecdiff_owner.go).
func (p *placement) ecTargets(rank int) []holderKey {
	if p.ec == nil {
		return nil
	}
	pos, ok := p.ec.pos[rank]
	if !ok {
		return nil
	}
	rows := p.ec.rows[pos.group]
	out := make([]holderKey, 0, len(rows))
	for j, rp := range rows {
		if !rp.vacant() {
			out = append(out, holderKey{rank: rp.holder, host: rp.host, row: j + 1})
		}
	}
	return out
}

// allTargets returns every target of rank's replication: its replica
// (or clear-copy) holders, its log-only holders (diff mode under EC),
// then its parity rows.
func (p *placement) allTargets(rank int) []holderKey {
	return append(p.diffTargets(rank), p.ecTargets(rank)...)
}

// parityHeld says why this host's holder rank does not keep row of
// stripe of group here under p, or "" if it does; and the stripe's
// members.
func (p *placement) parityHeld(host, holder, group, stripe, row int) ([]int, string) {
	switch {
	case p.ec == nil:
		return nil, "this job has no erasure coding"
	case p.ec.stripes(group) < 0 || stripe < 0 || stripe >= p.ec.stripes(group):
		return nil, fmt.Sprintf("no stripe %d of group %d", stripe, group)
	case row < 0 || row >= p.ec.m:
		return nil, fmt.Sprintf("no parity row %d of %d", row, p.ec.m)
	}
	rp := p.ec.rows[group][row]
	if rp.vacant() {
		return nil, fmt.Sprintf("parity row %d of group %d is vacant: its host %d runs no rank", row, group, rp.host)
	}
	if rp.host != host || rp.holder != holder || p.svcs[holder] == nil {
		return nil, fmt.Sprintf("rank %d on host %d does not hold parity row %d of group %d (rank %d on host %d does)", holder, host, row, group, rp.holder, rp.host)
	}
	return p.ec.members(group, stripe), ""
}
