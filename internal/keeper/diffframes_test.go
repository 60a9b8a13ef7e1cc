package keeper

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/internal/protecthook"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// ---- Frames sent to a holder directly ---------------------------------

// holderConn runs f (a holder's handler) on one end of a pipe and
// returns the other end, for the test to write the request's data and
// read the answer.
func holderConn(t *testing.T, f func(c net.Conn) error) (net.Conn, chan error) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	errc := make(chan error, 1)
	go func() { errc <- f(b) }()
	return a, errc
}

// diffTable is the table of the replicated regions of owner dr at step.
func diffTable(regs map[string][]byte) []tableEntry {
	return []tableEntry{
		{name: "optimizer", size: diffRegions[0].Size, sum: crc32.Checksum(regs["optimizer"], castagnoli)},
		{name: "meta", size: 64, sum: crc32.Checksum(regs["meta"], castagnoli)},
	}
}

// sendBaseTo has host h's store receive a base of owner 0 for holder 1
// at step with regs; it returns the holder's answer.
func sendBaseTo(t *testing.T, h *Keeper, step int64, gen uint64, regs map[string][]byte) error {
	t.Helper()
	tb := diffTable(regs)
	hdr := linkHdr{kind: kindBase, owner: 0, holder: 1, step: step, gen: gen, length: optDescSize + tableBytes(tb)}
	c, errc := holderConn(t, func(c net.Conn) error { return h.store.base(c, hdr, tb) })
	o := diffOpt
	b := appendOptDesc(nil, 0, &o)
	b = append(b, regs["optimizer"]...)
	b = append(b, regs["meta"]...)
	go c.Write(b)
	_, err := readAnswer(c)
	if herr := <-errc; herr != nil {
		t.Fatal(herr)
	}
	return err
}

// sendDiffTo has host h's store take owner 0's differential of step
// (gradient g, hyper-parameters hy, encoded with opt) with the committed
// regions regs; it returns the holder's answer.
func sendDiffTo(t *testing.T, h *Keeper, step int64, gen uint64, g []float32, hy replay.Hyper, opt replay.Options, regs map[string][]byte) error {
	t.Helper()
	var tn replay.Tensor
	if err := replay.CompressInto(&tn, 0, g, opt); err != nil {
		t.Fatal(err)
	}
	rec, err := (&replay.Record{Step: uint64(step), Tensors: []*replay.Tensor{&tn}}).AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	d := diffstore.Diff{Step: step, Hyper: hy, Record: rec, Other: map[string][]byte{"meta": bytes.Clone(regs["meta"])}}
	d.Seal()
	tb := diffTable(regs)
	hdr := linkHdr{kind: kindDiff, owner: 0, holder: 1, step: step, gen: gen}
	c, errc := holderConn(t, func(c net.Conn) error { return h.store.takeDiff(c, hdr, tb, d) })
	_, err = readAnswer(c)
	if herr := <-errc; herr != nil {
		t.Fatal(herr)
	}
	return err
}

// ownerSteps is an owner's states stepped from seed's: regs[s] the
// replicated regions committed at s, grads[s] its gradients.
func ownerSteps(t *testing.T, c *cluster, n int64) (regs []map[string][]byte, grads [][]float32) {
	dr, err := newDiffRank(t, c.hosts[0], 0, 11, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	for s := range n {
		g := dr.gradient(s)
		replay.Step(dr.w, dr.m, dr.v, g, diffHyper(s).Consts())
		r := dr.regionsAt(s)
		delete(r, "params")
		regs, grads = append(regs, r), append(grads, g)
	}
	return regs, grads
}

// TestDiffBaseKeepsAckedSteps (finding 7): the holder holds an old store
// A (which holds its G) and a newer B, whose steps it acknowledged; a
// third base C must not drop B's acknowledged steps.
func TestDiffBaseKeepsAckedSteps(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000)
	h := c.hosts[1]
	regs, grads := ownerSteps(t, c, 12)
	lossless := replay.Options{Lossless: true}
	h.SetG(0, 2)
	if err := sendBaseTo(t, h, 0, 0, regs[0]); err != nil {
		t.Fatal(err)
	}
	for s := int64(1); s <= 3; s++ {
		if err := sendDiffTo(t, h, s, 0, grads[s], diffHyper(s), lossless, regs[s]); err != nil {
			t.Fatal(err)
		}
	}
	if err := sendBaseTo(t, h, 5, 0, regs[5]); err != nil {
		t.Fatal(err)
	}
	for s := int64(6); s <= 7; s++ {
		if err := sendDiffTo(t, h, s, 0, grads[s], diffHyper(s), lossless, regs[s]); err != nil {
			t.Fatal(err)
		}
	}
	err := sendBaseTo(t, h, 9, 0, regs[9])
	t.Logf("base of step 9 with G 2: %v; the holder holds %v", err, heldRange(h, 0))
	for s := int64(2); s <= 7; s++ {
		if s == 4 {
			continue // never acknowledged
		}
		copyOutEq(t, h, 0, s, regs[s])
	}
	if err == nil {
		copyOutEq(t, h, 0, 9, regs[9])
	}
	// Once G reaches B's step, A may go and C comes in.
	h.SetG(0, 5)
	if err := sendBaseTo(t, h, 9, 0, regs[9]); err != nil {
		t.Fatal(err)
	}
	for s := int64(5); s <= 7; s++ {
		copyOutEq(t, h, 0, s, regs[s])
	}
	copyOutEq(t, h, 0, 9, regs[9])
	// hasDiff looks at the previous store too.
	o := h.store.owner(0)
	o.mu.Lock()
	has := o.hasDiff(linkHdr{owner: 0, holder: 1, step: 6}, diffTable(regs[6]), false)
	o.mu.Unlock()
	if !has {
		t.Errorf("has of step 6, held by the previous store: refused")
	}
}

