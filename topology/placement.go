package topology

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// ErrPlacement: replicas cannot be placed as required (too few data-parallel
// peers, hosts or failure domains), or a placement request is malformed.
var ErrPlacement = errors.New("topology: replica placement")

// Level is how far apart two hosts are, in failure domains: the widest
// domain that tells them apart. Hosts are in different racks only when
// both carry rack labels and the labels differ; likewise for switches.
type Level int

const (
	// LevelNone: the same host (or no holder at all).
	LevelNone Level = iota
	// LevelHost: different hosts, not known to be in different switches
	// or racks.
	LevelHost
	// LevelSwitch: different switches, not known to be in different racks.
	LevelSwitch
	// LevelRack: different racks.
	LevelRack
)

func (l Level) String() string {
	switch l {
	case LevelNone:
		return "none"
	case LevelHost:
		return "host"
	case LevelSwitch:
		return "switch"
	case LevelRack:
		return "rack"
	}
	return fmt.Sprintf("Level(%d)", int(l))
}

// ParseLevel parses "host", "switch" or "rack".
func ParseLevel(s string) (Level, error) {
	switch strings.ToLower(s) {
	case "host":
		return LevelHost, nil
	case "switch":
		return LevelSwitch, nil
	case "rack":
		return LevelRack, nil
	}
	return 0, fmt.Errorf("%w: failure domain %s: want host, switch or rack", ErrPlacement, shorten(s))
}

// Policy says where replicas should go beyond what is required.
type Policy int

const (
	// CrossDomain spreads an owner and its replicas over as wide failure
	// domains as the hostfile allows: distinct racks, else distinct
	// switches, else distinct hosts (DEADPOOL §V-C: survives the loss of
	// a rack or a switch).
	CrossDomain Policy = iota
	// SameDomain keeps replicas as close as allowed: other hosts, in the
	// owner's switch and rack when possible (TierCheck §3.1: cheaper
	// links; a rack failure falls to the persistent tier).
	SameDomain
)

