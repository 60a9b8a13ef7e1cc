package topology

// ECGroup.Traffic against the examples of the ECHECK paper and its volume
// identity, with a brute-force search for the cheapest choice of nodes.

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

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
