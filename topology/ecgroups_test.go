package topology

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// ecUniformHosts returns n hosts named n0, n1, ... with the given slots.
func ecUniformHosts(n, slots int) []Host {
	hosts := make([]Host, n)
	for i := range hosts {
		hosts[i] = Host{Name: fmt.Sprintf("n%d", i), Slots: slots}
	}
	return hosts
}

// ecMapAll maps one rank per slot of every non-spare host with MapRanks.
func ecMapAll(t testing.TB, hosts []Host, by MapBy) []Assignment {
	t.Helper()
	np := 0
	for _, h := range hosts {
		if !h.Spare {
			np += h.Slots
		}
	}
	assign, err := MapRanks(hosts, MapOptions{NP: np, By: by})
	if err != nil {
		t.Fatalf("MapRanks: %v", err)
	}
	return assign
}

// ecHandGroup builds an ECGroup by hand for nodes 0..len(workers)-1 with
// the given data and parity nodes, applying the §IV-B2 target rule as
// written in the brief (independently of PlanEC's code).
func ecHandGroup(workers [][]int, k int, data, parity []int) ECGroup {
	g := ECGroup{Workers: workers, Data: data, Parity: parity}
	host := map[int]int{}
	var order []int
	for i, ws := range workers {
		g.Hosts = append(g.Hosts, i)
		for _, r := range ws {
			host[r] = i
			order = append(order, r)
		}
	}
	m := len(parity)
	l := len(order) / k
	for j := range k {
		g.DataGroups = append(g.DataGroups, order[j*l:(j+1)*l])
	}
	for i := range l {
		var red Reduction
		for j := range k {
			red.Members = append(red.Members, g.DataGroups[j][i])
		}
		for j := range m {
			target := -1
			for _, r := range red.Members {
				if host[r] == parity[j] && (target < 0 || r < target) {
					target = r
				}
			}
			if target < 0 {
				if k >= m {
					target = red.Members[(j*(k/m))%k]
				} else {
					target = red.Members[j%k]
				}
			}
			red.Targets = append(red.Targets, target)
		}
		g.Reductions = append(g.Reductions, red)
	}
	return g
}

// ecBestChoice tries every ordered choice of k distinct data nodes (the
// other nodes are the parity nodes, ascending) and returns the least
// xor+p2p and one choice that reaches it.
func ecBestChoice(workers [][]int, k int) (best int, data, parity []int) {
	n := len(workers)
	best = math.MaxInt
	used := make([]bool, n)
	pick := make([]int, 0, k)
	var rec func()
	rec = func() {
		if len(pick) == k {
			var par []int
			for i := range n {
				if !used[i] {
					par = append(par, i)
				}
			}
			x, p := ecHandGroup(workers, k, slices.Clone(pick), par).Traffic()
			if x+p < best {
				best, data, parity = x+p, slices.Clone(pick), par
			}
			return
		}
		for i := range n {
			if !used[i] {
				used[i] = true
				pick = append(pick, i)
				rec()
				pick = pick[:len(pick)-1]
				used[i] = false
			}
		}
	}
	rec()
	return best, data, parity
}

// TestECPaperFig9 is the example of ECHECK Fig. 9: 3 nodes with 2 workers
// each, k = 2, m = 1. The sweep line picks data nodes 0 and 2 (Fig. 9a,
// 6 units); parity node 2 with data nodes 0 and 1 (Fig. 9b) costs 7.
func TestECPaperFig9(t *testing.T) {
	hosts := ecUniformHosts(3, 2)
	groups, err := PlanEC(hosts, ecMapAll(t, hosts, MapBySlot), ECOptions{K: 2, M: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 1 {
		t.Fatalf("%d groups, want 1", len(groups))
	}
	g := groups[0]
	workers := [][]int{{0, 1}, {2, 3}, {4, 5}}
	checks := []struct {
		name      string
		got, want any
	}{
		{"Hosts", g.Hosts, []int{0, 1, 2}},
		{"Workers (origin_group)", g.Workers, workers},
		{"DataGroups (data_group)", g.DataGroups, [][]int{{0, 1, 2}, {3, 4, 5}}},
		{"Data", g.Data, []int{0, 2}},
		{"Parity", g.Parity, []int{1}},
		{"Reductions", g.Reductions, []Reduction{
			{Members: []int{0, 3}, Targets: []int{3}}, // 3 lives on parity node 1
			{Members: []int{1, 4}, Targets: []int{1}}, // no parity worker: Members[0]
			{Members: []int{2, 5}, Targets: []int{2}}, // 2 lives on parity node 1
		}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
				t.Errorf("got %v, want %v", c.got, c.want)
			}
		})
	}

	choices := []struct {
		name           string
		data, parity   []int
		xor, p2p, cost int
	}{
		// Fig. 9a: 3 XOR transfers; node 0 receives d2, node 2 receives
		// d3, and the parity of reduction group {1,4} goes to node 1.
		{"Fig. 9a: parity node 1", []int{0, 2}, []int{1}, 3, 3, 6},
		// Fig. 9b: node 1 (data node 1) holds only d3 and receives d4 and d5.
		{"Fig. 9b: parity node 2", []int{0, 1}, []int{2}, 3, 4, 7},
		{"parity node 0", []int{1, 2}, []int{0}, 3, 4, 7},
		{"data nodes swapped", []int{2, 0}, []int{1}, 3, 7, 10},
	}
	for _, c := range choices {
		t.Run(c.name, func(t *testing.T) {
			xor, p2p := ecHandGroup(workers, 2, c.data, c.parity).Traffic()
			if xor != c.xor || p2p != c.p2p || xor+p2p != c.cost {
				t.Errorf("Traffic = %d xor + %d p2p; want %d + %d = %d", xor, p2p, c.xor, c.p2p, c.cost)
			}
		})
	}
	t.Run("PlanEC's choice", func(t *testing.T) {
		xor, p2p := g.Traffic()
		if xor != 3 || p2p != 3 {
			t.Errorf("Traffic = %d xor + %d p2p; want 3 + 3 (6 units, as in the paper)", xor, p2p)
		}
		if best, data, parity := ecBestChoice(workers, 2); xor+p2p != best {
			t.Errorf("cost %d; the best choice (data %v, parity %v) costs %d", xor+p2p, data, parity, best)
		}
		data, err := SelectDataNodes([]int{2, 2, 2}, 2)
		if err != nil || fmt.Sprint(data) != "[0 2]" {
			t.Errorf("SelectDataNodes([2 2 2], 2) = %v, %v; want [0 2]", data, err)
		}
	})
}

