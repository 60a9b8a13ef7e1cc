package keeper

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
)

// TestPropertyDiffRecoverable is TestPropertyGRecoverable's property in
// diff mode, with the bytes checked against the owners' real optimizer
// states: 3 hosts of one rank each, each rank's replica on the next
// host, every rank stepping replay's Adam with random gradients for 60
// steps, holders folding every 1, 7 or 16 steps and getting a base
// refresh every 10. At every G the launcher publishes, every step up to G
// that a holder holds (G among them) restores, on the holder (copyOut)
// and over a link (get), to the owner's committed bytes. A random host is
// lost when G reaches a random step: then the lost rank's G must still
// restore from its holder; the job restarts from G with a fresh host,
// whose rank restores Tier-2 (restoreRemote) and goes on to step 60.
func TestPropertyDiffRecoverable(t *testing.T) {
	seeds := 2
	if testing.Short() {
		seeds = 1
	}
	for _, fold := range []int{1, 7, 16} {
		for i := range seeds {
			seed := uint64(100*fold + i)
			t.Run(fmt.Sprintf("fold=%d,seed=%d", fold, seed), func(t *testing.T) { runDiffProperty(t, seed, fold) })
		}
	}
}

func runDiffProperty(t *testing.T, seed uint64, fold int) {
	const steps, nh = 60, 3
	holders := [][]int{{1}, {2}, {0}}
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newClusterWith(t, [][]int{{0}, {1}, {2}}, holders, peers, diffMod(fold, 10))
	rng := rand.New(rand.NewPCG(seed, 7))
	failAt := int64(3 + rng.IntN(50))
	fh := rng.IntN(nh)
	states := make([]map[int64]map[string][]byte, nh)
	from := int64(noStep)
	for round := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		rs := make([]*diffRank, nh)
		for r := range nh {
			dr, err := newDiffRank(t, c.hosts[r], r, seed, states[r])
			if err != nil {
				t.Fatalf("round %d rank %d: %v", round, r, err)
			}
			defer dr.close()
			rs[r], states[r] = dr, dr.states
			res, err := dr.restore(ctx)
			wantTier := 1
			if round == 1 && r == fh {
				wantTier = 2
			}
			if err != nil || res.Step != from || from >= 0 && res.Tier != wantTier {
				t.Fatalf("round %d rank %d: restore %+v, %v; want step %d tier %d", round, r, res, err, from, wantTier)
			}
		}
		var wg sync.WaitGroup
		for _, dr := range rs {
			wg.Go(func() {
				for s := from + 1; s <= steps && ctx.Err() == nil; s++ {
					if err := dr.step(ctx, s); err != nil {
						if ctx.Err() == nil {
							t.Errorf("rank %d: %v", dr.r, err)
						}
						return
					}
				}
			})
		}
		published := from
		deadline := time.Now().Add(60 * time.Second)
		for !t.Failed() {
			if g := c.publishG(); g > published {
				published = g
				for r, dr := range rs {
					hh := holders[r][0]
					checkTier2(t, c.hosts[r], c.hosts[hh], hh, dr, g)
				}
			}
			if round == 0 && published >= failAt || published >= steps {
				break
			}
			if time.Now().After(deadline) {
				c.dumpStall(t)
				t.Fatalf("round %d: G = %d after 60 s", round, published)
			}
			select {
			case <-c.changed:
			case <-time.After(2 * time.Millisecond):
			}
		}
		if round == 1 || t.Failed() {
			cancel()
			wg.Wait()
			break
		}
		// Host fh is lost: its rank's G must be at its holder, which is
		// not on fh.
		t.Logf("host %d lost with G = %d", fh, published)
		cancel() // the ranks stop (the lost host's too: its errors are the loss's)
		c.hosts[fh].Close()
		hh := holders[fh][0]
		checkTier2(t, c.hosts[(fh+2)%nh], c.hosts[hh], hh, rs[fh], published)
		wg.Wait()
		restartWith(t, c, fh, []int{fh}, peers, 1, published)
		from = published
	}
	// The run went through folds and base refreshes.
	var folded, refreshes int64
	for r, hr := range holders {
		h := c.hosts[hr[0]]
		folded += h.FoldStats().Steps
		h.store.mu.Lock()
		o := h.store.owners[r]
		h.store.mu.Unlock()
		o.mu.Lock()
		if o.cur != nil {
			// The store's first base counts as a refresh committed; the
			// periodic ones after it are committed (installed), or
			// verified and dropped when lossless folds passed them.
			st := o.cur.Stats()
			refreshes += max(st.Refreshes-1, 0) + st.RefreshesSuperseded
		}
		o.mu.Unlock()
		p := c.progress(r)
		t.Logf("rank %d: %d steps replicated, %d base bytes, %d differential bytes; holder host %d folded %+v", r, p.ReplSteps, p.ReplBaseBytes, p.ReplDiffBytes, hr[0], h.FoldStats())
		if p.ReplDiffBytes == 0 || p.ReplBytes != p.ReplBaseBytes+p.ReplDiffBytes {
			t.Errorf("rank %d: progress %+v", r, p)
		}
	}
	if steps-from >= 30 && (folded == 0 || refreshes == 0) {
		t.Errorf("steps %d to %d: %d steps folded, %d base refreshes after the first base (installed or verified); want some of each", from+1, steps, folded, refreshes)
	}
}

