package ckpt

// A step's way through the slots: Stage and Commit write it (under the
// crash-point hook the crash tests stop them with), Newest and Committed
// read the newest committed one back, verified, as a Snapshot.

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/gorun/gorun/internal/crc32c"
)

// testWriteHook, when set, is called before each write of the header
// sequence of Stage and Commit with its index: 0 the staging mark, 1 the
// step, 2 to N+1 the region entries, N+2 the header CRC, N+3 the committed
// flag (N regions). Returning true stops the sequence there, as if the
// writing process had died: Stage or Commit returns errStopped having
// written nothing more. For the crash tests.
var testWriteHook func(write int) bool

// testReadHook, when set, is called by Newest and At after they read slot
// i's state and step, before they read the other slot's: the tests move the
// writer on between the two reads.
var testReadHook func(slot int)

var errStopped = errors.New("ckpt: stopped by the test hook")

func stopAt(write int) bool {
	return testWriteHook != nil && testWriteHook(write)
}

// Stage begins writing step into the slot that does not hold the newest
// committed step (slot 0 when neither holds one): it first marks that
// slot's header staging, so that a crash while it is written can never
// leave it looking valid, and returns the slot's writable views, one per
// region. Steps must increase: staging a step not after the newest
// committed one is an error. Staging again before committing abandons the
// earlier Staged (its Commit fails) and reuses its slot.
//
// Stage does not verify the committed slots' CRCs: with the newest
// committed slot corrupt, the slot it overwrites may have been the only
// good one. The overwrite rule, which the caller enforces, makes that
// safe: it stages step s only once step s-1 can be recovered elsewhere.
func (s *Slots) Stage(step uint64) (*Staged, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, errClosed
	}
	info := [2]slotInfo{s.readInfo(0), s.readInfo(1)}
	slot := 0
	if n := newestSlot(info); n >= 0 {
		if step <= info[n].step {
			return nil, fmt.Errorf("ckpt: cannot stage step %d: slot %d holds step %d, and steps must increase", step, n, info[n].step)
		}
		slot = 1 - n
	}
	if stopAt(0) {
		return nil, errStopped
	}
	// A swap, not a store: a full barrier, so that the mark is visible
	// before any byte of the slot changes (see the package comment).
	atomic.SwapUint32(s.stateWord(slot), stateStaging)
	if stopAt(1) {
		return nil, errStopped
	}
	atomic.StoreUint64(s.stepWord(slot), step)
	s.gen++
	st := &Staged{s: s, slot: slot, step: step, gen: s.gen, views: make([][]byte, len(s.regions))}
	for i := range st.views {
		st.views[i] = s.maps[i].view(s.maps[i].rw, slot)
	}
	return st, nil
}

// Staged is a step being written into a slot, from Stage to Commit.
type Staged struct {
	s     *Slots
	slot  int
	step  uint64
	gen   uint64
	views [][]byte
	sums  []uint32 // the regions' CRC32Cs, set by Commit
	done  bool     // committed; guarded by s.wmu
}

// Region returns the writable view of the named region in the staging
// slot, or nil if there is no such region. The view must not be written
// after Commit.
func (st *Staged) Region(name string) []byte {
	if i := st.s.regionIndex(name); i >= 0 {
		return st.views[i]
	}
	return nil
}

// Views returns the writable views of all regions, in Regions order.
func (st *Staged) Views() [][]byte {
	return slices.Clone(st.views)
}

// Slot returns the slot being written, 0 or 1.
func (st *Staged) Slot() int { return st.slot }

// Step returns the step being written.
func (st *Staged) Step() uint64 { return st.step }

