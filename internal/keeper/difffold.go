package keeper

import (
	"fmt"
	"slices"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// setGDiff tells o's stores G, drops the previous store once the current
// one holds G, and folds if the log is long enough. o.mu is held.
//
// In diff mode under EC the stores' G is H instead (Keeper.pin), or the
// newer step the owner said H reached (baseH, o.hmin): their bases stay
// at H, no fold passes it.
func (st *replicaStore) setGDiff(o *ownerReplica, g int64) {
	if st.h.place().ecDiff() {
		g = max(st.h.pin(g), o.hmin)
	}
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds != nil {
			ds.SetG(g)
		}
	}
	if o.prev != nil && o.cur != nil {
		if first, _, ok := o.cur.Range(); ok && first <= g {
			o.prev = nil
			st.account(o)
		}
	}
	st.maybeFold(o)
}

// restartDiff drops o's steps after g received in generations older than
// gen (a restart of gen resumes from g; they were never recoverable),
// and keeps those received (or confirmed, kindHas) in gen itself: a
// holder's host may restart after the owner's rank restored from g and
// had its next steps acknowledged here, as full mode keeps the buffers
// of gen. A store is cut after the last step before the first older
// one after g; a store whose base is past that goes. o.mu is held.
func (st *replicaStore) restartDiff(o *ownerReplica, gen uint64, g int64) {
	// cut: the last step kept. Every step a store or log holds has its
	// sums.
	cut := max(o.diffNewest(), o.logNewest())
	if o.bw != nil && o.bw.Step() > g && o.bwGen < gen {
		cut = min(cut, o.bw.Step()-1)
	}
	for s := g + 1; s <= cut; s++ {
		if sg, ok := o.sumGen[s]; !ok || sg < gen {
			cut = s - 1
			break
		}
	}
	cut = max(cut, g)
	if o.bw != nil && o.bw.Step() > cut {
		o.bw = nil // Truncate aborts it
	}
	keep := func(ds *diffstore.Store) *diffstore.Store {
		if ds == nil || ds.Truncate(cut) != nil {
			return nil
		}
		return ds
	}
	o.cur, o.prev = keep(o.cur), keep(o.prev)
	if o.cur == nil {
		o.cur, o.prev = o.prev, nil
		if o.bw != nil {
			o.bw.Abort()
			o.bw = nil
		}
	}
	for s := range o.sums {
		if s > cut {
			delete(o.sums, s)
			delete(o.sumGen, s)
		}
	}
	// A divergence found in an older generation was at a step after g or
	// before: the restarted rank's steps are checked anew.
	o.diverged = nil
	st.restartLog(o, cut)
	st.setGDiff(o, g)
	st.account(o)
}

// maybeFold queues o for the host's fold goroutine once its current log
// holds DiffConfig.Fold steps up to G. o.mu is held.
func (st *replicaStore) maybeFold(o *ownerReplica) {
	h := st.h
	if o.cur == nil || h.folds == nil || h.place().ecDiff() {
		return // under EC the base stays at H: refreshes replace folds
	}
	first, last, ok := o.cur.Range()
	if !ok || min(h.G(), last)-first < int64(h.cfg.Diff.fold()) {
		return
	}
	if o.foldQueued.CompareAndSwap(false, true) {
		select {
		case h.folds <- o:
		default:
			o.foldQueued.Store(false) // queued again by the next differential
		}
	}
}

// foldReplay is how the holder's background folds replay: on one
// goroutine. A fold is not waited for (a restore replays what is not
// folded yet), so it takes one CPU at most and leaves the others to the
// ranks' steps, where with every CPU it would compete with them on all.
// Restores, which the job waits for, replay on every CPU.
var foldReplay = replay.ReplayOptions{Workers: 1}

