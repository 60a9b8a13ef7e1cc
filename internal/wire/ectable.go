package wire

import "slices"

// MaxECShards bounds K+M of an ECTable: the classic GF(2^8) Reed–Solomon
// code the agents use (ckpt.MaxShards) has at most 256 shards.
const MaxECShards = 256

// checkEC checks t.EC against the rest of t, and that restore rows ask to
// decode only when there is a code to decode from:
//
//   - K >= 1, M >= 1, K+M <= MaxECShards, at least one group and at most
//     one per K+M hosts of the table;
//   - each group has K+M places (Hosts), each a host of the table that
//     is not an idle spare; its K data places (Data) and M parity places
//     (Parity) together are its places, counted with repeats;
//   - each group has K data groups of one length L >= 1, and every rank of
//     the world is in exactly one data group of one group.
//
// A host may hold several places, of one group or of several: after a hot
// swap without a spare (--on-no-spare free-slots) the host that took the
// lost host's ranks also takes its places (topology.ECGroup.Replace). Each
// place keeps its role: a host that is Data[x] and Parity[j] of a group
// keeps the clear copies of data group x and parity row j of every stripe
// of the group, and the group survives fewer host losses (a loss of that
// host costs it both places).
//
// A place is vacant when its host runs no rank in the table (a fenced
// host, or one whose ranks all moved): it holds nothing. A vacant data
// place keeps no clear copy (Holders, which name ranks, name none there);
// a vacant parity place keeps its row of no stripe, so no share is sent
// to it, G does not wait for it and no decode reads it. The group survives
// one host loss fewer for each until a hot swap fills it. The agents'
// layout (rank.Placement.EC) means the same.
//
// A data group's ranks need not run on the group's hosts (a rank moved to
// free slots in another group).
func (t *EpochTable) checkEC() error {
	ec := t.EC
	if ec == nil {
		for _, row := range t.Restore {
			if row.Decode {
				return malformed("epoch table: rank %d restores by decoding, but the table has no erasure code", row.Rank)
			}
		}
		return nil
	}
	if ec.K < 1 || ec.M < 1 || ec.K > MaxECShards-ec.M {
		return malformed("epoch table: erasure code %d+%d: want K, M >= 1 and K+M <= %d", ec.K, ec.M, MaxECShards)
	}
	if len(ec.Groups) == 0 || len(ec.Groups) > len(t.Hosts)/(ec.K+ec.M) {
		return malformed("epoch table: %d erasure-coding groups of %d hosts for %d hosts", len(ec.Groups), ec.K+ec.M, len(t.Hosts))
	}
	ranks := make([]bool, t.World)
	placed := 0
	for gi, g := range ec.Groups {
		if len(g.Hosts) != ec.K+ec.M || len(g.Data) != ec.K || len(g.Parity) != ec.M {
			return malformed("epoch table: erasure-coding group %d has %d hosts, %d data and %d parity hosts; want %d, %d and %d",
				gi, len(g.Hosts), len(g.Data), len(g.Parity), ec.K+ec.M, ec.K, ec.M)
		}
		for _, h := range g.Hosts {
			if h < 0 || h >= len(t.Hosts) {
				return malformed("epoch table: erasure-coding group %d names host %d of %d", gi, h, len(t.Hosts))
			}
			if t.Hosts[h].Spare {
				return malformed("epoch table: erasure-coding group %d names host %d, an idle spare", gi, h)
			}
		}
		// Data and Parity are the group's places, counted with repeats
		// (they are as many: K+M).
		roles := append(slices.Clone(g.Data), g.Parity...)
		hosts := slices.Clone(g.Hosts)
		slices.Sort(roles)
		slices.Sort(hosts)
		if !slices.Equal(roles, hosts) {
			return malformed("epoch table: erasure-coding group %d: its data hosts %v and parity hosts %v are not its hosts %v, place for place",
				gi, g.Data, g.Parity, g.Hosts)
		}
		if len(g.DataGroups) != ec.K {
			return malformed("epoch table: erasure-coding group %d has %d data groups, want %d", gi, len(g.DataGroups), ec.K)
		}
		l := len(g.DataGroups[0])
		for j, dg := range g.DataGroups {
			if len(dg) != l || l == 0 {
				return malformed("epoch table: erasure-coding group %d: data group %d has %d ranks, data group 0 %d; want one length of at least 1",
					gi, j, len(dg), l)
			}
			for _, r := range dg {
				if r < 0 || r >= t.World || ranks[r] {
					return malformed("epoch table: erasure-coding group %d: rank %d out of range or in two data groups", gi, r)
				}
				ranks[r] = true
				placed++
			}
		}
	}
	if placed != t.World {
		return malformed("epoch table: the erasure-coding groups cover %d of %d ranks", placed, t.World)
	}
	return nil
}