// Commit computes each region's CRC32C, writes them and the sizes into the
// slot's header, then the header's own CRC, and sets the committed flag
// last with an atomic store: a reader in any process whose atomic load
// sees the flag sees the data (see the package comment). After Commit the
// slot holds the newest committed step. Commit fails if the Staged was
// committed already or abandoned by a later Stage.
func (st *Staged) Commit() error {
	s := st.s
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case s.closed:
		return errClosed
	case st.done:
		return fmt.Errorf("ckpt: step %d is committed already", st.step)
	case st.gen != s.gen:
		return fmt.Errorf("ckpt: step %d was abandoned by a later Stage", st.step)
	}
	if in := s.readInfo(st.slot); in.state != stateStaging || in.step != st.step {
		return fmt.Errorf("ckpt: slot %d changed while step %d was staged in it (now state %#08x, step %d): another writer?",
			st.slot, st.step, in.state, in.step)
	}
	h := s.slotHdr(st.slot)
	n := len(s.regions)
	sums := make([]uint32, n)
	for i, r := range s.regions {
		crc := checksum(st.views[i])
		sums[i] = crc
		if stopAt(2 + i) {
			return errStopped
		}
		e := h[entOff+entSize*i:][:entSize]
		ne.PutUint64(e, uint64(r.Size))
		ne.PutUint32(e[8:], crc)
		ne.PutUint32(e[12:], 0)
	}
	if stopAt(2 + n) {
		return errStopped
	}
	ne.PutUint32(h[4:], crc32c.Checksum(h[8:entOff+entSize*n]))
	if stopAt(3 + n) {
		return errStopped
	}
	atomic.StoreUint32(s.stateWord(st.slot), stateCommitted)
	st.done = true
	st.sums = sums
	return nil
}

// Sums returns the CRC32C of every region, in Regions order, once Commit
// succeeded (nil before).
func (st *Staged) Sums() []uint32 {
	st.s.wmu.Lock()
	defer st.s.wmu.Unlock()
	return slices.Clone(st.sums)
}

// maxReads bounds Newest's reads of slots that the writer keeps
// overwriting under it.
const maxReads = 16

// Newest returns the newest committed step whose every region's CRC32C
// verifies, with read-only views of its regions. If the newest committed
// slot does not verify, it falls back to the other one and says why in
// the Snapshot's Fallback. It returns an error wrapping ErrEmpty when no
// step was ever committed, one wrapping ErrCorrupt when no slot verifies.
//
// Newest reads every byte of the committed regions. If the writer stages
// into the slot being read meanwhile (which it does only two commits
// later), Newest notices and reads again, up to maxReads times, then
// returns an error wrapping ErrOutrun.
func (s *Slots) Newest() (*Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, errClosed
	}
	for range maxReads {
		sn, changed, err := s.newestOnce()
		if !changed {
			return sn, err
		}
		s.rereads.Add(1)
	}
	return nil, fmt.Errorf("%w: it overwrote the slot being read %d times", ErrOutrun, maxReads)
}

// newestOnce is one try of Newest; changed says that a slot changed while
// it was read, and the try counts for nothing.
func (s *Slots) newestOnce() (sn *Snapshot, changed bool, err error) {
	var info [2]slotInfo
	for i := range info {
		info[i] = s.readInfo(i)
		if testReadHook != nil {
			testReadHook(i)
		}
	}
	var errs []error
	var cands []int
	for i, in := range info {
		switch in.state {
		case stateEmpty, stateStaging:
		case stateCommitted:
			cands = append(cands, i)
		default:
			errs = append(errs, corruptErr("slot %d: state word %#08x is none of empty, staging, committed", i, in.state))
		}
	}
	if len(cands) == 2 {
		switch {
		case info[1].step > info[0].step:
			cands[0], cands[1] = 1, 0
		case info[1].step == info[0].step:
			// No writer does this: slots are staged with increasing
			// steps. Which one is right cannot be known.
			errs = append(errs, corruptErr("slots 0 and 1 both claim step %d", info[0].step))
		}
	}
	for _, i := range cands {
		sums, err := s.verify(i, info[i].step)
		if !s.unchanged(i, info[i]) {
			return nil, true, nil
		}
		if err == nil {
			sn := &Snapshot{Step: info[i].step, Slot: i, Fallback: errors.Join(errs...), s: s, views: make([][]byte, len(s.regions)), sums: sums}
			for j := range sn.views {
				sn.views[j] = s.maps[j].view(s.maps[j].ro, i)
			}
			return sn, false, nil
		}
		errs = append(errs, err)
	}
	// The two headers were read one after the other: a writer that
	// committed one slot and staged the other between the two reads makes
	// both look uncommitted (or both claim a step) though neither ever
	// was at one instant. The answer stands only if neither header moved.
	if s.readInfo(0) != info[0] || s.readInfo(1) != info[1] {
		return nil, true, nil
	}
	if len(errs) == 0 {
		return nil, false, ErrEmpty
	}
	return nil, false, errors.Join(errs...)
}

