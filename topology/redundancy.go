package topology

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrRedundancy: a --redundancy value that is not replicas:K or ec:K+M
// within their bounds.
var ErrRedundancy = errors.New("topology: bad redundancy")

// Bounds of a Redundancy.
const (
	// MaxReplicas is the most replicas of a rank's state a job may ask
	// for (gorun --replicas).
	MaxReplicas = 8
	// MaxECShards is the most data + parity hosts of an erasure-coding
	// group: the classic GF(2^8) Reed–Solomon code (ckpt.MaxShards).
	MaxECShards = 256
)

// Redundancy is what keeps a job's protected state through lost hosts
// (gorun --redundancy): Replicas whole copies of each rank's state on
// other hosts (replicas:K), or, when ECK > 0, an erasure code of ECK data
// and ECM parity hosts per group (ec:K+M, [PlanEC]) in place of replicas
// (Replicas is then 0). The zero Redundancy is replicas:0, nothing beyond
// each rank's own host.
type Redundancy struct {
	Replicas int
	ECK, ECM int
}

// EC reports whether r is an erasure code.
func (r Redundancy) EC() bool { return r.ECK > 0 }

// String returns r as ParseRedundancy reads it: "replicas:1", "ec:2+2".
func (r Redundancy) String() string {
	if r.EC() {
		return fmt.Sprintf("ec:%d+%d", r.ECK, r.ECM)
	}
	return fmt.Sprintf("replicas:%d", r.Replicas)
}

// ParseRedundancy parses "replicas:K" (0 <= K <= MaxReplicas) or
// "ec:K+M" (K, M >= 1, K+M <= MaxECShards), in decimal. Errors wrap
// [ErrRedundancy] and say what is wanted.
func ParseRedundancy(s string) (Redundancy, error) {
	kind, arg, ok := strings.Cut(s, ":")
	switch {
	case ok && kind == "replicas":
		k, err := strconv.Atoi(arg)
		if err != nil || k < 0 || k > MaxReplicas || !digits(arg) {
			return Redundancy{}, fmt.Errorf("%w: %s: want replicas:K with K from 0 to %d", ErrRedundancy, shorten(s), MaxReplicas)
		}
		return Redundancy{Replicas: k}, nil
	case ok && kind == "ec":
		ks, ms, plus := strings.Cut(arg, "+")
		k, errK := strconv.Atoi(ks)
		m, errM := strconv.Atoi(ms)
		if !plus || errK != nil || errM != nil || !digits(ks) || !digits(ms) {
			return Redundancy{}, fmt.Errorf("%w: %s: want ec:K+M, K data and M parity hosts per group (e.g. ec:2+2)", ErrRedundancy, shorten(s))
		}
		if k < 1 || m < 1 || k > MaxECShards-m {
			return Redundancy{}, fmt.Errorf("%w: %s: want K >= 1 data and M >= 1 parity hosts, K+M at most %d", ErrRedundancy, shorten(s), MaxECShards)
		}
		return Redundancy{ECK: k, ECM: m}, nil
	}
	return Redundancy{}, fmt.Errorf("%w: %s: want replicas:K or ec:K+M", ErrRedundancy, shorten(s))
}

