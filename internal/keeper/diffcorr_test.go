package keeper

// Tests of diff mode's correctness findings (generations, resent steps,
// fold verification, refusals the holder cannot resolve, the choice of
// store a base keeps, byte counters, the gradient's halves, lossless
// restores) and of the owner's resend from a holder's Next after a gap.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// stepWith is diffRank.step with hyper-parameters h (and, if tweak is
// set, the optimizer state changed by it after the replay step: a
// trainer whose optimizer is not replay's).
func stepWith(ctx context.Context, dr *diffRank, step int64, h replay.Hyper, tweak func(w []float32)) error {
	g := dr.gradient(step)
	replay.Step(dr.w, dr.m, dr.v, g, h.Consts())
	if tweak != nil {
		tweak(dr.w)
	}
	copy(dr.grad[step%2], protect.Float32Bytes(g))
	hy := &protect.Hyper{LR: h.LR, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, WeightDecay: h.WeightDecay, T: h.T}
	req, _ := json.Marshal(&protect.StepReq{Step: step, N: diffN, Hyper: hy})
	_, ans, err := dr.sess.Handle(ctx, protect.TypeGradient, req)
	if err != nil {
		return err
	}
	if e := ans.(*protect.GradientDone).Err; e != "" {
		return fmt.Errorf("Gradient(%d): %s", step, e)
	}
	sreq := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err = dr.sess.Handle(ctx, protect.TypeStage, sreq)
	if err != nil {
		return err
	}
	sd := ans.(*protect.Staged)
	if sd.Err != "" {
		return fmt.Errorf("Stage(%d): %s", step, sd.Err)
	}
	regs := dr.regionsAt(step)
	for i, reg := range diffRegions {
		copy(dr.views[sd.Slot][i], regs[reg.Name])
	}
	_, ans, err = dr.sess.Handle(ctx, protect.TypeCommit, sreq)
	if err != nil {
		return err
	}
	if e := ans.(*protect.Committed).Err; e != "" {
		return fmt.Errorf("Commit(%d): %s", step, e)
	}
	dr.mu.Lock()
	dr.states[step] = map[string][]byte{"optimizer": regs["optimizer"], "meta": regs["meta"]}
	dr.mu.Unlock()
	return nil
}

