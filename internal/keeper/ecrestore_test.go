package keeper

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// ecRecJob is a job protected with erasure coding on in-process hosts,
// for recovery tests: one group of K+M working hosts of per ranks each
// (rank r on host r/per), then spare hosts with no rank. Every rank is
// data-parallel with every other (params are the same everywhere, and
// restore from any rank), and has its own sizes of optimizer and meta
// (unequal shards).
type ecRecJob struct {
	t       *testing.T
	c       *cluster
	k, m    int
	per     int
	work    int // hosts with ranks: 0..work-1; the spares follow
	groups  []topology.ECGroup
	hostOf  []int
	holders [][]int
	g       int64        // the step every rank committed last, and G
	ranks   []*ecRecRank // the ranks' sessions of the job's start
}

func ecRecRegions(r int) []protect.Region {
	return []protect.Region{{Name: "optimizer", Size: int64(2000 + 613*r)}, {Name: "params", Size: 160}, {Name: "meta", Size: int64(24 + 5*r)}}
}

// ecRecState is rank r's bytes of reg at step: params the same on every
// rank.
func ecRecState(r int, step int64, reg protect.Region) []byte {
	b := make([]byte, reg.Size)
	for j := range b {
		if reg.Name == "params" {
			b[j] = byte(step*5 + int64(j))
		} else {
			b[j] = byte(int64(r)*131 + step*17 + int64(j)*3 + int64(len(reg.Name))*29)
		}
	}
	return b
}

// ecClearHolders returns each rank's clear-copy holders under groups with
// ranks on hostOf: the lowest rank on its data group's data host, none
// when it runs there.
func ecClearHolders(groups []topology.ECGroup, hostOf []int) [][]int {
	holders := make([][]int, len(hostOf))
	for _, g := range groups {
		for x, dg := range g.DataGroups {
			dh := g.Data[x]
			lowest := slices.Index(hostOf, dh)
			for _, r := range dg {
				if hostOf[r] != dh {
					holders[r] = []int{lowest}
				}
			}
		}
	}
	return holders
}

// newECRecJob plans one group of k+m hosts of per ranks, adds spares
// spare hosts, and has every rank commit steps 0 to 2; G is 2.
func newECRecJob(t *testing.T, k, m, per, spares int) *ecRecJob {
	t.Helper()
	n := k + m
	hosts := make([]topology.Host, n)
	var assign []topology.Assignment
	ranks := make([][]int, n+spares)
	var hostOf []int
	for h := range n {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: per}
		for l := range per {
			r := h*per + l
			assign = append(assign, topology.Assignment{Rank: r, Host: h, LocalRank: l})
			ranks[h] = append(ranks[h], r)
			hostOf = append(hostOf, h)
		}
	}
	groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: k, M: m})
	if err != nil {
		t.Fatal(err)
	}
	holders := ecClearHolders(groups, hostOf)
	world := n * per
	all := make([]int, world)
	for r := range all {
		all[r] = r
	}
	j := &ecRecJob{t: t, k: k, m: m, per: per, work: n, groups: groups, hostOf: hostOf, holders: holders}
	j.c = newClusterWith(t, ranks, holders, func(int) []int { return all }, func(cfg *Config) { cfg.EC = groups })
	var rs []*ecRecRank
	for r := range world {
		rs = append(rs, j.connect(r))
	}
	for s := range int64(3) {
		for _, er := range rs {
			er.protect(s)
		}
		j.c.waitFor(fmt.Sprintf("step %d replicated", s), func() bool {
			for r := range world {
				if j.c.progress(r).Replicated < s {
					return false
				}
			}
			return true
		})
		if g := j.c.publishG(); g != s {
			t.Fatalf("G = %d after step %d", g, s)
		}
	}
	j.g = 2
	j.ranks = rs
	return j
}

// ecRecRank is a rank speaking to its service through a Session, with
// its slots mapped.
type ecRecRank struct {
	t     *testing.T
	r     int
	sess  *Session
	views [2][][]byte
}

// connect says ProtectHello for rank r on its current host.
func (j *ecRecJob) connect(r int) *ecRecRank {
	j.t.Helper()
	j.c.mu.Lock()
	h := j.c.hosts[j.c.hostOf[r]]
	j.c.mu.Unlock()
	er := &ecRecRank{t: j.t, r: r, sess: h.Session(r)}
	if er.sess == nil {
		j.t.Fatalf("rank %d is not on host %d", r, h.cfg.Host)
	}
	er.views = protectHello(j.t, er.sess, r, ecRecRegions(r))
	return er
}

