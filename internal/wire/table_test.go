package wire_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// table returns a table of world ranks where host i runs hosts[i], in
// local-rank order.
func table(world int, hosts ...[]int) *wire.EpochTable {
	t := &wire.EpochTable{
		Version:    wire.Version,
		Job:        "job-42",
		Epoch:      3,
		World:      world,
		MasterAddr: "10.0.0.1",
		MasterPort: 29500,
	}
	for i, ranks := range hosts {
		t.Hosts = append(t.Hosts, wire.TableHost{
			Name:  fmt.Sprintf("node%04d", i),
			Addr:  fmt.Sprintf("10.0.%d.%d", i/250, 1+i%250),
			Ranks: wire.CompressRanks(ranks),
		})
	}
	return t
}

// clusterTable maps hosts×per ranks by slot or by node.
func clusterTable(hosts, per int, byNodeMap bool) *wire.EpochTable {
	rs := make([][]int, hosts)
	for h := range rs {
		if byNodeMap {
			rs[h] = byNode(h, hosts, per)
		} else {
			rs[h] = bySlot(h, per)
		}
	}
	return table(hosts*per, rs...)
}

func TestEpochTableRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		tab  *wire.EpochTable
	}{
		{"one rank", table(1, []int{0})},
		{"slot", clusterTable(4, 8, false)},
		{"node", clusterTable(4, 8, true)},
		{"irregular", table(6, []int{5, 0, 3}, []int{1, 2, 4})},
		{"host without ranks", table(3, []int{0, 1}, nil, []int{2})},
		{"empty strings", func() *wire.EpochTable {
			t := table(1, []int{0})
			t.MasterAddr, t.Hosts[0].Name, t.Hosts[0].Addr = "", "", ""
			return t
		}()},
		{"longest strings", func() *wire.EpochTable {
			t := table(1, []int{0})
			t.MasterAddr, t.Hosts[0].Name, t.Hosts[0].Addr = longest, longest, longest
			return t
		}()},
		{"replica ports", func() *wire.EpochTable {
			t := clusterTable(3, 2, false)
			t.Hosts[0].ReplicaPort, t.Hosts[2].ReplicaPort = 1, 65535
			return t
		}()},
		{"binary strings", func() *wire.EpochTable {
			t := table(1, []int{0})
			t.Hosts[0].Name = "a\x00b\xff\"\\"
			return t
		}()},
		{"limits", func() *wire.EpochTable {
			t := table(2, []int{1}, []int{0})
			t.Epoch, t.MasterPort, t.Job = 1<<62, 65535, strings.Repeat("z", 64)
			return t
		}()},
		{"epoch 0, port 0", func() *wire.EpochTable {
			t := table(1, []int{0})
			t.Epoch, t.MasterPort = 0, 0
			return t
		}()},
		{"membership", memberTable()},
		{"nothing protected yet", func() *wire.EpochTable {
			t := memberTable()
			t.G, t.Restore = -1, nil
			return t
		}()},
		{"erasure coded", ecTable()},
		{"erasure coded, recovery epoch with a vacant place", ecRecoveryTable()},
		{"erasure coded, free slots in the lost host's group", ecFreeSlotsTable()},
		{"erasure coded, free slots in another group", ecOtherGroupTable()},
		{"erasure coded, one host in every place", func() *wire.EpochTable {
			// Free slots twice more: host 1 holds all four places.
			t := ecFreeSlotsTable()
			t.Hosts[1].Ranks = wire.CompressRanks([]int{0, 1, 2, 3, 4, 5, 6, 7})
			t.Hosts[2], t.Hosts[3] = wire.TableHost{Name: "node0002", Fenced: true}, wire.TableHost{Name: "node0003", Fenced: true}
			t.Holders = nil
			g := &t.EC.Groups[0]
			g.Hosts, g.Data, g.Parity = []int{1, 1, 1, 1}, []int{1, 1}, []int{1, 1}
			return t
		}()},
		{"diff mode under erasure coding, first epoch", ecDiffTable()},
		{"diff mode under erasure coding, recovery epoch", func() *wire.EpochTable {
			t := ecDiffTable()
			t.Epoch, t.Gen, t.G, t.H = 2, 1, 41, 32
			return t
		}()},
		{"diff mode under erasure coding, H at G", func() *wire.EpochTable {
			t := ecDiffTable()
			t.G, t.H = 16, 16
			return t
		}()},
		{"erasure coded, largest code", func() *wire.EpochTable {
			// 256 hosts, one group of 255 data hosts of one rank each and
			// a parity host without ranks.
			hosts := make([][]int, 256)
			ec := &wire.ECTable{K: 255, M: 1, Groups: []wire.ECGroupRow{{Parity: []int{255}}}}
			g := &ec.Groups[0]
			for i := range 255 {
				hosts[i] = []int{254 - i}
				g.Hosts = append(g.Hosts, i)
				g.Data = append(g.Data, i)
				g.DataGroups = append(g.DataGroups, []int{254 - i})
			}
			g.Hosts = append(g.Hosts, 255)
			t := table(255, hosts...)
			t.EC = ec
			return t
		}()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.tab.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			b := tc.tab.Encode()
			got, err := wire.DecodeEpochTable(b)
			if err != nil {
				t.Fatalf("DecodeEpochTable: %v", err)
			}
			if !reflect.DeepEqual(got, tc.tab) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tc.tab)
			}
		})
	}
}