// verify checks committed slot i of step: its header's CRC and entries,
// and every region's CRC32C. Errors wrap ErrCorrupt.
func (s *Slots) verify(i int, step uint64) ([]uint32, error) {
	h := s.slotHdr(i)
	n := len(s.regions)
	if got, want := ne.Uint32(h[4:]), crc32c.Checksum(h[8:entOff+entSize*n]); got != want {
		return nil, corruptErr("slot %d (step %d): header CRC32C %#08x, its bytes give %#08x", i, step, got, want)
	}
	sums := make([]uint32, n)
	for j, r := range s.regions {
		e := h[entOff+entSize*j:][:entSize]
		if size := ne.Uint64(e); size != uint64(r.Size) {
			return nil, corruptErr("slot %d (step %d): region %q: size %d, the layout says %d", i, step, r.Name, size, r.Size)
		}
		if res := ne.Uint32(e[12:]); res != 0 {
			return nil, corruptErr("slot %d (step %d): region %q: reserved word %#x is not zero", i, step, r.Name, res)
		}
		sums[j] = ne.Uint32(e[8:])
		if got := checksum(s.maps[j].view(s.maps[j].ro, i)); got != sums[j] {
			return nil, corruptErr("slot %d (step %d): region %q: CRC32C %#08x, the data give %#08x", i, step, r.Name, sums[j], got)
		}
	}
	return sums, nil
}

// Snapshot is a committed step whose regions verified, as Newest found it.
type Snapshot struct {
	Step uint64 // the step
	Slot int    // the slot holding it, 0 or 1
	// Fallback is nil when nothing is wrong with the other slot; else it
	// wraps ErrCorrupt and says what: the newer committed step failed
	// to verify (this snapshot is then the older one), or the other
	// slot's state word is unreadable, or both slots claim this step.
	Fallback error

	s     *Slots
	views [][]byte
	sums  []uint32
}

// Sums returns every region's CRC32C, in Regions order, as committed and
// verified: a copy of the views made later can be checked against them
// (the writer may have staged over the slot meanwhile).
func (sn *Snapshot) Sums() []uint32 { return slices.Clone(sn.sums) }

// Region returns the read-only view of the named region (nil if there is
// no such region). The memory is mapped read-only: writing it faults. The
// view shows the slot as it is, and the slot is overwritten when the
// writer stages into it again (two steps later, under the overwrite
// rule); Valid tells whether it still holds this step.
func (sn *Snapshot) Region(name string) []byte {
	if i := sn.s.regionIndex(name); i >= 0 {
		return sn.views[i]
	}
	return nil
}

// Views returns the read-only views of all regions, in Regions order.
func (sn *Snapshot) Views() [][]byte {
	return slices.Clone(sn.views)
}

// Valid reports whether the snapshot's slot still holds its step,
// committed: a reader that copies the views elsewhere and then sees Valid
// true has copied exactly the verified bytes.
func (sn *Snapshot) Valid() bool {
	s := sn.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	return !s.closed && s.unchanged(sn.Slot, slotInfo{stateCommitted, sn.Step})
}

// Committed returns the steps the two slots' headers say they hold
// committed (0 and false for a slot that holds none: empty, being
// written, or unreadable), without verifying anything: cheap, for status.
func (s *Slots) Committed() (steps [2]uint64, ok [2]bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return
	}
	for i := range 2 {
		for range maxReads {
			in := s.readInfo(i)
			if atomic.LoadUint32(s.stateWord(i)) != in.state {
				continue
			}
			if in.state == stateCommitted {
				steps[i], ok[i] = in.step, true
			}
			break
		}
	}
	return steps, ok
}
