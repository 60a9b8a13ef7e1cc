package launcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// TestECJobTable: a job run with ec:2+2 on four hosts of two ranks
// publishes its erasure-coding groups and the clear copies' holders in
// its epoch table, and -v states what it survives.
func TestECJobTable(t *testing.T) {
	jobs := make(chan *job, 1)
	r := startRun(t, 8, `echo "up $GORUN_RANK"; exec env -u GORUN_JOB_ID sleep 600`, func(c *Config) {
		c.Hosts = nil
		for i := range 4 {
			c.Hosts = append(c.Hosts, topology.Host{Name: fmt.Sprintf("127.0.0.%d", i+1), Slots: 2})
		}
		c.ECK, c.ECM = 2, 2
		c.running = func(j *job) { jobs <- j }
	})
	j := <-jobs
	r.waitLines(regexp.MustCompile(`(?m)^\[\d\] up \d$`), 8)
	tab := j.rv.Table()
	// Data groups {0..3} and {4..7}: hosts 0 and 2 hold them in the clear.
	want := &wire.ECTable{K: 2, M: 2, Groups: []wire.ECGroupRow{{
		Hosts: []int{0, 1, 2, 3}, Data: []int{0, 2}, Parity: []int{1, 3},
		DataGroups: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}},
	}}}
	if !reflect.DeepEqual(tab.EC, want) {
		t.Errorf("table EC %+v, want %+v", tab.EC, want)
	}
	wantHolders := []wire.HolderRow{{Rank: 2, Holders: []int{0}}, {Rank: 3, Holders: []int{0}}, {Rank: 6, Holders: []int{4}}, {Rank: 7, Holders: []int{4}}}
	if !reflect.DeepEqual(tab.Holders, wantHolders) {
		t.Errorf("table holders %+v, want %+v", tab.Holders, wantHolders)
	}
	if s := "gorun: state protection: ec:2+2 over 4 hosts: any 2 of the 4 hosts\n"; !strings.Contains(r.stderr.String(), s) {
		t.Errorf("stderr does not say %q:\n%s", s, r.stderr.String())
	}
}

