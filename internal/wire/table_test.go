package wire_test

import (
	"encoding/binary"
	"errors"
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

func TestEpochTableRejects(t *testing.T) {
	tab := func(f func(*wire.EpochTable)) *wire.EpochTable {
		t := clusterTable(2, 2, false)
		f(t)
		return t
	}
	// Tables that Encode writes faithfully but that are not valid.
	invalid := []struct {
		name string
		tab  *wire.EpochTable
	}{
		{"version 0", tab(func(t *wire.EpochTable) { t.Version = 0 })},
		{"version 2", tab(func(t *wire.EpochTable) { t.Version = wire.Version + 1 })},
		{"empty job", tab(func(t *wire.EpochTable) { t.Job = "" })},
		{"uppercase job", tab(func(t *wire.EpochTable) { t.Job = "JOB" })},
		{"job with dot", tab(func(t *wire.EpochTable) { t.Job = "a.b" })},
		{"world 0", table(0, nil)},
		{"world past MaxWorld", tab(func(t *wire.EpochTable) { t.World = wire.MaxWorld + 1 })},
		{"negative world", tab(func(t *wire.EpochTable) { t.World = -4 })},
		{"no hosts", table(1)},
		{"negative master port", tab(func(t *wire.EpochTable) { t.MasterPort = -1 })},
		{"master port 65536", tab(func(t *wire.EpochTable) { t.MasterPort = 65536 })},
		{"oversized host name", tab(func(t *wire.EpochTable) { t.Hosts[1].Name = tooLong })},
		{"oversized host address", tab(func(t *wire.EpochTable) { t.Hosts[0].Addr = tooLong })},
		{"duplicate rank across hosts", table(2, []int{0, 1}, []int{1})},
		{"spare with ranks", tab(func(t *wire.EpochTable) { t.Hosts[0].Spare = true })},
		{"fenced with ranks", tab(func(t *wire.EpochTable) { t.Hosts[1].Fenced = true })},
		{"resume step below -1", tab(func(t *wire.EpochTable) { t.G = -2 })},
		{"resume step past MaxStep", tab(func(t *wire.EpochTable) { t.G = wire.MaxStep + 1 })},
		{"holder rows out of order", tab(func(t *wire.EpochTable) {
			t.Holders = []wire.HolderRow{{Rank: 1, Holders: []int{2}}, {Rank: 0, Holders: []int{2}}}
		})},
		{"two holder rows of a rank", tab(func(t *wire.EpochTable) {
			t.Holders = []wire.HolderRow{{Rank: 1, Holders: []int{2}}, {Rank: 1, Holders: []int{3}}}
		})},
		{"holder row past world", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 4, Holders: []int{2}}} })},
		{"rank its own holder", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 1, Holders: []int{1}}} })},
		{"holder twice", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 0, Holders: []int{2, 2}}} })},
		{"holder past world", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 0, Holders: []int{9}}} })},
		{"holder row without holders", tab(func(t *wire.EpochTable) { t.Holders = []wire.HolderRow{{Rank: 0}} })},
		{"restore rows out of order", tab(func(t *wire.EpochTable) {
			t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 0, Params: 3}, {Rank: 1, Opt: 3, Params: 0}}
		})},
		{"restore from itself", tab(func(t *wire.EpochTable) { t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 2, Params: 3}} })},
		{"restore source past world", tab(func(t *wire.EpochTable) { t.Restore = []wire.RestoreRow{{Rank: 2, Opt: 0, Params: 4}} })},
		{"duplicate rank across hosts, world not full", table(3, []int{0, 1}, []int{1, 2})},
		{"duplicate rank in a host", table(2, []int{0, 0})},
		{"missing rank", table(3, []int{0}, []int{2})},
		{"all ranks missing", table(2, nil, nil)},
		{"rank past world", table(2, []int{0, 1}, []int{2})},
		{"too many ranks", table(2, []int{0, 1, 2})},
		{"range past world", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(2, 3, 1)} })},
		{"zero count", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(2, 2, 1), rr(0, 0, 1)} })},
		{"zero stride", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(2, 2, 0)} })},
		{"negative first", tab(func(t *wire.EpochTable) { t.Hosts[1].Ranks = wire.RankSet{rr(-1, 1, 1)} })},
	}
	for _, tc := range invalid {
		t.Run("Validate/"+tc.name, func(t *testing.T) {
			if err := tc.tab.Validate(); !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("Validate() = %v, want ErrMalformed", err)
			}
		})
	}
	cases := make([]rejectCase, 0, len(invalid))
	for _, tc := range invalid {
		cases = append(cases, rejectCase{tc.name, tc.tab.Encode()})
	}

	valid := clusterTable(2, 2, false).Encode()
	header := func(fields ...uint64) []byte {
		b := []byte{'T', 3}
		for _, f := range fields {
			b = binary.AppendUvarint(b, f)
		}
		return b
	}
	overflow := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}
	cases = append(cases,
		rejectCase{"empty input", nil},
		rejectCase{"magic only", []byte{'T'}},
		rejectCase{"bad magic", append([]byte{'J'}, valid[1:]...)},
		rejectCase{"json", wire.Marshal(clusterTable(2, 2, false))},
		rejectCase{"format 0", append([]byte{'T', 0}, valid[2:]...)},
		rejectCase{"format 1 (without replica ports)", append([]byte{'T', 1}, valid[2:]...)},
		rejectCase{"format 2 (without membership)", append([]byte{'T', 2}, valid[2:]...)},
		rejectCase{"format 4", append([]byte{'T', 4}, valid[2:]...)},
		rejectCase{"trailing byte", append(valid[:len(valid):len(valid)], 0)},
		rejectCase{"varint overflow", append(header(1, 0), overflow...)},
		rejectCase{"job longer than MaxStringLen", append(header(1, 0, 1, wire.MaxStringLen+1), tooLong...)},
		rejectCase{"job length past end", append(header(1, 0, 1, 10), "job"...)},
		rejectCase{"host count past input", append(appendStrs(header(1, 0, 1), "j", ""), 0, 50, 0, 0, 0)},
		rejectCase{"host count past MaxHosts", append(binary.AppendUvarint(append(appendStrs(header(1, 0, 1), "j", ""), 0), wire.MaxHosts+1), make([]byte, 4*(wire.MaxHosts+1))...)},
		rejectCase{"range count past input", append(appendStrs(header(1, 0, 1), "j", ""), 0, 1, 0, 0, 0, 40, 0, 1, 1)},
		rejectCase{"rank past MaxWorld", binary.AppendUvarint(append(appendStrs(header(1, 0, 1), "j", ""), 0, 1, 0, 0, 0, 1, 0, 1), wire.MaxWorld+1)},
	)
	// Every proper prefix of a valid encoding is truncated.
	for n := range len(valid) {
		cases = append(cases, rejectCase{fmt.Sprintf("truncated to %d", n), valid[:n]})
	}
	testRejects(t, wire.DecodeEpochTable, cases)
}

// appendStrs appends each s as uvarint(len) and its bytes.
func appendStrs(b []byte, ss ...string) []byte {
	for _, s := range ss {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func TestEpochTableValidateTooManyHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MaxHosts hosts")
	}
	tab := table(1, []int{0})
	tab.Hosts = append(tab.Hosts, make([]wire.TableHost, wire.MaxHosts)...)
	if err := tab.Validate(); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("Validate() with %d hosts = %v, want ErrMalformed", len(tab.Hosts), err)
	}
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
