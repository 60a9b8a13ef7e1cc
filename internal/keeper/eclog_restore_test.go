package keeper

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// ecDiffRecJob is a job in diff mode under erasure coding on in-process
// hosts, for recovery tests: one group of K+M working hosts of two ranks
// each (diffRank trainers, rank r on host r/2), then spare hosts with no
// rank; the log-only holders of topology.ECLogHolders; and a publisher of
// G and H as the launcher computes them (min Replicated, min Base).
type ecDiffRecJob struct {
	t       *testing.T
	c       *cluster
	k, m    int
	work    int // hosts with ranks: 0..work-1; the spares follow
	groups  []topology.ECGroup
	hostOf  []int
	holders [][]int
	logs    [][]int
	rs      []*diffRank

	mu      sync.Mutex
	g, hb   int64 // as published
	freezeH bool  // H is not raised any more
}

const ecDiffPer = 2

func newECDiffRecJob(t *testing.T, k, m, baseEvery, spares int) *ecDiffRecJob {
	t.Helper()
	return newECDiffRecJobWith(t, k, m, baseEvery, spares, nil)
}

// newECDiffRecJobWith is newECDiffRecJob with more configuration (mod,
// if not nil, applied last).
func newECDiffRecJobWith(t *testing.T, k, m, baseEvery, spares int, more func(*Config)) *ecDiffRecJob {
	t.Helper()
	n := k + m
	hosts := make([]topology.Host, n)
	var assign []topology.Assignment
	ranks := make([][]int, n+spares)
	var hostOf []int
	for h := range n {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: ecDiffPer}
		for l := range ecDiffPer {
			r := h*ecDiffPer + l
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
	world := n * ecDiffPer
	all := make([]int, world)
	for r := range all {
		all[r] = r
	}
	j := &ecDiffRecJob{t: t, k: k, m: m, work: n, groups: groups, hostOf: hostOf, holders: holders, g: noStep, hb: noStep}
	j.logs = topology.ECLogHolders(groups, hostOf, ranks[:n])
	mod := diffMod(8, baseEvery)
	j.c = newClusterWith(t, ranks, holders, func(int) []int { return all }, func(cfg *Config) {
		mod(cfg)
		cfg.EC = groups
		if more != nil {
			more(cfg)
		}
	})
	for h := range n {
		p := Placement{Ranks: ranks[h], HostOf: hostOf, Holders: holders, EC: groups, Epoch: 1, G: noStep, Logs: j.logs, H: noStep}
		if err := j.c.hosts[h].SetPlacement(p); err != nil {
			t.Fatalf("host %d: %v", h, err)
		}
	}
	for r := range world {
		dr, err := newDiffRank(t, j.c.hosts[hostOf[r]], r, 11, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dr.close)
		if _, err := dr.restore(context.Background()); err != nil {
			t.Fatal(err)
		}
		j.rs = append(j.rs, dr)
	}
	return j
}

// publish computes G and H as the launcher does and tells the working
// hosts and the spares (H stays where it is once freezeH is set).
func (j *ecDiffRecJob) publish() {
	g, hb := int64(protect.MaxStep), int64(protect.MaxStep)
	for r := range j.hostOf {
		p := j.c.progress(r)
		g, hb = min(g, p.Replicated), min(hb, p.Base)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.freezeH {
		hb = j.hb
	}
	for _, h := range j.c.hosts {
		h.SetG(h.Gen(), g)
		h.SetH(h.Gen(), hb)
	}
	j.g, j.hb = max(j.g, g), max(j.hb, hb)
}

// run has every rank commit steps from to to, publishing G and H as it
// goes, until G = to.
func (j *ecDiffRecJob) run(from, to int64) {
	j.t.Helper()
	j.runUntil(from, to, fmt.Sprintf("G = %d", to), func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.g >= to
	})
}

// runUntil has every rank commit steps from to to, publishing G and H as
// it goes, until done (then the ranks stop, maybe mid-step).
func (j *ecDiffRecJob) runUntil(from, to int64, what string, done func() bool) {
	j.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-tick.C:
				j.publish()
			}
		}
	})
	for _, dr := range j.rs {
		wg.Go(func() {
			for s := from; s <= to && ctx.Err() == nil; s++ {
				if err := dr.step(ctx, s); err != nil {
					if ctx.Err() == nil {
						j.t.Errorf("rank %d: %v", dr.r, err)
						cancel()
					}
					return
				}
			}
		})
	}
	j.c.waitFor(what, func() bool { return j.t.Failed() || done() })
	cancel()
	wg.Wait()
	j.publish()
}