// TestDiffRefusals: diff mode refuses a trainer that does not declare its
// replay optimizer (with the contract in the answer), bad optimizer
// layouts, a restarted rank declaring another optimizer, Gradients
// without valid hyper-parameters, and a Commit without its Gradient; full
// mode accepts and ignores an optimizer declaration.
func TestDiffRefusals(t *testing.T) {
	hello := func(o *protect.Optimizer, grad int64) []byte {
		b, _ := json.Marshal(&protect.ProtectHello{Version: protect.Version, Regions: diffRegions, Gradient: grad, Optimizer: o})
		return b
	}
	opt := func(f func(o *protect.Optimizer)) *protect.Optimizer {
		o := diffOpt
		f(&o)
		return &o
	}
	for _, tc := range []struct {
		name string
		opt  *protect.Optimizer
		grad int64
		want string // in the err; "" accepted
	}{
		{"none", nil, diffN, errNoOptimizer},
		{"ok", &diffOpt, diffN, ""},
		{"no such region", opt(func(o *protect.Optimizer) { o.Region = "adam" }), diffN, `"adam" is not declared`},
		{"params", opt(func(o *protect.Optimizer) { o.Region = "params"; o.N = 100; o.M, o.V = 400, 800 }), diffN, "not replicated"},
		{"N 0", opt(func(o *protect.Optimizer) { o.N = 0 }), diffN, "0 elements"},
		{"unaligned", opt(func(o *protect.Optimizer) { o.M = 4*diffN + 2 }), diffN, "multiple of 4"},
		{"negative", opt(func(o *protect.Optimizer) { o.W = -4 }), diffN, "multiple of 4"},
		{"outside", opt(func(o *protect.Optimizer) { o.V = 8*diffN + 20 }), diffN, "inside region"},
		{"overlap", opt(func(o *protect.Optimizer) { o.M = 4 }), diffN, "overlap"},
		{"gradient short", &diffOpt, diffN - 1, "gradient buffer of 999"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClusterWith(t, [][]int{{0}}, nil, nil, diffMod(0, 0))
			_, ans, err := c.hosts[0].Session(0).Handle(context.Background(), protect.TypeProtectHello, hello(tc.opt, tc.grad))
			if err != nil {
				t.Fatal(err)
			}
			w := ans.(*protect.ProtectWelcome)
			switch {
			case tc.want == "" && (w.Err != "" || w.Mode != protect.ModeDiff):
				t.Fatalf("refused: %+v", w)
			case tc.want != "" && !strings.Contains(w.Err, tc.want):
				t.Fatalf("err %q, want it to say %q", w.Err, tc.want)
			}
			// Full mode ignores the declaration.
			cf := newCluster(t, [][]int{{0}}, nil, nil)
			_, ans, err = cf.hosts[0].Session(0).Handle(context.Background(), protect.TypeProtectHello, hello(tc.opt, tc.grad))
			if err != nil || ans.(*protect.ProtectWelcome).Err != "" || ans.(*protect.ProtectWelcome).Mode != protect.ModeFull {
				t.Fatalf("full mode: %+v, %v", ans, err)
			}
		})
	}

	c := newClusterWith(t, [][]int{{0}}, nil, nil, diffMod(0, 0))
	ctx := context.Background()
	dr, err := newDiffRank(t, c.hosts[0], 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	// Another optimizer than before.
	_, ans, _ := c.hosts[0].Session(0).Handle(ctx, protect.TypeProtectHello, hello(opt(func(o *protect.Optimizer) { o.W, o.M, o.V = 8*diffN, 0, 4*diffN }), diffN))
	if e := ans.(*protect.ProtectWelcome).Err; !strings.Contains(e, "differs") {
		t.Errorf("a restarted rank with another optimizer: err %q", e)
	}
	dr.sess = c.hosts[0].Session(0)
	if _, ans, _ := dr.sess.Handle(ctx, protect.TypeProtectHello, diffHello(t)); ans.(*protect.ProtectWelcome).Err != "" {
		t.Fatal(ans)
	}
	grad := func(step int64, h *protect.Hyper) string {
		req, _ := json.Marshal(&protect.StepReq{Step: step, N: diffN, Hyper: h})
		_, ans, err := dr.sess.Handle(ctx, protect.TypeGradient, req)
		if err != nil {
			t.Fatal(err)
		}
		return ans.(*protect.GradientDone).Err
	}
	for _, tc := range []struct {
		name string
		h    *protect.Hyper
		want string
	}{
		{"no hyper", nil, "without its hyper-parameters"},
		{"T 0", &protect.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, T: 0}, "steps count from 1"},
		{"beta 1", &protect.Hyper{LR: 1e-3, Beta1: 1, Beta2: 0.999, T: 1}, "betas"},
	} {
		if e := grad(0, tc.h); !strings.Contains(e, tc.want) {
			t.Errorf("%s: err %q, want %q", tc.name, e, tc.want)
		}
	}
	// Commit without the step's Gradient.
	if _, ans, _ := dr.sess.Handle(ctx, protect.TypeStage, []byte(`{"step":0}`)); ans.(*protect.Staged).Err != "" {
		t.Fatal(ans)
	}
	if _, ans, _ := dr.sess.Handle(ctx, protect.TypeCommit, []byte(`{"step":0}`)); !strings.Contains(ans.(*protect.Committed).Err, "without its Gradient") {
		t.Errorf("commit without a gradient: %+v", ans)
	}
	// The stage stays: the Gradient, then the Commit.
	if e := grad(0, &protect.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 1}); e != "" {
		t.Fatal(e)
	}
	if _, ans, _ := dr.sess.Handle(ctx, protect.TypeCommit, []byte(`{"step":0}`)); ans.(*protect.Committed).Err != "" {
		t.Errorf("commit after the gradient: %+v", ans)
	}
	// Adam's step count must follow.
	if e := grad(1, &protect.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 3}); !strings.Contains(e, "after optimizer step 1") {
		t.Errorf("T 3 after T 1: err %q", e)
	}
}

