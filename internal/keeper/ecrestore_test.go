package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
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

// TestECRestoreEverySubset: for 2+1, 2+2, 4+2 and 8+4 (two ranks per
// host, unequal shards), every set of at most M lost hosts: each lost
// rank, restored on the spare that takes its host's place by its Source
// (its clear copy where one survives, else by decode), through real
// Hosts and links, gets every region of G bitwise; every set of M+1 lost
// hosts: the ranks whose stripe keeps fewer than K shards fail with
// ErrUnrecoverable (those are among the ranks topology.ECLoss names),
// never with wrong bytes, and the others restore bitwise.
//
// A lost host is one whose replication address the spares do not know:
// every read of it fails at once, as a dead host's link does. The other
// hosts keep the placement before the loss (what they serve does not
// depend on it: a member's slot, a clear copy, a complete parity row).
func TestECRestoreEverySubset(t *testing.T) {
	for _, km := range [][2]int{{2, 1}, {2, 2}, {4, 2}, {8, 4}} {
		t.Run(fmt.Sprintf("%d+%d", km[0], km[1]), func(t *testing.T) {
			k, m := km[0], km[1]
			if (testing.Short() || raceEnabled) && k == 8 {
				// The race run covers the same code with the smaller
				// codes; 8+4 takes over two minutes under it.
				t.Skip("-short or -race: 8+4's 1585 sets of lost hosts (the plain run tries them all)")
			}
			j := newECRecJob(t, k, m, 2, m+1)
			addrs := make([]string, len(j.c.hosts))
			for h, x := range j.c.hosts {
				addrs[h] = x.cfg.Listener.Addr().String()
			}
			spares := make([]int, m+1)
			for i := range spares {
				spares[i] = j.work + i
			}
			paramsFrom := func(lost []int) func(int) int {
				return func(int) int {
					for r, h := range j.hostOf {
						if !slices.Contains(lost, h) {
							return r
						}
					}
					return 0
				}
			}
			sets, decodes, fails := 0, 0, 0
			subsets(j.work, 1, m+1, func(lost []int) {
				if t.Failed() {
					return
				}
				sets++
				drainLinkFailures(j.c)
				sw := swapHosts(j.groups, j.hostOf, j.holders, lost, spares, paramsFrom(lost))
				gone := slices.Clone(addrs)
				for _, h := range lost {
					gone[h] = ""
				}
				for _, sp := range spares[:len(lost)] {
					j.c.hosts[sp].SetAddrs(gone)
					if err := j.c.hosts[sp].SetPlacement(sw.placement(sp, 1, j.g)); err != nil {
						t.Fatalf("lost %v: spare %d: %v", lost, sp, err)
					}
				}
				var ecLoss []int
				if len(lost) > m {
					ecLoss = topology.ECLoss(j.groups, lost)
				}
				res := make([]*protect.Restorable, len(j.hostOf))
				var wg sync.WaitGroup
				for _, r := range sw.lost {
					wg.Go(func() {
						h := j.c.hosts[sw.hostOf[r]]
						er := &ecRecRank{t: t, r: r, sess: h.Session(r)}
						_, ans, err := er.sess.Handle(context.Background(), protect.TypeProtectHello, helloJSON(ecRecRegions(r)))
						if err != nil || ans.(*protect.ProtectWelcome).Err != "" {
							res[r] = &protect.Restorable{Step: noStep, Err: fmt.Sprintf("ProtectHello: %+v, %v", ans, err)}
							return
						}
						res[r] = er.restore()
					})
				}
				wg.Wait()
				for _, r := range sw.lost {
					src := sw.sources[r]
					want := !src.Decode || decodable(j.groups[0], j.hostOf, j.holders, lost, r)
					if src.Decode {
						decodes++
					}
					got := res[r]
					switch {
					case want && (got.Err != "" || got.Step != j.g || got.Tier != 2):
						t.Errorf("lost %v: rank %d (source %+v): %+v", lost, r, src, got)
					case want:
						if err := j.checkRestored(j.c.hosts[sw.hostOf[r]], r, j.g); err != nil {
							t.Errorf("lost %v: rank %d (source %+v): %v", lost, r, src, err)
						}
					case got.Err == "" || !strings.Contains(got.Err, ErrUnrecoverable.Error()):
						t.Errorf("lost %v: rank %d, whose stripe keeps fewer than %d shards: %+v, want %v", lost, r, k, got, ErrUnrecoverable)
					default:
						fails++
						if !slices.Contains(ecLoss, r) {
							t.Errorf("lost %v: rank %d is unrecoverable, but not among the ranks topology.ECLoss names (%v)", lost, r, ecLoss)
						}
					}
					if len(lost) <= m && !want {
						t.Errorf("lost %v: rank %d is not recoverable from %d lost hosts of a %d+%d group", lost, r, len(lost), k, m)
					}
				}
				// The spares back to no rank: their services close, their
				// slot files go.
				for _, sp := range spares[:len(lost)] {
					p := Placement{HostOf: j.hostOf, Holders: j.holders, EC: j.groups, Epoch: 0, G: j.g}
					if err := j.c.hosts[sp].SetPlacement(p); err != nil {
						t.Fatalf("lost %v: spare %d back: %v", lost, sp, err)
					}
				}
				for _, sp := range spares[:len(lost)] {
					dropLinks(t, j.c.hosts[sp])
					emptyStores(j.c.hosts[sp])
				}
			})
			t.Logf("%d sets of lost hosts, %d ranks decoded, %d unrecoverable", sets, decodes, fails)
			if decodes == 0 || fails == 0 {
				t.Errorf("%d decodes and %d unrecoverable ranks: the test did not exercise both", decodes, fails)
			}
		})
	}
}