// digits reports whether s is one or more ASCII digits (no sign, which
// strconv.Atoi would take).
func digits(s string) bool {
	if s == "" || len(s) > 9 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// SurvivesEC states what erasure-coding groups survive, in words for
// gorun -v and gorun plan: "ec:2+2 over 4 hosts: any 2 of the 4 hosts",
// or with several groups "ec:2+2 over 8 hosts: any 2 hosts in each of the
// 2 groups of 4". A group decodes whatever it lost while at most M of its
// hosts are lost ([ECLoss]); a host that is down already (down, e.g.
// fenced and not replaced: its role is vacant) uses one of those M, and
// the text names the groups left with less. Groups of different shapes
// are described one by one.
func SurvivesEC(groups []ECGroup, down []int) string {
	if len(groups) == 0 {
		return "ec: no groups: nothing beyond each rank's own host"
	}
	isDown := make(map[int]bool, len(down))
	for _, h := range down {
		isDown[h] = true
	}
	k, m := len(groups[0].Data), len(groups[0].Parity)
	hosts := 0
	same := true
	var reduced []string
	for i, g := range groups {
		hosts += len(g.Hosts)
		if len(g.Data) != k || len(g.Parity) != m {
			same = false
		}
		vacant := 0
		for _, h := range g.Hosts {
			if isDown[h] {
				vacant++
			}
		}
		if vacant > 0 {
			left := len(g.Parity) - vacant
			if left < 0 {
				reduced = append(reduced, fmt.Sprintf("group %d has lost %d hosts, more than its %d parity hosts: ranks may be lost", i, vacant, len(g.Parity)))
			} else {
				reduced = append(reduced, fmt.Sprintf("group %d, with %s down, survives %s more", i, plural(vacant, "host"), plural(left, "host")))
			}
		}
	}
	var b strings.Builder
	switch {
	case !same:
		fmt.Fprintf(&b, "ec over %s:", plural(hosts, "host"))
		for i, g := range groups {
			if i > 0 {
				b.WriteString(";")
			}
			fmt.Fprintf(&b, " group %d (ec:%d+%d): any %d of its %d hosts", i, len(g.Data), len(g.Parity), len(g.Parity), len(g.Hosts))
		}
	case len(groups) == 1:
		fmt.Fprintf(&b, "ec:%d+%d over %s: any %d of the %d hosts", k, m, plural(hosts, "host"), m, k+m)
	default:
		fmt.Fprintf(&b, "ec:%d+%d over %s: any %s in each of the %d groups of %d", k, m, plural(hosts, "host"), plural(m, "host"), len(groups), k+m)
	}
	for _, r := range reduced {
		b.WriteString("; ")
		b.WriteString(r)
	}
	return b.String()
}

// SurvivesReplicas states what replicas survive, in words for gorun -v
// and gorun plan: hostOf[r] is rank r's host, holders[r] the ranks whose
// hosts keep its copies (topology.Place's Holders; nil: none). A rank's
// state survives while one of the distinct hosts among its own and its
// holders' is up, so the job survives any T lost hosts where T + 1 is the
// fewest such hosts of any rank: "replicas:1 over 4 hosts: any 1 host".
// When each host's copies are all on one other host that keeps its
// copies on the first (replicas:1 between pairs of hosts), it adds that
// one host per pair survives: "...; 1 host per pair (2 pairs)".
func SurvivesReplicas(k int, hostOf []int, holders [][]int) string {
	hostSet := make(map[int]bool)
	for _, h := range hostOf {
		hostSet[h] = true
	}
	head := fmt.Sprintf("replicas:%d over %s", k, plural(len(hostSet), "host"))
	if len(hostOf) == 0 {
		return head + ": no ranks"
	}
	t := -1
	partner := make(map[int]int) // host -> the one host keeping its copies (-1: several)
	for r, h := range hostOf {
		copies := map[int]bool{h: true}
		if r < len(holders) {
			for _, x := range holders[r] {
				if x >= 0 && x < len(hostOf) {
					copies[hostOf[x]] = true
					if p, ok := partner[h]; !ok {
						partner[h] = hostOf[x]
					} else if p != hostOf[x] {
						partner[h] = -1
					}
				}
			}
		}
		if n := len(copies) - 1; t < 0 || n < t {
			t = n
		}
	}
	if t == 0 {
		return head + ": no lost host (some rank's state is on its own host only)"
	}
	s := fmt.Sprintf("%s: any %s", head, plural(t, "host"))
	if t == 1 && len(partner) == len(hostSet) {
		for h, p := range partner {
			if p < 0 || p == h || partner[p] != h {
				return s
			}
		}
		s += fmt.Sprintf("; 1 host per pair (%s)", plural(len(hostSet)/2, "pair"))
	}
	return s
}
