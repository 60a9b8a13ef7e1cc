package ckpt

import (
	"fmt"
	"sync/atomic"
)

// At returns the committed step step, with read-only views of its
// regions, once every region's CRC32C has verified; it is what a rank
// restoring to a step other than the newest (the newest globally
// recoverable one) reads. It returns an error wrapping ErrNoStep when
// neither slot holds step committed, one wrapping ErrCorrupt when the
// slot holding it does not verify (or both slots claim it). It never
// falls back to the other slot: the Snapshot's Fallback is nil.
//
// Like Newest, At notices a writer staging into the slot being read and
// reads again (the slot then no longer holds step, and At says so).
func (s *Slots) At(step uint64) (*Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, errClosed
	}
	for range maxReads {
		sn, changed, err := s.atOnce(step)
		if !changed {
			return sn, err
		}
		s.rereads.Add(1)
	}
	return nil, fmt.Errorf("ckpt: the writer overwrote the slot being read %d times", maxReads)
}

// atOnce is one try of At; changed says that the slot changed while it
// was read, and the try counts for nothing.
func (s *Slots) atOnce(step uint64) (sn *Snapshot, changed bool, err error) {
	var info [2]slotInfo
	for i := range info {
		info[i] = s.readInfo(i)
		if testReadHook != nil {
			testReadHook(i)
		}
	}
	slot := -1
	for i, in := range info {
		if in.state != stateCommitted || in.step != step {
			continue
		}
		if slot >= 0 {
			// No writer does this (see newestOnce).
			return nil, false, corruptErr("slots 0 and 1 both claim step %d", step)
		}
		slot = i
	}
	if slot < 0 {
		if s.readInfo(0) != info[0] || s.readInfo(1) != info[1] {
			// The headers moved between the two reads (see newestOnce).
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("%w: step %d (%s)", ErrNoStep, step, describe(info))
	}
	sums, err := s.verify(slot, step)
	if !s.unchanged(slot, info[slot]) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	sn = &Snapshot{Step: step, Slot: slot, s: s, views: make([][]byte, len(s.regions)), sums: sums}
	for j := range sn.views {
		sn.views[j] = s.maps[j].view(s.maps[j].ro, slot)
	}
	return sn, false, nil
}

// describe says what the slots' headers hold, for errors.
func describe(info [2]slotInfo) string {
	var d [2]string
	for i, in := range info {
		switch in.state {
		case stateEmpty:
			d[i] = "empty"
		case stateStaging:
			d[i] = "staging"
		case stateCommitted:
			d[i] = fmt.Sprintf("step %d", in.step)
		default:
			d[i] = fmt.Sprintf("state %#08x", in.state)
		}
	}
	return fmt.Sprintf("slot 0: %s, slot 1: %s", d[0], d[1])
}

// Truncate forgets the committed steps after step after: every slot
// holding one committed is marked staging (with the atomic swap Stage
// uses), which makes it invalid for every reader, in this process or
// another, and the slot the next Stage writes. A Staged in flight is
// abandoned whatever after is (its Commit fails). The slot holding after,
// or any step up to it, is not touched; when no committed step is after
// after, Truncate changes no slot.
//
// A rank restored to step G (read with At) calls Truncate(G), so that
// the next Stage(G+1) overwrites the slot of the forgotten steps, not
// the one holding G. Truncate verifies nothing.
func (s *Slots) Truncate(after uint64) error {
	return s.discard(func(step uint64) bool { return step > after })
}

// Clear discards every committed step, as Truncate does those after a
// step: the next Stage may stage any step. An abandoned Staged's Commit
// fails.
func (s *Slots) Clear() error {
	return s.discard(func(uint64) bool { return true })
}

func (s *Slots) discard(drop func(step uint64) bool) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errClosed
	}
	s.gen++
	for i := range 2 {
		if in := s.readInfo(i); in.state == stateCommitted && drop(in.step) {
			// A swap, as in Stage: a full barrier, and a reader
			// verifying the slot sees its state change and reads
			// again.
			atomic.SwapUint32(s.stateWord(i), stateStaging)
		}
	}
	return nil
}
