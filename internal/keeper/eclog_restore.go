package keeper

// Restore by decode and replay (diff mode under erasure coding;
// PROTOCOL.md "Erasure coding and diff mode", "Restore"). Only base
// steps are coded, so a rank with no clear copy of step G left rebuilds
// its replicated regions at the job's H (the newest step every rank has
// a coded base of, H <= G) from its stripe (decodeAt), then replays the
// differentials of (H, G] onto them, fetched from a host that keeps its
// log (getLog, eclog.go), in a diffstore of its own. The state replayed
// at G is checked against the CRC32Cs the owner committed at G, which the
// log's last frame carries: a mismatch is ErrUnrecoverable once no log
// holder gives one that matches, and wrong bytes are never used.
//
// The restorer holds one extra copy of the replicated regions (the
// store's base at H) and the log while it replays, reserved against the
// host's replica-memory reserve (ecrestore_mem.go).

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// errReplayMismatch: a log replayed onto the decoded base does not give
// the state the owner committed at G.
var errReplayMismatch = errors.New("the log replayed onto the decoded base differs from the committed state")

// decodeReplay rebuilds this rank's replicated regions at step g into
// views (by region name: the staged slot's) under placement pl, in diff
// mode under erasure coding: it decodes them at base step hb (the
// placement's H) from the rank's stripe, then replays the differentials
// of (hb, g] that the first host of logs (the rank's log-only holders,
// in the placement's order) and then of the other candidates
// (logCandidates) gives whole. It returns nil only when the views hold
// the rank's committed bytes at g (each region's CRC32C checked; with a
// lossy codec, the replay's approximation, as a diff-mode holder's
// restore gives it), and an error wrapping ErrUnrecoverable when no coded
// base or no log gives them, except one wrapping errNoRoom instead when
// the base's decode (decodeAt) or a log was refused for want of room in
// a host's reserve: a retry once there is room may restore.
func (s *service) decodeReplay(ctx context.Context, g, hb int64, logs []int, pl *placement, views map[string][]byte) error {
	if hb < 0 || hb > g {
		return fmt.Errorf("%w: rank %d: no coded base at or before step %d (H is %d)", ErrUnrecoverable, s.rank, g, hb)
	}
	tH, err := s.decodeAt(ctx, hb, pl, views)
	if err != nil {
		return fmt.Errorf("the base at step %d: %w", hb, err)
	}
	if hb == g {
		return nil
	}
	s.mu.Lock()
	var opt *protect.Optimizer
	if s.opt != nil {
		opt = s.opt.Clone()
	}
	s.mu.Unlock()
	if opt == nil {
		return errors.New("diff mode: the rank declared no optimizer")
	}
	// The replay's store (a copy of the base) and the log's records are
	// reserved before they are allocated (ecrestore_mem.go), and given
	// back when the restore returns, whatever the outcome.
	hold := s.h.store.newHold()
	defer hold.release()
	if err := hold.grow(tableBytes(tH), "the replay's copy of the base"); err != nil {
		return fmt.Errorf("rank %d: %w", s.rank, err)
	}
	ds, err := baseStore(tH, opt, hb, views)
	if err != nil {
		return fmt.Errorf("rank %d: the decoded base at step %d: %w", s.rank, hb, err)
	}
	maxRec := maxRecordLen(opt.N, s.h.cfg.Diff.codec())
	var logHeld uint64 // of the records of the log being replayed
	admit := func(n uint64) error {
		if err := hold.grow(n, "a differential of the log"); err != nil {
			return err
		}
		logHeld += n
		return nil
	}
	// The logs asked are of this restore's trajectory: its restart
	// generation and placement (eclog.go); a host of another refuses.
	s.h.gmu.Lock()
	lb := logLabel{gen: s.h.gen, resumed: s.h.resumed, epoch: pl.epoch, g: pl.g}
	s.h.gmu.Unlock()
	var errs []error
	for _, c := range s.logCandidates(pl, logs) {
		var tG []tableEntry
		err := s.h.links.getLog(ctx, c.host, c.holder, s.rank, lb, hb, g, tH, opt.Region, maxRec, admit, func(f logFrame) error {
			if err := ds.Append(f.d); err != nil {
				return fmt.Errorf("step %d: %w", f.d.Step, err)
			}
			tG = f.table
			return nil
		})
		s.noteLink(ctx, c.host, err)
		if err == nil {
			if err = s.replayInto(ds, hb, g, tG, views); err == nil {
				return nil
			}
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		errs = append(errs, fmt.Errorf("the log on host %d (rank %d): %w", c.host, c.holder, err))
		if err := ds.Truncate(hb); err != nil { // the next log starts from the base again
			return fmt.Errorf("rank %d: %w", s.rank, err)
		}
		hold.shrink(logHeld) // its records went with the truncation
		logHeld = 0
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no host keeps one"))
	}
	if slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, errNoRoom) }) {
		// A log that was there was refused here for want of room (the
		// others' hosts kept none, or theirs failed): a retry once the
		// reserve has room may restore from it, so not ErrUnrecoverable.
		return fmt.Errorf("rank %d: no log of steps %d to %d replayed onto the base at step %d: %w", s.rank, hb+1, g, hb, errors.Join(errs...))
	}
	return fmt.Errorf("%w: rank %d: no log of steps %d to %d replays onto the base at step %d: %w", ErrUnrecoverable, s.rank, hb+1, g, hb, errors.Join(errs...))
}