// memberTable is a recovery epoch's table: host 1 lost (fenced), its
// ranks on spare host 3, host 4 an idle spare, holders re-placed and a
// restore plan.
func memberTable() *wire.EpochTable {
	t := table(6, []int{0, 1}, nil, []int{4, 5}, []int{2, 3}, nil)
	t.Hosts[1].Fenced, t.Hosts[1].Addr = true, ""
	t.Hosts[4].Spare = true
	t.Gen, t.G = 2, 41
	t.Holders = []wire.HolderRow{{Rank: 0, Holders: []int{2, 4}}, {Rank: 1, Holders: []int{3}}, {Rank: 2, Holders: []int{4}},
		{Rank: 3, Holders: []int{5}}, {Rank: 4, Holders: []int{0}}, {Rank: 5, Holders: []int{1}}}
	t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 4, Params: 0}, {Rank: 3, Opt: 5, Params: 1}}
	return t
}

// ecTable is the first table of an ec:2+2 job on 4 hosts of 2 ranks and
// an idle spare (host 4), as topology.PlanEC plans it: data hosts 0 and 2
// keep data groups {0,1,2,3} and {4,5,6,7} in the clear, so ranks 2, 3
// (host 1) and 6, 7 (host 3) have their data host's lowest rank as holder;
// parity rows 0 and 1 are on hosts 1 and 3.
func ecTable() *wire.EpochTable {
	t := table(8, []int{0, 1}, []int{2, 3}, []int{4, 5}, []int{6, 7}, nil)
	t.Hosts[4].Spare = true
	t.G = -1
	t.Holders = []wire.HolderRow{{Rank: 2, Holders: []int{0}}, {Rank: 3, Holders: []int{0}},
		{Rank: 6, Holders: []int{4}}, {Rank: 7, Holders: []int{4}}}
	t.EC = &wire.ECTable{K: 2, M: 2, Groups: []wire.ECGroupRow{{
		Hosts: []int{0, 1, 2, 3}, Data: []int{0, 2}, Parity: []int{1, 3},
		DataGroups: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}},
	}}}
	return t
}

// ecDiffTable is ecTable's job run with --protect-mode diff: ranks on a
// host other than their data host (2, 3, 6, 7) have their clear copy's
// holder and one log-only holder, those on their data host (0, 1, 4, 5)
// two log-only holders, never on their own host nor their data host
// (topology.ECLogHolders); no base coded yet.
func ecDiffTable() *wire.EpochTable {
	t := ecTable()
	t.H = -1
	t.Logs = []wire.HolderRow{{Rank: 0, Holders: []int{2, 6}}, {Rank: 1, Holders: []int{6, 2}}, {Rank: 2, Holders: []int{4}},
		{Rank: 3, Holders: []int{6}}, {Rank: 4, Holders: []int{0, 2}}, {Rank: 5, Holders: []int{2, 0}},
		{Rank: 6, Holders: []int{2}}, {Rank: 7, Holders: []int{0}}}
	return t
}