// TestECPaperFig6 is the setting of ECHECK Figs. 6 and 7: 4 nodes with one
// worker each, k = m = 2, and its k = m generalisations. The paper's
// Fig. 6 has node 0 store D0, node 1 P0, node 2 D1 and node 3 P1; the
// reduction of p1 = e11·d1 + e12·d3 (parity row 0 of reduction group 1)
// lands on node 1 and p0 (row 0 of group 0) lands on node 0, which then
// sends it to node 1.
func TestECPaperFig6(t *testing.T) {
	tests := []struct {
		name       string
		n, slots   int
		k, m       int
		data       []int
		parity     []int
		reductions []Reduction // nil: not checked exactly
	}{
		{"Fig. 6: 4 nodes x 1 worker, k=m=2", 4, 1, 2, 2, []int{0, 2}, []int{1, 3}, []Reduction{
			{Members: []int{0, 2}, Targets: []int{0, 2}}, // no parity worker: interval k/m = 1
			{Members: []int{1, 3}, Targets: []int{1, 3}}, // both on their parity nodes
		}},
		// The paper says the sweep line "typically designates odd-indexed
		// nodes as data nodes" when k = m; its own Fig. 6 makes nodes 0
		// and 2 the data nodes, so it counts from 1: the 1st, 3rd, ... node.
		{"4 nodes x 2 workers, k=m=2", 4, 2, 2, 2, []int{0, 2}, []int{1, 3}, nil},
		{"4 nodes x 3 workers, k=m=2", 4, 3, 2, 2, []int{0, 2}, []int{1, 3}, nil},
		{"6 nodes x 1 worker, k=m=3", 6, 1, 3, 3, []int{0, 2, 4}, []int{1, 3, 5}, nil},
		{"6 nodes x 2 workers, k=m=3", 6, 2, 3, 3, []int{0, 2, 4}, []int{1, 3, 5}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hosts := ecUniformHosts(tt.n, tt.slots)
			groups, err := PlanEC(hosts, ecMapAll(t, hosts, MapBySlot), ECOptions{K: tt.k, M: tt.m})
			if err != nil {
				t.Fatal(err)
			}
			g := groups[0]
			if !slices.Equal(g.Data, tt.data) || !slices.Equal(g.Parity, tt.parity) {
				t.Errorf("data %v parity %v; want %v %v", g.Data, g.Parity, tt.data, tt.parity)
			}
			if tt.reductions != nil && fmt.Sprint(g.Reductions) != fmt.Sprint(tt.reductions) {
				t.Errorf("reductions %v; want %v", g.Reductions, tt.reductions)
			}
			ecCheckTargets(t, g, tt.k, tt.m)
			w := tt.n * tt.slots
			xor, p2p := g.Traffic()
			if xor+p2p != tt.m*w {
				t.Errorf("traffic %d xor + %d p2p = %d; want m·W = %d", xor, p2p, xor+p2p, tt.m*w)
			}
			// Each parity node's g workers sit in g distinct reduction
			// groups, so exactly W/k - g reductions per row have no
			// parity worker and need a P2P transfer (§IV-B2).
			offParity := 0
			for _, r := range g.Reductions {
				for j, tgt := range r.Targets {
					if ecHostOf(g, tgt) != g.Parity[j] {
						offParity++
					}
				}
			}
			if want := tt.m * (w/tt.k - tt.slots); offParity != want {
				t.Errorf("%d parity packets off their parity node; want m(W/k-g) = %d", offParity, want)
			}
		})
	}
}

// ecHostOf returns the host of rank r in g, or -1.
func ecHostOf(g ECGroup, r int) int {
	for i, ws := range g.Workers {
		if slices.Contains(ws, r) {
			return g.Hosts[i]
		}
	}
	return -1
}

// ecCheckTargets checks the reduction groups of g against §IV-B2: W/k of
// them, Members[j] = DataGroups[j][i], and each parity row's target on the
// row's parity node whenever a member lives there (the lowest such),
// otherwise at interval k/m (k >= m) or round robin (k < m).
func ecCheckTargets(t *testing.T, g ECGroup, k, m int) {
	t.Helper()
	if len(g.DataGroups) != k {
		t.Fatalf("%d data groups, want %d", len(g.DataGroups), k)
	}
	l := len(g.DataGroups[0])
	if len(g.Reductions) != l {
		t.Fatalf("%d reductions, want W/k = %d", len(g.Reductions), l)
	}
	for i, r := range g.Reductions {
		if len(r.Members) != k || len(r.Targets) != m {
			t.Fatalf("reduction %d: %d members, %d targets; want %d, %d", i, len(r.Members), len(r.Targets), k, m)
		}
		for j := range k {
			if r.Members[j] != g.DataGroups[j][i] {
				t.Fatalf("reduction %d: member %d is %d, want DataGroups[%d][%d] = %d", i, j, r.Members[j], j, i, g.DataGroups[j][i])
			}
		}
		for j, tgt := range r.Targets {
			want := -1
			for _, mem := range r.Members {
				if ecHostOf(g, mem) == g.Parity[j] && (want < 0 || mem < want) {
					want = mem
				}
			}
			if want < 0 {
				if k >= m {
					want = r.Members[(j*(k/m))%k]
				} else {
					want = r.Members[j%k]
				}
			}
			if tgt != want {
				t.Fatalf("reduction %d %v: row %d target %d, want %d", i, r.Members, j, tgt, want)
			}
		}
	}
}

// ecRefSelect is SelectDataNodes by brute force: for each data group in
// order, the overlap with every node computed directly, the best untaken
// node by overlap then index.
func ecRefSelect(origin []int, k int) []int {
	w := 0
	for _, c := range origin {
		w += c
	}
	size := w / k
	taken := make([]bool, len(origin))
	var data []int
	for j := range k {
		lo, hi := j*size, (j+1)*size
		best, bestOv := -1, -1
		start := 0
		for i, c := range origin {
			ov := max(0, min(start+c, hi)-max(start, lo))
			start += c
			if !taken[i] && ov > bestOv {
				best, bestOv = i, ov
			}
		}
		taken[best] = true
		data = append(data, best)
	}
	return data
}

