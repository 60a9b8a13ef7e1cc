package keeper

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// The local-peer tests run a data-parallel job of ranks that each step
// the shard [off, off+lpN) of a reduced gradient of lpP elements that
// every rank holds (lpReduced), on hosts with one rank each: every rank
// holds another's replicas, so each holder host runs a data-parallel peer
// of the owner it holds.
const lpN = 600

var lpRegions = []protect.Region{{Name: "optimizer", Size: 3 * 4 * lpN}, {Name: "meta", Size: 64}}

func lpMod(c *Config) {
	c.Mode = protect.ModeDiff
	c.Diff = DiffConfig{Fold: 3, BaseEvery: 7}
}

// lpReduced is the full reduced gradient of step, of p elements: the
// same on every rank.
func lpReduced(p int64, step int64) []float32 {
	rng := rand.New(rand.NewPCG(uint64(p), uint64(step)))
	g := make([]float32, p)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	return g
}

func lpHyper(step int64) replay.Hyper {
	return replay.Hyper{LR: 1e-3 * float32(1+step%3), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, T: int(step) + 1}
}

// lpRank is a trainer rank driven through its Session as the Client
// drives it: deposits, gradient, Adam, Gradient, Stage, Commit.
type lpRank struct {
	t       testing.TB
	r       int
	red     protect.Reduced
	sess    *Session
	views   [2][][]byte
	grad    [2][]byte // own gradient halves
	dep     [2][]byte // deposit areas
	unmap   func()
	w, m, v []float32
	plan    *protect.DepositPlan
	states  map[int64]map[string][]byte
	// deposited counts the steps it wrote deposits for.
	deposited int
}

func newLPRank(t testing.TB, h *Keeper, r int, red protect.Reduced) *lpRank {
	t.Helper()
	lr := &lpRank{t: t, r: r, red: red, sess: h.Session(r), states: map[int64]map[string][]byte{}}
	opt := protect.Optimizer{Region: "optimizer", N: lpN, W: 0, M: 4 * lpN, V: 8 * lpN, Reduced: &red}
	b, _ := json.Marshal(&protect.ProtectHello{Version: protect.Version, Regions: lpRegions, Gradient: lpN, Optimizer: &opt})
	_, ans, err := lr.sess.Handle(context.Background(), protect.TypeProtectHello, b)
	if err != nil {
		t.Fatal(err)
	}
	w := ans.(*protect.ProtectWelcome)
	if w.Err != "" {
		t.Fatalf("rank %d: ProtectHello: %s", r, w.Err)
	}
	g := w.Gradient
	if g == nil || g.Reduced != red.N || g.Deposit < g.Size || w.Deposits == nil {
		t.Fatalf("rank %d: ProtectWelcome: gradient %+v, deposits %+v", r, g, w.Deposits)
	}
	views, unmap, err := mapRegionFiles(w.Regions)
	if err != nil {
		t.Fatal(err)
	}
	size := g.Deposit + 4*g.Reduced
	gv, gunmap, err := ckpt.MapData(ckpt.RegionFile{Name: protect.GradientRegion, Size: size, Stride: g.Stride, Path: g.Path})
	if err != nil {
		t.Fatal(err)
	}
	lr.views, lr.plan = views, w.Deposits
	for i := range 2 {
		lr.grad[i], lr.dep[i] = gv[i][:g.Size], gv[i][g.Deposit:size]
	}
	lr.unmap = func() { unmap(); gunmap() }
	t.Cleanup(lr.unmap)
	rng := rand.New(rand.NewPCG(7, uint64(r)))
	lr.w, lr.m, lr.v = make([]float32, lpN), make([]float32, lpN), make([]float32, lpN)
	for i := range lr.w {
		lr.w[i] = rng.Float32()*2 - 1
	}
	return lr
}

func (lr *lpRank) call(typ byte, req any) (any, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	_, ans, err := lr.sess.Handle(context.Background(), typ, b)
	return ans, err
}

