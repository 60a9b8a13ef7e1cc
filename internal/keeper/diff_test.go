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
	"os"
	"slices"
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

// committedStates is a copy of dr's committed states, taken under its
// lock: a rank on a spare starts from it while dr may still be
// committing (each step's regions are never changed once recorded).
func (dr *diffRank) committedStates() map[int64]map[string][]byte {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	return maps.Clone(dr.states)
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
	regs, err := dr.stage(ctx, step)
	if err != nil {
		return err
	}
	return dr.commit(ctx, step, regs)
}

// stage runs step up to its Commit: the optimizer step, Gradient, Stage
// and the writes into the staged slot. It returns the regions written
// (commit's).
func (dr *diffRank) stage(ctx context.Context, step int64) (map[string][]byte, error) {
	g := dr.gradient(step)
	h := diffHyper(step)
	replay.Step(dr.w, dr.m, dr.v, g, h.Consts())
	copy(dr.grad[step%2], protect.Float32Bytes(g))
	hy := &protect.Hyper{LR: h.LR, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, WeightDecay: h.WeightDecay, T: h.T}
	if !dr.full {
		req, _ := json.Marshal(&protect.StepReq{Step: step, N: diffN, Hyper: hy})
		_, ans, err := dr.sess.Handle(ctx, protect.TypeGradient, req)
		if err != nil {
			return nil, fmt.Errorf("Gradient(%d): %w", step, err)
		}
		if e := ans.(*protect.GradientDone).Err; e != "" {
			return nil, fmt.Errorf("Gradient(%d): %s", step, e)
		}
	}
	sreq := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err := dr.sess.Handle(ctx, protect.TypeStage, sreq)
	if err != nil {
		return nil, fmt.Errorf("Stage(%d): %w", step, err)
	}
	sd := ans.(*protect.Staged)
	if sd.Err != "" {
		return nil, fmt.Errorf("Stage(%d): %s", step, sd.Err)
	}
	regs := dr.regionsAt(step)
	for i, reg := range dr.regions {
		copy(dr.views[sd.Slot][i], regs[reg.Name])
	}
	return regs, nil
}

// commit commits step, staged by stage (which returned regs).
func (dr *diffRank) commit(ctx context.Context, step int64, regs map[string][]byte) error {
	sreq := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err := dr.sess.Handle(ctx, protect.TypeCommit, sreq)
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
