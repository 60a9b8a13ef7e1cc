package topology

// PlanEC's and ECLoss's edge cases (hosts without ranks, validation errors,
// malformed groups) and spares: a spare with ranks, ECGroup.Replace.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

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

// TestECReplaceKeepsParityRows: parity row j lives on Parity[j]; a spare
// that replaces a parity host takes that row, whatever its index, and no
// other parity host changes row (its memory holds the row it had).
func TestECReplaceKeepsParityRows(t *testing.T) {
	hosts := []Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}, {Name: "c", Slots: 1}, {Name: "d", Slots: 1},
		{Name: "s", Slots: 1, Spare: true}, {Name: "t", Slots: 1, Spare: true}}
	groups, err := PlanEC(hosts, ecMapAll(t, hosts, MapBySlot), ECOptions{K: 2, M: 2})
	if err != nil {
		t.Fatal(err)
	}
	g := groups[0]
	for j, lost := range g.Parity {
		for _, spare := range []int{4, 5} {
			r := g.Replace(lost, spare)
			for i, h := range r.Parity {
				want := g.Parity[i]
				if i == j {
					want = spare
				}
				if h != want {
					t.Errorf("replacing parity row %d's host %d with %d: parity %v; want row %d on host %d", j, lost, spare, r.Parity, i, want)
				}
			}
		}
	}
}