// ecRecoveryTable is ecTable's job after data hosts 0 and 2 were lost at
// once: the spare (host 4) took host 0's place and ranks; host 2 is fenced
// and its ranks moved to host 3's free slots, but it keeps its place: a
// vacant place, which the table allows (hotswap gives the place to the
// host that takes the ranks, as in ecFreeSlotsTable).
// Ranks 0, 1 decode from the group; 4, 5 restore from their clear copy's
// survivor... which is lost too, so they decode as well.
func ecRecoveryTable() *wire.EpochTable {
	t := table(8, nil, []int{2, 3}, nil, []int{6, 7, 4, 5}, []int{0, 1})
	t.Hosts[0].Fenced, t.Hosts[2].Fenced = true, true
	t.Epoch, t.Gen, t.G = 4, 1, 17
	t.Holders = []wire.HolderRow{{Rank: 2, Holders: []int{0}}, {Rank: 3, Holders: []int{0}}}
	t.Restore = []wire.RestoreRow{{Rank: 0, Opt: 0, Params: 2, Decode: true}, {Rank: 1, Opt: 1, Params: 3, Decode: true},
		{Rank: 4, Opt: 2, Params: 6, Decode: true}, {Rank: 5, Opt: 5, Params: 7, Decode: true}}
	t.EC = &wire.ECTable{K: 2, M: 2, Groups: []wire.ECGroupRow{{
		Hosts: []int{4, 1, 2, 3}, Data: []int{4, 2}, Parity: []int{1, 3},
		DataGroups: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}},
	}}}
	return t
}

// ecFreeSlotsTable is ecTable's job without its spare after data host 0
// was lost with --on-no-spare free-slots: its ranks 0 and 1 moved to
// parity host 1, which took host 0's place too (topology.ECGroup.Replace):
// host 1 is both data host 0 and parity host 0 of the group. Ranks 0 to 3
// run on their data host (no clear copy); 0 and 1 decode, both their own
// slot and their clear copy lost with host 0.
func ecFreeSlotsTable() *wire.EpochTable {
	t := table(8, nil, []int{2, 3, 0, 1}, []int{4, 5}, []int{6, 7})
	t.Hosts[0].Fenced, t.Hosts[0].Addr = true, ""
	t.Epoch, t.Gen, t.G = 2, 1, 9
	t.Holders = []wire.HolderRow{{Rank: 6, Holders: []int{4}}, {Rank: 7, Holders: []int{4}}}
	t.Restore = []wire.RestoreRow{{Rank: 0, Opt: 0, Params: 4, Decode: true}, {Rank: 1, Opt: 1, Params: 5, Decode: true}}
	t.EC = &wire.ECTable{K: 2, M: 2, Groups: []wire.ECGroupRow{{
		Hosts: []int{1, 1, 2, 3}, Data: []int{1, 2}, Parity: []int{1, 3},
		DataGroups: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}},
	}}}
	return t
}

// ecOtherGroupTable is a job of two ec:2+2 groups of one rank per host
// after data host 0 of group 0 was lost with --on-no-spare free-slots:
// its rank moved to host 5, parity host 0 of group 1, which took host 0's
// place in group 0 too: host 5 is in both groups.
func ecOtherGroupTable() *wire.EpochTable {
	t := table(8, nil, []int{1}, []int{2}, []int{3}, []int{4}, []int{5, 0}, []int{6}, []int{7})
	t.Hosts[0].Fenced, t.Hosts[0].Addr = true, ""
	t.Epoch, t.G = 1, 3
	t.Holders = []wire.HolderRow{{Rank: 1, Holders: []int{5}}, {Rank: 3, Holders: []int{2}}, {Rank: 5, Holders: []int{4}}, {Rank: 7, Holders: []int{6}}}
	t.Restore = []wire.RestoreRow{{Rank: 0, Opt: 0, Params: 1, Decode: true}}
	t.EC = &wire.ECTable{K: 2, M: 2, Groups: []wire.ECGroupRow{
		{Hosts: []int{5, 1, 2, 3}, Data: []int{5, 2}, Parity: []int{1, 3}, DataGroups: [][]int{{0, 1}, {2, 3}}},
		{Hosts: []int{4, 5, 6, 7}, Data: []int{4, 6}, Parity: []int{5, 7}, DataGroups: [][]int{{4, 5}, {6, 7}}},
	}}
	return t
}

// logTab returns ecDiffTable changed by f.
func logTab(f func(t *wire.EpochTable)) *wire.EpochTable {
	t := ecDiffTable()
	f(t)
	return t
}