// published returns G and H as published.
func (j *ecDiffRecJob) published() (int64, int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.g, j.hb
}

// waitH publishes G and H (publish) until H reaches hb or later.
func (j *ecDiffRecJob) waitH(hb int64) {
	j.t.Helper()
	j.c.waitFor(fmt.Sprintf("H %d or later", hb), func() bool {
		j.publish()
		_, h := j.published()
		return h >= hb
	})
}

// recoverable reports whether rank r, its host among lost, can be
// restored: from its clear copy, when it has one on a host not lost; else
// by decode at H and replay: K of its stripe's shards at H (member y's is
// on y's data host, Data[x]: in its clear copy's store, or its owner's
// retained snapshot when it runs there; and in y's own slot while H is
// one of the two newest steps y committed) and parity rows (on
// Parity[j]) survive, and a copy of its log (H, G] on a log-only holder
// does (none is needed at H = G).
func (j *ecDiffRecJob) recoverable(lost []int, r int) bool {
	gone := func(h int) bool { return slices.Contains(lost, h) }
	if hs := j.holders[r]; len(hs) > 0 && !gone(j.hostOf[hs[0]]) {
		return true
	}
	g := j.groups[0]
	var x, i int
	for xi, dg := range g.DataGroups {
		if ii := slices.Index(dg, r); ii >= 0 {
			x, i = xi, ii
		}
	}
	j.mu.Lock()
	atG := j.hb == j.g
	hb := j.hb
	j.mu.Unlock()
	// A member's own slots hold its two newest committed steps: its
	// shard at H too when H is one of them.
	inSlot := func(y int) bool {
		dr := j.rs[y]
		dr.mu.Lock()
		defer dr.mu.Unlock()
		var newest, next int64 = noStep, noStep
		for s := range dr.states {
			switch {
			case s > newest:
				newest, next = s, newest
			case s > next:
				next = s
			}
		}
		return hb == newest || hb == next
	}
	n := 0
	for xi, dg := range g.DataGroups {
		if xi != x && i < len(dg) && (!gone(g.Data[xi]) || !gone(j.hostOf[dg[i]]) && inSlot(dg[i])) {
			n++
		}
	}
	for _, h := range g.Parity {
		if !gone(h) {
			n++
		}
	}
	logged := atG
	for _, lr := range j.logs[r] {
		logged = logged || !gone(j.hostOf[lr])
	}
	return n >= j.k && logged
}

// TestECDiffRestoreEverySubset: diff mode under 2+1, 2+2 and 4+2 (and
// 8+4 in the plain run), two ranks per host, the lossless codec, bases
// every 1, 3 and 8 steps: at a G past H, for every set of at most M lost
// hosts, each lost rank, restored on the spare that takes its host's
// place by its Source (its clear copy at G where one survives, else by
// decode at H and the replay of its log (H, G]), through real Hosts and
// links, gets its replicated regions of G bitwise; for every set of M+1,
// each lost rank either restores bitwise or fails with ErrUnrecoverable,
// never with other bytes, and fails exactly when no clear copy survives
// and its stripe keeps fewer than K shards at H or no copy of its log
// survives. Then, with H held back while the ranks go on (the bases after
// it coded and their refreshes verified and waiting in the clear copies'
// stores, not installed), the same at the older H.
//
// A lost host is one whose replication address the spares do not know:
// every read of it fails at once, as a dead host's link does. The other
// hosts keep the placement before the loss.
func TestECDiffRestoreEverySubset(t *testing.T) {
	for _, km := range [][2]int{{2, 1}, {2, 2}, {4, 2}, {8, 4}} {
		for _, every := range []int{1, 3, 8} {
			t.Run(fmt.Sprintf("%d+%d/B=%d", km[0], km[1], every), func(t *testing.T) {
				k, m := km[0], km[1]
				if k == 8 && (testing.Short() || raceEnabled || every != 8) {
					// 1,585 sets of lost hosts take about 30 s a phase
					// in the plain run: one B, one phase.
					t.Skip("8+4: the plain run tries B = 8 only, and not under -short or -race")
				}
				j := newECDiffRecJob(t, k, m, every, m+1)
				end := int64(3*every + 5)
				j.run(0, end)
				g, hb := j.published()
				if hb < 0 || hb > g {
					t.Fatalf("G %d, H %d after step %d", g, hb, end)
				}
				t.Logf("G %d, H %d", g, hb)
				j.everySubset(g, hb)
				if t.Failed() {
					return
				}
				if every < 2 || k == 8 {
					return // σ = 0: no base is coded ahead of H; 8+4: one phase
				}
				// H held back: the ranks go on until every rank's next
				// base after H is coded (its refresh verified in the clear
				// copies' stores, waiting for H) and G passes it.
				j.mu.Lock()
				j.freezeH = true
				j.mu.Unlock()
				next := hb + int64(every)
				j.runUntil(end+1, next+int64(4*every), fmt.Sprintf("every Base >= %d and G > %d", next, next), func() bool {
					for r := range j.hostOf {
						if j.c.progress(r).Base < next {
							return false
						}
					}
					g, _ := j.published()
					return g > next
				})
				g2, hb2 := j.published()
				if hb2 != hb || g2 <= next {
					t.Fatalf("with H held back: G %d, H %d; want G past %d, H %d", g2, hb2, next, hb)
				}
				t.Logf("H held back: G %d, H %d", g2, hb2)
				j.everySubset(g2, hb2)
			})
		}
	}
}