// ecSelectCases are the table cases of SelectDataNodes; they seed
// FuzzSelectDataNodes too. want nil means an error containing msg.
var ecSelectCases = []struct {
	name   string
	origin []int
	k      int
	want   []int
	msg    string
}{
	{"Fig. 9", []int{2, 2, 2}, 2, []int{0, 2}, ""},
	{"Fig. 6", []int{1, 1, 1, 1}, 2, []int{0, 2}, ""},
	{"k = n, one worker per node", []int{1, 1, 1, 1, 1}, 5, []int{0, 1, 2, 3, 4}, ""},
	{"k = n, uneven", []int{3, 1, 1, 3}, 4, []int{0, 1, 2, 3}, ""},
	{"k = 1", []int{1, 5, 2}, 1, []int{1}, ""},
	{"one node with all workers", []int{0, 0, 6, 0}, 2, []int{2, 0}, ""},
	{"one node with all workers, k = n", []int{4, 0, 0, 0}, 4, []int{0, 1, 2, 3}, ""},
	{"tie goes to the lower node", []int{2, 2}, 1, []int{0}, ""},
	{"best node taken: next best", []int{1, 4, 1}, 2, []int{1, 2}, ""},
	{"empty nodes between", []int{0, 3, 0, 3, 0}, 3, []int{1, 3, 0}, ""},
	{"uneven", []int{3, 1, 4, 1, 5, 9, 2, 5}, 3, []int{2, 5, 7}, ""},
	{"k > n, W divisible by k", []int{1, 7}, 4, nil, "k = 4 data nodes but only 2 nodes"},
	{"k = 0", []int{1, 1}, 0, nil, "k = 0 data nodes; need at least 1"},
	{"k < 0", []int{1, 1}, -3, nil, "k = -3 data nodes"},
	{"k > n", []int{2, 2}, 3, nil, "k = 3 data nodes but only 2 nodes"},
	{"no nodes", nil, 1, nil, "k = 1 data nodes but only 0 nodes"},
	{"W = 0", []int{0, 0, 0}, 1, nil, "the 3 nodes have no workers"},
	{"W % k != 0", []int{2, 1, 2}, 2, nil, "5 workers cannot be cut into 2 equal data groups"},
	{"negative count", []int{2, -1, 3}, 2, nil, "node 1 has -1 workers"},
	{"overflow", []int{math.MaxInt, 1}, 1, nil, "overflows at node 1"},
}

func TestSelectDataNodes(t *testing.T) {
	for _, tt := range ecSelectCases {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SelectDataNodes(tt.origin, tt.k)
			if tt.want == nil {
				if err == nil || !errors.Is(err, ErrECGroups) || !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("SelectDataNodes = %v, %v; want ErrECGroups containing %q", got, err, tt.msg)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("SelectDataNodes = %v, %v; want %v", got, err, tt.want)
			}
			if ref := ecRefSelect(tt.origin, tt.k); !slices.Equal(got, ref) {
				t.Fatalf("reference disagrees: %v", ref)
			}
		})
	}
}

// TestSelectDataNodesRandom compares SelectDataNodes with the brute-force
// reference on seeded random inputs, uneven and with empty nodes.
func TestSelectDataNodesRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 88544))
	shapes := []struct {
		name          string
		maxN, maxSize int
		zeros         bool
	}{
		{"small", 6, 4, false},
		{"small with empty nodes", 6, 4, true},
		{"medium", 40, 10, false},
		{"wide", 200, 3, true},
		{"big nodes", 12, 100, false},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			for iter := range 2000 {
				n := 1 + rng.IntN(sh.maxN)
				origin := make([]int, n)
				w := 0
				for i := range origin {
					lo := 1
					if sh.zeros && rng.IntN(3) == 0 {
						lo = 0
					}
					origin[i] = lo + rng.IntN(sh.maxSize)
					if lo == 0 && rng.IntN(2) == 0 {
						origin[i] = 0
					}
					w += origin[i]
				}
				if w == 0 {
					origin[0], w = 1, 1
				}
				var ks []int // every valid k
				for k := 1; k <= n; k++ {
					if w%k == 0 {
						ks = append(ks, k)
					}
				}
				if rng.IntN(3) == 0 { // make k = n or another large k valid
					k := 1 + rng.IntN(n)
					origin[n-1] += (k - w%k) % k
					w = (w + k - 1) / k * k
					ks = []int{k}
				}
				k := ks[rng.IntN(len(ks))]
				got, err := SelectDataNodes(origin, k)
				want := ecRefSelect(origin, k)
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("iter %d: SelectDataNodes(%v, %d) = %v, %v; reference %v", iter, origin, k, got, err, want)
				}
			}
		})
	}
}

// ecRefOrder is the group order of the non-spare hosts with ranks (all of
// them, here): hostfile order, or round robin over racks by first
// appearance.
func ecRefOrder(hosts []Host, spread bool) []int {
	var active []int
	for i, h := range hosts {
		if !h.Spare {
			active = append(active, i)
		}
	}
	if !spread {
		return active
	}
	var names []string
	byRack := map[string][]int{}
	for _, i := range active {
		r := hosts[i].Rack
		if _, ok := byRack[r]; !ok {
			names = append(names, r)
		}
		byRack[r] = append(byRack[r], i)
	}
	var out []int
	for pass := 0; len(out) < len(active); pass++ {
		for _, r := range names {
			if pass < len(byRack[r]) {
				out = append(out, byRack[r][pass])
			}
		}
	}
	return out
}

// ecSubsets calls f with every subset of hosts of size lo to hi.
func ecSubsets(hosts []int, lo, hi int, f func([]int)) {
	for mask := 0; mask < 1<<len(hosts); mask++ {
		var sub []int
		for i, h := range hosts {
			if mask&(1<<i) != 0 {
				sub = append(sub, h)
			}
		}
		if len(sub) >= lo && len(sub) <= hi {
			f(sub)
		}
	}
}

