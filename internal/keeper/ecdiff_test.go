package keeper

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// ecDiffJob is a job in diff mode under erasure coding on in-process
// hosts, per ranks per host (ecTestJob's), with log-only holders
// (topology.ECLogHolders), diffRank trainers, and a publisher of G and H
// as the launcher computes them (min Replicated, min Base).
type ecDiffJob struct {
	t    *testing.T
	j    *ecTestJob
	logs [][]int
	rs   []*diffRank
	// skipH: hosts the publisher does not tell H (a host that learns it
	// late).
	skipH map[int]bool

	mu    sync.Mutex // held while G and H are published, and by checks
	g, hb int64
	// check, if set, is called with every G and H stoppable publishes,
	// dj.mu held.
	check func(g, hb int64)
}

func newECDiffJob(t *testing.T, k, m, per, every int, skipH map[int]bool) *ecDiffJob {
	t.Helper()
	j := newECJobWith(t, k, m, per, false, diffMod(8, every))
	n := k + m
	hostOf := slices.Clone(j.c.hostOf)
	hostRanks := make([][]int, n)
	for r, h := range hostOf {
		hostRanks[h] = append(hostRanks[h], r)
	}
	logs := topology.ECLogHolders(j.groups, hostOf, hostRanks)
	for h := range n {
		p := Placement{Ranks: hostRanks[h], HostOf: hostOf, Holders: j.holders, EC: j.groups, Epoch: 1, G: noStep, Logs: logs, H: noStep}
		if err := j.c.hosts[h].SetPlacement(p); err != nil {
			t.Fatal(err)
		}
	}
	dj := &ecDiffJob{t: t, j: j, logs: logs, skipH: skipH, g: noStep, hb: noStep}
	for r := range n * per {
		dr, err := newDiffRank(t, j.c.hosts[r/per], r, 7, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dr.close)
		if _, err := dr.restore(context.Background()); err != nil {
			t.Fatal(err)
		}
		dj.rs = append(dj.rs, dr)
	}
	return dj
}

// publish computes G and H as the launcher does and tells the hosts.
func (dj *ecDiffJob) publish() {
	g, hb := int64(protect.MaxStep), int64(protect.MaxStep)
	for r := range dj.j.c.hostOf {
		p := dj.j.c.progress(r)
		g, hb = min(g, p.Replicated), min(hb, p.Base)
	}
	dj.mu.Lock()
	defer dj.mu.Unlock()
	if hb > g {
		dj.t.Errorf("H %d > G %d", hb, g)
	}
	for i, h := range dj.j.c.hosts {
		h.SetG(h.Gen(), g)
		if !dj.skipH[i] {
			h.SetH(h.Gen(), hb)
		}
	}
	dj.g, dj.hb = max(dj.g, g), max(dj.hb, hb)
}

// publishing publishes G and H until the test ends.
func (dj *ecDiffJob) publishing(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				dj.publish()
			}
		}
	})
	dj.t.Cleanup(wg.Wait)
}

// stoppable starts a publisher like ecDiffJob.publishing, but one the
// test can stop (stop waits for it). tell, if set, gives the H host i is
// told (else the published H).
func (dj *ecDiffJob) stoppable(tell func(i int, hb int64) int64) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			g, hb := int64(protect.MaxStep), int64(protect.MaxStep)
			for r := range dj.j.c.hostOf {
				p := dj.j.c.progress(r)
				g, hb = min(g, p.Replicated), min(hb, p.Base)
			}
			dj.mu.Lock()
			for i, h := range dj.j.c.hosts {
				h.SetG(h.Gen(), g)
				x := hb
				if tell != nil {
					x = tell(i, hb)
				}
				h.SetH(h.Gen(), x)
			}
			dj.g, dj.hb = max(dj.g, g), max(dj.hb, hb)
			if dj.check != nil {
				dj.check(g, hb)
			}
			dj.mu.Unlock()
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	dj.t.Cleanup(stop)
	return stop
}

