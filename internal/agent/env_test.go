package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// envMap turns env into a map, failing on a name given twice.
func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Errorf("entry without '=': %q", kv)
		}
		if old, dup := m[k]; dup {
			t.Errorf("%s given twice: %q and %q", k, old, v)
		}
		m[k] = v
	}
	return m
}

// unset, as checkVar's want, is a variable that must not be set (an
// empty want is one set to the empty string).
const unset = "\x00unset"

// checkVar checks that env (envMap's) sets name to want, or does not set
// it if want is unset.
func checkVar(t *testing.T, env map[string]string, name, want string) {
	t.Helper()
	got, ok := env[name]
	switch {
	case want == unset && ok:
		t.Errorf("%s=%q, want it unset", name, got)
	case want != unset && (!ok || got != want):
		t.Errorf("%s=%q (set %v), want %q", name, got, ok, want)
	}
}

func TestBaseEnvStripsInheritedContract(t *testing.T) {
	var inherited []string
	// Every contract variable, as an enclosing job would have set it.
	for _, n := range wire.ContractNames {
		inherited = append(inherited, n+"=stale")
	}
	inherited = append(inherited,
		"PATH=/usr/bin:/bin",
		"GORUN_SOMETHING_ELSE=x", // any GORUN_ variable, not only the contract
		"GORUN_=y",
		"HOME=/home/u",
		"OMP_NUM_THREADS=4", // not part of the contract: kept
		"TMPDIR=/var/tmp",   // likewise (rankEnv replaces it)
		"MY_RANK=7",         // names that merely contain a contract name
		"XGORUN_JOB_ID=z",
	)
	got := baseEnv(inherited, []string{"HOME=/home/x", "GORUNTEST_X=a=b c", "PATH=/opt/bin"})
	want := []string{
		"PATH=/opt/bin",
		"HOME=/home/x",
		"OMP_NUM_THREADS=4",
		"TMPDIR=/var/tmp",
		"MY_RANK=7",
		"XGORUN_JOB_ID=z",
		"GORUNTEST_X=a=b c",
	}
	if !slices.Equal(got, want) {
		t.Errorf("baseEnv =\n%q\nwant\n%q", got, want)
	}
}

func TestBaseEnvDoesNotModifyItsInput(t *testing.T) {
	in := []string{"A=1", "RANK=3", "B=2"}
	extra := []string{"A=9"}
	baseEnv(in, extra)
	if !slices.Equal(in, []string{"A=1", "RANK=3", "B=2"}) || !slices.Equal(extra, []string{"A=9"}) {
		t.Errorf("inputs changed: %q %q", in, extra)
	}
}

func TestMergeEnv(t *testing.T) {
	tests := []struct {
		name           string
		env, over, out []string
	}{
		{"empty", nil, nil, []string{}},
		{"only env", []string{"A=1", "B=2"}, nil, []string{"A=1", "B=2"}},
		{"only over", nil, []string{"A=1", "B=2"}, []string{"A=1", "B=2"}},
		{"over replaces in place", []string{"A=1", "B=2", "C=3"}, []string{"B=20"}, []string{"A=1", "B=20", "C=3"}},
		{"new names go last in their order", []string{"A=1"}, []string{"Z=26", "M=13"}, []string{"A=1", "Z=26", "M=13"}},
		{"later duplicates in env win", []string{"A=1", "B=2", "A=3"}, nil, []string{"A=3", "B=2"}},
		{"later duplicates in over win", []string{"A=1"}, []string{"C=5", "A=2", "C=6"}, []string{"A=2", "C=6"}},
		{"empty value", []string{"A=1"}, []string{"A="}, []string{"A="}},
		{"value with =", []string{"A=1"}, []string{"A=x=y"}, []string{"A=x=y"}},
		{"name is the text before the first =", []string{"AB=1", "A=2"}, []string{"A=B=3"}, []string{"AB=1", "A=B=3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mergeEnv(tt.env, tt.over)
			if !slices.Equal(got, tt.out) {
				t.Errorf("mergeEnv(%q, %q) = %q, want %q", tt.env, tt.over, got, tt.out)
			}
		})
	}
}

