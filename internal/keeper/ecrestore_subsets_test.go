package keeper

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

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
