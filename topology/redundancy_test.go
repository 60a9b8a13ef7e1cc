package topology

import (
	"errors"
	"strings"
	"testing"
)

func TestParseRedundancy(t *testing.T) {
	tests := []struct {
		in   string
		want Redundancy
		err  string // part of the error; "" = none
	}{
		{"replicas:0", Redundancy{}, ""},
		{"replicas:1", Redundancy{Replicas: 1}, ""},
		{"replicas:8", Redundancy{Replicas: 8}, ""},
		{"ec:2+2", Redundancy{ECK: 2, ECM: 2}, ""},
		{"ec:1+1", Redundancy{ECK: 1, ECM: 1}, ""},
		{"ec:255+1", Redundancy{ECK: 255, ECM: 1}, ""},
		{"ec:128+128", Redundancy{ECK: 128, ECM: 128}, ""},
		{"replicas:-1", Redundancy{}, "want replicas:K with K from 0 to 8"},
		{"replicas:+1", Redundancy{}, "want replicas:K with K from 0 to 8"},
		{"replicas:9", Redundancy{}, "want replicas:K with K from 0 to 8"},
		{"replicas:", Redundancy{}, "want replicas:K"},
		{"replicas", Redundancy{}, "want replicas:K or ec:K+M"},
		{"ec:2", Redundancy{}, "want ec:K+M, K data and M parity hosts per group"},
		{"ec:2+2+1", Redundancy{}, "want ec:K+M"},
		{"ec:+2", Redundancy{}, "want ec:K+M"},
		{"ec:2+-1", Redundancy{}, "want ec:K+M"},
		{"ec:0+1", Redundancy{}, "want K >= 1 data and M >= 1 parity hosts, K+M at most 256"},
		{"ec:2+0", Redundancy{}, "want K >= 1 data and M >= 1 parity hosts"},
		{"ec:200+100", Redundancy{}, "K+M at most 256"},
		{"ec:99999999999999999999+1", Redundancy{}, "want ec:K+M"},
		{"EC:2+2", Redundancy{}, "want replicas:K or ec:K+M"},
		{"raid:5", Redundancy{}, "want replicas:K or ec:K+M"},
		{"", Redundancy{}, "want replicas:K or ec:K+M"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRedundancy(tt.in)
			if tt.err == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseRedundancy(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
				}
				if s := got.String(); s != tt.in {
					t.Errorf("String() = %q, want %q", s, tt.in)
				}
				return
			}
			if !errors.Is(err, ErrRedundancy) || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("ParseRedundancy(%q) = %+v, %v; want an ErrRedundancy saying %q", tt.in, got, err, tt.err)
			}
		})
	}
}

func TestSurvivesEC(t *testing.T) {
	// plan plans n hosts of 2 ranks each.
	plan := func(n, k, m int) []ECGroup {
		t.Helper()
		hosts := make([]Host, n)
		var assign []Assignment
		for i := range hosts {
			hosts[i] = Host{Name: string(rune('a' + i)), Slots: 2}
			assign = append(assign, Assignment{Rank: 2 * i, Host: i}, Assignment{Rank: 2*i + 1, Host: i})
		}
		g, err := PlanEC(hosts, assign, ECOptions{K: k, M: m})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	tests := []struct {
		name   string
		groups []ECGroup
		down   []int
		want   string
	}{
		{"2+2 on 4", plan(4, 2, 2), nil, "ec:2+2 over 4 hosts: any 2 of the 4 hosts"},
		{"4+2 on 12", plan(12, 4, 2), nil, "ec:4+2 over 12 hosts: any 2 hosts in each of the 2 groups of 6"},
		{"2+1 on 3", plan(3, 2, 1), nil, "ec:2+1 over 3 hosts: any 1 of the 3 hosts"},
		{"2+2 with a vacant role", plan(4, 2, 2), []int{3}, "ec:2+2 over 4 hosts: any 2 of the 4 hosts; group 0, with 1 host down, survives 1 host more"},
		{"2+2 past its parity", plan(4, 2, 2), []int{0, 1, 3}, "group 0 has lost 3 hosts, more than its 2 parity hosts: ranks may be lost"},
		{"mixed shapes", append(plan(4, 2, 2), plan(3, 2, 1)...), nil, "ec over 7 hosts: group 0 (ec:2+2): any 2 of its 4 hosts; group 1 (ec:2+1): any 1 of its 3 hosts"},
		{"none", nil, nil, "ec: no groups: nothing beyond each rank's own host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SurvivesEC(tt.groups, tt.down); !strings.HasSuffix(got, tt.want) {
				t.Errorf("SurvivesEC = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSurvivesReplicas(t *testing.T) {
	tests := []struct {
		name    string
		k       int
		hostOf  []int
		holders [][]int
		want    string
	}{
		{"pairs", 1, []int{0, 1, 2, 3}, [][]int{{1}, {0}, {3}, {2}}, "replicas:1 over 4 hosts: any 1 host; 1 host per pair (2 pairs)"},
		{"ring", 1, []int{0, 1, 2}, [][]int{{1}, {2}, {0}}, "replicas:1 over 3 hosts: any 1 host"},
		{"two on distinct hosts", 2, []int{0, 1, 2}, [][]int{{1, 2}, {2, 0}, {0, 1}}, "replicas:2 over 3 hosts: any 2 hosts"},
		{"two holders on one host", 2, []int{0, 0, 1, 1}, [][]int{{2, 3}, {2, 3}, {0, 1}, {0, 1}}, "replicas:2 over 2 hosts: any 1 host; 1 host per pair (1 pair)"},
		{"one rank unprotected", 1, []int{0, 1}, [][]int{{1}, nil}, "replicas:1 over 2 hosts: no lost host (some rank's state is on its own host only)"},
		{"no holders", 0, []int{0, 1}, nil, "replicas:0 over 2 hosts: no lost host (some rank's state is on its own host only)"},
		{"holder on the same host", 1, []int{0, 0}, [][]int{{1}, {0}}, "replicas:1 over 1 host: no lost host (some rank's state is on its own host only)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SurvivesReplicas(tt.k, tt.hostOf, tt.holders); got != tt.want {
				t.Errorf("SurvivesReplicas = %q, want %q", got, tt.want)
			}
		})
	}
}
