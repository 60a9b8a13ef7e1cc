package keeper

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/gorun/gorun/topology"
)

// Erasure-coding layouts where a host holds several places of a group, or
// places in two groups (a hot swap without a spare, --on-no-spare
// free-slots: topology.ECGroup.Replace gives the host that takes the lost
// host's ranks its places too), and where a place is vacant.

// placesJob is a job on in-process hosts whose ranks and groups the test
// gives: ranks[h] on host h, groups planned by topology.PlanEC over one
// rank layout and then spliced.
type placesJob struct {
	t      *testing.T
	c      *cluster
	k, m   int
	groups []topology.ECGroup
	rs     []*ecRank
}

// planPlaces plans groups of k+m over hosts hosts of per ranks each (rank
// r on host r/per), then applies the splices (lost host → host that takes
// its ranks and, with replace, its places): it returns every host's ranks
// (in the order they came) and the groups.
func planPlaces(t *testing.T, k, m, groups, per int, splices [][2]int, replace bool) ([][]int, []topology.ECGroup) {
	t.Helper()
	n := groups * (k + m)
	hosts := make([]topology.Host, n)
	ranks := make([][]int, n)
	var assign []topology.Assignment
	for h := range n {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: per}
		for l := range per {
			assign = append(assign, topology.Assignment{Rank: h*per + l, Host: h, LocalRank: l})
			ranks[h] = append(ranks[h], h*per+l)
		}
	}
	gs, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: k, M: m})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range splices {
		lost, with := s[0], s[1]
		ranks[with] = append(ranks[with], ranks[lost]...)
		ranks[lost] = nil
		if replace {
			for gi, g := range gs {
				gs[gi] = g.Replace(lost, with)
			}
		}
	}
	return ranks, gs
}

// clearHolders is the clear copies' holders of groups (the launcher's and
// hotswap's rule): the lowest rank on a rank's data host, none when the
// rank runs there or the data host runs no rank.
func clearHolders(groups []topology.ECGroup, ranks [][]int, world int) [][]int {
	hostOf := make([]int, world)
	for h, rs := range ranks {
		for _, r := range rs {
			hostOf[r] = h
		}
	}
	holders := make([][]int, world)
	for _, g := range groups {
		for x, dg := range g.DataGroups {
			d := g.Data[x]
			if len(ranks[d]) == 0 {
				continue
			}
			for _, r := range dg {
				if hostOf[r] != d {
					holders[r] = []int{slices.Min(ranks[d])}
				}
			}
		}
	}
	return holders
}

func newPlacesJob(t *testing.T, k, m int, ranks [][]int, groups []topology.ECGroup) *placesJob {
	t.Helper()
	world := 0
	for _, rs := range ranks {
		world += len(rs)
	}
	holders := clearHolders(groups, ranks, world)
	j := &placesJob{t: t, k: k, m: m, groups: groups}
	j.c = newClusterWith(t, ranks, holders, nil, func(cfg *Config) { cfg.EC = groups })
	for r := range world {
		j.rs = append(j.rs, j.connect(r))
	}
	return j
}

// connect says ProtectHello for rank r on its host (ecTestJob.connect's,
// for ranks anywhere).
func (j *placesJob) connect(r int) *ecRank {
	j.t.Helper()
	er := &ecRank{t: j.t, r: r, sess: j.c.hosts[j.c.hostOf[r]].Session(r), regions: ecRegions(r)}
	er.views = protectHello(j.t, er.sess, r, er.regions)
	return er
}

// TestECDoubledPlaces: with hosts holding several places of a group (a
// data place and a row, two rows, two data places), places in two
// groups, or a vacant row, every rank's Replicated (so G) advances step
// after step, and every row that is not vacant holds, bitwise, the
// codec's parity of its stripe (shares from members on the row's own
// host included); a vacant row is kept nowhere.
func TestECDoubledPlaces(t *testing.T) {
	defer func(n int) { ecChunkSize = n }(ecChunkSize)
	ecChunkSize = 1024 // many chunks per share: the senders of two rows on one host run side by side
	for _, tc := range []struct {
		name              string
		k, m, groups, per int
		splices           [][2]int
		vacant            bool // the splices move ranks only: the lost hosts' places are vacant
	}{
		// PlanEC, one rank per host: Data [0 2], Parity [1 3].
		{"2+2 data host into a parity host", 2, 2, 1, 1, [][2]int{{0, 1}}, false},
		{"2+2 parity host into a parity host", 2, 2, 1, 1, [][2]int{{3, 1}}, false},
		{"2+2 parity host into a data host", 2, 2, 1, 2, [][2]int{{1, 0}}, false},
		{"2+2 data host into a data host", 2, 2, 1, 2, [][2]int{{2, 0}}, false},
		{"2+2 every place on one host", 2, 2, 1, 1, [][2]int{{0, 1}, {2, 1}, {3, 1}}, false},
		{"2+1 twice into one host", 2, 1, 1, 2, [][2]int{{0, 1}, {2, 1}}, false},
		{"4+2 parity host into a data host", 4, 2, 1, 2, [][2]int{{5, 2}}, false},
		{"2+2 two groups: a host in both", 2, 2, 2, 1, [][2]int{{0, 5}}, false},
		{"2+2 two groups: rows of both on one host", 2, 2, 2, 1, [][2]int{{3, 7}}, false},
		{"2+2 a vacant parity row", 2, 2, 1, 1, [][2]int{{3, 2}}, true},
		{"2+2 a vacant data place", 2, 2, 1, 1, [][2]int{{2, 1}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranks, groups := planPlaces(t, tc.k, tc.m, tc.groups, tc.per, tc.splices, !tc.vacant)
			t.Logf("ranks %v, groups %+v", ranks, groups)
			j := newPlacesJob(t, tc.k, tc.m, ranks, groups)
			for s := range int64(3) {
				for _, er := range j.rs {
					er.protect(s, 0)
				}
				j.c.waitFor(fmt.Sprintf("step %d replicated", s), func() bool {
					for r := range j.c.hostOf {
						if j.c.progress(r).Replicated < s {
							return false
						}
					}
					return true
				})
				if g := j.c.publishG(); g != s {
					t.Fatalf("G %d after step %d", g, s)
				}
			}
			for gi, g := range groups {
				for i := range len(g.DataGroups[0]) {
					members := stripeMembers(g, i)
					want := wantRow(t, tc.k, tc.m, members, 2, noSalt)
					for row, host := range g.Parity {
						got := make([]byte, len(want[row]))
						_, err := j.c.hosts[host].parity.read(gi, i, row, 2, 0, got)
						if len(ranks[host]) == 0 {
							if err == nil {
								t.Fatalf("group %d stripe %d: vacant row %d read from host %d", gi, i, row, host)
							}
							continue
						}
						if err != nil {
							t.Fatalf("group %d stripe %d row %d on host %d: %v", gi, i, row, host, err)
						}
						if !bytes.Equal(got, want[row]) {
							t.Fatalf("group %d stripe %d row %d on host %d differs from the codec's parity", gi, i, row, host)
						}
					}
				}
			}
		})
	}
}
