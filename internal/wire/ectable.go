package wire

import "slices"

// MaxECShards bounds K+M of an ECTable: the classic GF(2^8) Reed–Solomon
// code the agents use (ckpt.MaxShards) has at most 256 shards.
const MaxECShards = 256

// checkEC checks t.EC against the rest of t, and that restore rows ask to
// decode only when there is a code to decode from:
//
//   - K >= 1, M >= 1, K+M <= MaxECShards, at least one group;
//   - each group has K+M distinct hosts of the table, none of them an idle
//     spare; Data (K of them) and Parity (M) together are its Hosts;
//   - no host is in two groups;
//   - each group has K data groups of one length L >= 1, and every rank of
//     the world is in exactly one data group of one group.
//
// A fenced host may keep its place in a group: its role (data or parity)
// is vacant, and the group survives one host fewer until a hot swap fills
// it (topology.ECGroup.Replace). A data group's ranks need not run on the
// group's hosts (a rank moved to free slots elsewhere).
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
	inGroup := make([]int, len(t.Hosts)) // host -> 1 + its group
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
			if inGroup[h] != 0 {
				return malformed("epoch table: host %d is in erasure-coding groups %d and %d", h, inGroup[h]-1, gi)
			}
			inGroup[h] = gi + 1
		}
		// The hosts are distinct and K+M; Data and Parity are K+M hosts of
		// the group, each once, so they are the group's hosts.
		roles := append(slices.Clone(g.Data), g.Parity...)
		slices.Sort(roles)
		for i, h := range roles {
			if h < 0 || h >= len(t.Hosts) || inGroup[h] != gi+1 || i > 0 && roles[i-1] == h {
				return malformed("epoch table: erasure-coding group %d: its data hosts %v and parity hosts %v are not its hosts %v, each once",
					gi, g.Data, g.Parity, g.Hosts)
			}
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
