package rank

import (
	"errors"
	"slices"
)

// ErrFlipMode is returned by [Host.FlipReplicas] on a host whose replicas
// are not whole buffers (--protect-mode diff, erasure coding).
var ErrFlipMode = errors.New("rank: only full-mode replicas (replicas:K) can be flipped")

// FlippedReplica is one replica buffer [Host.FlipReplicas] corrupted.
type FlippedReplica struct {
	Owner  int    // the rank whose replica it is
	Step   int64  // the complete step the buffer holds
	Region string // the region whose first byte was flipped
}

// FlipReplicas is a debugging aid for the chaos suite (internal/chaos,
// fault replica-flip), reached only through the agent's
// GORUN_DEBUG_FLIP_REPLICAS hook: it flips the first byte of the largest
// region in every complete replica buffer this host holds for other
// ranks (both of an owner's buffers: whichever step a restore asks for is
// corrupt here), leaving the owner's CRC32C table as it was, as memory
// corrupted after the put's check would. A restore reading such a copy
// must find the mismatch (fillRegion) and take another copy or fail.
// Only full mode keeps whole buffers: in diff mode or under erasure
// coding it flips nothing and returns ErrFlipMode.
func (h *Host) FlipReplicas() ([]FlippedReplica, error) {
	if h.diffMode() || h.place().ec != nil {
		return nil, ErrFlipMode
	}
	st := h.store
	st.mu.Lock()
	owners := make([]int, 0, len(st.owners))
	for r := range st.owners {
		owners = append(owners, r)
	}
	st.mu.Unlock()
	slices.Sort(owners)
	var out []FlippedReplica
	for _, r := range owners {
		st.mu.Lock()
		o := st.owners[r]
		st.mu.Unlock()
		if o == nil {
			continue
		}
		o.mu.Lock()
		for i := range o.bufs {
			b := &o.bufs[i]
			if b.step < 0 || len(b.data) != len(b.table) {
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
			b.data[big][0] ^= 0x5a
			out = append(out, FlippedReplica{Owner: r, Step: b.step, Region: b.table[big].name})
		}
		o.mu.Unlock()
	}
	return out, nil
}
