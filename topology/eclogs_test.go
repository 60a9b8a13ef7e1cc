package topology

import (
	"slices"
	"testing"
)

// ecFixture plans ec:k+m over hosts of perHost ranks each.
func ecFixture(t *testing.T, hosts, perHost, k, m int) ([]ECGroup, []int, [][]int) {
	t.Helper()
	hs := make([]Host, hosts)
	assign := make([]Assignment, 0, hosts*perHost)
	rankHost := make([]int, 0, hosts*perHost)
	hostRanks := make([][]int, hosts)
	for h := range hs {
		hs[h] = Host{Name: "h" + string(rune('a'+h)), Slots: perHost}
		for range perHost {
			r := len(rankHost)
			assign = append(assign, Assignment{Rank: r, Host: h, LocalRank: len(hostRanks[h])})
			rankHost = append(rankHost, h)
			hostRanks[h] = append(hostRanks[h], r)
		}
	}
	groups, err := PlanEC(hs, assign, ECOptions{K: k, M: m})
	if err != nil {
		t.Fatal(err)
	}
	return groups, rankHost, hostRanks
}

func TestECLogHolders(t *testing.T) {
	for _, tc := range []struct{ hosts, perHost, k, m int }{
		{4, 1, 2, 2}, {4, 2, 2, 2}, {3, 2, 2, 1}, {6, 2, 4, 2}, {12, 2, 8, 4}, {8, 2, 2, 2},
	} {
		groups, rankHost, hostRanks := ecFixture(t, tc.hosts, tc.perHost, tc.k, tc.m)
		logs := ECLogHolders(groups, rankHost, hostRanks)
		load := make([]int, tc.hosts)
		for _, g := range groups {
			for x, dg := range g.DataGroups {
				for _, r := range dg {
					hosts := []int{}
					if rankHost[r] != g.Data[x] {
						hosts = append(hosts, g.Data[x])
					}
					for _, l := range logs[r] {
						hosts = append(hosts, rankHost[l])
					}
					for _, h := range hosts {
						load[h]++
						if h == rankHost[r] || !slices.Contains(g.Hosts, h) {
							t.Fatalf("%+v: rank %d (host %d) has a log on host %d", tc, r, rankHost[r], h)
						}
					}
					if s := slices.Clone(hosts); len(slices.Compact(func() []int { slices.Sort(s); return s }())) != tc.m {
						t.Fatalf("%+v: rank %d's logs are on hosts %v, want %d distinct", tc, r, hosts, tc.m)
					}
					for _, l := range logs[r] {
						if l != slices.Min(hostRanks[rankHost[l]]) {
							t.Fatalf("%+v: rank %d's log holder %d is not its host's lowest rank", tc, r, l)
						}
					}
				}
			}
		}
		if lo, hi := slices.Min(load), slices.Max(load); hi-lo > tc.perHost {
			t.Errorf("%+v: logs per host %v: spread %d > %d", tc, load, hi-lo, tc.perHost)
		}
	}
}