// TestPlaceEC: placeEC plans the groups over the job's hosts (job host
// indices: hosts without ranks are not in them), across racks when the
// hostfile names them, and the clear copies' holders; a job that cannot
// be planned is a ConfigError saying why.
func TestPlaceEC(t *testing.T) {
	tests := []struct {
		name        string
		hosts       []topology.Host // j.hosts' topology
		ranks       [][]int         // per job host
		k, m        int
		wantHosts   []int // of the one group
		wantData    []int
		wantHolders [][]int
		err         string
	}{
		{"one rank per host", hosts4("", "", "", ""), [][]int{{0}, {1}, {2}, {3}}, 2, 2,
			[]int{0, 1, 2, 3}, []int{0, 2}, [][]int{nil, {0}, nil, {2}}, ""},
		{"racks: spread", hosts4("a", "a", "b", "b"), [][]int{{0}, {1}, {2}, {3}}, 2, 2,
			[]int{0, 2, 1, 3}, []int{0, 1}, [][]int{nil, nil, {0}, {1}}, ""},
		{"a spare among the hosts", append(hosts4("", "", "", ""), topology.Host{Name: "s", Slots: 1, Spare: true}),
			[][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, nil}, 2, 2,
			[]int{0, 1, 2, 3}, []int{0, 2}, [][]int{nil, nil, {0}, {0}, nil, nil, {4}, {4}}, ""},
		{"3 hosts", hosts4("", "", "")[:3], [][]int{{0}, {1}, {2}}, 2, 2, nil, nil, nil,
			"--redundancy ec:2+2: only 3 hosts with ranks; a group needs 2 data + 2 parity hosts"},
		{"5 hosts", append(hosts4("", "", "", ""), topology.Host{Name: "e", Slots: 1}), [][]int{{0}, {1}, {2}, {3}, {4}}, 2, 2, nil, nil, nil,
			"--redundancy ec:2+2: 5 hosts with ranks cannot form groups of 2 data + 2 parity hosts: 1 left over"},
		{"ranks not a multiple of K", hosts4("", "", "", ""), [][]int{{0, 1}, {2}, {3}, {4}}, 2, 2, nil, nil, nil,
			"--redundancy ec:2+2: group 0 has 5 ranks on hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := &job{cfg: Config{ECK: tt.k, ECM: tt.m}, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
			for i, h := range tt.hosts {
				j.hosts = append(j.hosts, &agentHost{index: i, name: h.Name, topo: h, spare: h.Spare, ranks: tt.ranks[i]})
				for range tt.ranks[i] {
					j.rankHost = append(j.rankHost, 0)
				}
			}
			for i, rs := range tt.ranks {
				for _, r := range rs {
					j.rankHost[r] = i
				}
			}
			err := j.placeRedundancy(nil)
			if tt.err != "" {
				var ce *ConfigError
				if !errors.As(err, &ce) || !errors.Is(err, topology.ErrECGroups) || !strings.HasPrefix(ce.Msg, tt.err) {
					t.Fatalf("placeRedundancy: %v; want a ConfigError wrapping ErrECGroups starting %q", err, tt.err)
				}
				if j.ecGroups != nil || j.holders != nil {
					t.Errorf("groups %v and holders %v kept after an error", j.ecGroups, j.holders)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(j.ecGroups) != 1 || !reflect.DeepEqual(j.ecGroups[0].Hosts, tt.wantHosts) || !reflect.DeepEqual(j.ecGroups[0].Data, tt.wantData) {
				t.Fatalf("groups %+v; want hosts %v, data hosts %v", j.ecGroups, tt.wantHosts, tt.wantData)
			}
			if !reflect.DeepEqual(j.holders, tt.wantHolders) {
				t.Errorf("holders %v, want %v", j.holders, tt.wantHolders)
			}
			if tab := j.ecTable(); tab == nil || tab.K != tt.k || tab.M != tt.m || !reflect.DeepEqual(tab.Groups[0].DataGroups, j.ecGroups[0].DataGroups) {
				t.Errorf("ecTable() = %+v for groups %+v", tab, j.ecGroups)
			}
		})
	}
}

// hosts4 returns hosts a, b, c, d of one slot in the racks given.
func hosts4(racks ...string) []topology.Host {
	var hs []topology.Host
	for i, r := range racks {
		hs = append(hs, topology.Host{Name: string(rune('a' + i)), Slots: 1, Rack: r})
	}
	return hs
}

// TestRunECConfigError: Run refuses an erasure code the hosts cannot
// form, or one given with replicas, before it starts anything.
func TestRunECConfigError(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hosts    int
		k, m     int
		replicas int
		want     string
	}{
		{"3 hosts for 2+2", 3, 2, 2, 0, "--redundancy ec:2+2: only 3 hosts with ranks; a group needs 2 data + 2 parity hosts"},
		{"6 hosts for 2+2", 6, 2, 2, 0, "--redundancy ec:2+2: 6 hosts with ranks cannot form groups of 2 data + 2 parity hosts: 2 left over"},
		{"with replicas", 4, 2, 2, 1, "--redundancy ec:2+2 and --replicas 1: give one of them"},
		{"no parity", 4, 4, 0, 0, "--redundancy ec:4+0: want K >= 1 data and M >= 1 parity hosts"},
		{"too wide", 4, 200, 100, 0, "--redundancy ec:200+100: want K >= 1 data and M >= 1 parity hosts, K+M at most 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{NP: tc.hosts, Prog: "true", Dir: t.TempDir(), ECK: tc.k, ECM: tc.m, Replicas: tc.replicas}
			for i := range tc.hosts {
				cfg.Hosts = append(cfg.Hosts, topology.Host{Name: fmt.Sprintf("127.0.0.%d", i+1), Slots: 1})
			}
			code, err := Run(context.Background(), cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %d, %v; want a configuration error saying %q", code, err, tc.want)
			}
		})
	}
}
