package agent

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// TestTablePlacementEC: a table with an erasure-coding layout gives the
// placement topology.PlanEC planned for the job (Workers from the table's
// hosts, reduction groups from its data groups; Targets, which the agents
// do not use, nil), with its Decode restore rows as Decode sources, after
// the table's trip through its binary encoding; a table without EC gives
// none.
func TestTablePlacementEC(t *testing.T) {
	for _, tc := range []struct {
		name       string
		perHost    [][]int // the table's ranks per host; the last host is an idle spare
		k, m       int
		restore    []wire.RestoreRow
		wantSource map[int]keeper.Source
	}{
		{"2+2, by slot", [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, nil}, 2, 2, nil, nil},
		{"2+2, by node", [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}, nil}, 2, 2,
			[]wire.RestoreRow{{Rank: 1, Opt: 1, Params: 0, Decode: true}, {Rank: 5, Opt: 0, Params: 4}},
			map[int]keeper.Source{1: {Opt: 1, Params: 0, Decode: true}, 5: {Opt: 0, Params: 4}}},
		{"2+1 twice, uneven hosts", [][]int{{0, 1, 2}, {3}, {4, 5}, {6}, {7, 8, 9}, {10, 11}, nil}, 2, 1, nil, nil},
		{"4+2, ranks out of order", [][]int{{11, 5}, {4, 10}, {3, 9}, {2, 8}, {1, 7}, {0, 6}, nil}, 4, 2, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts := make([]topology.Host, len(tc.perHost))
			var assign []topology.Assignment
			tab := &wire.EpochTable{Version: wire.Version, Job: "ec", Epoch: 7, G: 3, Restore: tc.restore}
			for h, ranks := range tc.perHost {
				hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: max(len(ranks), 1), Spare: len(ranks) == 0}
				for _, r := range ranks {
					assign = append(assign, topology.Assignment{Rank: r, Host: h})
				}
				tab.World += len(ranks)
				tab.Hosts = append(tab.Hosts, wire.TableHost{Name: hosts[h].Name, Addr: "127.0.0.1", Ranks: wire.CompressRanks(ranks), Spare: len(ranks) == 0})
			}
			groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: tc.k, M: tc.m})
			if err != nil {
				t.Fatal(err)
			}
			tab.EC = &wire.ECTable{K: tc.k, M: tc.m}
			for _, g := range groups {
				tab.EC.Groups = append(tab.EC.Groups, wire.ECGroupRow{Hosts: g.Hosts, Data: g.Data, Parity: g.Parity, DataGroups: g.DataGroups})
			}
			// Diff mode's log-only holders and H ride along.
			rankHost := make([]int, tab.World)
			hostRanks := make([][]int, len(tc.perHost))
			for _, a := range assign {
				rankHost[a.Rank] = a.Host
				hostRanks[a.Host] = append(hostRanks[a.Host], a.Rank)
			}
			logs := topology.ECLogHolders(groups, rankHost, hostRanks)
			for r, ls := range logs {
				if len(ls) > 0 {
					tab.Logs = append(tab.Logs, wire.HolderRow{Rank: r, Holders: ls})
				}
			}
			tab.H = 2
			tab, err = wire.DecodeEpochTable(tab.Encode())
			if err != nil {
				t.Fatal(err)
			}
			wantLogs := make([][]int, tab.World)
			copy(wantLogs, logs)
			want := make([]topology.ECGroup, len(groups))
			for i, g := range groups {
				want[i] = g
				want[i].Reductions = nil
				for _, red := range g.Reductions {
					want[i].Reductions = append(want[i].Reductions, topology.Reduction{Members: red.Members})
				}
			}
			for host := range tc.perHost {
				pl := tablePlacement(tab, host)
				if !reflect.DeepEqual(pl.EC, want) {
					t.Fatalf("host %d: EC\n%+v\nwant\n%+v", host, pl.EC, want)
				}
				if pl.Epoch != 7 || pl.G != 3 {
					t.Errorf("host %d: placement epoch %d, G %d; want the table's 7 and 3 (they label the shares)", host, pl.Epoch, pl.G)
				}
				if !reflect.DeepEqual(pl.Logs, wantLogs) || pl.H != 2 {
					t.Errorf("host %d: Logs %v, H %d; want %v and 2", host, pl.Logs, pl.H, wantLogs)
				}
				if !reflect.DeepEqual(pl.Sources, tc.wantSource) {
					t.Errorf("host %d: Sources %+v, want %+v", host, pl.Sources, tc.wantSource)
				}
			}
			tab.EC, tab.Restore, tab.Logs, tab.H = nil, nil, nil, 0
			if pl := tablePlacement(tab, 0); pl.EC != nil || pl.Logs != nil || pl.H != 0 {
				t.Errorf("a table without EC: placement EC %+v, Logs %v, H %d", pl.EC, pl.Logs, pl.H)
			}
		})
	}
}