// TestPlanECProperties plans seeded random hostfiles and checks the
// invariants of the groups, the failure tolerance, and ECHECK's volume
// identity where it applies.
func TestPlanECProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(88544, 4))
	identityChecked := 0
	for iter := range 400 {
		k, m := 1+rng.IntN(4), 1+rng.IntN(3)
		ngroups := 1 + rng.IntN(4)
		nracks := 1 + rng.IntN(4)
		uniform := rng.IntN(3) == 0 // every host the same slots: the paper's setting
		slots := 1 + rng.IntN(8)
		var hosts []Host
		for active := 0; active < ngroups*(k+m); {
			h := Host{Name: fmt.Sprintf("n%d", len(hosts)), Slots: slots}
			if !uniform {
				h.Slots = 1 + rng.IntN(8)
			}
			if r := rng.IntN(nracks + 1); r < nracks {
				h.Rack = fmt.Sprintf("r%d", r)
			}
			if rng.IntN(8) == 0 {
				h.Spare = true
				h.Name = fmt.Sprintf("s%d", len(hosts))
			} else {
				active++
			}
			hosts = append(hosts, h)
		}
		opt := ECOptions{K: k, M: m, Spread: rng.IntN(2) == 0}
		order := ecRefOrder(hosts, opt.Spread)
		// Make each group's rank count a multiple of K.
		for s := 0; s < len(order); s += k + m {
			sum := 0
			for _, h := range order[s : s+k+m] {
				sum += hosts[h].Slots
			}
			if uniform && sum%k != 0 {
				for _, h := range order {
					hosts[h].Slots = k // uniform with k | g
				}
				slots = k
				break
			}
			hosts[order[s+k+m-1]].Slots += (k - sum%k) % k
		}
		by := MapBy(rng.IntN(2))
		assign := ecMapAll(t, hosts, by)
		name := fmt.Sprintf("iter %d K=%d M=%d spread=%t by %v", iter, k, m, opt.Spread, by)
		t.Run(name, func(t *testing.T) {
			saved := slices.Clone(assign)
			groups, err := PlanEC(hosts, assign, opt)
			if err != nil {
				t.Fatalf("PlanEC: %v", err)
			}
			if !slices.Equal(saved, assign) {
				t.Fatal("PlanEC changed its input")
			}
			if len(groups) != ngroups {
				t.Fatalf("%d groups, want %d", len(groups), ngroups)
			}
			hostOf := map[int]int{}
			for _, a := range assign {
				hostOf[a.Rank] = a.Host
			}
			seenRank := map[int]bool{}
			var planned []int
			for gi, g := range groups {
				planned = append(planned, g.Hosts...)
				if len(g.Hosts) != k+m || len(g.Workers) != k+m || len(g.Data) != k || len(g.Parity) != m {
					t.Fatalf("group %d: %d hosts, %d workers, %d data, %d parity", gi, len(g.Hosts), len(g.Workers), len(g.Data), len(g.Parity))
				}
				// Data and Parity are disjoint and cover the hosts.
				both := slices.Concat(g.Data, g.Parity)
				slices.Sort(both)
				if hs := slices.Sorted(slices.Values(g.Hosts)); !slices.Equal(both, hs) || len(slices.Compact(hs)) != k+m {
					t.Fatalf("group %d: data %v + parity %v vs hosts %v", gi, g.Data, g.Parity, g.Hosts)
				}
				if !slices.IsSorted(g.Parity) {
					t.Fatalf("group %d: parity %v not ascending", gi, g.Parity)
				}
				// Workers: the ranks of each host, ascending, each once.
				var flat []int
				origin := make([]int, len(g.Hosts))
				for i, ws := range g.Workers {
					origin[i] = len(ws)
					if len(ws) != hosts[g.Hosts[i]].Slots || !slices.IsSorted(ws) {
						t.Fatalf("group %d: host %d has workers %v (%d slots)", gi, g.Hosts[i], ws, hosts[g.Hosts[i]].Slots)
					}
					for _, r := range ws {
						if hostOf[r] != g.Hosts[i] || seenRank[r] {
							t.Fatalf("group %d: rank %d on host %d, seen before %t", gi, r, g.Hosts[i], seenRank[r])
						}
						seenRank[r] = true
					}
					flat = append(flat, ws...)
				}
				if !slices.Equal(slices.Concat(g.DataGroups...), flat) {
					t.Fatalf("group %d: data groups %v are not the workers %v cut in %d", gi, g.DataGroups, flat, k)
				}
				for _, dg := range g.DataGroups {
					if len(dg) != len(flat)/k {
						t.Fatalf("group %d: data groups %v not equal", gi, g.DataGroups)
					}
				}
				sel, err := SelectDataNodes(origin, k)
				if err != nil {
					t.Fatal(err)
				}
				for j, i := range sel {
					if g.Data[j] != g.Hosts[i] {
						t.Fatalf("group %d: data %v, SelectDataNodes %v over hosts %v", gi, g.Data, sel, g.Hosts)
					}
				}
				ecCheckTargets(t, g, k, m)

				w := len(flat)
				xor, p2p := g.Traffic()
				if want := w / k * m * (k - 1); xor != want {
					t.Fatalf("group %d: xor %d, want W/k·m(k-1) = %d", gi, xor, want)
				}
				if uniform {
					identityChecked++
					ecCheckIdentity(t, g, k, m, slots, xor+p2p)
				}

				// Any at most M failed hosts of the group lose nothing;
				// any M+1 lose exactly the ranks whose own host and data
				// host both failed; all of them lose every rank.
				ecSubsets(g.Hosts, 0, m, func(failed []int) {
					if lost := ECLoss(groups, failed); len(lost) != 0 {
						t.Fatalf("group %d: hosts %v failed, lost %v", gi, failed, lost)
					}
				})
				ecSubsets(g.Hosts, m+1, m+1, func(failed []int) {
					want := ecWantLost(g, failed)
					if lost := ECLoss(groups, failed); !slices.Equal(lost, want) {
						t.Fatalf("group %d: hosts %v failed, lost %v, want %v", gi, failed, lost, want)
					}
				})
				if lost := ECLoss(groups, g.Hosts); !slices.Equal(lost, slices.Sorted(slices.Values(flat))) {
					t.Fatalf("group %d: every host failed, lost %v, want %v", gi, lost, flat)
				}
			}
			if len(seenRank) != len(assign) {
				t.Fatalf("%d of %d ranks in groups", len(seenRank), len(assign))
			}
			if !slices.Equal(planned, order) {
				t.Fatalf("group hosts %v, want %v", planned, order)
			}
			// M failures in every group at once, plus every spare, lose nothing.
			var failed []int
			for i, h := range hosts {
				if h.Spare {
					failed = append(failed, i)
				}
			}
			for _, g := range groups {
				perm := rng.Perm(k + m)
				for _, i := range perm[:m] {
					failed = append(failed, g.Hosts[i])
				}
			}
			if lost := ECLoss(groups, failed); len(lost) != 0 {
				t.Fatalf("hosts %v failed, lost %v", failed, lost)
			}
		})
	}
	if identityChecked < 50 {
		t.Errorf("the volume identity was checked on only %d groups", identityChecked)
	}
}