// TestMergeEnvSeveral: merging several lists at once is merging them in
// turn.
func TestMergeEnvSeveral(t *testing.T) {
	for _, tt := range []struct {
		name  string
		env   []string
		overs [][]string
	}{
		{"none", []string{"A=1"}, nil},
		{"disjoint", []string{"A=1"}, [][]string{{"B=2"}, {"C=3"}}},
		{"later lists win", []string{"A=1", "B=2"}, [][]string{{"B=3", "C=4"}, {"C=5", "A=6"}, nil, {"B=7"}}},
		{"duplicates within a list", nil, [][]string{{"X=1", "X=2"}, {"Y=1"}, {"X=3", "Y=2", "Y=3"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.env
			for _, o := range tt.overs {
				want = mergeEnv(want, o)
			}
			if got := mergeEnv(tt.env, tt.overs...); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Errorf("mergeEnv(%q, %q...) = %q, want %q (in turn)", tt.env, tt.overs, got, want)
			}
		})
	}
}

// testTable is a valid epoch table: host 0 runs ranks 0 and 2, host 1 runs
// no rank (a spare), host 2 runs ranks 1, 3 and 4, host 3 runs rank 5.
func testTable() *wire.EpochTable {
	return &wire.EpochTable{
		Version: wire.Version, Job: "abcdefgh", Epoch: 3, World: 6,
		MasterAddr: "10.0.0.1", MasterPort: 29500,
		Hosts: []wire.TableHost{
			{Name: "h0", Addr: "10.0.0.1", Ranks: wire.CompressRanks([]int{0, 2})},
			{Name: "spare", Addr: "10.0.0.9"},
			{Name: "h2", Addr: "10.0.0.2", Ranks: wire.CompressRanks([]int{1, 3, 4})},
			{Name: "h3", Addr: "10.0.0.3", Ranks: wire.CompressRanks([]int{5})},
		},
	}
}

func TestRankEnvContract(t *testing.T) {
	tab := testTable()
	if err := tab.Validate(); err != nil {
		t.Fatal(err)
	}
	if tab.NodeCount() != 3 {
		t.Fatalf("NodeCount = %d, want 3", tab.NodeCount())
	}
	base := baseEnv([]string{"PATH=/bin", "RANK=99", "TMPDIR=/inherited"}, []string{"USERVAR=u"})
	seen := map[int]bool{}
	for h, places := range tab.Placements() {
		for _, pl := range places {
			t.Run(fmt.Sprintf("rank=%d", pl.Rank), func(t *testing.T) {
				socket := fmt.Sprintf("/run/job/rank-%d.sock", pl.Rank)
				env := envMap(t, rankEnv(base, &wire.JobSpec{Env: []string{"USERVAR=u"}, TP: 2}, tab, pl, socket, "/job/tmp"))
				if seen[pl.Rank] {
					t.Fatalf("rank %d placed twice", pl.Rank)
				}
				seen[pl.Rank] = true
				for _, n := range wire.ContractNames {
					if _, ok := env[n]; !ok {
						t.Errorf("%s not set", n)
					}
				}
				rank, world := strconv.Itoa(pl.Rank), "6"
				local, localSize := strconv.Itoa(pl.LocalRank), strconv.Itoa(pl.LocalSize)
				// Node ranks count the hosts that run ranks: the spare is skipped.
				node := map[int]string{0: "0", 2: "1", 3: "2"}[h]
				want := map[string]string{
					"GORUN_JOB_ID": "abcdefgh", "TORCHELASTIC_RUN_ID": "abcdefgh",
					"GORUN_RANK": rank, "RANK": rank, "ROLE_RANK": rank, "OMPI_COMM_WORLD_RANK": rank, "PMI_RANK": rank,
					"GORUN_WORLD_SIZE": world, "WORLD_SIZE": world, "ROLE_WORLD_SIZE": world, "OMPI_COMM_WORLD_SIZE": world, "PMI_SIZE": world,
					"GORUN_LOCAL_RANK": local, "LOCAL_RANK": local, "OMPI_COMM_WORLD_LOCAL_RANK": local,
					"GORUN_LOCAL_SIZE": localSize, "LOCAL_WORLD_SIZE": localSize, "OMPI_COMM_WORLD_LOCAL_SIZE": localSize,
					"GORUN_NODE_RANK": node, "GROUP_RANK": node, "OMPI_COMM_WORLD_NODE_RANK": node,
					"GROUP_WORLD_SIZE": "3",
					"GORUN_EPOCH":      "3",
					"GORUN_SOCKET":     socket,
					"MASTER_ADDR":      "10.0.0.1", "MASTER_PORT": "29500",
					"GORUN_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
					"ROLE_NAME":     "default",
					"GORUN_TP_SIZE": "2", "GORUN_PP_SIZE": "1", "GORUN_DP_SIZE": "3", // world 6, --tp 2
					"PATH": "/bin", "USERVAR": "u",
					"TMPDIR": "/job/tmp", // the inherited TMPDIR is replaced
				}
				for k, v := range want {
					if env[k] != v {
						t.Errorf("%s=%q, want %q", k, env[k], v)
					}
				}
				// 1 where ranks share the host, unset where one is alone.
				omp := "1"
				if pl.LocalSize == 1 {
					omp = unset
				}
				checkVar(t, env, "OMP_NUM_THREADS", omp)
			})
		}
	}
	if len(seen) != tab.World {
		t.Errorf("%d ranks placed, want %d", len(seen), tab.World)
	}
}