// foldLoop folds the owners' logs queued by maybeFold into their bases,
// one at a time, until the host stops: the holder's background replay
// (diffstore.Store.Fold, which stops at G). In a lossless job it checks
// the fold before it becomes the base (diffstore.Store.FoldChecked: the
// steps are replayed once, into a spare buffer): the state at the step
// the fold ends at must have the owner's committed CRC32Cs of that step;
// if it does not, the owner's optimizer step is not replay's, the fold
// does not happen (the base stays, and the steps before the divergence
// still restore), and the owner's differentials are refused from then on
// with failDiverged, which fails its rank.
func (h *Keeper) foldLoop() {
	defer h.wg.Done()
	for {
		select {
		case <-h.life.Done():
			return
		case o := <-h.folds:
			o.foldQueued.Store(false)
			o.mu.Lock()
			ds, dv := o.cur, o.diverged
			var first, last int64
			ok := false
			if ds != nil {
				first, last, ok = ds.Range()
			}
			upTo := min(h.G(), last)
			// The committed CRC32Cs of the steps the fold may end at
			// (it stops at the store's G, which may lag h.G()): the
			// check runs with the store's fold lock held, and may not
			// take o.mu (takeDiff holds it while it truncates).
			var sums map[int64][]tableEntry
			if h.cfg.Diff.lossless() {
				sums = make(map[int64][]tableEntry, max(0, upTo-first))
				for s := first + 1; s <= upTo; s++ {
					if t, ok := o.sums[s]; ok {
						sums[s] = t
					}
				}
			}
			o.mu.Unlock()
			if dv != nil || !ok || upTo <= first {
				continue
			}
			before := ds.Stats()
			var err error
			var div *CorruptError
			if h.cfg.Diff.lossless() && ds.Exact(upTo) {
				regs := ds.Regions()
				err = ds.FoldChecked(upTo, foldReplay, func(step int64, got [][]byte) error {
					if div = h.checkFold(o.rank, regs, step, got, sums[step]); div != nil {
						return div
					}
					return nil
				})
				if div != nil {
					o.mu.Lock()
					if o.cur == ds {
						o.diverged = div
					}
					o.mu.Unlock()
					h.log.Error("a replica holder's replay of a rank's differentials differs from the rank's commit: the rank's optimizer step is not replay's; its base is kept and the rank will fail", "rank", o.rank, "step", div.Step, "err", div.Detail)
				}
			} else {
				err = ds.Fold(upTo, foldReplay)
			}
			if err != nil && div == nil {
				h.log.Warn("folding a replica's differentials failed", "rank", o.rank, "err", err)
			}
			// Whatever the fold's outcome: it may have measured a drift,
			// and moved buffers (a spare taken, records recycled).
			after := ds.Stats()
			h.foldSteps.Add(after.FoldedSteps - before.FoldedSteps)
			h.foldNS.Add(int64(after.FoldTime - before.FoldTime))
			h.noteDrift(o.rank, before, after)
			o.mu.Lock()
			h.store.account(o)
			o.mu.Unlock()
		}
	}
}

// checkFold compares owner's state at step, as a fold made it (got, one
// slice per region of regs), with the owner's committed CRC32Cs of that
// step, want (nil: not known here, nothing to compare): the divergence
// found (Detail names the region and both CRC32Cs), or nil.
func (h *Keeper) checkFold(owner int, regs []diffstore.Region, step int64, got [][]byte, want []tableEntry) *CorruptError {
	for _, e := range want {
		i := slices.IndexFunc(regs, func(r diffstore.Region) bool { return r.Name == e.name })
		if i < 0 {
			continue
		}
		if sum := crc32c.Checksum(got[i]); sum != e.sum {
			return &CorruptError{Rank: owner, Step: step, Region: e.name, Sum: e.sum, Got: sum, Replay: true,
				Detail: fmt.Sprintf("the holder on host %d replayed region %s of step %d to CRC32C %08x, committed %08x", h.cfg.Host, e.name, step, sum, e.sum)}
		}
	}
	return nil
}
