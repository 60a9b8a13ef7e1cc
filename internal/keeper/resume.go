package keeper

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/protect"
)

// Resuming from disk (gorun --resume, after the whole job died): before
// its ranks start, the agent rebuilds each local rank's state at the step
// T every rank can reach from the durable tier (internal/cascade) and
// puts it into the rank's slots as committed step T (Preload): the ranks
// then start as after a restart in place, their first Restore answering T
// from their own slots (Tier 1), once the host's G is T (the launcher
// publishes T as G). Their holders are empty: the replicator sends them T
// at that restore, as after a restart. A rank's first ProtectHello must
// declare the regions stored (the manifest's), else it is refused, saying
// so; it gets its gradient buffer and optimizer declaration then.

// ErrPreloaded: Preload of a rank whose slots exist already.
var ErrPreloaded = errors.New("rank: the rank's protected state exists already")

// Preload creates local rank r's slots with regions and commits step in
// one of them, whose regions fill writes (fill gets the staged slot's
// views, one per region, in order; it returns an error to abandon it).
// fill also returns Adam's step count at step in diff mode (the one the
// next Gradient's must follow), or 0 when not known (the holders check
// the next one). It must be called before the rank says ProtectHello: the
// rank's first ProtectHello must then declare exactly regions. On error
// nothing is kept (the files are removed) and the rank starts afresh.
func (h *Keeper) Preload(r int, regions []protect.Region, step int64, fill func(views [][]byte) (adamT int, err error)) error {
	s := h.place().svcs[r]
	if s == nil {
		return fmt.Errorf("rank: rank %d does not run on host %d", r, h.cfg.Host)
	}
	if step < 0 || step > protect.MaxStep {
		return fmt.Errorf("rank: preload of step %d", step)
	}
	s.mu.Lock()
	busy := s.slots != nil
	s.mu.Unlock()
	if busy {
		return fmt.Errorf("%w: rank %d", ErrPreloaded, r)
	}
	cr := make([]ckpt.Region, len(regions))
	for i, g := range regions {
		cr[i] = ckpt.Region{Name: g.Name, Size: g.Size}
	}
	h.claimFiles()
	opt := ckpt.Options{Dir: h.cfg.Dir}
	var slots *ckpt.Slots
	err := h.names(r, func() error {
		var err error
		slots, err = ckpt.Create(h.cfg.Job, r, cr, opt)
		return err
	})
	if err != nil {
		return fmt.Errorf("rank %d: %w", r, err)
	}
	fail := func(err error) error {
		slots.Close()
		ran := false
		rerr := h.names(r, func() error { ran = true; _, err := ckpt.RemoveOwned(slots.Owned()); return err })
		if !ran {
			ckpt.Disown(slots.Owned()) // the lock failed: the files stay
		}
		if rerr != nil {
			h.log.Warn("cannot remove the slots of a preload that failed", "rank", r, "err", rerr)
		}
		return err
	}
	st, err := slots.Stage(uint64(step))
	if err != nil {
		return fail(fmt.Errorf("rank %d: %w", r, err))
	}
	views := st.Views()
	adamT, err := fill(views)
	if err != nil {
		return fail(err)
	}
	if err := st.Commit(); err != nil {
		return fail(fmt.Errorf("rank %d: %w", r, err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slots != nil || s.gone || s.life.Err() != nil {
		return fail(fmt.Errorf("%w: rank %d (a ProtectHello, or the host stopping, came meanwhile)", ErrPreloaded, r))
	}
	slot := st.Slot()
	s.slots = slots
	s.owned = append(s.owned, slots.Owned()...)
	s.regions = slices.Clone(regions)
	s.files = slots.Files()
	s.repl = s.repl[:0]
	for i, g := range s.regions {
		if g.Name != "params" {
			s.repl = append(s.repl, i)
		}
	}
	for i := range 2 {
		s.views[i] = make([][]byte, len(s.files))
	}
	s.views[slot] = views
	s.slotStep[slot] = step
	s.sums[slot] = st.Sums()
	s.slotT[slot] = adamT
	s.slotEpoch[slot] = h.place().epoch
	s.committed = step
	s.preloaded = true
	return nil
}

// helloPreloaded is helloLocked for the first ProtectHello of a rank
// whose state Preload put in its slots: the regions must be those
// stored; the gradient buffer is created and the optimizer taken as in a
// first ProtectHello. s.mu is held.
func (s *service) helloPreloaded(req *protect.ProtectHello) (*protect.ProtectWelcome, error) {
	if !slices.Equal(s.regions, req.Regions) {
		return nil, fmt.Errorf("regions %v differ from the %v of the state resumed from the checkpoint directory (gorun --resume needs the rank to protect the regions it protected before)", req.Regions, s.regions)
	}
	if req.Gradient > 0 {
		var reduced int64
		if s.h.diffMode() && req.Optimizer.Reduced != nil {
			reduced = req.Optimizer.Reduced.N
		}
		// Under the rank's names lock, as helloLocked makes its files:
		// another agent of the job sharing the directory may be removing
		// its own files of the rank (a partitioned host ending after a
		// spare rolled the rank back, Preload).
		err := s.h.names(s.rank, func() error { return s.createGradient(req.Gradient*4, reduced) })
		if err != nil {
			return nil, err
		}
	}
	if s.h.diffMode() {
		s.opt = req.Optimizer.Clone()
	}
	s.preloaded = false
	return s.welcome(), nil
}

// Rolling the job back to disk (a lost rank's state at G in no memory
// tier, hotswap.RollbackToDisk): after Restart(gen, T) discarded every
// step after T, the agent rebuilds each local rank's state at T from the
// durable tier with Reload, survivors included, whose slots held G.

// Reload puts local rank r's state at step into its slots as committed,
// as Preload does, for a rank whose slots may exist already (a rank that
// ran here before a roll-back to step). A rank whose slots hold step
// committed keeps them (it reports false, and fill is not called); a
// rank without slots is preloaded (Preload); else step is staged into
// its slots, which must hold no committed step at or after step (Restart
// discarded them) and regions equal to the rank's, and it reports true.
// It must be called before the rank's next ProtectHello.
func (h *Keeper) Reload(r int, regions []protect.Region, step int64, fill func(views [][]byte) (adamT int, err error)) (bool, error) {
	s := h.place().svcs[r]
	if s == nil {
		return false, fmt.Errorf("rank: rank %d does not run on host %d", r, h.cfg.Host)
	}
	if step < 0 || step > protect.MaxStep {
		return false, fmt.Errorf("rank: reload of step %d", step)
	}
	s.mu.Lock()
	if s.slots == nil {
		s.mu.Unlock()
		return true, h.Preload(r, regions, step, fill)
	}
	if slices.Contains(s.slotStep[:], step) {
		s.mu.Unlock()
		return false, nil
	}
	if !slices.Equal(s.regions, regions) {
		s.mu.Unlock()
		return false, fmt.Errorf("rank %d: regions %v differ from the %v of the state on disk", r, s.regions, regions)
	}
	st, err := s.slots.Stage(uint64(step))
	s.staged = nil
	s.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("rank %d: %w", r, err)
	}
	// (Filled without s.mu: a progress report of the host must not wait
	// for the disk. The rank is not running.)
	views := st.Views()
	adamT, err := fill(views)
	if err != nil {
		return false, err // the staged slot is abandoned: it holds nothing committed
	}
	if err := st.Commit(); err != nil {
		return false, fmt.Errorf("rank %d: %w", r, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	slot := st.Slot()
	s.views[slot] = views
	s.slotStep[slot] = step
	s.sums[slot] = st.Sums()
	s.slotT[slot] = adamT
	s.slotEpoch[slot] = h.place().epoch
	s.committed = step
	s.lastT = adamT
	return true, nil
}