// TestDiffLosslessRefusesInexact (finding 11): a lossless job's holder
// that holds a lossy differential (an owner configured otherwise) refuses
// to restore it rather than serve an approximation.
func TestDiffLosslessRefusesInexact(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000)
	h := c.hosts[1]
	regs, grads := ownerSteps(t, c, 3)
	if err := sendBaseTo(t, h, 0, 0, regs[0]); err != nil {
		t.Fatal(err)
	}
	if err := sendDiffTo(t, h, 1, 0, grads[1], diffHyper(1), replay.Options{}, regs[1]); err != nil {
		t.Fatal(err)
	}
	dst := map[string][]byte{"optimizer": make([]byte, diffRegions[0].Size), "meta": make([]byte, 64)}
	err := h.store.copyOut(0, 1, dst)
	if err == nil || !strings.Contains(err.Error(), "lossless") {
		t.Fatalf("restore of an inexact step in a lossless job: %v", err)
	}
}

// TestProgressByteCounters (finding 8): reports taken while a round adds
// its bytes always satisfy ReplBaseBytes + ReplDiffBytes ≤ ReplBytes (the
// launcher drops a report that does not).
func TestProgressByteCounters(t *testing.T) {
	c, _ := twoHostDiff(t, 100, 1000)
	s := c.hosts[0].place().svcs[0]
	p := c.hosts[0].place()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				s.addReplBytes(3, 5)
			}
		}
	})
	bad := 0
	for range 200000 {
		pr := s.progress(p)
		if pr.ReplBaseBytes+pr.ReplDiffBytes > pr.ReplBytes {
			bad++
		}
	}
	close(stop)
	wg.Wait()
	if bad > 0 {
		t.Errorf("%d of 200000 reports had base + diff bytes > total", bad)
	}
}

