package topology

import (
	"errors"
	"fmt"
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
