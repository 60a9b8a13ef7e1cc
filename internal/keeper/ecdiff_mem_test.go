package keeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// snapHeld returns what rank r's replicator holds reserved for its
// snapshots, checking the bookkeeping: each retained snapshot and only
// those (and the current refresh) hold a reservation, of the snapshot's
// size, and the sum is what the reserve counts for them.
func snapHeld(t *testing.T, s *service) (held uint64, retained int, noRoom int64) {
	t.Helper()
	r := &s.rep
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &r.ecb
	var sum uint64
	for ref, n := range b.held {
		if n != uint64(len(ref.buf)) {
			t.Fatalf("rank %d: the snapshot of step %d holds %d bytes reserved, it has %d", s.rank, ref.step, n, len(ref.buf))
		}
		sum += n
	}
	for _, ref := range b.retained {
		if _, ok := b.held[ref]; !ok {
			t.Fatalf("rank %d: the retained snapshot of step %d holds no reservation", s.rank, ref.step)
		}
	}
	if sum != b.heldBytes {
		t.Fatalf("rank %d: the snapshots hold %d bytes reserved, the replicator counts %d", s.rank, sum, b.heldBytes)
	}
	return b.heldBytes, len(b.retained), b.noRoom - 1
}

// TestECDiffRetainedReserve: a rank on its own data host (diff mode under
// EC) reserves its base snapshots, which it retains as its shard's copy
// there, against the host's replica-memory reserve before it takes them,
// and gives each back once neither current nor retained; a reserve with
// no room left refuses the next snapshot (the base waits, nothing is
// allocated, Base stays), which is taken once there is room; the
// replicator's stop gives every byte back.
func TestECDiffRetainedReserve(t *testing.T) {
	const k, m, every = 2, 2, 3
	// The hook is set before the job starts and put back after it closed
	// (the cleanup registered first runs last): its replicators read it.
	// It acts once armed, on the rank set then.
	var (
		hmu    sync.Mutex
		armed  *service // guarded by hmu; nil: the hook does nothing
		onHold func(x *replicator)
	)
	t.Cleanup(func() { testHookSnapHold = nil })
	testHookSnapHold = func(x *replicator) {
		hmu.Lock()
		defer hmu.Unlock()
		if armed != nil && x == &armed.rep {
			onHold(x)
		}
	}
	j := newECDiffRecJob(t, k, m, every, 0)
	r := ownDataRank(t, j)
	h := j.c.hosts[j.hostOf[r]]
	s := h.svc(r)
	j.run(0, 4*every)
	held, retained, _ := snapHeld(t, s)
	if held == 0 || retained == 0 {
		t.Fatalf("rank %d: %d snapshots retained, %d bytes reserved for them; want some", r, retained, held)
	}

	// No room left when the next base's snapshot is asked for (the
	// limit set just then, so that the holders here took the other
	// ranks' differentials up to it): it is refused, nothing reserved or
	// taken; at the next try (the next round) there is room again.
	calls := 0
	var heldAt [2]uint64
	var refAt [2]bool
	hmu.Lock()
	armed, onHold = s, func(x *replicator) {
		if calls >= 2 {
			return
		}
		heldAt[calls], refAt[calls] = x.ecb.heldBytes, x.ref != nil
		h.store.mu.Lock()
		if calls == 0 {
			h.store.limit = h.store.bytes
		} else {
			h.store.limit = 0
		}
		h.store.mu.Unlock()
		calls++
	}
	hmu.Unlock()
	j.run(4*every+1, 8*every)
	hmu.Lock()
	armed = nil
	n := calls
	hmu.Unlock()
	held, retained, noRoom := snapHeld(t, s)
	switch {
	case n < 2:
		t.Fatalf("rank %d: %d snapshots asked for after the limit was set, want 2", r, n)
	case noRoom != 5*every:
		t.Fatalf("rank %d: the reserve refused the snapshot of step %d, want %d", r, noRoom, 5*every)
	case heldAt[1] != heldAt[0] || refAt[0] || refAt[1]:
		t.Fatalf("rank %d: %d bytes reserved for snapshots when the reserve refused one, %d at the next try (a snapshot current: %v, %v); want no change, none", r, heldAt[0], heldAt[1], refAt[0], refAt[1])
	case held == 0 || retained == 0 || j.c.progress(r).Base < 7*every:
		t.Fatalf("rank %d: with room again: %d snapshots retained, %d bytes reserved, Base %d", r, retained, held, j.c.progress(r).Base)
	}

	h.store.mu.Lock()
	before := h.store.bytes
	h.store.mu.Unlock()
	s.rep.stop()
	s.rep.mu.Lock()
	got, n := s.rep.ecb.heldBytes, len(s.rep.ecb.held)
	s.rep.mu.Unlock()
	if got != 0 || n != 0 {
		t.Fatalf("after the replicator stopped: %d bytes reserved for %d snapshots", got, n)
	}
	h.store.mu.Lock()
	after := h.store.bytes
	h.store.mu.Unlock()
	if before-after < held {
		t.Fatalf("the replicator's stop gave %d bytes back to the reserve, its snapshots held %d", before-after, held)
	}
}

