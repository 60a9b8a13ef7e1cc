package topology

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestParseMapBy(t *testing.T) {
	tests := []struct {
		in   string
		want MapBy
		ok   bool
	}{
		{"slot", MapBySlot, true},
		{"node", MapByNode, true},
		{"NODE", MapByNode, true},
		{"Slot", MapBySlot, true},
		{"core", 0, false},
		{"slots", 0, false},
		{"", 0, false},
		{" node", 0, false},
		{"node:oversubscribe", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseMapBy(tt.in)
		if tt.ok {
			if err != nil || got != tt.want {
				t.Errorf("ParseMapBy(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			continue
		}
		if !errors.Is(err, ErrBadMapBy) {
			t.Errorf("ParseMapBy(%q) error = %v; want ErrBadMapBy", tt.in, err)
			continue
		}
		if want := fmt.Sprintf("%q", tt.in); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "want slot or node") {
			t.Errorf("ParseMapBy(%q) error %q does not name the value and the choices", tt.in, err)
		}
	}
}

func TestMapByString(t *testing.T) {
	for _, tt := range []struct {
		m    MapBy
		want string
	}{{MapBySlot, "slot"}, {MapByNode, "node"}, {MapBy(7), "MapBy(7)"}} {
		if got := tt.m.String(); got != tt.want {
			t.Errorf("MapBy(%d).String() = %q, want %q", int(tt.m), got, tt.want)
		}
		if back, err := ParseMapBy(tt.m.String()); tt.m <= MapByNode && (err != nil || back != tt.m) {
			t.Errorf("ParseMapBy(%q) = %v, %v; want round trip", tt.m.String(), back, err)
		}
	}
}

// hs builds hosts from "name:slots[:max][:spare]" shorthands.
func hs(specs ...string) []Host {
	var out []Host
	for _, s := range specs {
		var h Host
		parts := strings.Split(s, ":")
		h.Name = parts[0]
		fmt.Sscan(parts[1], &h.Slots)
		for _, p := range parts[2:] {
			if p == "spare" {
				h.Spare = true
			} else {
				fmt.Sscan(p, &h.MaxSlots)
			}
		}
		out = append(out, h)
	}
	return out
}

// hostsOf returns, for each rank, its host index; and checks Rank fields.
func hostsOf(t *testing.T, as []Assignment) []int {
	t.Helper()
	out := make([]int, len(as))
	for r, a := range as {
		if a.Rank != r {
			t.Fatalf("assignment %d has Rank %d", r, a.Rank)
		}
		out[r] = a.Host
	}
	return out
}

func TestMapRanks(t *testing.T) {
	tests := []struct {
		name  string
		hosts []Host
		opt   MapOptions
		want  []int // host of each rank
		local []int // local rank of each rank (nil: not checked)
	}{
		{"slot fills in order", hs("a:2", "b:2"), MapOptions{NP: 3, By: MapBySlot},
			[]int{0, 0, 1}, []int{0, 1, 0}},
		{"slot exact fit", hs("a:2", "b:3"), MapOptions{NP: 5, By: MapBySlot},
			[]int{0, 0, 1, 1, 1}, []int{0, 1, 0, 1, 2}},
		{"slot one rank", hs("a:4", "b:4"), MapOptions{NP: 1, By: MapBySlot}, []int{0}, []int{0}},
		{"node round robin", hs("a:2", "b:2"), MapOptions{NP: 3, By: MapByNode},
			[]int{0, 1, 0}, []int{0, 0, 1}},
		{"node skips full hosts", hs("a:3", "b:1", "c:2"), MapOptions{NP: 6, By: MapByNode},
			[]int{0, 1, 2, 0, 2, 0}, []int{0, 0, 0, 1, 1, 2}},
		{"node fewer ranks than hosts", hs("a:2", "b:2", "c:2"), MapOptions{NP: 2, By: MapByNode},
			[]int{0, 1}, []int{0, 0}},
		{"spare skipped by slot", hs("a:1", "s:4:spare", "b:2"), MapOptions{NP: 3, By: MapBySlot},
			[]int{0, 2, 2}, []int{0, 0, 1}},
		{"spare skipped by node", hs("s:4:spare", "a:2", "b:2"), MapOptions{NP: 4, By: MapByNode},
			[]int{1, 2, 1, 2}, []int{0, 0, 1, 1}},
		{"max_slots ignored without oversubscription", hs("a:2:2", "b:1:3"), MapOptions{NP: 3, By: MapBySlot},
			[]int{0, 0, 1}, nil},
		{"oversubscribe by slot deals the excess", hs("a:2", "b:2"), MapOptions{NP: 7, By: MapBySlot, Oversubscribe: true},
			[]int{0, 0, 0, 0, 1, 1, 1}, []int{0, 1, 2, 3, 0, 1, 2}},
		{"oversubscribe by node continues round robin", hs("a:2", "b:1"), MapOptions{NP: 5, By: MapByNode, Oversubscribe: true},
			[]int{0, 1, 0, 1, 0}, []int{0, 0, 1, 1, 2}},
		{"oversubscribe one host", hs("a:1"), MapOptions{NP: 3, By: MapByNode, Oversubscribe: true},
			[]int{0, 0, 0}, []int{0, 1, 2}},
		{"oversubscribe respects max_slots", hs("a:1:1", "b:1:3", "c:1"), MapOptions{NP: 7, By: MapBySlot, Oversubscribe: true},
			[]int{0, 1, 1, 1, 2, 2, 2}, nil},
		{"oversubscribe fills max_slots exactly", hs("a:1:2", "b:2:4"), MapOptions{NP: 6, By: MapByNode, Oversubscribe: true},
			[]int{0, 1, 0, 1, 1, 1}, []int{0, 0, 1, 1, 2, 3}},
		{"oversubscribe not needed", hs("a:2", "b:2"), MapOptions{NP: 4, By: MapByNode, Oversubscribe: true},
			[]int{0, 1, 0, 1}, nil},
		{"oversubscribe skips spares", hs("s:8:spare", "a:1"), MapOptions{NP: 2, By: MapBySlot, Oversubscribe: true},
			[]int{1, 1}, []int{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MapRanks(tt.hosts, tt.opt)
			if err != nil {
				t.Fatalf("MapRanks: %v", err)
			}
			if h := hostsOf(t, got); !reflect.DeepEqual(h, tt.want) {
				t.Errorf("hosts of ranks = %v, want %v", h, tt.want)
			}
			if tt.local != nil {
				var local []int
				for _, a := range got {
					local = append(local, a.LocalRank)
				}
				if !reflect.DeepEqual(local, tt.local) {
					t.Errorf("local ranks = %v, want %v", local, tt.local)
				}
			}
		})
	}
}

func TestMapRanksErrors(t *testing.T) {
	tests := []struct {
		name  string
		hosts []Host
		opt   MapOptions
		kind  error
		msg   string
	}{
		{"too many ranks", hs("a:2", "b:2"), MapOptions{NP: 5}, ErrTooManyRanks,
			"topology: too many ranks: 5 ranks requested but only 4 slots on 2 hosts; use --oversubscribe or add hosts"},
		{"too many ranks by node", hs("a:2", "b:2"), MapOptions{NP: 5, By: MapByNode}, ErrTooManyRanks,
			"5 ranks requested but only 4 slots on 2 hosts"},
		{"spares do not count", hs("a:2", "s:8:spare"), MapOptions{NP: 3}, ErrTooManyRanks,
			"3 ranks requested but only 2 slots on 1 host; use --oversubscribe"},
		{"max_slots too few", hs("a:1:2", "b:1:2"), MapOptions{NP: 5, Oversubscribe: true}, ErrTooManyRanks,
			"5 ranks requested but max_slots allows only 4 on 2 hosts"},
		{"zero ranks", hs("a:1"), MapOptions{NP: 0}, ErrBadNP, "0 requested; need at least 1"},
		{"negative ranks", hs("a:1"), MapOptions{NP: -3}, ErrBadNP, "-3 requested"},
		{"absurd ranks", hs("a:1"), MapOptions{NP: 1 << 30, Oversubscribe: true}, ErrBadNP, "at most 16777216"},
		{"no hosts", nil, MapOptions{NP: 1}, ErrNoSlots, "none of the 0 hosts"},
		{"only spares", hs("s:4:spare"), MapOptions{NP: 1}, ErrNoSlots, "none of the 1 hosts"},
		{"bad policy", hs("a:1"), MapOptions{NP: 1, By: MapBy(9)}, ErrBadMapBy, "MapBy(9)"},
		{"host without slots", hs("a:1", "b:0"), MapOptions{NP: 1}, ErrBadValue, `host 1 ("b") has 0 slots`},
		{"max below slots", hs("a:4:2"), MapOptions{NP: 1}, ErrBadValue, "max_slots 2 below its 4 slots"},
		{"negative max", hs("a:4:-1"), MapOptions{NP: 1}, ErrBadValue, "max_slots -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MapRanks(tt.hosts, tt.opt)
			if err == nil {
				t.Fatalf("MapRanks = %v; want error %v", got, tt.kind)
			}
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("MapRanks error = %q; want %v containing %q", err, tt.kind, tt.msg)
			}
		})
	}
}

