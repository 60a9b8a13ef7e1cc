package keeper

import "slices"

// Diff mode under erasure coding (issue 16): the seam between the owner's
// side (the retained base snapshot, ecdiff_owner.go) and the restore side
// (Keeper.shardRange serving a member's shard at H).

// retainedBase calls read with the owner's retained snapshot of base step
// step, when the rank runs on its own data host and keeps it (diff mode
// under EC, PROTOCOL.md "Erasure coding and diff mode"): its table (the
// replicated regions with their CRC32Cs at step) and the regions' bytes
// in table order. The snapshot is not released while read runs. It
// reports false, without calling read, when no snapshot of step is kept.
func (s *service) retainedBase(step int64, read func(t []tableEntry, data [][]byte) error) (bool, error) {
	r := &s.rep
	r.mu.Lock()
	var ref *refresh
	for _, x := range r.ecb.retained {
		if x.step == step {
			ref = x
		}
	}
	if ref == nil {
		r.mu.Unlock()
		return false, nil
	}
	ref.rb.retain()
	r.mu.Unlock()
	defer ref.rb.release()
	return true, read(slices.Clone(ref.table), ref.views())
}
