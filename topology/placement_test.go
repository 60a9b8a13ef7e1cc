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

func TestLayout(t *testing.T) {
	tests := []struct {
		world, tp, pp int
		want          Layout
		err           string
	}{
		{8, 1, 1, Layout{1, 1, 8}, ""},
		{16, 4, 2, Layout{4, 2, 2}, ""},
		{16, 16, 1, Layout{16, 1, 1}, ""},
		{12, 2, 3, Layout{2, 3, 2}, ""},
		{16, 3, 1, Layout{}, "16 ranks are not a multiple of tensor-parallel 3 × pipeline-parallel 1 = 3"},
		{8, 4, 4, Layout{}, "tensor-parallel 4 × pipeline-parallel 4 is more than the 8 ranks"},
		{8, 0, 1, Layout{}, "tensor-parallel size 0"},
		{8, 1, -2, Layout{}, "pipeline-parallel size -2"},
		{0, 1, 1, Layout{}, "0 ranks"},
		{8, math.MaxInt, math.MaxInt, Layout{}, "more than the 8 ranks"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d/%d/%d", tc.world, tc.tp, tc.pp), func(t *testing.T) {
			l, err := NewLayout(tc.world, tc.tp, tc.pp)
			if tc.err != "" {
				if !errors.Is(err, ErrBadLayout) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("NewLayout = %v, %v; want an ErrBadLayout saying %q", l, err, tc.err)
				}
				return
			}
			if err != nil || l != tc.want {
				t.Fatalf("NewLayout = %v, %v; want %v", l, err, tc.want)
			}
			checkLayout(t, l)
		})
	}
}

// checkLayout checks Coord, Rank and the data-parallel groups of l against
// the definition rank = tp + TP·(dp + DP·pp).
func checkLayout(t *testing.T, l Layout) {
	t.Helper()
	seen := make([]bool, l.World())
	for r := range l.World() {
		c := l.Coord(r)
		if c.TP < 0 || c.TP >= l.TP || c.PP < 0 || c.PP >= l.PP || c.DP < 0 || c.DP >= l.DP {
			t.Fatalf("%v: Coord(%d) = %+v out of range", l, r, c)
		}
		if c.TP+l.TP*(c.DP+l.DP*c.PP) != r || l.Rank(c) != r {
			t.Fatalf("%v: Coord(%d) = %+v does not give the rank back", l, r, c)
		}
		g := l.DPGroup(r)
		if len(g) != l.DP || g[c.DP] != r {
			t.Fatalf("%v: DPGroup(%d) = %v", l, r, g)
		}
		for d, m := range g {
			if mc := l.Coord(m); mc.TP != c.TP || mc.PP != c.PP || mc.DP != d {
				t.Fatalf("%v: DPGroup(%d) holds %d at %+v", l, r, m, mc)
			}
		}
	}
	for _, g := range l.DPGroups() {
		for _, r := range g {
			if seen[r] {
				t.Fatalf("%v: rank %d in two data-parallel groups", l, r)
			}
			seen[r] = true
		}
	}
	if slices.Contains(seen, false) {
		t.Fatalf("%v: a rank in no data-parallel group", l)
	}
}