// TestECRestoreReencode: after two hosts of a 2+2 group (a data host and
// a parity host) are lost and replaced by spares, the lost ranks restored
// (some by decode) and every host in the new placement, the group has its
// full redundancy back before G may pass: every rank's Replicated reaches
// G only once the spare in the parity role holds a complete row of G of
// every stripe, bitwise the codec's parity of the members' shards; and a
// second loss of two other hosts (the other data and the other parity
// host: the only row left is the new one) still restores every lost rank
// bitwise.
func TestECRestoreReencode(t *testing.T) {
	const k, m = 2, 2
	j := newECRecJob(t, k, m, 2, 4)
	g0 := j.groups[0]
	type loss struct{ lost, spares []int }
	steps := []loss{
		{lost: []int{g0.Data[0], g0.Parity[0]}, spares: []int{4, 5}},
		{lost: []int{g0.Data[1], g0.Parity[1]}, spares: []int{6, 7}},
	}
	groups, hostOf, holders := j.groups, j.hostOf, j.holders
	var closed []int
	for n, l := range steps {
		sw := swapHosts(groups, hostOf, holders, l.lost, l.spares, func(r int) int {
			for p, h := range hostOf {
				if !slices.Contains(l.lost, h) {
					return p
				}
			}
			return 0
		})
		for _, h := range l.lost {
			if err := j.c.hosts[h].Close(); err != nil {
				t.Fatal(err)
			}
			closed = append(closed, h)
		}
		decoded := 0
		for r, src := range sw.sources {
			if src.Decode {
				decoded++
				if !decodable(groups[0], hostOf, holders, l.lost, r) {
					t.Fatalf("loss %d: rank %d is not decodable: the test's losses are wrong", n, r)
				}
			}
		}
		if decoded == 0 {
			t.Fatalf("loss %d of %v: no rank decodes", n, l.lost)
		}
		epoch := uint64(n + 1)
		for h, x := range j.c.hosts {
			if slices.Contains(closed, h) {
				continue
			}
			if err := x.SetPlacement(sw.placement(h, epoch, j.g)); err != nil {
				t.Fatalf("loss %d: host %d: %v", n, h, err)
			}
		}
		j.c.mu.Lock()
		copy(j.c.hostOf, sw.hostOf)
		j.c.mu.Unlock()
		var wg sync.WaitGroup
		res := map[int]*protect.Restorable{}
		var mu sync.Mutex
		for _, r := range sw.lost {
			er := j.connect(r)
			wg.Go(func() {
				got := er.restore()
				mu.Lock()
				res[r] = got
				mu.Unlock()
			})
		}
		wg.Wait()
		for _, r := range sw.lost {
			if got := res[r]; got.Err != "" || got.Step != j.g {
				t.Fatalf("loss %d: rank %d (source %+v): %+v", n, r, sw.sources[r], got)
			}
			if err := j.checkRestored(j.c.hosts[sw.hostOf[r]], r, j.g); err != nil {
				t.Fatalf("loss %d: %v", n, err)
			}
		}
		// Every rank's G counts the new placement's targets: the spares
		// in the data and parity roles.
		j.c.waitFor(fmt.Sprintf("G after loss %d replicated in the new placement", n), func() bool {
			for r := range sw.hostOf {
				if j.c.progress(r).Replicated < j.g {
					return false
				}
			}
			return true
		})
		// The spare that took parity row 0 or 1 holds a complete row of
		// G for every stripe: the codec's parity of the members' shards.
		g := sw.groups[0]
		for row, ph := range g.Parity {
			if !slices.Contains(l.spares, ph) {
				continue
			}
			for i := range len(g.DataGroups[0]) {
				members := stripeMembers(g, i)
				want := wantRecRow(t, k, m, members, j.g)[row]
				got := make([]byte, len(want))
				ms, err := j.c.hosts[ph].parity.read(0, i, row, j.g, 0, got)
				if err != nil {
					t.Fatalf("loss %d: spare %d's row %d of stripe %d at G: %v", n, ph, row, i, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("loss %d: spare %d's row %d of stripe %d at G differs from the codec's parity", n, ph, row, i)
				}
				for x, mb := range ms {
					if mb.rank != members[x] {
						t.Fatalf("loss %d: row %d of stripe %d: member %d is rank %d, want %d", n, row, i, x, mb.rank, members[x])
					}
				}
			}
		}
		groups, hostOf, holders = sw.groups, sw.hostOf, sw.holders
	}
}

// wantRecRow is the parity rows of the stripe whose members are ranks,
// at step, of ecRecJob's states.
func wantRecRow(t *testing.T, k, m int, members []int, step int64) [][]byte {
	t.Helper()
	shards := make([][]byte, len(members))
	for x, r := range members {
		for _, reg := range ecRecRegions(r) {
			if reg.Name != "params" {
				shards[x] = append(shards[x], ecRecState(r, step, reg)...)
			}
		}
	}
	return parityOf(t, k, m, shards)
}

// drainLinkFailures forgets the link failures c's hosts reported: links
// to the hosts a set lost, and those dropLinks closed, which fail when
// next used.
func drainLinkFailures(c *cluster) {
	for {
		select {
		case <-c.links:
		default:
			return
		}
	}
}

// dropLinks closes every replication link into host h and waits until
// their handlers have returned: a request a replicator sent before it
// stopped (the spares' restored ranks left them) may still be read and
// stored after h's stores are emptied, and serve a later set of losses a
// copy it should not have (the 8+4 sets failed so under -race).
func dropLinks(t *testing.T, h *Keeper) {
	t.Helper()
	h.store.mu.Lock()
	for c := range h.store.conns {
		c.Close()
	}
	h.store.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.store.mu.Lock()
		n := len(h.store.conns)
		h.store.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %d: %d replication links still served 10 s after they were closed", h.cfg.Host, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// emptyStores drops every copy and parity row host h holds, as a fresh
// spare's: the restored ranks' replicators sent it clear copies and
// shares of G, which it would keep (G does not pass them here) and serve
// to the next set of losses' decodes.
func emptyStores(h *Keeper) {
	h.store.mu.Lock()
	h.store.owners, h.store.bytes = map[int]*ownerReplica{}, 0
	h.store.mu.Unlock()
	h.parity.mu.Lock()
	h.parity.rows = map[ecRowKey]*parityRow{}
	h.parity.mu.Unlock()
}

// parityOf is the codec's parity rows of shards (padded with zeros to
// the longest).
func parityOf(t *testing.T, k, m int, shards [][]byte) [][]byte {
	t.Helper()
	codec, err := ckpt.NewCodec(k, m)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range shards {
		n = max(n, len(d))
	}
	rows := make([][]byte, m)
	shares := make([][]byte, m)
	for j := range rows {
		rows[j], shares[j] = make([]byte, n), make([]byte, n)
	}
	for x, d := range shards {
		p := make([]byte, n)
		copy(p, d)
		if err := codec.Share(p, x, shares); err != nil {
			t.Fatal(err)
		}
		for j := range rows {
			ckpt.Accumulate(rows[j], shares[j])
		}
	}
	return rows
}

// loseDataAndParity plans the loss of group 0's first data host and its
// parity host (a rank of that data host with no clear copy keeps one
// shard of its stripe's three), onto spares 3 and 4 of a 2+1 job, and
// gives the spares their placement (epoch 1, G).
func (j *ecRecJob) loseDataAndParity() ([]int, ecSwap) {
	t := j.t
	t.Helper()
	g0 := j.groups[0]
	lost := []int{g0.Data[0], g0.Parity[0]}
	spares := []int{3, 4}
	keep := slices.Index(j.hostOf, g0.Data[1])
	sw := swapHosts(j.groups, j.hostOf, j.holders, lost, spares, func(int) int { return keep })
	addrs := make([]string, len(j.c.hosts))
	for h, x := range j.c.hosts {
		if !slices.Contains(lost, h) {
			addrs[h] = x.cfg.Listener.Addr().String()
		}
	}
	for _, sp := range spares {
		j.c.hosts[sp].SetAddrs(addrs)
		if err := j.c.hosts[sp].SetPlacement(sw.placement(sp, 1, j.g)); err != nil {
			t.Fatal(err)
		}
	}
	j.c.mu.Lock()
	copy(j.c.hostOf, sw.hostOf)
	j.c.mu.Unlock()
	return lost, sw
}

// TestECRestoreUnrecoverable: a rank restoring by decode whose stripe
// keeps fewer than K shards gets an error wrapping ErrUnrecoverable from
// restoreRemote, and no slot of G is committed; a lost rank of the same
// job whose clear copy survives restores from it (the ordinary get).
func TestECRestoreUnrecoverable(t *testing.T) {
	j := newECRecJob(t, 2, 1, 2, 2)
	lost, sw := j.loseDataAndParity()
	g0 := j.groups[0]
	decoded, direct := 0, 0
	for _, r := range sw.lost {
		src := sw.sources[r]
		j.connect(r)
		h := j.c.hosts[sw.hostOf[r]]
		s := h.svc(r)
		s.reqMu.Lock()
		_, err := s.restoreRemote(context.Background(), j.g)
		s.reqMu.Unlock()
		if !src.Decode {
			direct++
			if err != nil {
				t.Errorf("rank %d from its clear copy: %v", r, err)
			} else if err := j.checkRestored(h, r, j.g); err != nil {
				t.Error(err)
			}
			continue
		}
		decoded++
		if decodable(g0, j.hostOf, j.holders, lost, r) {
			t.Fatalf("rank %d is decodable: the test's losses are wrong", r)
		}
		if !errors.Is(err, ErrUnrecoverable) {
			t.Errorf("rank %d by decode with one shard of its stripe left: %v, want %v", r, err, ErrUnrecoverable)
		}
		s.mu.Lock()
		_, err = s.slots.At(uint64(j.g))
		s.mu.Unlock()
		if err == nil {
			t.Errorf("rank %d: a slot of G committed after a failed decode", r)
		}
	}
	if decoded == 0 || direct == 0 {
		t.Fatalf("%d ranks decode, %d restore from a clear copy: want both", decoded, direct)
	}
}

// TestECRestoreRowGenerationMoves: a parity row's generation moves on
// when a member of a newer generation confirms its share of G (ecHas, as
// every member's replicator does after a restart), so the rows of one
// stripe may name their members with different generations, even while
// a decode reads them; G's bytes are the same, and the decode that needs
// both rows (both data hosts of a 2+2 group lost) still restores every
// lost rank bitwise.
func TestECRestoreRowGenerationMoves(t *testing.T) {
	const k, m = 2, 2
	j := newECRecJob(t, k, m, 2, 2)
	g0 := j.groups[0]
	ph := g0.Parity[0]
	holder := slices.Index(j.hostOf, ph)
	for i := range len(g0.DataGroups[0]) {
		ms, err := j.c.hosts[ph].parity.read(0, i, 0, j.g, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		for x, mb := range ms {
			h := linkHdr{kind: kindECHas, owner: mb.rank, holder: holder, step: j.g, gen: mb.gen + 1}
			e := ecHdr{group: 0, stripe: i, row: 0, member: x, n: mb.length, epoch: mb.epoch + 1}
			if err := j.c.hosts[g0.Parity[1]].links.ecAcked(context.Background(), ph, h, mb.table, e, nil); err != nil {
				t.Fatalf("stripe %d member %d: ecHas of a newer generation: %v", i, x, err)
			}
		}
		after, err := j.c.hosts[ph].parity.read(0, i, 0, j.g, 0, nil)
		if err != nil || after[0].gen != ms[0].gen+1 {
			t.Fatalf("stripe %d: row 0's members after the ecHas: %+v, %v; want generation %d", i, after, err, ms[0].gen+1)
		}
	}
	lost := g0.Data
	spares := []int{4, 5}
	sw := swapHosts(j.groups, j.hostOf, j.holders, lost, spares, func(int) int { return slices.Index(j.hostOf, g0.Parity[1]) })
	addrs := make([]string, len(j.c.hosts))
	for h, x := range j.c.hosts {
		if !slices.Contains(lost, h) {
			addrs[h] = x.cfg.Listener.Addr().String()
		}
	}
	for _, sp := range spares {
		j.c.hosts[sp].SetAddrs(addrs)
		if err := j.c.hosts[sp].SetPlacement(sw.placement(sp, 1, j.g)); err != nil {
			t.Fatal(err)
		}
	}
	j.c.mu.Lock()
	copy(j.c.hostOf, sw.hostOf)
	j.c.mu.Unlock()
	decoded := 0
	for _, r := range sw.lost {
		if sw.sources[r].Decode {
			decoded++
		}
		got := j.connect(r).restore()
		if got.Err != "" || got.Step != j.g {
			t.Fatalf("rank %d (source %+v): %+v", r, sw.sources[r], got)
		}
		if err := j.checkRestored(j.c.hosts[sw.hostOf[r]], r, j.g); err != nil {
			t.Fatal(err)
		}
	}
	if decoded == 0 {
		t.Fatal("no rank decodes")
	}
}