// ecCheckIdentity checks ECHECK's volume identity on a group of n = k+m
// nodes with g workers each (W = n·g): xor + p2p = m·W (§V-F, "= msW").
//
// The paper's derivation assumes each data node already holds g packets
// of its data group ("each data node already holds g data packets"), i.e.
// that every data group (W/k = n·g/k consecutive workers) contains some
// node's g workers whole. XOR costs W/k·m(k-1) and parity P2P m(W/k - g)
// (a parity node's g consecutive workers are in g distinct reduction
// groups) whatever the choice, and data P2P is W minus what the data nodes
// hold, so in general
//
//	xor + p2p = m·W + (k·g - Σ_j overlap(Data[j], DataGroups[j]))
//
// and m·W is a lower bound for any choice of data and parity nodes: the
// identity holds exactly when every data group contains a whole node. That
// is guaranteed when k divides n (data groups are n/k whole nodes), when
// m >= k (W/k >= 2g, and any 2g-1 consecutive workers hold a whole node)
// or when g = 1, but not otherwise: with n = 4, g = 3, k = 3, m = 1 the
// data group of workers 4-7 holds 2 workers of node 1 and 2 of node 2, and
// one checkpoint costs 13 units, not m·W = 12 (no choice does better).
func ecCheckIdentity(t *testing.T, g ECGroup, k, m, slots, total int) {
	t.Helper()
	n := k + m
	w := n * slots
	l := w / k
	contained, overlap := true, 0
	for j := range k {
		lo, hi := j*l, (j+1)*l
		whole := false
		for i := range n {
			s, e := i*slots, (i+1)*slots
			if lo <= s && e <= hi {
				whole = true
			}
			if g.Hosts[i] == g.Data[j] {
				overlap += max(0, min(e, hi)-max(s, lo))
			}
		}
		contained = contained && whole
	}
	if n%k == 0 || m >= k || slots == 1 {
		if !contained {
			t.Fatalf("k=%d m=%d g=%d: some data group holds no whole node", k, m, slots)
		}
	}
	if want := m*w + k*slots - overlap; total != want {
		t.Fatalf("k=%d m=%d g=%d: traffic %d, want m·W + k·g - overlap = %d", k, m, slots, total, want)
	}
	if contained && total != m*w {
		t.Fatalf("k=%d m=%d g=%d: traffic %d, want m·W = %d", k, m, slots, total, m*w)
	}
	if !contained && total <= m*w {
		t.Fatalf("k=%d m=%d g=%d: traffic %d, want above m·W = %d", k, m, slots, total, m*w)
	}
}

// TestECVolumeIdentity sweeps the paper's setting (n = k+m nodes, g
// workers each) and checks the identity (see ecCheckIdentity) and, for
// small n, that no other choice of data and parity nodes costs less.
func TestECVolumeIdentity(t *testing.T) {
	exceptions := 0
	for k := 1; k <= 5; k++ {
		for m := 1; m <= 4; m++ {
			for g := 1; g <= 6; g++ {
				n := k + m
				if n*g%k != 0 {
					continue
				}
				t.Run(fmt.Sprintf("k=%d m=%d g=%d", k, m, g), func(t *testing.T) {
					hosts := ecUniformHosts(n, g)
					groups, err := PlanEC(hosts, ecMapAll(t, hosts, MapBySlot), ECOptions{K: k, M: m})
					if err != nil {
						t.Fatal(err)
					}
					xor, p2p := groups[0].Traffic()
					if xor+p2p != m*n*g {
						exceptions++
						t.Logf("no whole node in some data group: %d units, m·W = %d", xor+p2p, m*n*g)
					}
					ecCheckIdentity(t, groups[0], k, m, g, xor+p2p)
					if n <= 6 {
						if best, data, parity := ecBestChoice(groups[0].Workers, k); xor+p2p != best {
							t.Errorf("traffic %d; data %v parity %v costs %d", xor+p2p, data, parity, best)
						}
					}
				})
			}
		}
	}
	if exceptions == 0 {
		t.Error("expected shapes where no data group holds a whole node (e.g. k=3 m=1 g=3)")
	}
}

