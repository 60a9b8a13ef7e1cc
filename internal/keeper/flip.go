package keeper

import (
	"context"
	"errors"
	"slices"
	"time"
)

// ErrFlipMode is returned by [Keeper.FlipReplicas] on a host whose replicas
// are not whole buffers (--protect-mode diff, erasure coding).
var ErrFlipMode = errors.New("rank: only full-mode replicas (replicas:K) can be flipped")

// FlippedReplica is one replica buffer [Keeper.FlipReplicas] corrupted.
type FlippedReplica struct {
	Owner  int    // the rank whose replica it is
	Step   int64  // the complete step the buffer holds
	Region string // the region whose byte FlipByte was flipped
}

// FlipByte is the byte of a region [Keeper.FlipReplicas] flips (the last
// one in a region shorter): byte 3, the sign and high exponent bits of a
// little-endian float32 at the region's start, so that a copy restored
// without its CRC32C check would surely change the state, not by a few
// ulps of one value.
const FlipByte = 3

// flipLockPoll is how often FlipReplicas tries again an owner's lock
// held by a request in progress.
const flipLockPoll = 5 * time.Millisecond

// FlipReplicas is a debugging aid for the chaos suite (internal/chaos,
// fault replica-flip), reached only through the agent's
// GORUN_DEBUG_FLIP_REPLICAS hook: it flips byte FlipByte of the largest
// region in every complete replica buffer this host holds for other
// ranks (both of an owner's buffers: whichever step a restore asks for is
// corrupt here), leaving the owner's CRC32C table as it was, as memory
// corrupted after the put's check would. A restore reading such a copy
// must find the mismatch (fillRegion) and take another copy or fail.
//
// It never waits on a request in progress: an owner whose lock is held
// is tried again until ctx ends, and then returned in busy, untouched; an
// owner one of whose buffers a get is sending or a has checking
// (replicaBuf.pin) is
// returned in busy too, that buffer untouched. Only full mode keeps whole
// buffers: in diff mode or under erasure coding it flips nothing and
// returns ErrFlipMode.
func (h *Keeper) FlipReplicas(ctx context.Context) (flipped []FlippedReplica, busy []int, err error) {
	if h.diffMode() || h.place().ec != nil {
		return nil, nil, ErrFlipMode
	}
	st := h.store
	st.mu.Lock()
	owners := make([]int, 0, len(st.owners))
	for r := range st.owners {
		owners = append(owners, r)
	}
	st.mu.Unlock()
	slices.Sort(owners)
	for _, r := range owners {
		st.mu.Lock()
		o := st.owners[r]
		st.mu.Unlock()
		if o == nil {
			continue
		}
		if !lockBefore(ctx, &o.mu) {
			busy = append(busy, r)
			continue
		}
		f, sending := o.flip()
		o.mu.Unlock()
		flipped = append(flipped, f...)
		if sending {
			busy = append(busy, r)
		}
	}
	return flipped, busy, nil
}

// lockBefore locks mu, trying again every flipLockPoll while it is held,
// and reports whether it did before ctx ended.
func lockBefore(ctx context.Context, mu interface{ TryLock() bool }) bool {
	for !mu.TryLock() {
		t := time.NewTimer(flipLockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	return true
}

// flip flips byte FlipByte of the largest region of o's complete
// buffers, and returns what it flipped, and whether it left a buffer as
// it was because a get is sending it (replicaBuf.pin). o.mu is held.
func (o *ownerReplica) flip() (out []FlippedReplica, sending bool) {
	for i := range o.bufs {
		b := &o.bufs[i]
		if b.step < 0 || len(b.data) != len(b.table) {
			continue
		}
		if b.pinned() {
			sending = true
			continue
		}
		big := -1
		for j, d := range b.data {
			if len(d) > 0 && (big < 0 || len(d) > len(b.data[big])) {
				big = j
			}
		}
		if big < 0 {
			continue
		}
		d := b.data[big]
		d[min(FlipByte, len(d)-1)] ^= 0x5a
		out = append(out, FlippedReplica{Owner: o.rank, Step: b.step, Region: b.table[big].name})
	}
	return out, sending
}