// TestDiffResendFromHolderNext: the owner believes the holder takes step
// 7 next (its differentials of 4 to 6 lost on the way) while the holder
// lacks them: the holder refuses step 7 with a gap and its Next (4), and
// the owner resends 4, 5, 6 and 7 from its queue (no base).
func TestDiffResendFromHolderNext(t *testing.T) {
	var mu sync.Mutex
	var sent []int64
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if h.owner == 0 && (h.kind == kindDiff || h.kind == kindBase) {
			mu.Lock()
			if h.kind == kindBase {
				sent = append(sent, -100-h.step)
			} else {
				sent = append(sent, h.step)
			}
			mu.Unlock()
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	c, _ := twoHostDiff(t, 100, 1000)
	dr, err := newDiffRank(t, c.hosts[0], 0, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	if _, err := dr.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	stepsG(t, c, dr, 0, 0, 3)
	// Steps 4 to 7 commit while the replicator is paused (the test is
	// the launcher: G lets the stages go on).
	r := &c.hosts[0].place().svcs[0].rep
	r.pause()
	for s := int64(4); s <= 7; s++ {
		if err := dr.step(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		c.hosts[0].SetG(0, s)
	}
	k := holderKey{rank: 1, host: 1}
	r.mu.Lock()
	r.acked[k], r.dnext[k] = 3, 7 // 4 to 6 went, and were lost
	r.mu.Unlock()
	mu.Lock()
	sent = nil
	mu.Unlock()
	r.resume(7)
	c.waitFor("step 7 replicated", func() bool { return c.progress(0).Replicated >= 7 })
	mu.Lock()
	got := fmt.Sprint(sent)
	mu.Unlock()
	if got != "[7 4 5 6 7]" {
		t.Errorf("the owner sent %s, want [7 4 5 6 7] (refused as a gap, then from the holder's Next)", got)
	}
	for s := int64(4); s <= 7; s++ {
		copyOutEq(t, c.hosts[1], 0, s, dr.want(s))
	}
}

// TestClientGradientWaitsForHalf (finding 10): Gradient(s+1) while the
// staging of step s-1 (the same half of the gradient buffer) is in
// flight waits for it rather than write the half the service reads at
// s-1's Commit.
func TestClientGradientWaitsForHalf(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{})
	protecthook.Staged = func(step int64) {
		if step == 2 {
			close(held)
			<-release
		}
	}
	t.Cleanup(func() { protecthook.Staged = nil })
	c, _ := twoHostDiff(t, 100, 1000)
	o := diffOpt
	ctx := context.Background()
	cl, err := protect.Connect(ctx, diffRegions, protect.Options{Socket: c.sockets[0], Optimizer: &o})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	data := map[string][][]byte{}
	for _, r := range diffRegions {
		data[r.Name] = [][]byte{make([]byte, r.Size)}
	}
	grad := func(s int64) []float32 {
		g := make([]float32, diffN)
		for i := range g {
			g[i] = float32(s) + float32(i)/diffN
		}
		return g
	}
	for s := int64(0); s <= 2; s++ {
		if err := cl.Gradient(ctx, s, grad(s), diffHyper(s)); err != nil {
			t.Fatal(err)
		}
		if err := cl.Stage(ctx, s, data); err != nil {
			t.Fatal(err)
		}
		if s < 2 {
			if err := cl.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			for _, h := range c.hosts {
				h.SetG(0, s) // the test is the launcher
			}
		}
	}
	<-held // step 2 is copied into its slot, not committed
	if err := cl.Gradient(ctx, 3, grad(3), diffHyper(3)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cl.Gradient(ctx, 4, grad(4), diffHyper(4)) }()
	var err4 error
	returned := false
	select {
	case err4 = <-done:
		returned = true
		t.Errorf("Gradient(4) returned (%v) while the staging of step 2 was in flight", err4)
	case <-time.After(300 * time.Millisecond):
	}
	torn := !slicesEqualF32(cl.GradientBuffer(2)[:diffN], grad(2))
	close(release)
	if torn {
		t.Errorf("Gradient(4) wrote step 2's half of the buffer before step 2 committed")
	}
	if !returned {
		err4 = <-done
	}
	if err4 != nil {
		t.Fatal(err4)
	}
}

func slicesEqualF32(a, b []float32) bool {
	return bytes.Equal(protect.Float32Bytes(a), protect.Float32Bytes(b))
}

// TestDiffCommitRacesRestart: a restart from G begins while a Commit,
// which checked the generation before, is about to hand its step to the
// replicator. The step (after G) must not reach the holder then, nor be
// sent later labelled with the new generation: the restarted rank
// commits that step again with other gradients, and its holder must
// restore the new states, step by step. (Without the hand-off's second
// generation check the old step is queued after the truncation and sent
// in the new generation: the holder then holds the old step, and
// refuses the new one as a step resent with another record.)
func TestDiffCommitRacesRestart(t *testing.T) {
	c, _ := twoHostDiff(t, 4, 100)
	rs := startDiffRanks(t, c, 2, 7)
	runSteps(t, c, rs, 0, 5)
	var once sync.Once
	testHookHandOff = func(r int, step int64) {
		if r != 0 || step != 6 {
			return
		}
		once.Do(func() {
			for _, h := range c.hosts {
				if err := h.Restart(1, 5); err != nil {
					t.Error(err)
				}
			}
		})
	}
	t.Cleanup(func() { testHookHandOff = nil })
	if err := rs[0].step(context.Background(), 6); err != nil {
		t.Fatal(err) // its Commit checked the generation before the restart
	}
	testHookHandOff = nil
	r := &c.hosts[0].svc(0).rep
	r.mu.Lock()
	for _, od := range r.dq {
		if od.step > 5 {
			t.Errorf("the replicator queued step %d after the restart from step 5", od.step)
		}
	}
	r.mu.Unlock()
	for _, rg := range heldRange(c.hosts[1], 0) {
		if rg[1] > 5 {
			t.Errorf("rank 0's holder holds steps %d to %d after the restart from step 5", rg[0], rg[1])
		}
	}
	// The ranks start again from 5 with other gradients (another seed).
	again := make([]*diffRank, 2)
	for i, old := range rs {
		dr, err := newDiffRank(t, c.hosts[i], i, 8, old.states)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dr.close)
		if res, err := dr.restore(context.Background()); err != nil || res.Step != 5 {
			t.Fatalf("rank %d: restore %+v, %v; want step 5", i, res, err)
		}
		again[i] = dr
	}
	runSteps(t, c, again, 6, 12)
	checkTier2(t, c.hosts[0], c.hosts[1], 1, again[0], c.publishG())
}
