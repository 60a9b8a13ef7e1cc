package launcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
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
				j.hosts = append(j.hosts, &hostAgent{index: i, name: h.Name, topo: h, spare: h.Spare, ranks: tt.ranks[i]})
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

// TestPlaceECDiff: in diff mode under EC placeRedundancy also plans every
// rank's log-only holders (topology.ECLogHolders) into j.logs, the
// machine gets them with Diff, and epochs carry H (never above G); in
// full mode there are none.
func TestPlaceECDiff(t *testing.T) {
	for _, mode := range []ProtectMode{ModeDiff, ModeFull} {
		t.Run(string(mode), func(t *testing.T) {
			j := &job{cfg: Config{ECK: 2, ECM: 2, ProtectMode: mode, NP: 8}, world: 8, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
			ranks := [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, nil}
			hosts := append(hosts4("", "", "", ""), topology.Host{Name: "s", Slots: 2, Spare: true})
			for i, h := range hosts {
				h.Slots = 2
				j.hosts = append(j.hosts, &hostAgent{index: i, name: h.Name, topo: h, spare: h.Spare, ranks: ranks[i]})
			}
			j.rankHost = []int{0, 0, 1, 1, 2, 2, 3, 3}
			if err := j.placeRedundancy(nil); err != nil {
				t.Fatal(err)
			}
			if mode == ModeFull {
				if j.logs != nil || j.diffEC() || j.epochH(5) != 0 {
					t.Fatalf("full mode: logs %v, diffEC %v, H %d", j.logs, j.diffEC(), j.epochH(5))
				}
				return
			}
			want := topology.ECLogHolders(j.ecGroups, j.rankHost, j.placement())
			if !reflect.DeepEqual(j.logs, want) || len(holderRows(j.logs)) != 8 {
				t.Fatalf("logs %v, want %v", j.logs, want)
			}
			c := j.machineConfig()
			if !c.Diff || !reflect.DeepEqual(c.Logs, want) {
				t.Fatalf("machine config Diff %v, Logs %v", c.Diff, c.Logs)
			}
			if _, err := hotswap.New(c); err != nil {
				t.Fatalf("hotswap.New: %v", err)
			}
			j.prog = newProgress(j.placement(), j.rankHost, func(*wire.GlobalStep) {})
			j.prog.trackH()
			if h := j.epochH(-1); h != -1 {
				t.Fatalf("H = %d before any base, want -1", h)
			}
			for h := range 4 {
				j.prog.handle(&wire.UpProgress{Host: h, Ranks: []wire.RankProgress{{Rank: 2 * h, Committed: 9, Replicated: 9, Base: 8}, {Rank: 2*h + 1, Committed: 9, Replicated: 9, Base: 8}}})
			}
			if h := j.epochH(9); h != 8 {
				t.Fatalf("H = %d, want 8", h)
			}
			if h := j.epochH(5); h != -1 {
				t.Fatalf("H = %d for an epoch resuming from 5, want -1: never above G, and 5 is no base (the H before 8 was -1)", h)
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

// TestECFreeSlotsPublishes: under ec:2+2 with no spare (--on-no-spare
// free-slots, the default), a lost host's ranks and its places in the
// group go to a surviving host of the group, which then holds two places
// (topology.ECGroup.Replace). The recovery epoch's table is published
// (it was refused: "host 1 is in erasure-coding groups 0 and 0", and the
// job stopped), carries the doubled place, and the report states the
// group's reduced tolerance.
func TestECFreeSlotsPublishes(t *testing.T) {
	events := &syncBuffer{}
	jobs := make(chan *job, 1)
	r := startRun(t, 4, `echo "up $GORUN_RANK"; exec env -u GORUN_JOB_ID sleep 600`, func(c *Config) {
		c.Hosts = nil
		for i := range 4 {
			c.Hosts = append(c.Hosts, topology.Host{Name: fmt.Sprintf("127.0.0.%d", i+1), Slots: 2})
		}
		c.MapBy = topology.MapByNode // one rank per host, a free slot on each
		c.ECK, c.ECM = 2, 2
		c.Events = events
		c.Recovery = hotswap.RecoveryInPlace
		c.KillGrace = time.Second
		c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, time.Second
		c.running = func(j *job) { jobs <- j }
	})
	j := <-jobs
	r.waitLines(regexp.MustCompile(`(?m)^\[\d\] up \d$`), 4)
	tab := j.rv.Table()
	want := wire.ECGroupRow{Hosts: []int{0, 1, 2, 3}, Data: []int{0, 2}, Parity: []int{1, 3}, DataGroups: [][]int{{0, 1}, {2, 3}}}
	if tab.EC == nil || !reflect.DeepEqual(tab.EC.Groups, []wire.ECGroupRow{want}) {
		t.Fatalf("first table's EC %+v, want the group %+v", tab.EC, want)
	}
	// Every rank protected step 5 (as their hosts' agents report it).
	for h := range 4 {
		j.progress <- &wire.UpProgress{Host: h, Ranks: []wire.RankProgress{{Rank: h, Committed: 5, Replicated: 5}}}
	}
	waitUntil(t, r, "G = 5", func() bool { return j.prog.G() == 5 })

	// Data host 0 (rank 0) is lost: its agent ends.
	j.killAgent(j.hosts[0])
	waitUntil(t, r, "published epoch in --events", func() bool { return strings.Contains(events.String(), `"event":"publish"`) })
	tab = j.rv.Table()
	if err := tab.Validate(); err != nil {
		t.Fatalf("the published table does not validate: %v", err)
	}
	if tab.Epoch != 1 || tab.G != 5 || !tab.Hosts[0].Fenced {
		t.Fatalf("table epoch %d G %d host 0 %+v; want epoch 1, G 5, host 0 fenced", tab.Epoch, tab.G, tab.Hosts[0])
	}
	with := j.rankHost[0]
	g := tab.EC.Groups[0]
	wantG := wire.ECGroupRow{Hosts: []int{with, 1, 2, 3}, Data: []int{with, 2}, Parity: []int{1, 3}, DataGroups: want.DataGroups}
	if with == 0 || !reflect.DeepEqual(g, wantG) {
		t.Fatalf("rank 0 on host %d; group %+v, want %+v", with, g, wantG)
	}
	// Rank 0's own slot and its clear copy went with host 0: it decodes.
	if len(tab.Restore) != 1 || tab.Restore[0].Rank != 0 || !tab.Restore[0].Decode {
		t.Errorf("restore rows %+v, want rank 0 decoding", tab.Restore)
	}
	// Clear copies: rank 1 on host 0's place (with) unless it runs there,
	// rank 3 on host 2; rank 0 runs on its data host.
	var wantHolders []wire.HolderRow
	if with != 1 {
		wantHolders = append(wantHolders, wire.HolderRow{Rank: 1, Holders: []int{slices.Min(j.hosts[with].ranks)}})
	}
	wantHolders = append(wantHolders, wire.HolderRow{Rank: 3, Holders: []int{2}})
	if !reflect.DeepEqual(tab.Holders, wantHolders) {
		t.Errorf("holders %+v, want %+v", tab.Holders, wantHolders)
	}
	reduced := fmt.Sprintf("erasure-coding group 0 (hosts %s) survives", strings.Join([]string{j.hosts[with].name, "127.0.0.2", "127.0.0.3", "127.0.0.4"}, ","))
	twice := fmt.Sprintf("(host %s holds 2 of its places)", j.hosts[with].name)
	waitUntil(t, r, "the reduced tolerance reported", func() bool {
		s := r.stderr.String()
		return strings.Contains(s, reduced) && strings.Contains(s, twice)
	})

	r.signals <- syscall.SIGTERM
	r.wait()
	if r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d (stopped by SIGTERM, not by the recovery)", r.code, 128+int(syscall.SIGTERM))
	}
}