// stepsG has rank dr (alone in stepping) commit steps from to to, each
// replicated before the next, and tells hosts G = each step once it is
// (the test is the launcher; gen is their generation).
func stepsG(t *testing.T, c *cluster, dr *diffRank, gen uint64, from, to int64) {
	t.Helper()
	for s := from; s <= to; s++ {
		if err := dr.step(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		c.waitFor(fmt.Sprintf("rank %d's step %d replicated", dr.r, s), func() bool { return c.progress(dr.r).Replicated >= s })
		for _, h := range c.hosts {
			h.SetG(gen, s)
		}
	}
}

// copyOutEq checks that host h restores owner's step to want.
func copyOutEq(t *testing.T, h *Keeper, owner int, step int64, want map[string][]byte) {
	t.Helper()
	dst := map[string][]byte{"optimizer": make([]byte, diffRegions[0].Size), "meta": make([]byte, 64)}
	if err := h.store.copyOut(owner, step, dst); err != nil {
		t.Fatalf("rank %d step %d on host %d: %v", owner, step, h.cfg.Host, err)
	}
	for name, b := range want {
		if !bytes.Equal(dst[name], b) {
			t.Fatalf("rank %d step %d on host %d: region %s differs from the commit", owner, step, h.cfg.Host, name)
		}
	}
}

// TestDiffRestartKeepsNewGeneration (finding 2): the holder's host
// restarts late, after the owner's rank restored from G = 5 in the new
// generation and the holder acknowledged its step 6: the holder keeps
// step 6 (full mode keeps the buffers of the new generation).
func TestDiffRestartKeepsNewGeneration(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000)
	dr, err := newDiffRank(t, c.hosts[0], 0, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	if _, err := dr.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	stepsG(t, c, dr, 0, 0, 5)
	if err := c.hosts[0].Restart(1, 5); err != nil {
		t.Fatal(err)
	}
	dr2, err := newDiffRank(t, c.hosts[0], 0, 3, dr.states)
	if err != nil {
		t.Fatal(err)
	}
	defer dr2.close()
	if res, err := dr2.restore(context.Background()); err != nil || res.Step != 5 {
		t.Fatalf("restore: %+v, %v", res, err)
	}
	stepsG(t, c, dr2, 1, 6, 6) // host 1 is still in generation 0: its G stays
	if err := c.hosts[1].Restart(1, 5); err != nil {
		t.Fatal(err)
	}
	if got := heldRange(c.hosts[1], 0); len(got) == 0 || got[0][1] < 6 {
		t.Fatalf("after its late restart the holder holds %v, want step 6 (acknowledged in generation 1)", got)
	}
	copyOutEq(t, c.hosts[1], 0, 6, dr2.want(6))
	// has confirms step 6 in the new generation: a second late restart
	// keeps it too.
	if err := c.hosts[1].Restart(1, 5); err != nil {
		t.Fatal(err)
	}
	copyOutEq(t, c.hosts[1], 0, 6, dr2.want(6))
}

// restoreInPlace has rank 0 (committed past g, G told g) restore in
// place: a new session on its host, Tier 1.
func restoreInPlace(t *testing.T, c *cluster, dr *diffRank, g int64) *diffRank {
	t.Helper()
	dr2, err := newDiffRank(t, c.hosts[c.hostOf[dr.r]], dr.r, dr.seed, dr.states)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dr2.close)
	if res, err := dr2.restore(context.Background()); err != nil || res.Step != g || res.Tier != 1 {
		t.Fatalf("restore: %+v, %v; want step %d tier 1", res, err, g)
	}
	return dr2
}