// twoHostDiff is a diff-mode job of two hosts, rank r on host r, each
// rank's replica on the other.
func twoHostDiff(t *testing.T, fold, baseEvery int) (*cluster, func(int) []int) {
	peers := func(int) []int { return []int{0, 1} }
	return newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, diffMod(fold, baseEvery)), peers
}

// runSteps has ranks rs protect steps from to to, publishing G as they
// go, until G = to.
func runSteps(t *testing.T, c *cluster, rs []*diffRank, from, to int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, dr := range rs {
		wg.Go(func() {
			for s := from; s <= to && ctx.Err() == nil; s++ {
				if err := dr.step(ctx, s); err != nil {
					if ctx.Err() == nil {
						t.Errorf("rank %d: %v", dr.r, err)
					}
					return
				}
			}
		})
	}
	c.waitFor(fmt.Sprintf("G = %d", to), func() bool { return t.Failed() || c.publishG() >= to })
	if t.Failed() {
		cancel() // the ranks may wait at the overwrite rule for good
	}
	wg.Wait()
}

// TestDiffDamagedOrLost: a differential damaged on the wire is refused by
// the holder (its step is not held, not acknowledged), sent again, and
// replaced by a base when damaged again; one lost on the way leaves the
// next one refused as a gap, and the owner resends from the holder's
// Next. Replicated never passes the step meanwhile, and every step ends
// up restorable bitwise.
func TestDiffDamagedOrLost(t *testing.T) {
	var mu sync.Mutex
	damaged, dropped, resent := 0, false, false
	var heldAtSecond, replAtGap []int64
	var c *cluster
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if h.kind != kindDiff || h.owner != 0 {
			return bufs
		}
		mu.Lock()
		defer mu.Unlock()
		switch h.step {
		case 3:
			damaged++
			if damaged == 2 {
				for _, rg := range heldRange(c.hosts[1], 0) {
					heldAtSecond = append(heldAtSecond, rg[1])
				}
			}
			nb := slices.Clone(bufs)
			rec := slices.Clone(nb[1])
			rec[len(rec)/2] ^= 0x40
			nb[1] = rec
			return nb
		case 7, 8:
			// From the loss until step 7 is sent again, Replicated
			// stays below 7.
			if dropped && !resent {
				replAtGap = append(replAtGap, c.progress(0).Replicated)
				resent = h.step == 7
			}
		}
		return bufs
	}
	testHookDropDiff = func(owner, holder int, step int64) bool {
		mu.Lock()
		defer mu.Unlock()
		if owner == 0 && step == 7 && !dropped {
			dropped = true
			return true
		}
		return false
	}
	t.Cleanup(func() { testHookLinkFrame, testHookDropDiff = nil, nil })
	c, _ = twoHostDiff(t, 4, 100)
	rs := startDiffRanks(t, c, 2, 5)
	runSteps(t, c, rs, 0, 12)
	mu.Lock()
	defer mu.Unlock()
	if damaged < 2 {
		t.Errorf("the damaged differential of step 3 was sent %d times, want 2 (then a base)", damaged)
	}
	for _, last := range heldAtSecond {
		if last >= 3 {
			t.Errorf("the holder holds step %d after refusing the damaged step 3", last)
		}
	}
	if !dropped || !resent || slices.Max(replAtGap) >= 7 {
		t.Errorf("lost step 7: dropped %v, resent %v, rank 0's Replicated at each send of steps 7 and 8 until then %v (want < 7)", dropped, resent, replAtGap)
	}
	if p := c.progress(0); p.ReplBaseBytes < 2*int64(diffRegions[0].Size) {
		t.Errorf("rank 0 sent %d base bytes: want the first base and the one that replaced step 3", p.ReplBaseBytes)
	}
	g := c.publishG()
	checkTier2(t, c.hosts[0], c.hosts[1], 1, rs[0], g)
	checkTier2(t, c.hosts[1], c.hosts[0], 0, rs[1], g)
}

