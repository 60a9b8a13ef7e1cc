package keeper

// Failures landed inside a step while a base's shares are paced (the
// pacing tests of ecpace_test.go land them between steps, with the
// ranks waiting at the pacing): a host lost while the ranks have the
// next step staged over the base's slot and not committed, while a
// rank's commit is being handed to its replicator, and while a parity
// row takes the commit of the base's shares.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// stepAllAsync starts step s on every rank of pj and returns a wait for
// their errors (each rank's step's, in rank order). Nothing publishes G
// meanwhile: G must allow Stage(s) already.
func (pj *pacedJob) stepAllAsync(s int64) func() []error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	errs := make([]error, len(pj.rs))
	var wg sync.WaitGroup
	for i, dr := range pj.rs {
		wg.Go(func() { errs[i] = dr.step(ctx, s) })
	}
	return func() []error {
		wg.Wait()
		cancel()
		return errs
	}
}

// waitClosed waits for ch to be closed, at most a minute.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s: not after a minute", what)
	}
}

// finishWindow runs pj on from step from past the window of base
// paceEvery and the next base, and fails the test unless base
// paceEvery is coded by every rank and H reaches it.
func (pj *pacedJob) finishWindow(from int64) {
	pj.t.Helper()
	const b = paceEvery
	pj.run(from, 2*b+1)
	pj.c.waitFor(fmt.Sprintf("base %d coded by every rank", b), func() bool { return pj.coded(b) })
	pj.waitH(b)
}

// TestECPaceFailureInStep: diff mode under 2+1, a base every 8 steps (σ
// 4), base 8's shares paced. A host lost (every set of lost hosts, on the
// spares) at three moments inside a step leaves every rank recoverable
// bitwise at the G and H published then, and the job goes on to code
// base 8 after:
//   - every rank has step 10 staged (Stage and its writes, over the slot
//     that held base 8) and not committed, with base 8's shares halfway
//     through their window;
//   - rank 0's commit of step 10 is in progress: its slot is committed,
//     its replicator not told yet (testHookHandOff), the other ranks'
//     commits done or going;
//   - a parity row takes the commit of a rank's share of base 8 (the
//     window's last step committed, testHookECCommit), the other
//     members' commits waiting or done.
func TestECPaceFailureInStep(t *testing.T) {
	const b = paceEvery
	const sigma = paceEvery / 2
	t.Run("step staged, not committed", func(t *testing.T) {
		pj := newPacedJob(t)
		pj.stepAll(b + 1)
		pj.quiet(b + 1)
		pj.waitG(b + 1) // Stage(b+2) waits for G b+1
		regs := make([]map[string][]byte, len(pj.rs))
		for r, dr := range pj.rs {
			var err error
			if regs[r], err = dr.stage(context.Background(), b+2); err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		pj.pacedRuns(b) // base b's shares still mid-pace
		g, hb := pj.published()
		if hb != 0 || g < b {
			t.Fatalf("G %d, H %d: want G %d or later and H 0 while base %d's shares go", g, hb, b, b)
		}
		pj.everySubset(g, hb)
		for r, dr := range pj.rs {
			if err := dr.commit(context.Background(), b+2, regs[r]); err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		pj.quiet(b + 2)
		pj.finishWindow(b + 3)
	})
	t.Run("commit handed off", func(t *testing.T) {
		pj := newPacedJob(t)
		pj.stepAll(b + 1)
		pj.quiet(b + 1)
		pj.waitG(b + 1) // Stage(b+2) waits for G b+1: nothing is published meanwhile
		arrived, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		testHookHandOff = func(rank int, step int64) {
			if rank == 0 && step == b+2 {
				once.Do(func() {
					close(arrived)
					<-release
				})
			}
		}
		t.Cleanup(func() { testHookHandOff = nil })
		wait := pj.stepAllAsync(b + 2)
		waitClosed(t, arrived, "rank 0's commit of step 10 handed off")
		pj.pacedRuns(b)
		g, hb := pj.published()
		pj.everySubset(g, hb)
		close(release)
		for r, err := range wait() {
			if err != nil {
				t.Fatalf("rank %d step %d: %v", r, b+2, err)
			}
		}
		pj.quiet(b + 2)
		pj.finishWindow(b + 3)
	})
	t.Run("share's commit at a parity row", func(t *testing.T) {
		pj := newPacedJob(t)
		arrived, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		setECCommitHook(t, func(h linkHdr, e ecHdr) {
			if h.step == b {
				once.Do(func() {
					close(arrived)
					<-release
				})
			}
		})
		// Unblocked at the end whatever happens: the row's server
		// goroutine must not outlive the cluster.
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		for c := int64(b + 1); c < b+sigma-1; c++ {
			pj.stepAll(c)
			pj.quiet(c)
		}
		pj.stepAll(b + sigma - 1) // every byte allowed: the commits go
		waitClosed(t, arrived, fmt.Sprintf("a share's commit of base %d", b))
		if pj.coded(b) {
			t.Fatalf("base %d coded while a share's commit is held", b)
		}
		g, hb := pj.published()
		if hb != 0 {
			t.Fatalf("G %d, H %d: want H 0 while base %d's shares commit", g, hb, b)
		}
		pj.everySubset(g, hb)
		close(release)
		pj.finishWindow(b + sigma)
	})
}