func TestRankEnvLocalRanksFollowTableOrder(t *testing.T) {
	tab := testTable()
	places := tab.Placements()
	want := map[int][2]int{ // rank → local rank, local size
		0: {0, 2}, 2: {1, 2}, 1: {0, 3}, 3: {1, 3}, 4: {2, 3}, 5: {0, 1},
	}
	for _, ps := range places {
		for _, pl := range ps {
			env := envMap(t, rankEnv(nil, &wire.JobSpec{}, tab, pl, "s", "/t"))
			w := want[pl.Rank]
			if env["LOCAL_RANK"] != strconv.Itoa(w[0]) || env["LOCAL_WORLD_SIZE"] != strconv.Itoa(w[1]) {
				t.Errorf("rank %d: LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s, want %d %d",
					pl.Rank, env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], w[0], w[1])
			}
		}
	}
	if len(places[1]) != 0 {
		t.Errorf("the spare host got placements %v", places[1])
	}
}

func TestRankEnvOMPNumThreads(t *testing.T) {
	tab := testTable()
	shared := wire.Placement{Rank: 1, Host: 2, LocalRank: 0, LocalSize: 3, NodeRank: 1}
	alone := wire.Placement{Rank: 5, Host: 3, LocalRank: 0, LocalSize: 1, NodeRank: 2}
	tests := []struct {
		name string
		base []string
		pl   wire.Placement
		want string // or unset
	}{
		{"shared host, unset", nil, shared, "1"},
		{"shared host, set by the user", baseEnv(nil, []string{"OMP_NUM_THREADS=8"}), shared, "8"},
		{"shared host, inherited", baseEnv([]string{"OMP_NUM_THREADS=2"}, nil), shared, "2"},
		{"alone, unset", nil, alone, unset},
		{"alone, set by the user", baseEnv(nil, []string{"OMP_NUM_THREADS=8"}), alone, "8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkVar(t, envMap(t, rankEnv(tt.base, &wire.JobSpec{}, tab, tt.pl, "s", "/t")), "OMP_NUM_THREADS", tt.want)
		})
	}
}

func TestRankEnvTmpdir(t *testing.T) {
	tab := testTable()
	pl := wire.Placement{Rank: 0, Host: 0, LocalRank: 0, LocalSize: 2}
	tests := []struct {
		name            string
		inherited, user []string
		want            string
	}{
		{"none", nil, nil, "/job/tmp"},
		{"inherited from the agent is replaced", []string{"TMPDIR=/var/tmp"}, nil, "/job/tmp"},
		{"set with -x is kept", []string{"TMPDIR=/var/tmp"}, []string{"TMPDIR=/scratch"}, "/scratch"},
		{"set with -x to empty is kept", nil, []string{"TMPDIR="}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := baseEnv(tt.inherited, tt.user)
			checkVar(t, envMap(t, rankEnv(base, &wire.JobSpec{Env: tt.user}, tab, pl, "s", "/job/tmp")), "TMPDIR", tt.want)
		})
	}
}