// step runs step s on every rank side by side.
func (dj *ecDiffJob) step(ctx context.Context, s int64) {
	dj.t.Helper()
	errs := make([]error, len(dj.rs))
	var wg sync.WaitGroup
	for i, dr := range dj.rs {
		wg.Go(func() { errs[i] = dr.step(ctx, s) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			dj.t.Fatalf("rank %d step %d: %v", i, s, err)
		}
	}
}

// copyOf returns what host h keeps of owner, or nil.
func copyOf(h *Keeper, owner int) *ownerReplica {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	return h.store.owners[owner]
}

// baseAt reports whether host h holds owner's shard at exactly step:
// its clear store's base (diffstore.Store.ReadBase), or, for an owner
// that runs on h, its retained snapshot.
func baseAt(h *Keeper, owner int, step int64) bool {
	if s := h.svc(owner); s != nil {
		ok, err := s.retainedBase(step, func([]tableEntry, [][]byte) error { return nil })
		if ok && err == nil {
			return true
		}
	}
	o := copyOf(h, owner)
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var b [1]byte
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds != nil && ds.ReadBase(step, 0, b[:]) == nil {
			return true
		}
	}
	return false
}

// recordsAt reports whether host h keeps owner's differentials (from,
// to] (a clear store that holds both steps, or a log), as holder rank.
func recordsAt(h *Keeper, owner int, from, to int64) bool {
	o := copyOf(h, owner)
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.log != nil && o.log.Holds(from, to) {
		return true
	}
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds != nil && ds.Held(from) && ds.Held(to) {
			return true
		}
	}
	return false
}

// checkRecoverable checks, with G and H as published (dj.mu held), that
// every rank survives every set of M lost hosts: its own slot holds G,
// or its clear copy's holder's store does, or K shards and rows of its
// stripe at H survive and a holder of its differentials (H, G] does.
func (dj *ecDiffJob) checkRecoverable() {
	dj.t.Helper()
	g, hb := dj.g, dj.hb
	if g < 0 {
		return
	}
	j := dj.j
	n := j.k + j.m
	grp := j.groups[0]
	ec := j.c.hosts[0].place().ec
	for _, lost := range lossSets(n, j.m) {
		gone := func(h int) bool { return slices.Contains(lost, h) }
		for r := range j.c.hostOf {
			hr := j.c.hostOf[r]
			if !gone(hr) {
				continue // its own slot holds G (the overwrite rule)
			}
			if hs := j.holders[r]; len(hs) > 0 {
				ch := j.c.hostOf[hs[0]]
				if !gone(ch) && recordsAt(j.c.hosts[ch], r, g, g) {
					continue
				}
			}
			if hb < 0 {
				dj.t.Fatalf("G %d, H %d: rank %d is lost with hosts %v and no base is coded", g, hb, r, lost)
			}
			pos := ec.pos[r]
			have := 0
			for x, y := range ec.members(pos.group, pos.stripe) {
				dh := grp.Data[x]
				if !gone(dh) && baseAt(j.c.hosts[dh], y, hb) {
					have++
				}
			}
			for row, ph := range grp.Parity {
				var b [1]byte
				if !gone(ph) {
					if _, err := j.c.hosts[ph].parity.read(pos.group, pos.stripe, row, hb, 0, b[:]); err == nil {
						have++
					}
				}
			}
			if have < j.k {
				dj.t.Fatalf("G %d, H %d: rank %d is lost with hosts %v: %d shards and rows of its stripe at H survive, K is %d", g, hb, r, lost, have, j.k)
			}
			if g == hb {
				continue
			}
			recs := false
			for _, x := range append(slices.Clone(j.holders[r]), dj.logs[r]...) {
				if xh := j.c.hostOf[x]; !gone(xh) && recordsAt(j.c.hosts[xh], r, hb, g) {
					recs = true
				}
			}
			if !recs {
				dj.t.Fatalf("G %d, H %d: rank %d is lost with hosts %v: no surviving holder keeps its differentials (H, G]", g, hb, r, lost)
			}
		}
	}
}