// TestPlanECSpread: 2 racks of 3 hosts and groups of 3 (K=2, M=1). Any
// group of 3 has 2 hosts in one rack, so a rack failure must cost some
// group 2 > M hosts; Spread limits that to 2 hosts (instead of 3) in one
// group per rack. With groups of 2, or 3 racks of 2 hosts, the groups
// allow it and Spread makes every single rack failure harmless.
func TestPlanECSpread(t *testing.T) {
	rack := func(specs ...string) []Host { // "name@rack"
		var hosts []Host
		for _, s := range specs {
			name, r, _ := strings.Cut(s, "@")
			hosts = append(hosts, Host{Name: name, Slots: 2, Rack: r})
		}
		return hosts
	}
	twoRacks := rack("a1@A", "a2@A", "a3@A", "b1@B", "b2@B", "b3@B")
	tests := []struct {
		name   string
		hosts  []Host
		opt    ECOptions
		groups [][]int          // hosts of each group
		lost   map[string][]int // rack -> ranks lost when it fails
		span   int              // racks each group spans (0: not checked)
	}{
		{"2 racks x 3, K=2 M=1, spread", twoRacks, ECOptions{K: 2, M: 1, Spread: true},
			[][]int{{0, 3, 1}, {4, 2, 5}},
			// Rack A takes a1, a2 of group 0; rack B takes b2, b3 of group 1.
			map[string][]int{"A": {0, 1, 2, 3}, "B": {8, 9, 10, 11}}, 2},
		{"2 racks x 3, K=2 M=1, no spread", twoRacks, ECOptions{K: 2, M: 1},
			[][]int{{0, 1, 2}, {3, 4, 5}},
			map[string][]int{"A": {0, 1, 2, 3, 4, 5}, "B": {6, 7, 8, 9, 10, 11}}, 1},
		{"2 racks x 3, K=1 M=1, spread", twoRacks, ECOptions{K: 1, M: 1, Spread: true},
			[][]int{{0, 3}, {1, 4}, {2, 5}},
			map[string][]int{"A": nil, "B": nil}, 2},
		{"3 racks x 2, K=2 M=1, spread", rack("a1@A", "a2@A", "b1@B", "b2@B", "c1@C", "c2@C"), ECOptions{K: 2, M: 1, Spread: true},
			[][]int{{0, 2, 4}, {1, 3, 5}},
			map[string][]int{"A": nil, "B": nil, "C": nil}, 3},
		{"interleaved racks keep first-appearance order", rack("b1@B", "a1@A", "b2@B", "b3@B", "a2@A", "x1"), ECOptions{K: 2, M: 1, Spread: true},
			[][]int{{0, 1, 5}, {2, 4, 3}},
			map[string][]int{"A": nil, "B": {6, 7, 4, 5}, "": nil}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			groups, err := PlanEC(tt.hosts, ecMapAll(t, tt.hosts, MapBySlot), tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]int
			for _, g := range groups {
				got = append(got, g.Hosts)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.groups) {
				t.Fatalf("groups %v, want %v", got, tt.groups)
			}
			for r, want := range tt.lost {
				var failed []int
				for i, h := range tt.hosts {
					if h.Rack == r {
						failed = append(failed, i)
					}
				}
				slices.Sort(want)
				if lost := ECLoss(groups, failed); !slices.Equal(lost, want) {
					t.Errorf("rack %q fails: lost %v, want %v", r, lost, want)
				}
				for _, g := range groups {
					if exact := ecWantLost(g, failed); !isSubset(exact, want) {
						t.Errorf("rack %q fails: group %v loses %v, not within %v", r, g.Hosts, exact, want)
					}
				}
			}
			for gi, g := range groups {
				racks := map[string]bool{}
				for _, h := range g.Hosts {
					racks[tt.hosts[h].Rack] = true
				}
				if tt.span > 0 && len(racks) != tt.span {
					t.Errorf("group %d spans racks %v, want %d racks", gi, racks, tt.span)
				}
			}
		})
	}
}

// TestPlanECSkips: spare hosts and hosts without ranks are in no group;
// ranks need not be dense.
func TestPlanECSkips(t *testing.T) {
	hosts := []Host{
		{Name: "a", Slots: 1}, {Name: "s", Slots: 4, Spare: true}, {Name: "b", Slots: 1},
		{Name: "c", Slots: 1}, {Name: "d", Slots: 1},
	}
	tests := []struct {
		name   string
		assign []Assignment
		hosts  []int
		data   []int
		work   [][]int
	}{
		{"MapRanks with NP=3 leaves d empty", nil, []int{0, 2, 3}, []int{0}, [][]int{{0}, {1}, {2}}},
		{"sparse ranks, out of order", []Assignment{{Rank: 30, Host: 4}, {Rank: 10, Host: 2}, {Rank: 20, Host: 3}},
			[]int{2, 3, 4}, []int{2}, [][]int{{10}, {20}, {30}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assign := tt.assign
			if assign == nil {
				var err error
				if assign, err = MapRanks(hosts, MapOptions{NP: 3}); err != nil {
					t.Fatal(err)
				}
			}
			groups, err := PlanEC(hosts, assign, ECOptions{K: 1, M: 2})
			if err != nil {
				t.Fatal(err)
			}
			if len(groups) != 1 || !slices.Equal(groups[0].Hosts, tt.hosts) ||
				!slices.Equal(groups[0].Data, tt.data) || fmt.Sprint(groups[0].Workers) != fmt.Sprint(tt.work) {
				t.Fatalf("groups %+v; want hosts %v data %v workers %v", groups, tt.hosts, tt.data, tt.work)
			}
			// The spare, d (in no group in the first case), hosts that do
			// not exist, and at most M = 2 hosts of the group.
			if lost := ECLoss(groups, []int{1, 4, 99, -1, tt.hosts[0]}); len(lost) != 0 {
				t.Errorf("lost %v", lost)
			}
		})
	}
}