func TestRankEnvUserCannotOverrideContract(t *testing.T) {
	tab := testTable()
	pl := wire.Placement{Rank: 4, Host: 2, LocalRank: 2, LocalSize: 3, NodeRank: 1}
	user := []string{"RANK=0", "GORUN_RANK=0", "MASTER_PORT=1", "KEEP=me"}
	m := envMap(t, rankEnv(baseEnv(nil, user), &wire.JobSpec{Env: user}, tab, pl, "s", "/t"))
	if m["RANK"] != "4" || m["GORUN_RANK"] != "4" || m["MASTER_PORT"] != "29500" || m["KEEP"] != "me" {
		t.Errorf("RANK=%s GORUN_RANK=%s MASTER_PORT=%s KEEP=%s", m["RANK"], m["GORUN_RANK"], m["MASTER_PORT"], m["KEEP"])
	}
}

func TestRankEnvDoesNotModifyBase(t *testing.T) {
	tab := testTable()
	base := []string{"PATH=/bin", "TMPDIR=/x"}
	pl := wire.Placement{Rank: 0, LocalSize: 2}
	rankEnv(base, &wire.JobSpec{}, tab, pl, "s", "/t")
	if !slices.Equal(base, []string{"PATH=/bin", "TMPDIR=/x"}) {
		t.Errorf("base changed: %q", base)
	}
}

// TestMasterPortPerEpoch: the agent registers a pool of MASTER_PORT
// candidates, and the ranks of a restart in place (a new epoch) get
// another MASTER_PORT than those of the epoch before, the one of the
// epoch's table: a torch job's store never binds the old epoch's port.
func TestMasterPortPerEpoch(t *testing.T) {
	var dir string
	f := startFakeLauncherSpec(t, "mportepoch", []int{0, 1}, nil, func(js *wire.JobSpec) { dir = js.Dir },
		"sh", "-c", `echo "$MASTER_ADDR:$MASTER_PORT" > port.$GORUN_EPOCH.$RANK.tmp && mv port.$GORUN_EPOCH.$RANK.tmp port.$GORUN_EPOCH.$RANK && exec sleep 3600`)
	// ports returns what both ranks of epoch saw, once both wrote it.
	ports := func(epoch int) string {
		t.Helper()
		var seen []string
		for r := range 2 {
			for {
				b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("port.%d.%d", epoch, r)))
				if err == nil {
					seen = append(seen, strings.TrimSpace(string(b)))
					break
				}
				select {
				case <-f.ctx.Done():
					t.Fatalf("rank %d of epoch %d did not write its MASTER_PORT", r, epoch)
				case err := <-f.agentErr:
					t.Fatalf("the agent ended: %v", err)
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
		if seen[0] != seen[1] {
			t.Fatalf("epoch %d: rank 0 has master %s, rank 1 %s", epoch, seen[0], seen[1])
		}
		return seen[0]
	}
	first := ports(0)
	if tb := f.rv.Table(); first != "127.0.0.1:"+strconv.Itoa(tb.MasterPort) || tb.MasterPort == 0 {
		t.Fatalf("epoch 0: the ranks have master %s, the table 127.0.0.1:%d", first, tb.MasterPort)
	}
	f.send(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: -1})
	tb := f.rv.Advance(1)
	if tb == nil {
		t.Fatal("could not publish the restart's table")
	}
	second := ports(1)
	if second != "127.0.0.1:"+strconv.Itoa(tb.MasterPort) {
		t.Errorf("epoch 1: the ranks have master %s, the table 127.0.0.1:%d", second, tb.MasterPort)
	}
	if second == first {
		t.Errorf("the restart's ranks have the MASTER_PORT of the epoch before: %s", first)
	}
}