// everySubset fails every set of at most M+1 working hosts at G g and H
// hb and checks the lost ranks' restores (TestECDiffRestoreEverySubset).
func (j *ecDiffRecJob) everySubset(g, hb int64) {
	t := j.t
	k, m := j.k, j.m
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
		// The restored ranks get no clear copy's holder and no log-only
		// holder: their replicators would anchor the surviving logs at G
		// and install a base of G in the surviving clear copies (the
		// rebase after a recovery), which the next sets of losses, at H,
		// must not see. Their restore does not use them (it reads its
		// Source, its stripe's other members' copies, and the logs on the
		// hosts of its group).
		for _, r := range sw.lost {
			sw.holders[r] = nil
		}
		gone := slices.Clone(addrs)
		for _, h := range lost {
			gone[h] = ""
		}
		for _, sp := range spares[:len(lost)] {
			j.c.hosts[sp].SetAddrs(gone)
			p := sw.placement(sp, 2, g)
			p.H = hb
			if err := j.c.hosts[sp].SetPlacement(p); err != nil {
				t.Fatalf("lost %v: spare %d: %v", lost, sp, err)
			}
		}
		res := make([]*protect.Restorable, len(j.hostOf))
		errs := make([]error, len(j.hostOf))
		var wg sync.WaitGroup
		for _, r := range sw.lost {
			wg.Go(func() {
				dr, err := newDiffRank(t, j.c.hosts[sw.hostOf[r]], r, 11, j.rs[r].committedStates())
				if err != nil {
					res[r], errs[r] = &protect.Restorable{Step: noStep, Err: err.Error()}, err
					return
				}
				defer dr.close()
				// restore checks the bytes against the committed state:
				// an error that is not the service's is other bytes.
				res[r], errs[r] = dr.restore(context.Background())
			})
		}
		wg.Wait()
		for _, r := range sw.lost {
			src := sw.sources[r]
			want := j.recoverable(lost, r)
			if src.Decode {
				decodes++
			}
			got := res[r]
			switch {
			case got != nil && got.Err == "" && errs[r] != nil:
				t.Errorf("lost %v: rank %d (source %+v): other bytes: %v", lost, r, src, errs[r])
			case want && (got.Err != "" || got.Step != g || got.Tier != 2):
				t.Errorf("lost %v: rank %d (source %+v): %+v", lost, r, src, got)
			case want:
			case got.Err == "" || !strings.Contains(got.Err, ErrUnrecoverable.Error()):
				t.Errorf("lost %v: rank %d, with no clear copy and fewer than %d shards at H or no log left: %+v, want %v", lost, r, k, got, ErrUnrecoverable)
			default:
				fails++
			}
			if len(lost) <= m && !want {
				t.Errorf("lost %v: rank %d is not recoverable from %d lost hosts of a %d+%d group (the model)", lost, r, len(lost), k, m)
			}
		}
		// The spares back to no rank: their services close, their slot
		// files go. Nothing is held for anyone there (a closing
		// replicator would otherwise send to the holders it names).
		for _, sp := range spares[:len(lost)] {
			p := Placement{HostOf: j.hostOf, EC: j.groups, Epoch: 1, G: g, H: hb}
			if err := j.c.hosts[sp].SetPlacement(p); err != nil {
				t.Fatalf("lost %v: spare %d back: %v", lost, sp, err)
			}
		}
		for _, sp := range spares[:len(lost)] {
			dropLinks(t, j.c.hosts[sp])
			emptyStores(j.c.hosts[sp])
		}
	})
	t.Logf("G %d, H %d: %d sets of lost hosts, %d ranks decoded, %d unrecoverable", g, hb, sets, decodes, fails)
	if decodes == 0 || fails == 0 {
		t.Errorf("%d decodes and %d unrecoverable ranks: the test did not exercise both", decodes, fails)
	}
}