// TestDiffRefreshInterrupted: the owner's host is lost in the middle of a
// base refresh (after its first chunk): the holder keeps its old base and
// log, and restores every step of its range bitwise; the job restarts
// from G, the lost rank restores from the holder (Tier-2), and a later
// refresh from its new host completes.
func TestDiffRefreshInterrupted(t *testing.T) {
	chunks := 0
	stopped := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if h.kind == kindBaseChunk && h.owner == 0 {
			if chunks++; chunks == 2 {
				once.Do(func() { close(stopped) })
				<-release
			}
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	c, peers := twoHostDiff(t, 3, 6)
	rs := startDiffRanks(t, c, 2, 9)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, dr := range rs {
		wg.Go(func() {
			for s := int64(0); ctx.Err() == nil; s++ {
				if dr.step(ctx, s) != nil {
					return
				}
			}
		})
	}
	for done := false; !done; {
		c.publishG()
		select {
		case <-stopped:
			done = true
		case <-c.changed:
		case <-time.After(2 * time.Millisecond):
		}
	}
	// Rank 0's host is lost with its refresh half sent.
	g := c.publishG()
	cancel()
	closed := make(chan struct{})
	go func() { c.hosts[0].Close(); close(closed) }()
	close(release)
	<-closed
	wg.Wait()
	h1 := c.hosts[1]
	h1.store.mu.Lock()
	o := h1.store.owners[0]
	h1.store.mu.Unlock()
	o.mu.Lock()
	pending := o.bw != nil
	o.mu.Unlock()
	if !pending {
		t.Fatal("no refresh in progress at the holder after the owner's host was lost mid-refresh")
	}
	t.Logf("host 0 lost mid-refresh with G = %d; the holder holds %v", g, heldRange(h1, 0))
	checkTier2(t, nil, h1, 1, rs[0], g)
	refreshesBefore := o.cur.Stats().Refreshes

	restartWith(t, c, 0, []int{0}, peers, 1, g)
	for r := range rs {
		dr, err := newDiffRank(t, c.hosts[r], r, 9, rs[r].states)
		if err != nil {
			t.Fatal(err)
		}
		defer dr.close()
		res, err := dr.restore(context.Background())
		if err != nil || res.Step != g || r == 0 && res.Tier != 2 {
			t.Fatalf("rank %d restored %+v, %v; want step %d", r, res, err, g)
		}
		rs[r] = dr
	}
	// A refresh is paced over 3 steps, and a newer one supersedes it 6
	// steps on: on a loaded machine (the race detector, other tests) the
	// holder may take a few refreshes' time before one completes.
	refreshes := func() diffstore.Stats {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.cur.Stats()
	}
	last := g
	for st := refreshes(); st.Refreshes <= refreshesBefore; st = refreshes() {
		if last >= g+200 {
			t.Fatalf("no refresh completed in the 200 steps after the restart: %+v (before: %d)", st, refreshesBefore)
		}
		runSteps(t, c, rs, last+1, last+25)
		last += 25
	}
	checkTier2(t, c.hosts[0], h1, 1, rs[0], c.publishG())
}