// TestGlooEnv: the ranks get GLOO_SOCKET_IFNAME naming the interface of
// the address the host registered, unless the user set it or the address
// is a loopback one.
func TestGlooEnv(t *testing.T) {
	lookup := func(ip net.IP) (string, error) {
		if ip.Equal(net.ParseIP("10.0.0.2")) {
			return "eth7", nil
		}
		return "", errors.New("no such interface")
	}
	tests := []struct {
		name string
		env  []string
		addr string
		want string // or unset
	}{
		{"registered address", []string{"PATH=/bin"}, "10.0.0.2", "eth7"},
		{"set by the user", baseEnv(nil, []string{"GLOO_SOCKET_IFNAME=ib0"}), "10.0.0.2", "ib0"},
		{"inherited", baseEnv([]string{"GLOO_SOCKET_IFNAME=ib1"}, nil), "10.0.0.2", "ib1"},
		{"loopback", nil, "127.0.0.1", unset},
		{"loopback v6", nil, "::1", unset},
		{"unspecified", nil, "0.0.0.0", unset},
		{"a host name", nil, "node1", unset},
		{"no interface holds it", nil, "10.0.0.3", unset},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkVar(t, envMap(t, glooEnv(tt.env, tt.addr, lookup)), "GLOO_SOCKET_IFNAME", tt.want)
		})
	}
}

// TestIfaceOf: the interface holding an address of this machine is found
// (loopback's always exists), and an address no interface holds is an
// error.
func TestIfaceOf(t *testing.T) {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var want string
	var ip net.IP
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && want == "" {
				want, ip = ifc.Name, n.IP
			}
		}
	}
	if ip == nil {
		t.Skip("no interface has an address")
	}
	if got, err := ifaceOf(ip); err != nil || got != want {
		t.Errorf("ifaceOf(%s) = %q, %v; want %q", ip, got, err, want)
	}
	if got, err := ifaceOf(net.ParseIP("192.0.2.255")); err == nil {
		t.Errorf("ifaceOf(192.0.2.255) = %q, want an error", got)
	}
}

// TestEnvBaseMerge: merging into an envBase is mergeEnv of the
// environment it was made from, whatever the duplicates and overrides.
func TestEnvBaseMerge(t *testing.T) {
	for _, tt := range []struct {
		name  string
		env   []string
		overs [][]string
	}{
		{"empty", nil, nil},
		{"only overs", nil, [][]string{{"A=1", "B=2"}, {"A=3"}}},
		{"only env", []string{"A=1", "B=2"}, nil},
		{"duplicates in env: the later wins, in the first's place", []string{"A=1", "B=2", "A=3"}, [][]string{{"C=4"}}},
		{"overs replace env in place", []string{"A=1", "B=2", "C=3"}, [][]string{{"B=20"}, {"A=10"}}},
		{"new names last, in their first order", []string{"A=1"}, [][]string{{"Z=26", "M=13"}, {"Y=25", "Z=0"}}},
		{"later lists win", []string{"A=1", "B=2"}, [][]string{{"B=3", "C=4"}, {"C=5", "A=6"}, nil, {"B=7"}}},
		{"duplicates within a list", nil, [][]string{{"X=1", "X=2"}, {"Y=1"}, {"X=3", "Y=2", "Y=3"}}},
		{"names without =", []string{"A", "B=1"}, [][]string{{"A=2", "C"}, {"C=3"}}},
		{"name is the text before the first =", []string{"AB=1", "A=2"}, [][]string{{"A=B=3"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := mergeEnv(tt.env, tt.overs...)
			b := newEnvBase(tt.env)
			// Twice: a merge leaves the base as it was for the next.
			for i := range 2 {
				if got := b.merge(tt.overs...); !slices.Equal(got, want) {
					t.Errorf("merge %d: %q, want mergeEnv's %q", i, got, want)
				}
			}
		})
	}
}

// TestRankVarsAreRankEnv: rankVars, as launch merges them into the shared
// base, give rankEnv's environment.
func TestRankVarsAreRankEnv(t *testing.T) {
	tab := testTable()
	for _, base := range [][]string{
		{"PATH=/bin", "HOME=/root"},
		{"PATH=/bin", "OMP_NUM_THREADS=4", "RANK=stale"},
	} {
		for _, pl := range tab.Placements()[2] {
			spec := &wire.JobSpec{Env: []string{"USERVAR=u"}}
			want := rankEnv(base, spec, tab, pl, "s", "/t")
			got := newEnvBase(base).merge(rankVars(spec, tab, pl, "s", "/t", hasVar(base, wire.EnvOMPNumThreads)))
			if !slices.Equal(got, want) {
				t.Errorf("base %q, rank %d: %q, want rankEnv's %q", base, pl.Rank, got, want)
			}
		}
	}
}