// TestDiffResentStepOtherCommit (finding 3): the owner restores in place
// to G = 6 (same generation: the holder keeps its step 7) and commits
// step 7 again with the same gradient and another meta byte: the holder
// must not take the resent step as a no-op; its step 7 restores to the
// new commit.
func TestDiffResentStepOtherCommit(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000)
	dr, err := newDiffRank(t, c.hosts[0], 0, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	if _, err := dr.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	stepsG(t, c, dr, 0, 0, 6)
	if err := dr.step(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	c.waitFor("step 7 replicated", func() bool { return c.progress(0).Replicated >= 7 })
	dr2 := restoreInPlace(t, c, dr, 6)
	dr2.meta[40] ^= 0xff
	if err := dr2.step(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	c.waitFor("step 7 replicated again", func() bool { return c.progress(0).Replicated >= 7 })
	copyOutEq(t, c.hosts[1], 0, 7, dr2.want(7))
}

// TestDiffFoldVerifies (finding 4): a trainer whose optimizer step is not
// replay's (its step 3 changes a weight beyond the replay): the holder's
// fold finds the replayed state differs from the commit, keeps its base,
// and the owner's rank fails with an error naming the rank and the step.
func TestDiffFoldVerifies(t *testing.T) {
	c, _ := twoHostDiff(t, 2, 1000)
	dr, err := newDiffRank(t, c.hosts[0], 0, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	if _, err := dr.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for s := int64(0); ; s++ {
			var tweak func([]float32)
			if s == 3 {
				tweak = func(w []float32) { w[7] += 0.5 }
			}
			if err := stepWith(ctx, dr, s, diffHyper(s), tweak); err != nil {
				done <- err
				return
			}
			c.waitFor("replicated", func() bool { return ctx.Err() != nil || c.progress(0).Replicated >= s || len(c.failed) > 0 })
			for _, h := range c.hosts {
				h.SetG(0, s)
			}
			if s >= 40 {
				done <- nil
				return
			}
		}
	}()
	var f hostFailure
	select {
	case f = <-c.failed:
	case err := <-done:
		t.Fatalf("the rank stepped on (%v) and never failed: the holder folded a replay that differs from the commit", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no failure")
	}
	cancel()
	<-done
	if f.rank != 0 || !errors.Is(f.err, ErrReplayDiffers) || !strings.Contains(f.err.Error(), "rank 0") {
		t.Fatalf("failure %+v", f)
	}
	if rg := heldRange(c.hosts[1], 0); len(rg) == 0 || rg[0][0] >= 3 {
		t.Errorf("the holder's base passed the step whose replay differs: it holds %v", rg)
	}
}

// TestDiffGradientTAfterRestore (finding 5, the service): after a restore
// in place to G, the next Gradient's optimizer step must follow G's.
func TestDiffGradientTAfterRestore(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000)
	dr, err := newDiffRank(t, c.hosts[0], 0, 6, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	if _, err := dr.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	stepsG(t, c, dr, 0, 0, 6)
	if err := dr.step(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	dr2 := restoreInPlace(t, c, dr, 6)
	h := diffHyper(7)
	h.T = 1
	err = stepWith(context.Background(), dr2, 7, h, nil)
	if err == nil || !strings.Contains(err.Error(), "after optimizer step 7") {
		t.Fatalf("Gradient of step 7 with T 1 after a restore to step 6 (T 7): %v", err)
	}
	if err := dr2.step(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	c.waitFor("step 7 replicated", func() bool { return c.progress(0).Replicated >= 7 })
}

// TestDiffMismatchSendsBase (finding 5, the holder): after a Tier-2
// restore (the service does not know G's optimizer step) the rank's
// next differential does not follow the holder's (another T): the holder
// cannot take it, and the owner sends a base instead of the same
// differential forever.
func TestDiffMismatchSendsBase(t *testing.T) {
	c, peers := twoHostDiff(t, 100, 1000)
	dr, err := newDiffRank(t, c.hosts[0], 0, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	if _, err := dr.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Rank 1 (rank 0's data-parallel peer, with its params) protects
	// its steps too.
	dr1, err := newDiffRank(t, c.hosts[1], 1, 7, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr1.close()
	if _, err := dr1.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	for s := int64(0); s <= 6; s++ {
		for _, d := range []*diffRank{dr, dr1} {
			if err := d.step(context.Background(), s); err != nil {
				t.Fatal(err)
			}
		}
		c.waitFor(fmt.Sprintf("step %d replicated", s), func() bool { return min(c.progress(0).Replicated, c.progress(1).Replicated) >= s })
		for _, h := range c.hosts {
			h.SetG(0, s)
		}
	}
	c.hosts[0].Close()
	restartWith(t, c, 0, []int{0}, peers, 1, 6)
	dr2, err := newDiffRank(t, c.hosts[0], 0, 7, dr.states)
	if err != nil {
		t.Fatal(err)
	}
	defer dr2.close()
	if res, err := dr2.restore(context.Background()); err != nil || res.Step != 6 || res.Tier != 2 {
		t.Fatalf("restore: %+v, %v", res, err)
	}
	base := c.progress(0).ReplBaseBytes
	for s := int64(7); s <= 9; s++ {
		h := diffHyper(s)
		h.T = int(s) - 6 // Adam's count starts again
		if err := stepWith(context.Background(), dr2, s, h, nil); err != nil {
			t.Fatal(err)
		}
		c.waitFor(fmt.Sprintf("step %d replicated", s), func() bool { return c.progress(0).Replicated >= s })
		for _, h := range c.hosts {
			h.SetG(1, s)
		}
	}
	if p := c.progress(0); p.ReplBaseBytes <= base {
		t.Errorf("no base sent: %+v", p)
	}
	copyOutEq(t, c.hosts[1], 0, 9, dr2.want(9))
}