// TestMapRanksHugeSlots checks that slot sums near the int limit do not
// overflow and that a spare host with no slots is fine.
func TestMapRanksHugeSlots(t *testing.T) {
	const big = int(^uint(0) >> 1)
	hosts := []Host{{Name: "a", Slots: big}, {Name: "b", Slots: big, MaxSlots: big}, {Name: "s", Spare: true}}
	for _, by := range []MapBy{MapBySlot, MapByNode} {
		got, err := MapRanks(hosts, MapOptions{NP: 3, By: by})
		if err != nil || len(got) != 3 {
			t.Errorf("by %v: %v, %v", by, got, err)
		}
	}
}

// refMap is a slow, literal reference for MapRanks on valid input.
func refMap(hosts []Host, opt MapOptions) ([]int, bool) {
	count := make([]int, len(hosts))
	total := 0
	for _, h := range hosts {
		if !h.Spare {
			total += h.Slots
		}
	}
	placed := 0
	if opt.NP <= total {
		if opt.By == MapBySlot {
			for i, h := range hosts {
				for !h.Spare && count[i] < h.Slots && placed < opt.NP {
					count[i]++
					placed++
				}
			}
		} else {
			for placed < opt.NP {
				for i, h := range hosts {
					if !h.Spare && count[i] < h.Slots && placed < opt.NP {
						count[i]++
						placed++
					}
				}
			}
		}
	} else {
		if !opt.Oversubscribe {
			return nil, false
		}
		for i, h := range hosts {
			if !h.Spare {
				count[i] = h.Slots
			}
		}
		placed = total
		for placed < opt.NP {
			progress := false
			for i, h := range hosts {
				if !h.Spare && (h.MaxSlots == 0 || count[i] < h.MaxSlots) && placed < opt.NP {
					count[i]++
					placed++
					progress = true
				}
			}
			if !progress {
				return nil, false
			}
		}
	}
	var out []int
	if opt.By == MapBySlot {
		for i := range hosts {
			for range count[i] {
				out = append(out, i)
			}
		}
		return out, true
	}
	for pass := 0; len(out) < opt.NP; pass++ {
		for i := range hosts {
			if count[i] > pass {
				out = append(out, i)
			}
		}
	}
	return out, true
}

