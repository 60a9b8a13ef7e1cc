package keeper

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// A diff-mode rank's state: N float32 each of W, M and V in "optimizer"
// (with 16 bytes after them that never change), "params" (the same on
// every rank: restored from a data-parallel peer) and "meta".
const diffN = 1000

var diffRegions = []protect.Region{{Name: "optimizer", Size: 3*4*diffN + 16}, {Name: "params", Size: 2048}, {Name: "meta", Size: 64}}

var diffOpt = protect.Optimizer{Region: "optimizer", N: diffN, W: 0, M: 4 * diffN, V: 8 * diffN}

func diffHello(t testing.TB) []byte { return diffHelloOf(t, diffRegions) }

// diffHelloOf is diffHello with other regions (diffRegions' optimizer
// region among them).
func diffHelloOf(t testing.TB, regions []protect.Region) []byte {
	o := diffOpt
	b, err := json.Marshal(&protect.ProtectHello{Version: protect.Version, Regions: regions, Gradient: diffN, Optimizer: &o})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func diffMod(fold, baseEvery int) func(*Config) {
	return func(c *Config) {
		if testing.Verbose() && os.Getenv("GORUN_TEST_LOG") != "" {
			c.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		c.Mode = protect.ModeDiff
		c.Diff = DiffConfig{Fold: fold, BaseEvery: baseEvery}
	}
}

// diffRank is a trainer rank in diff mode: it steps replay's Adam on its
// own W, M, V with random gradients, hands the service each step's
// gradient, and keeps the replicated regions it committed at each step.
type diffRank struct {
	t       testing.TB
	r       int
	seed    uint64
	regions []protect.Region // diffRegions unless newDiffRankOf was given others
	full    bool             // the host runs full mode: no Gradient
	sess    *Session
	views   [2][][]byte
	grad    [2][]byte
	unmap   func()
	w, m, v []float32
	meta    []byte

	mu     sync.Mutex
	states map[int64]map[string][]byte // the replicated regions committed at each step
}

// newDiffRank says ProtectHello on h for rank r (its state starts as
// seed's initial one; Restore replaces it).
func newDiffRank(t testing.TB, h *Keeper, r int, seed uint64, states map[int64]map[string][]byte) (*diffRank, error) {
	return newDiffRankOf(t, h, r, seed, states, diffRegions)
}

// newDiffRankOf is newDiffRank with other regions: diffRegions' optimizer
// region, and any of its params and meta.
func newDiffRankOf(t testing.TB, h *Keeper, r int, seed uint64, states map[int64]map[string][]byte, regions []protect.Region) (*diffRank, error) {
	dr := &diffRank{t: t, r: r, seed: seed, sess: h.Session(r), states: states, regions: regions}
	if dr.states == nil {
		dr.states = map[int64]map[string][]byte{}
	}
	_, ans, err := dr.sess.Handle(context.Background(), protect.TypeProtectHello, diffHelloOf(t, regions))
	if err != nil {
		return nil, err
	}
	w := ans.(*protect.ProtectWelcome)
	if w.Err != "" {
		return nil, fmt.Errorf("ProtectHello: %s", w.Err)
	}
	if w.Mode != h.mode() || w.Gradient == nil || w.Gradient.Stride < w.Gradient.Size {
		return nil, fmt.Errorf("ProtectWelcome: mode %q, gradient %+v", w.Mode, w.Gradient)
	}
	views, unmap, err := mapRegionFiles(w.Regions)
	if err != nil {
		return nil, err
	}
	gv, gunmap, err := ckpt.MapData(ckpt.RegionFile{Name: protect.GradientRegion, Size: w.Gradient.Size, Stride: w.Gradient.Stride, Path: w.Gradient.Path})
	if err != nil {
		unmap()
		return nil, err
	}
	dr.views, dr.grad = views, gv
	dr.full = w.Mode == protect.ModeFull
	dr.unmap = func() { unmap(); gunmap() }
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	dr.w, dr.m, dr.v = make([]float32, diffN), make([]float32, diffN), make([]float32, diffN)
	for i := range dr.w {
		dr.w[i] = rng.Float32()*2 - 1
	}
	dr.meta = make([]byte, 64)
	return dr, nil
}

func (dr *diffRank) close() { dr.unmap() }

// startDiffRanks starts ranks 0..n-1 of c, one per host, in diff mode
// (newDiffRank with seed), restores each (none has a state yet), and
// closes them when the test ends.
func startDiffRanks(t testing.TB, c *cluster, n int, seed uint64) []*diffRank {
	t.Helper()
	return startDiffRanksOf(t, c, n, seed, diffRegions)
}

// startDiffRanksOf is startDiffRanks with the ranks' regions.
func startDiffRanksOf(t testing.TB, c *cluster, n int, seed uint64, regions []protect.Region) []*diffRank {
	t.Helper()
	rs := make([]*diffRank, n)
	for r := range rs {
		dr, err := newDiffRankOf(t, c.hosts[r], r, seed, nil, regions)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dr.close)
		rs[r] = dr
		if _, err := dr.restore(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return rs
}

// hyper is step's hyper-parameters: Adam's step count is step+1.
func diffHyper(step int64) replay.Hyper {
	return replay.Hyper{LR: 1e-3 * float32(1+step%3), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, T: int(step) + 1}
}

// gradient is rank r's gradient of step.
func (dr *diffRank) gradient(step int64) []float32 {
	rng := rand.New(rand.NewPCG(dr.seed^0x9e3779b97f4a7c15, uint64(dr.r)<<32|uint64(step)))
	g := make([]float32, diffN)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	return g
}

// regionsAt returns the rank's regions as it commits them at step.
func (dr *diffRank) regionsAt(step int64) map[string][]byte {
	opt := make([]byte, diffRegions[0].Size)
	copy(opt, protect.Float32Bytes(dr.w))
	copy(opt[4*diffN:], protect.Float32Bytes(dr.m))
	copy(opt[8*diffN:], protect.Float32Bytes(dr.v))
	binary.LittleEndian.PutUint64(dr.meta, uint64(step))
	binary.LittleEndian.PutUint64(dr.meta[8:], uint64(step)*0x9e37+uint64(dr.r))
	params := make([]byte, 2048)
	for i := range params {
		params[i] = byte(step*5 + int64(i))
	}
	return map[string][]byte{"optimizer": opt, "params": params, "meta": slices.Clone(dr.meta)}
}

// load takes the rank's state from restored regions.
func (dr *diffRank) load(regs map[string][]byte) {
	opt := regs["optimizer"]
	f := func(off int) []float32 {
		return slices.Clone(unsafe.Slice((*float32)(unsafe.Pointer(&opt[off])), diffN))
	}
	dr.w, dr.m, dr.v = f(0), f(4*diffN), f(8*diffN)
	copy(dr.meta, regs["meta"])
}

// want returns the replicated regions the rank committed at step.
func (dr *diffRank) want(step int64) map[string][]byte {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	return dr.states[step]
}

// step runs step: the optimizer step, Gradient, Stage, the writes and
// Commit. It returns the error of the first request refused.
func (dr *diffRank) step(ctx context.Context, step int64) error {
	g := dr.gradient(step)
	h := diffHyper(step)
	replay.Step(dr.w, dr.m, dr.v, g, h.Consts())
	copy(dr.grad[step%2], protect.Float32Bytes(g))
	hy := &protect.Hyper{LR: h.LR, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, WeightDecay: h.WeightDecay, T: h.T}
	if !dr.full {
		req, _ := json.Marshal(&protect.StepReq{Step: step, N: diffN, Hyper: hy})
		_, ans, err := dr.sess.Handle(ctx, protect.TypeGradient, req)
		if err != nil {
			return fmt.Errorf("Gradient(%d): %w", step, err)
		}
		if e := ans.(*protect.GradientDone).Err; e != "" {
			return fmt.Errorf("Gradient(%d): %s", step, e)
		}
	}
	sreq := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err := dr.sess.Handle(ctx, protect.TypeStage, sreq)
	if err != nil {
		return fmt.Errorf("Stage(%d): %w", step, err)
	}
	sd := ans.(*protect.Staged)
	if sd.Err != "" {
		return fmt.Errorf("Stage(%d): %s", step, sd.Err)
	}
	regs := dr.regionsAt(step)
	for i, reg := range dr.regions {
		copy(dr.views[sd.Slot][i], regs[reg.Name])
	}
	_, ans, err = dr.sess.Handle(ctx, protect.TypeCommit, sreq)
	if err != nil {
		return fmt.Errorf("Commit(%d): %w", step, err)
	}
	if e := ans.(*protect.Committed).Err; e != "" {
		return fmt.Errorf("Commit(%d): %s", step, e)
	}
	dr.mu.Lock()
	dr.states[step] = map[string][]byte{"optimizer": regs["optimizer"], "meta": regs["meta"]}
	dr.mu.Unlock()
	return nil
}

// restore restores the rank and loads the state: the step and tier.
func (dr *diffRank) restore(ctx context.Context) (*protect.Restorable, error) {
	_, ans, err := dr.sess.Handle(ctx, protect.TypeRestore, []byte(`{}`))
	if err != nil {
		return nil, err
	}
	res := ans.(*protect.Restorable)
	if res.Err != "" {
		return res, fmt.Errorf("Restore: %s", res.Err)
	}
	if res.Step >= 0 {
		regs := map[string][]byte{}
		for i, reg := range dr.regions {
			regs[reg.Name] = slices.Clone(dr.views[res.Slot][i])
		}
		if want := dr.want(res.Step); want != nil {
			for name, b := range want {
				if !bytes.Equal(regs[name], b) {
					return res, fmt.Errorf("tier-%d restore of step %d: region %s differs from the committed state", res.Tier, res.Step, name)
				}
			}
		}
		dr.load(regs)
	}
	return res, nil
}

// heldRange returns the steps host h's replica of owner can restore, by
// store (cur, then prev).
func heldRange(h *Keeper, owner int) [][2]int64 {
	h.store.mu.Lock()
	o := h.store.owners[owner]
	h.store.mu.Unlock()
	if o == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var out [][2]int64
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds == nil {
			continue
		}
		if f, l, ok := ds.Range(); ok {
			out = append(out, [2]int64{f, l})
		}
	}
	return out
}

// checkTier2 checks that every step s ≤ g that owner's holder on host hh
// holds restores, by copyOut on hh and by a get from host from (the
// paths of restoreRemote), to the state owner committed at s; and that g
// itself is among them.
func checkTier2(t testing.TB, from, hh *Keeper, holder int, dr *diffRank, g int64) {
	t.Helper()
	if g < 0 {
		return
	}
	seenG := false
	for _, rg := range heldRange(hh, dr.r) {
		for s := rg[0]; s <= min(rg[1], g); s++ {
			want := dr.want(s)
			if want == nil {
				continue // a step of a previous life, before a restore
			}
			seenG = seenG || s == g
			dst := map[string][]byte{"optimizer": make([]byte, diffRegions[0].Size), "meta": make([]byte, 64)}
			if err := hh.store.copyOut(dr.r, s, dst); err != nil {
				if s < g && !stillHeld(hh, dr.r, s) {
					continue // folded meanwhile (up to G)
				}
				t.Errorf("rank %d step %d (G %d): copyOut: %v", dr.r, s, g, err)
				continue
			}
			for name, b := range want {
				if !bytes.Equal(dst[name], b) {
					t.Errorf("rank %d step %d (G %d): copyOut's %s differs from the owner's commit", dr.r, s, g, name)
				}
			}
			if from == nil {
				continue // no other host to get it from
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			got := map[string][]byte{"optimizer": make([]byte, diffRegions[0].Size), "meta": make([]byte, 64)}
			dst = maps.Clone(got) // fetch deletes what it filled
			err := from.links.fetch(ctx, hh.cfg.Host, linkHdr{kind: kindGet, owner: dr.r, holder: holder, step: s}, []tableEntry{{name: "optimizer"}, {name: "meta"}}, dst)
			cancel()
			if err != nil {
				if s < g && !stillHeld(hh, dr.r, s) {
					continue
				}
				t.Errorf("rank %d step %d (G %d): get: %v", dr.r, s, g, err)
				continue
			}
			for name, b := range want {
				if !bytes.Equal(got[name], b) {
					t.Errorf("rank %d step %d (G %d): get's %s differs from the owner's commit", dr.r, s, g, name)
				}
			}
		}
	}
	if !seenG && dr.want(g) != nil {
		t.Errorf("rank %d: its holder on host %d cannot restore G = %d (holds %v)", dr.r, hh.cfg.Host, g, heldRange(hh, dr.r))
	}
}

func stillHeld(h *Keeper, owner int, s int64) bool {
	for _, rg := range heldRange(h, owner) {
		if rg[0] <= s && s <= rg[1] {
			return true
		}
	}
	return false
}

// restartWith restarts the job from step g in generation gen after host
// fh failed (it is closed): the survivors restart, a fresh host (empty
// slot directory) takes fh's place.
func restartWith(t *testing.T, c *cluster, fh int, ranks []int, peers func(int) []int, gen uint64, g int64) {
	t.Helper()
	for i, o := range c.hosts {
		if i != fh {
			if err := o.Restart(gen, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.startHost(fh, ranks, peers, t.TempDir())
	addrs := make([]string, len(c.hosts))
	for i, o := range c.hosts {
		addrs[i] = o.cfg.Listener.Addr().String()
	}
	for _, o := range c.hosts {
		o.SetAddrs(addrs)
	}
	if err := c.hosts[fh].Restart(gen, g); err != nil {
		t.Fatal(err)
	}
}

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
	runSteps(t, c, rs, g+1, g+25)
	o.mu.Lock()
	st := o.cur.Stats()
	o.mu.Unlock()
	if st.Refreshes <= refreshesBefore {
		t.Errorf("no refresh completed after the restart: %+v", st)
	}
	checkTier2(t, c.hosts[0], h1, 1, rs[0], c.publishG())
}

// BenchmarkReplicateStep measures one protected step of 64 MiB of
// optimizer state on a loopback pair of hosts, full mode against diff
// mode (lossless): the time from Stage to every holder's acknowledgement,
// and the bytes on the replication link per step, bases included.
//
// The diff side's trainer steps its optimizer (replay's Adam) as the
// gradients it hands say: a holder's fold (every 16 steps) checks its
// replay against the commits, and an optimizer left as it was would fail
// the rank at step 16, and stop its replication.
func BenchmarkReplicateStep(b *testing.B) {
	full, diff, s := replicateSteps(b, (64<<20)/12, b.Loop) // W, M and V: 64 MiB
	pf, pd := full.c.progress(0), diff.c.progress(0)
	steps := float64(s)
	b.ReportMetric(float64(pf.ReplBytes)/steps, "full-B/step")
	b.ReportMetric(float64(pd.ReplBytes)/steps, "diff-B/step")
	b.ReportMetric(float64(pd.ReplBytes)/float64(pf.ReplBytes), "diff/full-bytes")
	b.ReportMetric(float64(full.ns.Nanoseconds())/steps, "full-ns/step")
	b.ReportMetric(float64(diff.ns.Nanoseconds())/steps, "diff-ns/step")
	b.ReportMetric(float64(diff.ns)/float64(full.ns), "diff/full-time")
}

// TestReplicateStepsPastFold: BenchmarkReplicateStep's harness, small,
// past the diff side's first fold (step 16): every step is replicated,
// the rank never failed (its trainer's optimizer is replay's).
func TestReplicateStepsPastFold(t *testing.T) {
	left := 20
	_, diff, s := replicateSteps(t, 4096, func() bool { left--; return left >= 0 })
	if p := diff.c.progress(0); s != 20 || p.Replicated != s-1 {
		t.Errorf("diff side: %d steps, replicated to %d, want 20, 19", s, p.Replicated)
	}
}

// replicateSide is one host pair of replicateSteps: its cluster, the
// rank's session, regions and gradient views, the time its steps took,
// and (diff mode) its trainer's optimizer state.
type replicateSide struct {
	c        *cluster
	sess     *Session
	v        [2][][]byte
	g        [2][]byte
	ns       time.Duration
	w, m, vv []float32
}

// replicateSteps runs protected steps of n-element W, M and V while more
// says so on a full-mode pair and a diff-mode pair side by side (each
// step waiting for its replication), and returns both and the number of
// steps. It fails tb if a rank fails.
func replicateSteps(b testing.TB, n int64, more func() bool) (full, diff *replicateSide, s int64) {
	regions := []protect.Region{{Name: "optimizer", Size: 12 * n}, {Name: "meta", Size: 64}}
	o := protect.Optimizer{Region: "optimizer", N: n, W: 0, M: 4 * n, V: 8 * n}
	hello, _ := json.Marshal(&protect.ProtectHello{Version: protect.Version, Regions: regions, Gradient: n, Optimizer: &o})
	type side = replicateSide
	mk := func(mod func(*Config)) *side {
		c := newClusterWith(b, [][]int{{0}, {1}}, [][]int{{1}, nil}, func(int) []int { return []int{0, 1} }, mod)
		sd := &side{c: c, sess: c.hosts[0].Session(0)}
		_, ans, err := sd.sess.Handle(context.Background(), protect.TypeProtectHello, hello)
		if err != nil || ans.(*protect.ProtectWelcome).Err != "" {
			b.Fatal(ans, err)
		}
		w := ans.(*protect.ProtectWelcome)
		views, unmap, err := mapRegionFiles(w.Regions)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(unmap)
		gv, gunmap, err := ckpt.MapData(ckpt.RegionFile{Name: protect.GradientRegion, Size: w.Gradient.Size, Stride: w.Gradient.Stride, Path: w.Gradient.Path})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { gunmap() })
		sd.v, sd.g = views, gv
		sd.w, sd.m, sd.vv = make([]float32, n), make([]float32, n), make([]float32, n)
		return sd
	}
	rng := rand.New(rand.NewPCG(1, 2))
	grad := make([]float32, n)
	for i := range grad {
		grad[i] = float32(rng.NormFloat64())
	}
	step := func(sd *side, s int64, withGrad bool) {
		ctx := context.Background()
		hy := replay.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: int(s) + 1}
		if withGrad {
			replay.Step(sd.w, sd.m, sd.vv, grad, hy.Consts()) // the trainer's, not measured
		}
		start := time.Now()
		var untimed time.Duration
		if withGrad {
			copy(sd.g[s%2], protect.Float32Bytes(grad))
			req, _ := json.Marshal(&protect.StepReq{Step: s, N: n, Hyper: &protect.Hyper{LR: hy.LR, Beta1: hy.Beta1, Beta2: hy.Beta2, Eps: hy.Eps, T: hy.T}})
			if _, ans, err := sd.sess.Handle(ctx, protect.TypeGradient, req); err != nil || ans.(*protect.GradientDone).Err != "" {
				b.Fatal(ans, err)
			}
		}
		sreq := fmt.Appendf(nil, `{"step":%d}`, s)
		_, ans, err := sd.sess.Handle(ctx, protect.TypeStage, sreq)
		if err != nil || ans.(*protect.Staged).Err != "" {
			b.Fatal(ans, err)
		}
		slot := sd.v[ans.(*protect.Staged).Slot]
		slot[1][0] = byte(s) // meta changes
		if withGrad {
			// The optimizer's bytes are the trainer's cost, not measured.
			t0 := time.Now()
			copy(slot[0], protect.Float32Bytes(sd.w))
			copy(slot[0][4*n:], protect.Float32Bytes(sd.m))
			copy(slot[0][8*n:], protect.Float32Bytes(sd.vv))
			untimed = time.Since(t0)
		}
		if _, ans, err := sd.sess.Handle(ctx, protect.TypeCommit, sreq); err != nil || ans.(*protect.Committed).Err != "" {
			b.Fatal(ans, err)
		}
		for sd.c.progress(0).Replicated < s {
			if err := sd.c.hosts[0].svc(0).failure(); err != nil {
				b.Fatalf("step %d: the rank failed: %v", s, err)
			}
			select {
			case <-sd.c.changed:
			case <-time.After(time.Millisecond):
			}
		}
		sd.ns += time.Since(start) - untimed
		for _, h := range sd.c.hosts {
			h.SetG(0, s)
		}
	}
	full, diff = mk(nil), mk(diffMod(16, 100))
	for more() {
		step(full, s, false)
		step(diff, s, true)
		s++
	}
	return full, diff, s
}