// lossSets returns every set of m of the hosts 0..n-1.
func lossSets(n, m int) [][]int {
	var out [][]int
	var rec func(from int, cur []int)
	rec = func(from int, cur []int) {
		if len(cur) == m {
			out = append(out, slices.Clone(cur))
			return
		}
		for h := from; h < n; h++ {
			rec(h+1, append(cur, h))
		}
	}
	rec(0, nil)
	return out
}

// TestECDiffProtect: diff mode under ec:2+1 over 3 hosts and ec:2+2 over
// 4, several bases: after every step, with G and H as published, every
// rank survives every set of M lost hosts (its slot, its clear copy at
// G, or K shards and rows of its stripe at H and its differentials (H,
// G] on a surviving holder); H and G move past two bases.
func TestECDiffProtect(t *testing.T) {
	for _, tc := range []struct{ k, m, per, every int }{{2, 1, 2, 3}, {2, 2, 1, 3}, {2, 2, 1, 1}} {
		t.Run(fmt.Sprintf("%d+%d/B%d", tc.k, tc.m, tc.every), func(t *testing.T) {
			dj := newECDiffJob(t, tc.k, tc.m, tc.per, tc.every, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dj.publishing(ctx)
			steps := int64(4*tc.every + 3)
			for s := range steps {
				dj.step(ctx, s)
				dj.mu.Lock()
				dj.checkRecoverable()
				dj.mu.Unlock()
			}
			want := int64(2 * tc.every)
			dj.j.c.waitFor("H past two bases", func() bool {
				dj.publish()
				dj.mu.Lock()
				defer dj.mu.Unlock()
				dj.checkRecoverable()
				return dj.hb >= want && dj.g >= steps-1
			})
		})
	}
}

// TestECDiffStallsAtCap: a parity host that does not take a base's
// shares stalls G at Base + B + σ - 1 (every rank then waits at the
// overwrite rule), and G moves on once it takes them.
func TestECDiffStallsAtCap(t *testing.T) {
	const every = 4 // σ = min(B/2, Fold) = 2
	var blocked atomic.Bool
	release := make(chan struct{})
	blocked.Store(true)
	setECCommitHook(t, func(h linkHdr, e ecHdr) {
		if e.row == 0 && h.step >= every && blocked.Load() {
			<-release
		}
	})
	dj := newECDiffJob(t, 2, 1, 2, every, nil)
	defer func() {
		if blocked.Swap(false) {
			close(release)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dj.publishing(ctx)
	var wg sync.WaitGroup
	var stepErr atomic.Value
	for _, dr := range dj.rs {
		wg.Go(func() {
			for s := int64(0); s < 4*every && ctx.Err() == nil; s++ {
				if err := dr.step(ctx, s); err != nil {
					if ctx.Err() == nil {
						stepErr.Store(err)
					}
					return
				}
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	sigma := int64(2)
	stall := int64(0) + every + sigma - 1
	waiting := func() bool {
		for _, h := range dj.j.c.hosts {
			if h.waiters.Load() == 0 {
				return false
			}
		}
		return true
	}
	dj.j.c.waitFor("every rank waiting at the overwrite rule", func() bool {
		dj.publish()
		return waiting() && dj.j.c.hosts[0].G() == stall
	})
	dj.mu.Lock()
	if dj.g != stall || dj.hb != 0 {
		t.Errorf("stalled at G %d, H %d; want G %d (Base 0 + B %d + σ %d - 1), H 0", dj.g, dj.hb, stall, every, sigma)
	}
	dj.checkRecoverable()
	dj.mu.Unlock()
	blocked.Store(false)
	close(release)
	dj.j.c.waitFor("G past the stall", func() bool {
		dj.publish()
		return dj.j.c.hosts[0].G() > stall+every
	})
	if err, _ := stepErr.Load().(error); err != nil {
		t.Fatal(err)
	}
}
