package keeper

// The retained snapshots' memory (diff mode under EC, ecdiff_owner.go): a
// rank on its own data host keeps its snapshot of base b_k, the shard's
// copy on that host, until H passes it. Like the copies, rows and logs
// this host keeps for others, it is reserved against the host's
// replica-memory reserve (replicaStore.reserve) before the snapshot is
// allocated, and a snapshot that does not fit is not taken: the base
// waits (the cap keeps Replicated at the bases coded, so no step is
// counted recoverable that a decode could not restore), and is tried
// again each round. The reservation of a snapshot goes back once it is
// neither the current refresh nor retained (settleSnapsLocked, after
// every change of either), and all of them when the replicator stops.
//
// The wait is bounded (snapNoRoomWait): what the reserve holds goes
// mostly when H moves, and H cannot pass this rank's base before the
// snapshot is taken, so a shortage that outlasts the bound is for good:
// G would stop at the cap and every rank wait at the overwrite rule with
// no error. The rank is failed instead (service.fail, Config.Failed),
// with errNoRoom naming the reserve, so that the launcher restarts or
// stops the job.

import (
	"fmt"
	"slices"
	"time"
)

// snapNoRoomWait is how long the snapshot of one base step may be
// refused by the reserve before the rank fails (tests shorten it), and
// snapNoRoomRetry how often the snapshot is asked for again meanwhile.
var (
	snapNoRoomWait  = slowWait
	snapNoRoomRetry = time.Second
)

// holdSnapLocked reserves size bytes for the snapshot of base step about
// to be taken, or logs (once per step) and returns why it cannot; stuck
// when the reserve has refused the step's snapshot for snapNoRoomWait
// (the rank is to fail with err). r.mu is held.
func (r *replicator) holdSnapLocked(step int64, size uint64) (stuck bool, err error) {
	b := &r.ecb
	if testHookSnapHold != nil {
		testHookSnapHold(r)
	}
	if err := r.s.h.store.reserve(b.heldBytes+size, b.heldBytes); err != nil {
		err = fmt.Errorf("%w: the snapshot of base step %d (%d bytes), retained on the rank's data host: %w", errNoRoom, step, size, err)
		if b.noRoom != step+1 {
			b.noRoom, b.noRoomSince = step+1, time.Now()
			r.s.h.log.Warn("a base waits: its snapshot does not fit in the host's replica-memory reserve", "rank", r.s.rank, "step", step, "err", err)
			r.retrySnapLocked()
			return false, err
		}
		if waited := time.Since(b.noRoomSince); waited >= snapNoRoomWait {
			r.stopSnapRetryLocked()
			return true, fmt.Errorf("rank %d: refused for %v (H cannot pass the base before its snapshot is taken): %w", r.s.rank, waited.Round(time.Millisecond), err)
		}
		r.retrySnapLocked()
		return false, err
	}
	r.stopSnapRetryLocked()
	b.heldBytes += size
	return false, nil
}

// retrySnapLocked has the loop run again while a base's snapshot waits
// for room (at most snapNoRoomRetry from now, and when the wait's bound
// is reached): nothing else would run it once the ranks wait at the
// overwrite rule (G at the cap: they commit nothing, and a round with
// nothing to send ends the loop), and both the retry and the bound are
// checked only when the loop asks again. r.mu is held.
func (r *replicator) retrySnapLocked() {
	b := &r.ecb
	r.stopSnapRetryLocked()
	d := min(snapNoRoomRetry, max(snapNoRoomWait-time.Since(b.noRoomSince), 0)) + time.Millisecond
	// While a round runs, its next round asks again, unless this was
	// its last: look again later.
	r.loopAfterLocked(&b.noRoomRetry, d, r.retrySnapLocked)
}

// stopSnapRetryLocked stops retrySnapLocked's timer. r.mu is held.
func (r *replicator) stopSnapRetryLocked() {
	if t := r.ecb.noRoomRetry; t != nil {
		t.Stop()
		r.ecb.noRoomRetry = nil
	}
}

// testHookSnapHold, if set (by tests), is called before a snapshot's
// reservation is asked for. r.mu is held.
var testHookSnapHold func(r *replicator)

// unholdSnapLocked gives back n bytes holdSnapLocked reserved for a
// snapshot not taken. r.mu is held.
func (r *replicator) unholdSnapLocked(n uint64) {
	b := &r.ecb
	n = min(n, b.heldBytes)
	r.s.h.store.reserve(b.heldBytes-n, b.heldBytes) // a shrink never fails
	b.heldBytes -= n
}

// heldSnapLocked records that snapshot ref holds the n bytes reserved
// for it (0: none). r.mu is held.
func (r *replicator) heldSnapLocked(ref *refresh, n uint64) {
	if n == 0 {
		return
	}
	b := &r.ecb
	if b.held == nil {
		b.held = map[*refresh]uint64{}
	}
	b.held[ref] += n
}

// settleSnapsLocked gives back the reservation of every snapshot that is
// neither the current refresh nor retained any more. r.mu is held.
func (r *replicator) settleSnapsLocked() {
	b := &r.ecb
	for ref, n := range b.held {
		if ref == r.ref || slices.Contains(b.retained, ref) {
			continue
		}
		delete(b.held, ref)
		r.unholdSnapLocked(n)
	}
}

// releaseSnaps gives back every snapshot's reservation: the replicator
// stopped (its service closes; it takes no snapshot any more).
func (r *replicator) releaseSnaps() {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &r.ecb
	clear(b.held)
	r.unholdSnapLocked(b.heldBytes)
}