// ecTab returns ecTable changed by f.
func ecTab(f func(t *wire.EpochTable, ec *wire.ECTable, g *wire.ECGroupRow)) *wire.EpochTable {
	t := ecTable()
	f(t, t.EC, &t.EC.Groups[0])
	return t
}

func TestPlacements(t *testing.T) {
	tab := table(7, []int{0, 2, 4}, nil, []int{1, 3, 5}, []int{6}, []int{})
	if err := tab.Validate(); err != nil {
		t.Fatal(err)
	}
	want := [][]wire.Placement{
		{
			{Rank: 0, Host: 0, LocalRank: 0, LocalSize: 3, NodeRank: 0},
			{Rank: 2, Host: 0, LocalRank: 1, LocalSize: 3, NodeRank: 0},
			{Rank: 4, Host: 0, LocalRank: 2, LocalSize: 3, NodeRank: 0},
		},
		nil,
		{
			{Rank: 1, Host: 2, LocalRank: 0, LocalSize: 3, NodeRank: 1},
			{Rank: 3, Host: 2, LocalRank: 1, LocalSize: 3, NodeRank: 1},
			{Rank: 5, Host: 2, LocalRank: 2, LocalSize: 3, NodeRank: 1},
		},
		{
			{Rank: 6, Host: 3, LocalRank: 0, LocalSize: 1, NodeRank: 2},
		},
		nil,
	}
	if got := tab.Placements(); !reflect.DeepEqual(got, want) {
		t.Errorf("Placements() =\n%+v\nwant\n%+v", got, want)
	}
	if got := tab.NodeCount(); got != 3 {
		t.Errorf("NodeCount() = %d, want 3", got)
	}
}

func TestPlacementsCluster(t *testing.T) {
	const hosts, per = 16, 4
	for _, byNodeMap := range []bool{false, true} {
		t.Run(fmt.Sprintf("byNode=%v", byNodeMap), func(t *testing.T) {
			tab := clusterTable(hosts, per, byNodeMap)
			if got := tab.NodeCount(); got != hosts {
				t.Errorf("NodeCount() = %d, want %d", got, hosts)
			}
			seen := map[int]bool{}
			for h, ps := range tab.Placements() {
				want := bySlot(h, per)
				if byNodeMap {
					want = byNode(h, hosts, per)
				}
				if len(ps) != per {
					t.Fatalf("host %d has %d placements, want %d", h, len(ps), per)
				}
				for l, p := range ps {
					if p != (wire.Placement{Rank: want[l], Host: h, LocalRank: l, LocalSize: per, NodeRank: h}) {
						t.Errorf("host %d local rank %d: %+v, want rank %d", h, l, p, want[l])
					}
					if seen[p.Rank] {
						t.Errorf("rank %d placed twice", p.Rank)
					}
					seen[p.Rank] = true
				}
			}
			if len(seen) != hosts*per {
				t.Errorf("%d ranks placed, want %d", len(seen), hosts*per)
			}
		})
	}
}

// TestEpochTableCompact checks that ranks mapped by slot or by node cost a
// few bytes per host, however many ranks a host runs.
func TestEpochTableCompact(t *testing.T) {
	const hosts, per, limit = 1024, 8, 100 << 10
	for _, byNodeMap := range []bool{false, true} {
		t.Run(fmt.Sprintf("byNode=%v", byNodeMap), func(t *testing.T) {
			tab := clusterTable(hosts, per, byNodeMap)
			for _, h := range tab.Hosts {
				if len(h.Ranks) != 1 {
					t.Fatalf("host %s ranks compressed to %v, want one range", h.Name, h.Ranks)
				}
			}
			b := tab.Encode()
			j := wire.Marshal(tab)
			t.Logf("%d hosts × %d ranks: Encode %d bytes (%.1f per host), JSON %d bytes",
				hosts, per, len(b), float64(len(b))/hosts, len(j))
			if len(b) >= limit {
				t.Errorf("Encode is %d bytes, want < %d", len(b), limit)
			}
			if len(j) >= limit {
				t.Errorf("JSON is %d bytes, want < %d", len(j), limit)
			}
			got, err := wire.DecodeEpochTable(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tab) {
				t.Fatal("decoded table differs")
			}
		})
	}
}

func BenchmarkDecodeEpochTable(b *testing.B) {
	enc := clusterTable(1024, 8, true).Encode()
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.DecodeEpochTable(enc); err != nil {
			b.Fatal(err)
		}
	}
}