// baseStore returns a diffstore whose base at step hb is views (the
// regions of table t, which Commit checks against t's CRC32Cs), for the
// owner's optimizer opt.
func baseStore(t []tableEntry, opt *protect.Optimizer, hb int64, views map[string][]byte) (*diffstore.Store, error) {
	regions := make([]diffstore.Region, len(t))
	sums := make(map[string]uint32, len(t))
	for i, e := range t {
		regions[i] = diffstore.Region{Name: e.name, Size: e.size}
		sums[e.name] = e.sum
	}
	ds, err := diffstore.New(regions, diffstore.Optimizer{Region: opt.Region, N: opt.N, WOff: opt.W, MOff: opt.M, VOff: opt.V})
	if err != nil {
		return nil, err
	}
	w, err := ds.BeginBase(hb)
	if err != nil {
		return nil, err
	}
	for _, e := range t {
		v, ok := views[e.name]
		if !ok || int64(len(v)) != e.size {
			w.Abort()
			return nil, fmt.Errorf("region %q of %d bytes has no view of its size here", e.name, e.size)
		}
		if err := w.Write(e.name, 0, v); err != nil {
			w.Abort()
			return nil, err
		}
	}
	if err := w.Commit(hb, sums); err != nil {
		w.Abort()
		return nil, err
	}
	return ds, nil
}

// replayInto restores step g of ds into views and checks it against tG,
// the owner's committed table of g. On a mismatch it puts the base at hb
// back into views, and fails.
func (s *service) replayInto(ds *diffstore.Store, hb, g int64, tG []tableEntry, views map[string][]byte) error {
	if first, last, ok := ds.Range(); !ok || first != hb || last != g || tG == nil {
		return fmt.Errorf("the log gave steps %d to %d, want %d to %d", first+1, last, hb+1, g)
	}
	if !sameShape(tG, regionTable(ds.Regions())) {
		return fmt.Errorf("the committed table of step %d has other regions than the base's", g)
	}
	if err := ds.Restore(g, views, replay.ReplayOptions{}); err != nil {
		return err
	}
	exact := ds.Exact(g)
	var bad []error
	for _, e := range tG {
		if got := crc32c.Checksum(views[e.name]); got != e.sum {
			bad = append(bad, fmt.Errorf("region %s: CRC32C %08x, committed %08x", e.name, got, e.sum))
		}
	}
	switch {
	case len(bad) > 0 && exact:
		err := fmt.Errorf("%w at step %d: %w", errReplayMismatch, g, errors.Join(bad...))
		if rerr := ds.Restore(hb, views, replay.ReplayOptions{}); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	case !exact && s.h.cfg.Diff.lossless():
		if rerr := ds.Restore(hb, views, replay.ReplayOptions{}); rerr != nil {
			return rerr
		}
		return fmt.Errorf("the log of step %d is not exact (a lossy differential) and the job is lossless", g)
	case !exact:
		s.h.log.Warn("restoring an approximation of a rank's state (--diff-codec is lossy): not the owner's bytes", "rank", s.rank, "step", g)
	}
	return nil
}

// logCandidates returns where this rank's log may be read under pl, one
// place per host, in the order tried: its log-only holders logs, its clear
// copy's holders, then a rank of each other host of its erasure-coding
// group (a host that kept its log under an earlier placement still
// serves it, as a spare copy does).
func (s *service) logCandidates(pl *placement, logs []int) []shardLoc {
	var out []shardLoc
	add := func(host, holder int) {
		if host >= 0 && holder >= 0 && !slices.ContainsFunc(out, func(l shardLoc) bool { return l.host == host }) {
			out = append(out, shardLoc{host: host, holder: holder})
		}
	}
	for _, r := range logs {
		add(pl.hostOf(r), r)
	}
	for _, r := range pl.holdersOf(s.rank) {
		add(pl.hostOf(r), r)
	}
	if pl.ec == nil {
		return out
	}
	if pos, ok := pl.ec.pos[s.rank]; ok && pos.group < len(pl.ec.groups) {
		g := pl.ec.groups[pos.group]
		for i, host := range g.Hosts {
			if i < len(g.Workers) && len(g.Workers[i]) > 0 {
				add(host, slices.Min(g.Workers[i]))
			}
		}
	}
	return out
}