// TestLayoutMegatronOrder pins the order against Megatron-LM's: with 16
// ranks, TP=2, PP=2 (so DP=4), the tensor-parallel groups are consecutive
// pairs and the data-parallel group of rank 0 is 0, 2, 4, 6; pipeline
// stage 1 starts at rank 8.
func TestLayoutMegatronOrder(t *testing.T) {
	l, err := NewLayout(16, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if g := l.DPGroup(0); !slices.Equal(g, []int{0, 2, 4, 6}) {
		t.Errorf("DPGroup(0) = %v", g)
	}
	if g := l.DPGroup(9); !slices.Equal(g, []int{9, 11, 13, 15}) {
		t.Errorf("DPGroup(9) = %v", g)
	}
	if c := l.Coord(8); c != (Coord{TP: 0, PP: 1, DP: 0}) {
		t.Errorf("Coord(8) = %+v", c)
	}
	if c := l.Coord(7); c != (Coord{TP: 1, PP: 0, DP: 3}) {
		t.Errorf("Coord(7) = %+v", c)
	}
}

func FuzzLayout(f *testing.F) {
	f.Add(16, 4, 2)
	f.Add(8, 3, 1)
	f.Add(0, 0, 0)
	f.Add(-1, math.MaxInt, 2)
	f.Fuzz(func(t *testing.T, world, tp, pp int) {
		l, err := NewLayout(world, tp, pp)
		if err != nil {
			if !errors.Is(err, ErrBadLayout) {
				t.Fatalf("error %v does not wrap ErrBadLayout", err)
			}
			return
		}
		if l.World() != world || l.TP != tp || l.PP != pp {
			t.Fatalf("NewLayout(%d, %d, %d) = %v", world, tp, pp, l)
		}
		if world <= 4096 {
			checkLayout(t, l)
		}
	})
}

// cluster builds hosts from a compact spec: one entry per host,
// "rack/switch" labels ("" for none), all with slots slots.
func cluster(slots int, labels ...string) []Host {
	hosts := make([]Host, len(labels))
	for i, lb := range labels {
		rack, sw, _ := strings.Cut(lb, "/")
		hosts[i] = Host{Name: fmt.Sprintf("h%d", i), Slots: slots, Rack: rack, Switch: sw}
	}
	return hosts
}

func mustMap(t testing.TB, hosts []Host, np int) []Assignment {
	t.Helper()
	a, err := MapRanks(hosts, MapOptions{NP: np})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustLayout(t testing.TB, world, tp, pp int) Layout {
	t.Helper()
	l, err := NewLayout(world, tp, pp)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// checkPlacement checks the invariants every placement keeps: K holders
// per rank, in the owner's data-parallel group, on hosts distinct from
// the owner's and each other's, Level as computed from the hosts, Load
// the count of holdings, and no holder over K while a peer had room.
func checkPlacement(t *testing.T, l Layout, hosts []Host, assign []Assignment, p *Placement) {
	t.Helper()
	d := newDomains(hosts)
	load := make([]int, l.World())
	for r, hs := range p.Holders {
		if len(hs) != p.K {
			t.Fatalf("rank %d has %d holders, want %d", r, len(hs), p.K)
		}
		group := l.DPGroup(r)
		seenHosts := []int{assign[r].Host}
		for _, h := range hs {
			if !slices.Contains(group, h) || h == r {
				t.Fatalf("rank %d's holder %d is not a peer in its data-parallel group %v", r, h, group)
			}
			if slices.Contains(seenHosts, assign[h].Host) {
				t.Fatalf("rank %d: holders %v share a host with each other or the owner", r, hs)
			}
			seenHosts = append(seenHosts, assign[h].Host)
			load[h]++
		}
		lv := LevelRack
		for a := range seenHosts {
			for b := a + 1; b < len(seenHosts); b++ {
				lv = min(lv, d.level(seenHosts[a], seenHosts[b]))
			}
		}
		if lv != p.Level[r] {
			t.Fatalf("rank %d: Level %v, computed %v", r, p.Level[r], lv)
		}
		if lv < p.Require {
			t.Fatalf("rank %d: Level %v below the required %v", r, lv, p.Require)
		}
	}
	if !slices.Equal(load, p.Load) {
		t.Fatalf("Load %v, counted %v", p.Load, load)
	}
}

func TestPlace(t *testing.T) {
	tests := []struct {
		name      string
		hosts     []Host
		np        int
		tp, pp    int
		opt       PlacementOptions
		guarantee Level // Placement.Guarantee
		short     bool  // Shortfalls expected
		err       string
	}{
		{
			name:  "DEADPOOL k=1 on a DP ring, no labels",
			hosts: cluster(1, "", "", "", ""), np: 4, tp: 1, pp: 1,
			opt: PlacementOptions{K: 1}, guarantee: LevelHost,
		},
		{
			name:  "k=2 over three racks: cross-rack",
			hosts: cluster(2, "r1/", "r1/", "r2/", "r2/", "r3/", "r3/"), np: 12, tp: 2, pp: 1,
			opt: PlacementOptions{K: 2}, guarantee: LevelRack,
		},
		{
			name:  "k=2 with two racks: cross-rack impossible, reported",
			hosts: cluster(1, "r1/s1", "r1/s2", "r2/s3", "r2/s4"), np: 4, tp: 1, pp: 1,
			opt: PlacementOptions{K: 2}, guarantee: LevelSwitch, short: true,
		},
		{
			name:  "k=2 with two racks required: error",
			hosts: cluster(1, "r1/", "r1/", "r2/", "r2/"), np: 4, tp: 1, pp: 1,
			opt: PlacementOptions{K: 2, Require: LevelRack},
			err: "cannot give every owner and its 2 replicas distinct racks",
		},
		{
			name:  "k=1 cross-rack with two racks",
			hosts: cluster(1, "r1/", "r1/", "r2/", "r2/"), np: 4, tp: 1, pp: 1,
			opt: PlacementOptions{K: 1, Require: LevelRack}, guarantee: LevelRack,
		},
		{
			name:  "same-domain keeps replicas in the rack",
			hosts: cluster(1, "r1/", "r1/", "r1/", "r2/", "r2/", "r2/"), np: 6, tp: 1, pp: 1,
			opt: PlacementOptions{K: 2, Policy: SameDomain}, guarantee: LevelHost,
		},
		{
			name:  "TP=2 on hosts of 2 slots: every ring peer on another host",
			hosts: cluster(2, "", "", ""), np: 6, tp: 2, pp: 1,
			opt: PlacementOptions{K: 2}, guarantee: LevelHost,
		},
		{
			name:  "ranks of a host in one DP ring: holders still leave the host",
			hosts: cluster(4, "", ""), np: 8, tp: 1, pp: 1,
			opt: PlacementOptions{K: 1}, guarantee: LevelHost,
		},
		{
			name:  "too few hosts for k",
			hosts: cluster(4, "", ""), np: 8, tp: 1, pp: 1,
			opt: PlacementOptions{K: 2},
			err: "spans 2 hosts; 2 replicas on other hosts need 3",
		},
		{
			name:  "TP=4 on hosts of 4: a DP group of one",
			hosts: cluster(4, "", ""), np: 4, tp: 4, pp: 1,
			opt: PlacementOptions{K: 1},
			err: "spans 1 host",
		},
		{
			name:  "rack required, no labels",
			hosts: cluster(1, "", "", ""), np: 3, tp: 1, pp: 1,
			opt: PlacementOptions{K: 1, Require: LevelRack},
			err: "rack separation required, but the hostfile names 0 racks",
		},
		{
			name:  "k=0",
			hosts: cluster(1, "", ""), np: 2, tp: 1, pp: 1,
			opt: PlacementOptions{K: 0}, err: "0 replicas requested",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := mustLayout(t, tc.np, tc.tp, tc.pp)
			assign := mustMap(t, tc.hosts, tc.np)
			p, err := Place(l, tc.hosts, assign, tc.opt)
			if tc.err != "" {
				if !errors.Is(err, ErrPlacement) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Place: %v; want ErrPlacement saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPlacement(t, l, tc.hosts, assign, p)
			if g := p.Guarantee(); g != tc.guarantee {
				t.Errorf("Guarantee %v, want %v (holders %v)", g, tc.guarantee, p.Holders)
			}
			if got := len(p.Shortfalls) > 0; got != tc.short {
				t.Errorf("Shortfalls %v, want some: %v", p.Shortfalls, tc.short)
			}
			for _, s := range p.Shortfalls {
				t.Log(s)
			}
			if tc.opt.Policy == SameDomain {
				for r, hs := range p.Holders {
					for _, h := range hs {
						if tc.hosts[assign[h].Host].Rack != tc.hosts[assign[r].Host].Rack {
							t.Errorf("same-domain: rank %d's holder %d is in another rack", r, h)
						}
					}
				}
			}
			// Every rank holds exactly K replicas when the ring allows.
			for r, n := range p.Load {
				if n != tc.opt.K {
					t.Errorf("rank %d holds %d replicas, want %d", r, n, tc.opt.K)
				}
			}
		})
	}
}

// randomCluster draws a hostfile: 2-24 hosts of 1-4 slots, labelled with
// racks and switches (some hosts unlabelled, sometimes).
func randomCluster(rng *rand.Rand) []Host {
	n := 2 + rng.IntN(23)
	racks := 1 + rng.IntN(5)
	labelled := rng.IntN(4) != 0
	slots := 1 + rng.IntN(4)
	hosts := make([]Host, n)
	for i := range hosts {
		hosts[i] = Host{Name: fmt.Sprintf("h%d", i), Slots: slots}
		if labelled && rng.IntN(10) != 0 {
			r := rng.IntN(racks)
			hosts[i].Rack = fmt.Sprintf("r%d", r)
			hosts[i].Switch = fmt.Sprintf("r%d-s%d", r, rng.IntN(2))
		}
	}
	return hosts
}

// subsets calls f with every subset of [0, n) of size at most k, in a
// reused slice.
func subsets(n, k int, f func([]int)) {
	var cur []int
	var rec func(start int)
	rec = func(start int) {
		f(cur)
		if len(cur) == k {
			return
		}
		for i := start; i < n; i++ {
			cur = append(cur, i)
			rec(i + 1)
			cur = cur[:len(cur)-1]
		}
	}
	rec(0)
}

// TestPlacementSurvivesItsPromise: on random hostfiles and layouts, every
// placement keeps the invariants, loses nothing to any K failed hosts,
// and, when it guarantees racks (or switches), nothing to any K failed
// racks (switches); K+1 failures of an owner's and its holders' hosts do
// lose its shard, so Lost is not vacuous.
func TestPlacementSurvivesItsPromise(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 2))
	placed := 0
	for trial := range 400 {
		hosts := randomCluster(rng)
		slots := hosts[0].Slots
		np := len(hosts) * slots
		tp := []int{1, 1, 2, slots}[rng.IntN(4)]
		if np%tp != 0 {
			tp = 1
		}
		pp := 1
		if rng.IntN(3) == 0 && (np/tp)%2 == 0 {
			pp = 2
		}
		l := mustLayout(t, np, tp, pp)
		assign := mustMap(t, hosts, np)
		opt := PlacementOptions{K: 1 + rng.IntN(3), Policy: Policy(rng.IntN(2))}
		p, err := Place(l, hosts, assign, opt)
		if err != nil {
			if !errors.Is(err, ErrPlacement) {
				t.Fatalf("trial %d: %v", trial, err)
			}
			continue // not enough hosts in some group: checked by TestPlace
		}
		placed++
		checkPlacement(t, l, hosts, assign, p)
		subsets(len(hosts), opt.K, func(failed []int) {
			if lost := p.Lost(assign, failed); len(lost) > 0 {
				t.Fatalf("trial %d (%v, k=%d): hosts %v failed, shards of %v lost", trial, l, opt.K, failed, lost)
			}
		})
		for _, dom := range []struct {
			lv    Level
			label func(Host) string
		}{{LevelRack, func(h Host) string { return h.Rack }}, {LevelSwitch, func(h Host) string { return h.Switch }}} {
			if p.Guarantee() < dom.lv {
				continue
			}
			var names []string
			for _, h := range hosts {
				if !slices.Contains(names, dom.label(h)) {
					names = append(names, dom.label(h))
				}
			}
			subsets(len(names), opt.K, func(failedDomains []int) {
				var failed []int
				for i, h := range hosts {
					for _, fd := range failedDomains {
						if dom.label(h) == names[fd] {
							failed = append(failed, i)
						}
					}
				}
				if lost := p.Lost(assign, failed); len(lost) > 0 {
					t.Fatalf("trial %d: %v-level placement lost %v when %v failed", trial, dom.lv, lost, failed)
				}
			})
		}
		// The owner's and its holders' hosts together do lose it.
		r := rng.IntN(np)
		failed := []int{assign[r].Host}
		for _, h := range p.Holders[r] {
			failed = append(failed, assign[h].Host)
		}
		if !slices.Contains(p.Lost(assign, failed), r) {
			t.Fatalf("trial %d: rank %d survives the loss of its owner and holders' hosts %v", trial, r, failed)
		}
	}
	if placed < 200 {
		t.Fatalf("only %d of 400 random clusters could be placed: the generator is off", placed)
	}
}

func TestPlaceDeterministic(t *testing.T) {
	hosts := benchHosts(64)
	assign := mustMap(t, hosts, 512)
	l := mustLayout(t, 512, 8, 1)
	a, err := Place(l, hosts, assign, PlacementOptions{K: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Place(l, hosts, assign, PlacementOptions{K: 2})
	for r := range a.Holders {
		if !slices.Equal(a.Holders[r], b.Holders[r]) {
			t.Fatalf("rank %d: %v, then %v", r, a.Holders[r], b.Holders[r])
		}
	}
}

func TestChooseSpare(t *testing.T) {
	// Three racks of two hosts; rack r3 has no ranks' hosts but spares.
	hosts := cluster(1, "r1/", "r1/", "r2/", "r2/")
	hosts = append(hosts,
		Host{Name: "spare-r1", Slots: 1, Rack: "r1", Spare: true},
		Host{Name: "spare-r2", Slots: 1, Rack: "r2", Spare: true},
		Host{Name: "spare-small", Slots: 1, Rack: "r3", Spare: true},
	)
	assign := mustMap(t, hosts, 4)
	l := mustLayout(t, 4, 1, 1)
	cross, err := Place(l, hosts, assign, PlacementOptions{K: 1})
	if err != nil {
		t.Fatal(err)
	}
	same, err := Place(l, hosts, assign, PlacementOptions{K: 1, Policy: SameDomain})
	if err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return hosts[i].Name }
	// Host 0 (r1) is lost. Under cross-domain its rank's holder is in r2,
	// so a spare in r2 would break the guarantee.
	s, err := ChooseSpare(hosts, assign, cross, 0, []int{5, 4}, false)
	if err != nil || name(s) != "spare-r1" {
		t.Errorf("cross-domain: chose %v, %v; want spare-r1", s, err)
	}
	// Under same-domain, the spare in the lost host's rack keeps links
	// short.
	s, err = ChooseSpare(hosts, assign, same, 0, []int{5, 4}, false)
	if err != nil || name(s) != "spare-r1" {
		t.Errorf("same-domain: chose %v, %v; want spare-r1", s, err)
	}
	// A third rack is as good as the lost one for cross-domain; the order
	// of spares breaks the tie, deterministically.
	s1, _ := ChooseSpare(hosts, assign, cross, 0, []int{6, 4}, false)
	s2, _ := ChooseSpare(hosts, assign, cross, 0, []int{6, 4}, false)
	if s1 != s2 || name(s1) != "spare-small" {
		t.Errorf("tie: %v then %v", s1, s2)
	}
	// Too small, or none.
	big := append(cluster(2, "", ""), Host{Name: "tiny", Slots: 1, Spare: true})
	bigAssign := mustMap(t, big, 4)
	bp, err := Place(mustLayout(t, 4, 2, 1), big, bigAssign, PlacementOptions{K: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ChooseSpare(big, bigAssign, bp, 0, []int{2}, false); !errors.Is(err, ErrPlacement) || !strings.Contains(err.Error(), "tiny has 1 slot for 2 ranks") {
		t.Errorf("small spare: %v", err)
	}
	if _, err := ChooseSpare(big, bigAssign, bp, 0, nil, false); !errors.Is(err, ErrPlacement) || !strings.Contains(err.Error(), "no spare host left") {
		t.Errorf("no spare: %v", err)
	}
}

func TestPLossBound(t *testing.T) {
	// DEADPOOL §V-C: D·q^(k+1) over 10^5 steps, q = 1e-4: k=1 gives 0.128
	// for their D, so D = 0.128 / (1e-8 · 1e5) = 128; k=2 gives 1.28e-5.
	const d = 128
	if got := PLossBound(d, 1e-4, 1) * 1e5; math.Abs(got-0.128) > 1e-9 {
		t.Errorf("k=1: %v", got)
	}
	if got := PLossBound(d, 1e-4, 2) * 1e5; math.Abs(got-1.28e-5) > 1e-15 {
		t.Errorf("k=2: %v", got)
	}
}