func (p Policy) String() string {
	switch p {
	case CrossDomain:
		return "cross-domain"
	case SameDomain:
		return "same-domain"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy parses "cross-domain" or "same-domain".
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(s) {
	case "cross-domain":
		return CrossDomain, nil
	case "same-domain":
		return SameDomain, nil
	}
	return 0, fmt.Errorf("%w: policy %s: want cross-domain or same-domain", ErrPlacement, shorten(s))
}

// PlacementOptions: K replicas per shard, placed by Policy; Require is the
// separation every owner must get from all its holders, and they from each
// other (LevelHost, the default when zero, survives any K host failures).
type PlacementOptions struct {
	K       int
	Policy  Policy
	Require Level
}

// Placement says, for every rank, which ranks hold the replicas of its
// optimizer shard.
type Placement struct {
	K       int
	Policy  Policy
	Require Level
	// Holders[r]: the K ranks holding r's replicas, all in r's
	// data-parallel group.
	Holders [][]int
	// Level[r]: the separation r and its holders achieved, pairwise: the
	// narrowest of the K+1 hosts' pairwise levels.
	Level []Level
	// Load[r]: how many shards rank r holds replicas of.
	Load []int
	// Shortfalls: where CrossDomain could not spread as wide as the
	// hostfile's labels ask for, one entry per data-parallel group.
	Shortfalls []Shortfall
}

// Shortfall reports owners of one data-parallel group that got a narrower
// separation than the widest domain the hostfile names.
type Shortfall struct {
	Group  int   // index into Layout.DPGroups
	Owners []int // the ranks concerned
	Wanted Level // the widest domain named in the hostfile
	Got    Level // the narrowest separation among Owners
	Why    string
}

func (s Shortfall) String() string {
	return fmt.Sprintf("data-parallel group %d: %d owners separated by %s, not %s: %s", s.Group, len(s.Owners), s.Got, s.Wanted, s.Why)
}

// domains holds, per host index, small integer ids of its rack and switch
// (-1 when unlabelled).
type domains struct {
	rack, sw []int32
	racks    int // distinct rack labels
	switches int // distinct switch labels
}

func newDomains(hosts []Host) domains {
	d := domains{rack: make([]int32, len(hosts)), sw: make([]int32, len(hosts))}
	racks, sws := map[string]int32{}, map[string]int32{}
	id := func(m map[string]int32, s string) int32 {
		if s == "" {
			return -1
		}
		v, ok := m[s]
		if !ok {
			v = int32(len(m))
			m[s] = v
		}
		return v
	}
	for i, h := range hosts {
		d.rack[i], d.sw[i] = id(racks, h.Rack), id(sws, h.Switch)
	}
	d.racks, d.switches = len(racks), len(sws)
	return d
}

// level is the separation of hosts a and b.
func (d *domains) level(a, b int) Level {
	switch {
	case a == b:
		return LevelNone
	case d.rack[a] >= 0 && d.rack[b] >= 0 && d.rack[a] != d.rack[b]:
		return LevelRack
	case d.sw[a] >= 0 && d.sw[b] >= 0 && d.sw[a] != d.sw[b]:
		return LevelSwitch
	}
	return LevelHost
}

// widest is the widest level the labels can express at all.
func (d *domains) widest() Level {
	switch {
	case d.racks > 1:
		return LevelRack
	case d.switches > 1:
		return LevelSwitch
	}
	return LevelHost
}

// Place chooses, for every rank of layout l mapped on hosts by assign
// (indexed by rank, as MapRanks returns it), K replica holders among its
// data-parallel group (DEADPOOL §V-B: the ranks with its tp and pp
// coordinate hold the same parameters, so only the optimizer shard needs
// copies). Holders are on hosts other than the owner's and each other's,
// so any K host failures leave a copy of every shard; beyond that the
// policy spreads them (CrossDomain) or keeps them close (SameDomain).
//
// Holders are sought along the data-parallel ring from the owner, the
// nearest acceptable peer first, and no rank holds more than K replicas
// while another acceptable peer has room, so the memory a rank gives to
// replicas stays K shards in the common case. The result is a pure
// function of its arguments.
//
// The error wraps ErrPlacement when a group has too few peers on other
// hosts for K holders, or when opt.Require cannot be met; it names the
// group and what is missing. A CrossDomain placement that reaches the
// requirement but not the widest domain the hostfile names is not an
// error: see Placement.Shortfalls.
func Place(l Layout, hosts []Host, assign []Assignment, opt PlacementOptions) (*Placement, error) {
	if opt.Require == LevelNone {
		opt.Require = LevelHost
	}
	switch {
	case opt.K < 1:
		return nil, fmt.Errorf("%w: %d replicas requested; need at least 1", ErrPlacement, opt.K)
	case opt.Policy != CrossDomain && opt.Policy != SameDomain:
		return nil, fmt.Errorf("%w: unknown policy %v", ErrPlacement, opt.Policy)
	case opt.Require < LevelHost || opt.Require > LevelRack:
		return nil, fmt.Errorf("%w: unknown failure domain %v", ErrPlacement, opt.Require)
	case l.TP < 1 || l.PP < 1 || l.DP < 1:
		return nil, fmt.Errorf("%w: layout %v", ErrPlacement, l)
	case len(assign) != l.World():
		return nil, fmt.Errorf("%w: %d assignments for %d ranks", ErrPlacement, len(assign), l.World())
	}
	hostOf := make([]int, len(assign))
	for r, a := range assign {
		if a.Rank != r || a.Host < 0 || a.Host >= len(hosts) {
			return nil, fmt.Errorf("%w: assignment %d is rank %d on host %d of %d", ErrPlacement, r, a.Rank, a.Host, len(hosts))
		}
		hostOf[r] = a.Host
	}
	d := newDomains(hosts)
	if opt.Require > d.widest() {
		return nil, fmt.Errorf("%w: %s separation required, but the hostfile names %s", ErrPlacement, opt.Require, labelsSummary(d))
	}
	n := l.World()
	p := &Placement{
		K: opt.K, Policy: opt.Policy, Require: opt.Require,
		Holders: make([][]int, n),
		Level:   make([]Level, n),
		Load:    make([]int, n),
	}
	flat := make([]int, n*opt.K)
	for r := range p.Holders {
		p.Holders[r] = flat[r*opt.K : (r+1)*opt.K : (r+1)*opt.K]
	}
	pl := placer{d: &d, hostOf: hostOf, p: p, k: opt.K}
	for gi, g := range l.DPGroups() {
		if err := pl.group(gi, g, opt); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func labelsSummary(d domains) string {
	return fmt.Sprintf("%s and %s", plural(d.racks, "rack"), plural(d.switches, "switch"))
}

// placer holds the state of one Place call.
type placer struct {
	d      *domains
	hostOf []int
	p      *Placement
	k      int
	picked []int // scratch: holders picked so far for one owner
}

// group places the holders of every member of one data-parallel group g
// (in ring order).
func (pl *placer) group(gi int, g []int, opt PlacementOptions) error {
	// What the group can reach at all: K holders need K other hosts; a
	// separation level needs K+1 distinct domains at that level.
	hostsIn := map[int]bool{}
	racks, sws := map[int32]bool{}, map[int32]bool{}
	unlabelledRack, unlabelledSw := false, false
	for _, r := range g {
		h := pl.hostOf[r]
		hostsIn[h] = true
		if v := pl.d.rack[h]; v >= 0 {
			racks[v] = true
		} else {
			unlabelledRack = true
		}
		if v := pl.d.sw[h]; v >= 0 {
			sws[v] = true
		} else {
			unlabelledSw = true
		}
	}
	if len(hostsIn) < pl.k+1 {
		return fmt.Errorf("%w: data-parallel group %d (ranks %s) spans %s; %d replicas on other hosts need %d", ErrPlacement, gi, rankList(g), plural(len(hostsIn), "host"), pl.k, pl.k+1)
	}
	reachable := LevelHost
	if len(sws) >= pl.k+1 && !unlabelledSw {
		reachable = LevelSwitch
	}
	if len(racks) >= pl.k+1 && !unlabelledRack {
		reachable = LevelRack
	}
	if opt.Require > reachable {
		return fmt.Errorf("%w: data-parallel group %d (ranks %s) cannot give every owner and its %d replicas distinct %ss: they span %s and %s", ErrPlacement, gi, rankList(g), pl.k, opt.Require, plural(len(racks), "labelled rack"), plural(len(sws), "labelled switch"))
	}
	// The tries, best first: a separation level, exactly or at least.
	type try struct {
		lv    Level
		exact bool
	}
	var tries []try
	switch opt.Policy {
	case CrossDomain:
		for lv := reachable; lv >= opt.Require; lv-- {
			tries = append(tries, try{lv, false})
		}
	case SameDomain:
		// Exactly the required separation (the closest peers), then
		// any peers at least that far apart.
		tries = []try{{opt.Require, true}, {opt.Require, false}}
	}
	var short []int
	var shortGot Level = LevelRack
	wanted := pl.d.widest()
	pools := make([]*tryPools, len(tries))
	for i, t := range tries {
		pools[i] = pl.buildPools(g, t.lv, t.exact)
	}
	for _, owner := range g {
		ok := false
		// Within the load cap first; then without it.
		for _, capped := range []bool{true, false} {
			for i := range tries {
				if ok = pl.pick(pools[i], owner, capped); ok {
					break
				}
			}
			if ok {
				break
			}
		}
		if !ok {
			// Every owner can reach the requirement in a group that
			// passed the checks above, unless the peers on other hosts
			// run out for this one (few hosts, many ranks per host).
			return fmt.Errorf("%w: rank %d of data-parallel group %d (ranks %s) finds no %d peers on distinct other hosts %s apart", ErrPlacement, owner, gi, rankList(g), pl.k, opt.Require)
		}
		copy(pl.p.Holders[owner], pl.picked)
		for _, h := range pl.picked {
			pl.p.Load[h]++
		}
		pl.p.Level[owner] = pl.achieved(owner)
		if opt.Policy == CrossDomain && pl.p.Level[owner] < wanted {
			short = append(short, owner)
			shortGot = min(shortGot, pl.p.Level[owner])
		}
	}
	if len(short) > 0 {
		why := fmt.Sprintf("the group spans %s and %s for %d copies", plural(len(racks), "labelled rack"), plural(len(sws), "labelled switch"), pl.k+1)
		if reachable >= wanted {
			why = "peers in other domains ran out of room"
		}
		pl.p.Shortfalls = append(pl.p.Shortfalls, Shortfall{Group: gi, Owners: short, Wanted: wanted, Got: shortGot, Why: why})
	}
	return nil
}

// achieved is the narrowest pairwise separation of owner and its holders.
func (pl *placer) achieved(owner int) Level {
	return pl.d.separation(owner, pl.p.Holders[owner], func(r int) int { return pl.hostOf[r] })
}

// separation is the narrowest pairwise level among the hosts of owner and
// holders (host of a rank given by hostOf).
func (d *domains) separation(owner int, holders []int, hostOf func(int) int) Level {
	hs := make([]int, 0, len(holders)+1)
	hs = append(hs, hostOf(owner))
	for _, h := range holders {
		hs = append(hs, hostOf(h))
	}
	lv := LevelRack
	for a := range hs {
		for b := a + 1; b < len(hs); b++ {
			lv = min(lv, d.level(hs[a], hs[b]))
		}
	}
	return lv
}

// Guarantee is the narrowest separation any owner got: every shard
// survives the loss of any K domains of that level.
func (p *Placement) Guarantee() Level {
	g := LevelRack
	for _, lv := range p.Level {
		g = min(g, lv)
	}
	return g
}

// Lost returns the ranks whose optimizer shard is gone when the hosts
// failed fail: the owner's host and every holder's host among them.
// assign maps ranks to hosts, as for Place (after a host was replaced,
// pass the new mapping).
func (p *Placement) Lost(assign []Assignment, failed []int) []int {
	down := map[int]bool{}
	for _, h := range failed {
		down[h] = true
	}
	var lost []int
	for r, hs := range p.Holders {
		if !down[assign[r].Host] {
			continue
		}
		all := true
		for _, h := range hs {
			if !down[assign[h].Host] {
				all = false
				break
			}
		}
		if all {
			lost = append(lost, r)
		}
	}
	return lost
}

// PLossBound is DEADPOOL's union bound (eq. 1) on the probability that
// some shard loses all its copies within one step: d shards, each with k
// replicas, independent failures of probability p per host and step:
// d·p^(k+1).
func PLossBound(d int, p float64, k int) float64 {
	return float64(d) * math.Pow(p, float64(k+1))
}

// rankList prints up to 8 ranks of g, then how many more.
func rankList(g []int) string {
	const show = 8
	var b strings.Builder
	for i, r := range g[:min(len(g), show)] {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, r)
	}
	if len(g) > show {
		fmt.Fprintf(&b, ",… (%d in all)", len(g))
	}
	return b.String()
}

// ChooseSpare picks the spare host to take over the ranks of host lost,
// among the hosts in spares (indices into hosts). assign is the mapping
// before the loss and p the placement in force. A spare qualifies when its
// slots hold the lost host's ranks (its MaxSlots, if oversubscribe). Among
// those it prefers the one that keeps every owner touched by the swap (the
// lost host's ranks, and the owners whose replicas it held) at the
// separation it had, then, for CrossDomain, the widest separation in all
// (a spare outside the failure domains of the lost ranks' replica
// holders), for SameDomain the narrowest (the closest links), then the
// first in spares. The choice is deterministic. The error wraps
// ErrPlacement when no spare qualifies.
func ChooseSpare(hosts []Host, assign []Assignment, p *Placement, lost int, spares []int, oversubscribe bool) (int, error) {
	if lost < 0 || lost >= len(hosts) {
		return -1, fmt.Errorf("%w: lost host %d out of range", ErrPlacement, lost)
	}
	if len(assign) != len(p.Holders) {
		return -1, fmt.Errorf("%w: %d assignments for a placement of %d ranks", ErrPlacement, len(assign), len(p.Holders))
	}
	d := newDomains(hosts)
	// The owners the swap touches.
	var onLost []int
	touched := map[int]bool{}
	for r, a := range assign {
		if a.Host < 0 || a.Host >= len(hosts) {
			return -1, fmt.Errorf("%w: rank %d on host %d of %d", ErrPlacement, r, a.Host, len(hosts))
		}
		if a.Host == lost {
			onLost = append(onLost, r)
			touched[r] = true
		}
	}
	if len(onLost) == 0 {
		return -1, fmt.Errorf("%w: host %s runs no rank", ErrPlacement, hosts[lost].Name)
	}
	for r, hs := range p.Holders {
		for _, h := range hs {
			if assign[h].Host == lost {
				touched[r] = true
			}
		}
	}
	owners := make([]int, 0, len(touched))
	for r := range touched {
		owners = append(owners, r)
	}
	slices.Sort(owners) // the score must not depend on map order

	best, bestKept, bestSum := -1, -1, 0
	var reasons []string
	for _, s := range spares {
		if s < 0 || s >= len(hosts) {
			return -1, fmt.Errorf("%w: spare %d out of range", ErrPlacement, s)
		}
		h := hosts[s]
		room := h.Slots
		if oversubscribe {
			room = h.MaxSlots
			if room == 0 {
				room = len(onLost)
			}
		}
		if s == lost || room < len(onLost) {
			reasons = append(reasons, fmt.Sprintf("%s has %s for %s", h.Name, plural(room, "slot"), plural(len(onLost), "rank")))
			continue
		}
		hostAfter := func(r int) int {
			if a := assign[r].Host; a != lost {
				return a
			}
			return s
		}
		kept, sum := 0, 0
		for _, o := range owners {
			lv := d.separation(o, p.Holders[o], hostAfter)
			if lv >= p.Level[o] && lv >= p.Require {
				kept++
			}
			sum += int(lv)
		}
		better := best < 0 || kept > bestKept
		if !better && kept == bestKept {
			if p.Policy == SameDomain {
				better = sum < bestSum
			} else {
				better = sum > bestSum
			}
		}
		if better {
			best, bestKept, bestSum = s, kept, sum
		}
	}
	if best < 0 {
		if len(spares) == 0 {
			return -1, fmt.Errorf("%w: no spare host left to replace %s", ErrPlacement, hosts[lost].Name)
		}
		return -1, fmt.Errorf("%w: no spare can take the %s of %s: %s", ErrPlacement, plural(len(onLost), "rank"), hosts[lost].Name, strings.Join(reasons, "; "))
	}
	return best, nil
}