func (er *ecRecRank) protect(step int64) {
	er.t.Helper()
	req := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err := er.sess.Handle(context.Background(), protect.TypeStage, req)
	if err != nil || ans.(*protect.Staged).Err != "" {
		er.t.Fatalf("rank %d: Stage(%d): %+v, %v", er.r, step, ans, err)
	}
	slot := ans.(*protect.Staged).Slot
	for i, reg := range ecRecRegions(er.r) {
		copy(er.views[slot][i], ecRecState(er.r, step, reg))
	}
	_, ans, err = er.sess.Handle(context.Background(), protect.TypeCommit, req)
	if err != nil || ans.(*protect.Committed).Err != "" {
		er.t.Fatalf("rank %d: Commit(%d): %+v, %v", er.r, step, ans, err)
	}
}

// restore asks rank er's service to Restore.
func (er *ecRecRank) restore() *protect.Restorable {
	_, ans, err := er.sess.Handle(context.Background(), protect.TypeRestore, []byte(`{}`))
	if err != nil {
		return &protect.Restorable{Step: noStep, Err: err.Error()}
	}
	return ans.(*protect.Restorable)
}

// ecSwap is the placement after a hot swap of lost hosts onto spares
// (spare[i] takes lost[i]'s place, ranks and roles), and how each lost
// rank restores: from its clear copy where its data host survives and it
// did not run there, else by decode.
type ecSwap struct {
	groups  []topology.ECGroup
	hostOf  []int
	holders [][]int
	sources map[int]Source
	lost    []int // the lost ranks, ascending
}

// swap plans the replacement of lost (hosts of before) by spares, from
// the placement before (groups, hostOf, holders).
func swapHosts(groups []topology.ECGroup, hostOf []int, holders [][]int, lost, spares []int, paramsFrom func(r int) int) ecSwap {
	sw := ecSwap{hostOf: slices.Clone(hostOf), sources: map[int]Source{}}
	for _, g := range groups {
		for i, h := range lost {
			g = g.Replace(h, spares[i])
		}
		sw.groups = append(sw.groups, g)
	}
	for r, h := range hostOf {
		if i := slices.Index(lost, h); i >= 0 {
			sw.hostOf[r] = spares[i]
			sw.lost = append(sw.lost, r)
		}
	}
	sw.holders = ecClearHolders(sw.groups, sw.hostOf)
	for _, r := range sw.lost {
		src := Source{Params: paramsFrom(r), Decode: true}
		if hs := holders[r]; len(hs) > 0 && !slices.Contains(lost, hostOf[hs[0]]) {
			src.Opt, src.Decode = hs[0], false
		} else {
			src.Opt = r
		}
		sw.sources[r] = src
	}
	return sw
}

// placement returns host h's Placement of sw (epoch, resuming from g).
func (sw ecSwap) placement(h int, epoch uint64, g int64) Placement {
	var mine []int
	for r, x := range sw.hostOf {
		if x == h {
			mine = append(mine, r)
		}
	}
	return Placement{Ranks: mine, HostOf: sw.hostOf, Holders: sw.holders, Sources: sw.sources, EC: sw.groups, Epoch: epoch, G: g}
}

// decodable reports whether lost rank r (restoring by decode) has at
// least K shards of its stripe left when the hosts lost are gone: its
// stripe's other members whose host survives or whose clear copy does,
// and the rows whose parity host survives. The model of decodeRemote's
// sources.
func decodable(g topology.ECGroup, hostOf []int, holders [][]int, lost []int, r int) bool {
	k := len(g.DataGroups)
	var x, i int
	for xi, dg := range g.DataGroups {
		if ii := slices.Index(dg, r); ii >= 0 {
			x, i = xi, ii
		}
	}
	n := 0
	for xi, dg := range g.DataGroups {
		m := dg[i]
		if xi == x {
			continue
		}
		if !slices.Contains(lost, hostOf[m]) || len(holders[m]) > 0 && !slices.Contains(lost, hostOf[holders[m][0]]) {
			n++
		}
	}
	for _, h := range g.Parity {
		if !slices.Contains(lost, h) {
			n++
		}
	}
	return n >= k
}

// checkRestored checks that rank r's slot of step on its host holds its
// state bitwise (every region, params too).
func (j *ecRecJob) checkRestored(h *Keeper, r int, step int64) error {
	s := h.svc(r)
	if s == nil {
		return fmt.Errorf("rank %d is not on host %d", r, h.cfg.Host)
	}
	var names []string
	for _, reg := range ecRecRegions(r) {
		names = append(names, reg.Name)
	}
	return s.readSlot(step, names, func(t []tableEntry, data [][]byte) error {
		for i, reg := range ecRecRegions(r) {
			if !bytes.Equal(data[i], ecRecState(r, step, reg)) {
				return fmt.Errorf("rank %d region %s at step %d: other bytes", r, reg.Name, step)
			}
		}
		return nil
	})
}