// TestPlanECErrors: every validation error wraps ErrECGroups and says what
// is wrong.
func TestPlanECErrors(t *testing.T) {
	three := ecUniformHosts(3, 1)
	seven := ecUniformHosts(7, 1)
	mixed := []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 1}, {Name: "c", Slots: 2}}
	second := ecUniformHosts(6, 1)
	second[0].Slots = 2
	one := func(rank, host int) Assignment { return Assignment{Rank: rank, Host: host} }
	tests := []struct {
		name   string
		hosts  []Host
		assign []Assignment
		opt    ECOptions
		msg    string
	}{
		{"K = 0", three, []Assignment{one(0, 0)}, ECOptions{K: 0, M: 1}, "K = 0 data hosts per group; need at least 1"},
		{"K < 0", three, []Assignment{one(0, 0)}, ECOptions{K: -2, M: 1}, "K = -2 data hosts"},
		{"M = 0", three, []Assignment{one(0, 0)}, ECOptions{K: 2, M: 0}, "M = 0 parity hosts per group; need at least 1"},
		{"M < 0", three, []Assignment{one(0, 0)}, ECOptions{K: 2, M: -7}, "M = -7 parity hosts"},
		{"no assignment", three, nil, ECOptions{K: 2, M: 1}, "no ranks to protect: the assignment is empty"},
		{"no hosts at all", nil, nil, ECOptions{K: 1, M: 1}, "the assignment is empty"},
		{"host out of range", three, []Assignment{one(0, 0), one(1, 3)}, ECOptions{K: 2, M: 1},
			"assignment 1 puts rank 1 on host 3, out of range for 3 hosts"},
		{"negative host", three, []Assignment{one(0, -1)}, ECOptions{K: 2, M: 1}, "puts rank 0 on host -1"},
		{"no hosts, one assignment", nil, []Assignment{one(0, 0)}, ECOptions{K: 1, M: 1}, "puts rank 0 on host 0, out of range for 0 hosts"},
		{"negative rank", three, []Assignment{one(0, 0), one(-4, 1)}, ECOptions{K: 2, M: 1}, "assignment 1 has negative rank -4"},
		{"duplicate rank", three, []Assignment{one(0, 0), one(5, 2), one(5, 1)}, ECOptions{K: 2, M: 1},
			`rank 5 is assigned twice (to host 1 "n1" and host 2 "n2")`},
		{"duplicate assignment", three, []Assignment{one(0, 0), one(0, 0)}, ECOptions{K: 2, M: 1}, "rank 0 is assigned twice"},
		{"too few hosts", three, []Assignment{one(0, 0), one(1, 1)}, ECOptions{K: 2, M: 1},
			"only 2 hosts with ranks; a group needs 2 data + 1 parity hosts"},
		{"huge K and M", three, []Assignment{one(0, 0)}, ECOptions{K: math.MaxInt, M: math.MaxInt}, "only 1 host with ranks"},
		{"left over", seven, ecMapAll(t, seven, MapBySlot), ECOptions{K: 2, M: 1},
			"7 hosts with ranks cannot form groups of 2 data + 1 parity hosts: 1 left over"},
		{"group not a multiple of K", mixed, ecMapAll(t, mixed, MapBySlot), ECOptions{K: 2, M: 1},
			`group 0 has 5 ranks on hosts "a" (2), "b" (1), "c" (2): not a multiple of K = 2, so they cannot be cut into 2 equal data groups`},
		{"second group not a multiple of K", second, ecMapAll(t, second, MapBySlot),
			ECOptions{K: 2, M: 1}, `group 1 has 3 ranks on hosts "n3" (1), "n4" (1), "n5" (1): not a multiple of K = 2`},
		{"many hosts are cut short", ecUniformHosts(10, 1), ecMapAll(t, ecUniformHosts(10, 1), MapBySlot),
			ECOptions{K: 3, M: 7}, `group 0 has 10 ranks on hosts "n0" (1), "n1" (1), "n2" (1), "n3" (1), "n4" (1), "n5" (1), "n6" (1), "n7" (1), ... (2 more): not a multiple of K = 3`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			groups, err := PlanEC(tt.hosts, tt.assign, tt.opt)
			if err == nil {
				t.Fatalf("PlanEC = %v; want an error", groups)
			}
			if !errors.Is(err, ErrECGroups) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("PlanEC error = %q; want ErrECGroups containing %q", err, tt.msg)
			}
			if !strings.HasPrefix(err.Error(), "topology: erasure-coding groups: ") {
				t.Errorf("PlanEC error = %q; want the sentinel's text first", err)
			}
		})
	}
}

// TestECMalformed: Traffic and ECLoss do not panic on groups PlanEC would
// not make.
func TestECMalformed(t *testing.T) {
	tests := []struct {
		name     string
		g        ECGroup
		xor, p2p int
	}{
		{"zero", ECGroup{}, 0, 0},
		{"no data or parity hosts", ECGroup{
			Hosts: []int{0}, Workers: [][]int{{1}, {2}}, DataGroups: [][]int{{1}, {2}},
			Reductions: []Reduction{{Members: []int{1, 2}, Targets: []int{7}}},
		}, 1, 3},
		{"reduction of one member", ECGroup{Reductions: []Reduction{{Members: []int{1}, Targets: []int{1, 1}}}}, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if xor, p2p := tt.g.Traffic(); xor != tt.xor || p2p != tt.p2p {
				t.Errorf("Traffic = %d, %d; want %d, %d", xor, p2p, tt.xor, tt.p2p)
			}
			_ = ECLoss([]ECGroup{tt.g}, []int{0, 0, 1, -5})
		})
	}
	if lost := ECLoss(nil, nil); lost != nil {
		t.Errorf("ECLoss(nil, nil) = %v", lost)
	}
	dup := ECGroup{Hosts: []int{0, 0, 1}, Workers: [][]int{{1}, {1}}, DataGroups: [][]int{{1}}, Data: []int{0}, Parity: []int{1}}
	if lost := ECLoss([]ECGroup{dup}, []int{0, 1}); !slices.Equal(lost, []int{1}) {
		t.Errorf("ECLoss on a group listing a host twice = %v, want [1]", lost)
	}
}

// ecDecodeOrigin turns fuzz bytes into worker counts (-128..127).
func ecDecodeOrigin(data []byte) []int {
	origin := make([]int, len(data))
	for i, b := range data {
		origin[i] = int(int8(b))
	}
	return origin
}

// FuzzSelectDataNodes checks that SelectDataNodes never panics and, when
// it succeeds, returns k distinct nodes in range, the brute-force
// reference's answer.
func FuzzSelectDataNodes(f *testing.F) {
	for _, tt := range ecSelectCases {
		var data []byte
		ok := true
		for _, c := range tt.origin {
			if c < math.MinInt8 || c > math.MaxInt8 {
				ok = false
			}
			data = append(data, byte(int8(c)))
		}
		if ok {
			f.Add(data, tt.k)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, k int) {
		if len(data) > 512 {
			data = data[:512]
		}
		origin := ecDecodeOrigin(data)
		got, err := SelectDataNodes(origin, k)
		if err != nil {
			if !errors.Is(err, ErrECGroups) {
				t.Fatalf("error %q does not wrap ErrECGroups", err)
			}
			return
		}
		if len(got) != k {
			t.Fatalf("%d nodes, want %d", len(got), k)
		}
		seen := make([]bool, len(origin))
		for _, i := range got {
			if i < 0 || i >= len(origin) || seen[i] {
				t.Fatalf("nodes %v: %d out of range or repeated", got, i)
			}
			seen[i] = true
		}
		if want := ecRefSelect(origin, k); !slices.Equal(got, want) {
			t.Fatalf("SelectDataNodes(%v, %d) = %v; reference %v", origin, k, got, want)
		}
	})
}