// step runs one step; it returns the first refusal.
func (lr *lpRank) step(step int64) error {
	full := lpReduced(lr.red.N, step)
	var ver uint64
	if lr.plan != nil && len(lr.plan.Ranges) > 0 {
		ver = lr.plan.Version
		d := lr.dep[step%2]
		for _, rg := range lr.plan.Ranges {
			copy(d[4*rg.Lo:4*rg.Hi], protect.Float32Bytes(full[rg.Lo:rg.Hi]))
		}
		lr.deposited++
	}
	g := full[lr.red.Off : lr.red.Off+lpN]
	copy(lr.grad[step%2], protect.Float32Bytes(g))
	h := lpHyper(step)
	replay.Step(lr.w, lr.m, lr.v, g, h.Consts())
	hy := &protect.Hyper{LR: h.LR, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, WeightDecay: h.WeightDecay, T: h.T}
	ans, err := lr.call(protect.TypeGradient, &protect.StepReq{Step: step, N: lpN, Hyper: hy, Deposits: ver})
	if err != nil {
		return err
	}
	if e := ans.(*protect.GradientDone).Err; e != "" {
		return fmt.Errorf("Gradient(%d): %s", step, e)
	}
	ans, err = lr.call(protect.TypeStage, &protect.StepReq{Step: step})
	if err != nil {
		return err
	}
	sd := ans.(*protect.Staged)
	if sd.Err != "" {
		return fmt.Errorf("Stage(%d): %s", step, sd.Err)
	}
	lr.plan = sd.Deposits
	opt := slices.Concat(protect.Float32Bytes(lr.w), protect.Float32Bytes(lr.m), protect.Float32Bytes(lr.v))
	meta := make([]byte, 64)
	binary.LittleEndian.PutUint64(meta, uint64(step))
	copy(lr.views[sd.Slot][0], opt)
	copy(lr.views[sd.Slot][1], meta)
	ans, err = lr.call(protect.TypeCommit, &protect.StepReq{Step: step})
	if err != nil {
		return err
	}
	if e := ans.(*protect.Committed).Err; e != "" {
		return fmt.Errorf("Commit(%d): %s", step, e)
	}
	lr.states[step] = map[string][]byte{"optimizer": opt, "meta": meta}
	return nil
}

// checkRestore checks that holder host hh restores owner lr's step
// bitwise.
func (lr *lpRank) checkRestore(hh *Keeper, step int64) {
	lr.t.Helper()
	_, got, err := hh.store.restoreDiff(lr.r, step, nil)
	if err != nil {
		lr.t.Fatalf("rank %d step %d from host %d: %v", lr.r, step, hh.cfg.Host, err)
	}
	for name, want := range lr.states[step] {
		if !bytes.Equal(got[name], want) {
			lr.t.Fatalf("rank %d step %d from host %d: region %s differs from the committed state", lr.r, step, hh.cfg.Host, name)
		}
	}
}

// lpJob is n hosts with rank r on host r, rank r held by rank r+1 mod n,
// all of them one data-parallel group.
type lpJob struct {
	t     *testing.T
	c     *cluster
	ranks []*lpRank
	live  []bool
}

func newLPJob(t *testing.T, n int, reds []protect.Reduced) *lpJob {
	ranks := make([][]int, n)
	holders := make([][]int, n)
	all := make([]int, n)
	for r := range n {
		ranks[r], holders[r], all[r] = []int{r}, []int{(r + 1) % n}, r
	}
	c := newClusterWith(t, ranks, holders, func(int) []int { return all }, lpMod)
	j := &lpJob{t: t, c: c}
	for r := range n {
		j.ranks = append(j.ranks, newLPRank(t, c.hosts[r], r, reds[r]))
		j.live = append(j.live, true)
	}
	return j
}