// TestMapRanksProperties checks MapRanks on random hosts against its
// invariants and against refMap.
func TestMapRanksProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		n := rng.IntN(8)
		hosts := make([]Host, n)
		nonSpare := 0
		for i := range hosts {
			hosts[i] = Host{Name: fmt.Sprintf("h%d", i), Slots: 1 + rng.IntN(6)}
			if rng.IntN(5) == 0 {
				hosts[i].Spare = true
			} else {
				nonSpare++
			}
			if rng.IntN(3) == 0 {
				hosts[i].MaxSlots = hosts[i].Slots + rng.IntN(4)
			}
		}
		opt := MapOptions{NP: 1 + rng.IntN(40), By: MapBy(rng.IntN(2)), Oversubscribe: rng.IntN(2) == 0}
		name := fmt.Sprintf("iter %d: %+v %+v", iter, hosts, opt)

		got, err := MapRanks(hosts, opt)
		want, ok := refMap(hosts, opt)
		if nonSpare == 0 {
			if !errors.Is(err, ErrNoSlots) {
				t.Fatalf("%s: err = %v, want ErrNoSlots", name, err)
			}
			continue
		}
		if !ok {
			if !errors.Is(err, ErrTooManyRanks) {
				t.Fatalf("%s: err = %v, want ErrTooManyRanks", name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != opt.NP {
			t.Fatalf("%s: %d assignments", name, len(got))
		}
		// Every rank exactly once, on a valid non-spare host.
		onHost := make([][]int, n)
		for r, a := range got {
			if a.Rank != r {
				t.Fatalf("%s: assignment %d has rank %d", name, r, a.Rank)
			}
			if a.Host < 0 || a.Host >= n || hosts[a.Host].Spare {
				t.Fatalf("%s: rank %d on host %d", name, r, a.Host)
			}
			onHost[a.Host] = append(onHost[a.Host], r)
			// Local ranks are dense 0..k-1 in rank order.
			if a.LocalRank != len(onHost[a.Host])-1 {
				t.Fatalf("%s: rank %d has local rank %d, want %d", name, r, a.LocalRank, len(onHost[a.Host])-1)
			}
		}
		for i, rs := range onHost {
			h := hosts[i]
			if !opt.Oversubscribe && len(rs) > h.Slots {
				t.Fatalf("%s: host %d has %d ranks > %d slots", name, i, len(rs), h.Slots)
			}
			if h.MaxSlots > 0 && len(rs) > max(h.MaxSlots, h.Slots) {
				t.Fatalf("%s: host %d has %d ranks > max_slots %d", name, i, len(rs), h.MaxSlots)
			}
			if opt.By == MapBySlot && len(rs) > 0 && rs[len(rs)-1]-rs[0] != len(rs)-1 {
				t.Fatalf("%s: by slot, host %d has non-consecutive ranks %v", name, i, rs)
			}
		}
		if h := hostsOf(t, got); !reflect.DeepEqual(h, want) {
			t.Fatalf("%s: hosts = %v, reference %v", name, h, want)
		}
	}
}

func BenchmarkMapRanks(b *testing.B) {
	hosts := make([]Host, 10000)
	for i := range hosts {
		hosts[i] = Host{Name: fmt.Sprintf("n%d", i), Slots: 1 + i%8}
	}
	for _, by := range []MapBy{MapBySlot, MapByNode} {
		b.Run(by.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := MapRanks(hosts, MapOptions{NP: 100000, By: by, Oversubscribe: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