// TestECDiffRetainedReserveFull: a rank on its own data host whose next
// base's snapshot the host's replica-memory reserve keeps refusing (the
// reserve stays full: H cannot move past the base before the snapshot
// is taken, so nothing frees it) fails once the refusals outlast
// snapNoRoomWait (nothing: the second refusal; or 300 ms, after the ranks
// stopped committing: the loop is run again to ask, retrySnapLocked), with an
// error naming the reserve (errNoRoom) handed to Config.Failed and to
// the rank's next Stage, rather than leaving G at the cap and every rank
// waiting at the overwrite rule with no error.
func TestECDiffRetainedReserveFull(t *testing.T) {
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) { testRetainedReserveFull(t, wait) })
	}
}

func testRetainedReserveFull(t *testing.T, wait time.Duration) {
	const k, m, every = 2, 2, 3
	// The hook and the bound are set before the job starts and put back
	// after it closed (the cleanup registered first runs last): its
	// replicators read them.
	var cmu sync.Mutex
	var full *Keeper // the host whose reserve stays full, once set
	calls := map[int]int{}
	w, rt := snapNoRoomWait, snapNoRoomRetry
	t.Cleanup(func() { testHookSnapHold, snapNoRoomWait, snapNoRoomRetry = nil, w, rt })
	snapNoRoomWait, snapNoRoomRetry = wait, 20*time.Millisecond
	testHookSnapHold = func(x *replicator) {
		cmu.Lock()
		h := full
		if h == x.s.h {
			calls[x.s.rank]++
		}
		cmu.Unlock()
		if h != x.s.h {
			return
		}
		h.store.mu.Lock()
		h.store.limit = max(h.store.bytes, 1) // full: no snapshot fits (0 is the default limit)
		h.store.mu.Unlock()
	}
	j := newECDiffRecJob(t, k, m, every, 0)
	r := ownDataRank(t, j)
	h := j.c.hosts[j.hostOf[r]]
	j.run(0, 4*every)
	// Every rank of the host (each on its data host) is refused: the
	// first whose refusals outlast the bound fails.
	cmu.Lock()
	full = h
	cmu.Unlock()
	// The ranks go on (each until its first refused request) until the
	// rank fails.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stageErr := make([]error, len(j.rs))
	for i, dr := range j.rs {
		wg.Go(func() {
			for st := 4*every + 1; ctx.Err() == nil; st++ {
				if err := dr.step(ctx, int64(st)); err != nil {
					stageErr[i] = err
					return
				}
			}
		})
	}
	var f hostFailure
	j.c.waitFor(fmt.Sprintf("rank %d failed", r), func() bool {
		j.publish()
		select {
		case f = <-j.c.failed:
			return true
		default:
			return false
		}
	})
	cancel()
	wg.Wait()
	fr := f.rank
	if fr < 0 || fr >= len(j.hostOf) || j.hostOf[fr] != j.hostOf[r] || !errors.Is(f.err, errNoRoom) || !strings.Contains(f.err.Error(), "replica-memory reserve") {
		t.Fatalf("Config.Failed(rank %d, %v); want a rank of host %d failed with %v", fr, f.err, j.hostOf[r], errNoRoom)
	}
	cmu.Lock()
	n := calls[fr]
	cmu.Unlock()
	if n < 2 {
		t.Fatalf("rank %d failed after %d refusals of its snapshot, want at least 2", fr, n)
	}
	if err := h.svc(fr).failure(); !errors.Is(err, errNoRoom) {
		t.Fatalf("rank %d's service failure %v, want %v", fr, err, errNoRoom)
	}
	if err := stageErr[fr]; err == nil || !strings.Contains(err.Error(), "replica-memory reserve") {
		t.Fatalf("rank %d's last request: %v; want its Stage refused with the reserve named", fr, err)
	}
	t.Logf("rank %d: %v", fr, f.err)
}

// ownDataRank is a rank of j that runs on its own data host (no clear
// copy elsewhere: it retains its base snapshots).
func ownDataRank(t *testing.T, j *ecDiffRecJob) int {
	t.Helper()
	for x, hs := range j.holders {
		if len(hs) == 0 {
			return x
		}
	}
	t.Fatal("no rank runs on its data host")
	return -1
}