// step runs step on every live rank, in rank order (a holder's host may
// get the owner's differential before its local peer committed the step),
// waits until every live rank's step is replicated, checks that each
// holder restores it bitwise, and publishes G (the live ranks').
func (j *lpJob) step(step int64) {
	j.t.Helper()
	for r, lr := range j.ranks {
		if j.live[r] {
			if err := lr.step(step); err != nil {
				j.t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	g := int64(protect.MaxStep)
	for r := range j.ranks {
		if !j.live[r] {
			continue
		}
		j.c.waitFor(fmt.Sprintf("rank %d step %d replicated", r, step), func() bool { return j.c.progress(r).Replicated >= step })
		rep := j.c.progress(r).Replicated
		for _, hr := range j.c.holders[r] {
			j.ranks[r].checkRestore(j.c.hosts[j.c.hostOf[hr]], rep)
		}
		g = min(g, rep)
	}
	for _, h := range j.c.hosts {
		h.SetG(h.Gen(), g)
	}
}

func TestLocalPeerRestoresBitwise(t *testing.T) {
	const steps = 24
	p := int64(2 * lpN)
	j := newLPJob(t, 2, []protect.Reduced{{N: p, Off: 0}, {N: p, Off: lpN}})
	for s := range int64(steps) {
		j.step(s)
	}
	for r := range j.ranks {
		pr := j.c.progress(r)
		t.Logf("rank %d: %d differentials by reference, %d with the record, %d bytes of differentials, %d of bases", r, pr.DiffLocal, pr.DiffNet, pr.ReplDiffBytes, pr.ReplBaseBytes)
		// The first differential after the base may find no plan yet (the
		// peer learns it at its next Stage): at most those few go with
		// the record.
		if pr.DiffLocal < steps-4 {
			t.Errorf("rank %d: %d of %d differentials by reference", r, pr.DiffLocal, steps)
		}
		// A reference carries no gradient: far fewer bytes than a step's
		// gradient each.
		if per := pr.ReplDiffBytes / max(pr.DiffLocal+pr.DiffNet, 1); pr.DiffNet == 0 && per > 4*lpN/4 {
			t.Errorf("rank %d: %d bytes per differential by reference", r, per)
		}
		if pr.SourceLocal != 1 || pr.SourceNet != 0 {
			t.Errorf("rank %d: %d holders use the local source now, %d the network; want 1, 0", r, pr.SourceLocal, pr.SourceNet)
		}
		if j.ranks[(r+1)%2].deposited == 0 {
			t.Errorf("rank %d deposited nothing", (r+1)%2)
		}
	}
}

// TestLocalPeerDifferentSize: a peer whose reduced gradient has another
// size is no source: every differential goes with its record, after one
// reference answered failNoPeer.
func TestLocalPeerDifferentSize(t *testing.T) {
	j := newLPJob(t, 2, []protect.Reduced{{N: 2 * lpN, Off: 0}, {N: 3 * lpN, Off: lpN}})
	for s := range int64(20) {
		j.step(s)
	}
	for r := range j.ranks {
		pr := j.c.progress(r)
		if pr.DiffLocal != 0 || pr.DiffNet < 19 {
			t.Errorf("rank %d: %d differentials by reference, %d with the record", r, pr.DiffLocal, pr.DiffNet)
		}
		if j.ranks[r].deposited != 0 {
			t.Errorf("rank %d deposited %d times", r, j.ranks[r].deposited)
		}
	}
}

// TestLocalPeerCopyInterrupted: the local peer's copy of a deposit is
// interrupted (and, killed, the peer's session ends there and it runs
// no more steps): the holder falls back to the network for that step and
// the following ones, every step its owner calls replicated restores
// bitwise, and a peer that goes on becomes the source again.
func TestLocalPeerCopyInterrupted(t *testing.T) {
	const at, steps = 9, 40
	for _, tc := range []struct {
		name string
		kill bool
	}{{"interrupted", false}, {"killed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := int64(2 * lpN)
			j := newLPJob(t, 2, []protect.Reduced{{N: p, Off: 0}, {N: p, Off: lpN}})
			var mu sync.Mutex
			hit := 0
			testHookDepositCopy = func(rank int, step int64, owner int) bool {
				if rank != 1 || step != at {
					return true
				}
				mu.Lock()
				hit++
				mu.Unlock()
				if tc.kill {
					j.ranks[1].sess.Close()
				}
				return false
			}
			t.Cleanup(func() { testHookDepositCopy = nil })
			for s := range int64(steps) {
				j.step(s)
				if s == at && tc.kill {
					j.live[1] = false
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if hit != 1 {
				t.Fatalf("the copy hook ran %d times at step %d", hit, at)
			}
			pr := j.c.progress(0)
			t.Logf("rank 0: %d by reference, %d with the record", pr.DiffLocal, pr.DiffNet)
			switch {
			case pr.DiffNet < localRetry:
				t.Errorf("rank 0: %d differentials with the record after the copy failed at step %d, want ≥ %d", pr.DiffNet, at, localRetry)
			case !tc.kill && pr.DiffLocal < steps-localRetry-4:
				t.Errorf("rank 0: %d differentials by reference: the peer did not become the source again", pr.DiffLocal)
			case tc.kill && pr.DiffLocal > at+1:
				t.Errorf("rank 0: %d differentials by reference, with the peer dead from step %d", pr.DiffLocal, at)
			case tc.kill && (pr.SourceNet != 1 || pr.SourceLocal != 0):
				t.Errorf("rank 0 with its holder's peer dead: sources now %d local, %d network", pr.SourceLocal, pr.SourceNet)
			}
		})
	}
}

// TestLocalPeerPlanChange: the owner's holder moves to another host
// mid-run; the new holder's host makes its peer deposit, the old one's
// plan drops the owner, and every step stays restorable bitwise.
func TestLocalPeerPlanChange(t *testing.T) {
	p := int64(3 * lpN)
	j := newLPJob(t, 3, []protect.Reduced{{N: p, Off: 0}, {N: p, Off: lpN}, {N: p, Off: 2 * lpN}})
	for s := range int64(10) {
		j.step(s)
	}
	before := j.c.progress(0).DiffLocal
	// Rank 0's holder: rank 2 (host 2) instead of rank 1.
	holders := [][]int{{2}, {2}, {0}}
	j.c.place([]int{0, 1, 2}, []int{0, 1, 2}, holders, nil)
	for r, lr := range j.ranks {
		ans, err := lr.call(protect.TypeRestore, &protect.Empty{})
		if err != nil || ans.(*protect.Restorable).Err != "" {
			t.Fatalf("rank %d: restore in place: %v %+v", r, err, ans)
		}
	}
	for s := int64(10); s < 30; s++ {
		j.step(s)
	}
	if got := j.c.progress(0).DiffLocal; got < before+15 {
		t.Errorf("rank 0: %d differentials by reference after the change, %d before", got, before)
	}
	// Host 1 no longer holds rank 0: its rank deposits only rank 2's...
	// which it no longer holds either: nothing.
	s1 := j.c.hosts[1].svc(1)
	s1.mu.Lock()
	owners := slices.Clone(s1.dep.cur.owners)
	s1.mu.Unlock()
	if len(owners) != 0 {
		t.Errorf("rank 1 still deposits for %+v", owners)
	}
}

// TestLocalPeerDiesWhileHolderWaits: the holder waits for its local
// peer's commit of the owner's step; the peer's session ends instead
// (it died before its commit): the wait ends at once, the owner sends
// the step with its record, and it restores bitwise.
func TestLocalPeerDiesWhileHolderWaits(t *testing.T) {
	old := localWaitMax
	localWaitMax = time.Minute // only the session's end may end the wait in time
	t.Cleanup(func() { localWaitMax = old })
	p := int64(2 * lpN)
	j := newLPJob(t, 2, []protect.Reduced{{N: p, Off: 0}, {N: p, Off: lpN}})
	for s := range int64(5) {
		j.step(s)
	}
	before := j.c.progress(0)
	if err := j.ranks[0].step(5); err != nil {
		t.Fatal(err)
	}
	lp := j.c.hosts[1].local
	j.c.waitFor("the holder waiting for its peer", func() bool {
		lp.mu.Lock()
		defer lp.mu.Unlock()
		return lp.waiting > 0
	})
	j.ranks[1].sess.Close()
	j.c.waitFor("rank 0 step 5 replicated", func() bool { return j.c.progress(0).Replicated >= 5 })
	j.ranks[0].checkRestore(j.c.hosts[1], 5)
	if pr := j.c.progress(0); pr.DiffNet != before.DiffNet+1 || pr.DiffLocal != before.DiffLocal {
		t.Errorf("rank 0: %d/%d differentials by reference/with the record, before step 5 %d/%d", pr.DiffLocal, pr.DiffNet, before.DiffLocal, before.DiffNet)
	}
}