// FuzzPlanEC checks that PlanEC never panics on hosts and assignments
// built from arbitrary bytes, and that its errors wrap ErrECGroups.
func FuzzPlanEC(f *testing.F) {
	f.Add([]byte{2, 2, 2}, []byte{0, 0, 1, 1, 2, 2}, 2, 1, false)
	f.Add([]byte{1, 1, 1, 1}, []byte{0, 1, 2, 3}, 2, 2, true)
	f.Add([]byte{1, 0x81, 1}, []byte{0, 1, 2, 200}, 1, 1, true)
	f.Fuzz(func(t *testing.T, hostBytes, assignBytes []byte, k, m int, spread bool) {
		if len(hostBytes) > 64 || len(assignBytes) > 256 {
			return
		}
		hosts := make([]Host, len(hostBytes))
		for i, b := range hostBytes {
			hosts[i] = Host{Name: fmt.Sprintf("h%d", i), Slots: 1, Rack: fmt.Sprintf("r%d", b&3), Spare: b&0x80 != 0}
		}
		var assign []Assignment
		for i, b := range assignBytes {
			assign = append(assign, Assignment{Rank: i, Host: int(int8(b))})
			if b == 0x7f {
				assign = append(assign, Assignment{Rank: i, Host: 0}) // a duplicate
			}
		}
		groups, err := PlanEC(hosts, assign, ECOptions{K: k, M: m, Spread: spread})
		if err != nil {
			if !errors.Is(err, ErrECGroups) {
				t.Fatalf("error %q does not wrap ErrECGroups", err)
			}
			return
		}
		n := 0
		for _, g := range groups {
			n += len(slices.Concat(g.Workers...))
			g.Traffic()
			if lost := ECLoss(groups, g.Parity); len(lost) != 0 {
				t.Fatalf("losing the parity hosts %v lost %v", g.Parity, lost)
			}
		}
		if n != len(assign) {
			t.Fatalf("%d of %d ranks in groups", n, len(assign))
		}
	})
}

// ecWantLost is the reference of ECLoss for one group: with more than M of
// its hosts down, the ranks whose own host and data host are both down.
func ecWantLost(g ECGroup, failed []int) []int {
	down := 0
	for _, h := range g.Hosts {
		if slices.Contains(failed, h) {
			down++
		}
	}
	if down <= len(g.Parity) {
		return nil
	}
	var want []int
	for j, dg := range g.DataGroups {
		if !slices.Contains(failed, g.Data[j]) {
			continue
		}
		for _, r := range dg {
			for i, ws := range g.Workers {
				if slices.Contains(ws, r) && slices.Contains(failed, g.Hosts[i]) {
					want = append(want, r)
				}
			}
		}
	}
	slices.Sort(want)
	return want
}

func isSubset(a, b []int) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// TestPlanECSpareWithRanks: a spare that took over ranks is planned like
// any host with ranks (it is the assignment that counts).
func TestPlanECSpareWithRanks(t *testing.T) {
	hosts := []Host{{Name: "a", Slots: 1}, {Name: "sp", Slots: 1, Spare: true}, {Name: "b", Slots: 1}}
	assign := []Assignment{{Rank: 0, Host: 0}, {Rank: 1, Host: 1}, {Rank: 2, Host: 2}, {Rank: 3, Host: 0}}
	hosts[0].Slots = 2
	groups, err := PlanEC(hosts, assign, ECOptions{K: 2, M: 1})
	if err != nil || len(groups) != 1 || !slices.Equal(groups[0].Hosts, []int{0, 1, 2}) {
		t.Fatalf("PlanEC = %v, %v", groups, err)
	}
}

// TestECReplace: after a hot swap the spare takes the lost host's place
// and role; nothing else in the group moves, and the spare's ranks are
// protected as the lost host's were.
func TestECReplace(t *testing.T) {
	hosts := []Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}, {Name: "c", Slots: 2}, {Name: "s", Slots: 2, Spare: true}}
	groups, err := PlanEC(hosts, ecMapAll(t, hosts, MapBySlot), ECOptions{K: 2, M: 1})
	if err != nil {
		t.Fatal(err)
	}
	g := groups[0]
	for _, lost := range g.Hosts {
		r := g.Replace(lost, 3)
		if slices.Contains(r.Hosts, lost) || !slices.Contains(r.Hosts, 3) {
			t.Fatalf("replacing %d: hosts %v", lost, r.Hosts)
		}
		if slices.Contains(g.Data, lost) != slices.Contains(r.Data, 3) {
			t.Fatalf("replacing %d: the spare did not take its role: data %v parity %v", lost, r.Data, r.Parity)
		}
		if fmt.Sprint(r.DataGroups) != fmt.Sprint(g.DataGroups) || fmt.Sprint(r.Reductions) != fmt.Sprint(g.Reductions) {
			t.Fatalf("replacing %d moved ranks", lost)
		}
		if !slices.Equal(g.Hosts, groups[0].Hosts) {
			t.Fatal("Replace changed the original group")
		}
		// Any one failure of the new group loses nothing.
		for _, h := range r.Hosts {
			if lost := ECLoss([]ECGroup{r}, []int{h}); lost != nil {
				t.Fatalf("after replacing %d, host %d down loses %v", lost, h, lost)
			}
		}
	}
}

// TestECReplaceKeepsParityRows: the spare that replaces parity host
// Parity[j] holds row j: every other parity host keeps its row, whatever
// the spare's index (parity row j of every stripe is on Parity[j], so a
// re-ordered Parity would move rows between surviving hosts).
func TestECReplaceKeepsParityRows(t *testing.T) {
	var hosts []Host
	for i := range 5 {
		hosts = append(hosts, Host{Name: fmt.Sprintf("h%d", i), Slots: 1})
	}
	hosts[4].Spare = true
	groups, err := PlanEC(hosts, ecMapAll(t, hosts, MapBySlot), ECOptions{K: 2, M: 2})
	if err != nil {
		t.Fatal(err)
	}
	g := groups[0]
	for j, lost := range g.Parity {
		r := g.Replace(lost, 4)
		for i, h := range g.Parity {
			want := h
			if i == j {
				want = 4
			}
			if r.Parity[i] != want {
				t.Fatalf("replacing parity host %d (row %d) of %v by host 4: Parity %v, want row %d on host %d", lost, j, g.Parity, r.Parity, i, want)
			}
		}
	}
}
