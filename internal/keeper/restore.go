package keeper

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/protect"
)

// restore chooses the step to resume from (G) and makes a slot hold it:
// the rank's own slot (Tier-1), or replicas from other hosts (Tier-2).
func (s *service) restore(ctx context.Context) *protect.Restorable {
	g, gen := s.h.G(), s.h.Gen()
	// A note of an earlier restore is of another attempt: only this
	// one's failure may be reported with the rank's exit.
	s.h.noteCorruptCopies(s.rank, gen, g, nil)
	s.mu.Lock()
	slots := s.slots
	s.mu.Unlock()
	if slots == nil {
		return &protect.Restorable{Step: noStep, Err: "ProtectHello first"}
	}
	if g < 0 {
		// No step is recoverable on every rank: every rank starts afresh,
		// and whatever this host has is discarded.
		if err := s.truncate(noStep); err != nil {
			return &protect.Restorable{Step: noStep, Err: err.Error()}
		}
		return &protect.Restorable{Step: noStep}
	}
	sn, err := slots.At(uint64(g))
	if err == nil {
		slot := sn.Slot
		if err := s.truncate(g); err != nil {
			return &protect.Restorable{Step: noStep, Err: err.Error()}
		}
		return &protect.Restorable{Step: g, Slot: slot, Tier: 1}
	}
	if !errors.Is(err, ckpt.ErrNoStep) && !errors.Is(err, ckpt.ErrCorrupt) {
		return &protect.Restorable{Step: noStep, Err: err.Error()}
	}
	s.h.log.Info("restoring from other hosts", "rank", s.rank, "step", g, "local", err)
	start := time.Now()
	slot, err2 := s.restoreRemote(ctx, g)
	if cc, ok := errors.AsType[*CopiesCorruptError](err2); ok {
		s.h.noteCorruptCopies(s.rank, gen, cc.Step, cc.Holders)
	}
	if err2 != nil {
		return &protect.Restorable{Step: noStep, Err: fmt.Sprintf("step %d: not here (%v), and not from other hosts: %v", g, err, err2)}
	}
	s.h.log.Info("restored from other hosts", "rank", s.rank, "step", g, "took", time.Since(start))
	return &protect.Restorable{Step: g, Slot: slot, Tier: 2}
}

// corruptErr is a failed restore of step g's error err, as a
// *CopiesCorruptError when the copies at holder ranks crcBad failed
// their CRC32C (whatever else then failed: the stripe's decode, the
// durable tier), so that the launcher counts them lost.
func (s *service) corruptErr(g int64, crcBad []int, err error) error {
	if len(crcBad) == 0 {
		return err
	}
	return &CopiesCorruptError{Rank: s.rank, Step: g, Holders: slices.Clone(crcBad), Err: err}
}

// restoreNoRoomWait is how long a restore by decode retries while the
// host's replica-memory reserve has no room for its buffers (errNoRoom):
// several ranks restoring on one spare hold theirs while the owners send
// that spare bases, rows and logs, and room comes back as they finish.
var restoreNoRoomWait = slowWait

// testHookNoRoomRetry, if set (by tests), is called with each errNoRoom
// failure that retryNoRoom is about to retry, before it waits.
var testHookNoRoomRetry func(err error)

// retryNoRoom runs f until it does not fail with errNoRoom, the wait
// has passed (then its last error), or ctx ends, backing off 50 ms
// doubling to 1 s between tries. f holds no reservation between tries
// (it gives its back on failure), and nothing is locked while it waits.
func retryNoRoom(ctx context.Context, wait time.Duration, f func() error) error {
	const first, most = 50 * time.Millisecond, time.Second
	deadline := time.Now().Add(wait)
	for backoff := first; ; backoff = min(2*backoff, most) {
		err := f()
		if !errors.Is(err, errNoRoom) || ctx.Err() != nil {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return err
		}
		if h := testHookNoRoomRetry; h != nil {
			h(err)
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// durableTier reports whether the job has a durable tier to restore
// from (restoreFromDisk).
func (s *service) durableTier() bool {
	return s.h.cfg.Persist.Dir != "" || s.h.cfg.DiffLog != nil && s.h.cfg.DiffLog.Dir != ""
}

// restoreRemote fetches step g into a local slot: the replicated regions
// from the copy the placement's Source names for the rank (Opt's host),
// else from a replica holder, or, with erasure coding, rebuilt from the
// rank's stripe (decodeRemote) when the Source says Decode or no holder
// has them; params from the Source's data-parallel peer, else from
// another peer. It then has step g (re)sent to the rank's holders and
// parity rows that lack it (the restored rank's clear copy and shares:
// its group's full redundancy back).
// A decode refused for want of room is retried (retryNoRoom); one that
// fails for want of room or shards falls through to the durable tier
// when the job has one. An error wraps ErrUnrecoverable when the stripe
// cannot give the state (and the durable tier, if any, did not either).
// It runs as a request (reqMu held) and holds s.mu only while it changes
// the slots, not while it waits for other hosts.
func (s *service) restoreRemote(ctx context.Context, g int64) (int, error) {
	s.persistTruncate(g) // what the rank saved after g is of an abandoned trajectory
	// The replicator reads no slot while they are rewritten; then it has
	// the newest step committed replicated (g, or what is left on failure).
	s.rep.pause()
	defer func() {
		s.mu.Lock()
		committed := s.committed
		s.mu.Unlock()
		s.rep.resume(committed)
	}()
	s.mu.Lock()
	st, err := s.stageForRestore(g)
	regions, repl := s.regions, s.repl
	s.grads, s.lastGrad, s.lastT = nil, noStep, 0
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}
	s.rep.truncateDiffs(g - 1) // this host's steps from g on are gone
	s.resetDiffLog(g)          // and those after g on disk
	views := st.Views()
	pl := s.h.place()
	src, hasSrc := pl.sources[s.rank]

	replViews := map[string][]byte{}
	var want []tableEntry
	for _, i := range repl {
		replViews[regions[i].Name] = views[i]
		want = append(want, tableEntry{name: regions[i].Name})
	}
	// Where the replicated regions are: the Source's copy first, then
	// the holders; with erasure coding, when the Source says no copy
	// survives (Decode) or none answers, the rank's stripe (ecrestore.go).
	var optFrom []int
	if !hasSrc || !src.Decode {
		optFrom = preferFirst(src.Opt, hasSrc, pl.holdersOf(s.rank))
	}
	var errs []error
	var crcBad []int // holders whose copies failed their CRC32C
	got := len(want) == 0
	decodeFailed := false // for want of room or shards: the durable tier is tried
	if !got && len(optFrom) > 0 {
		var holderErrs []error
		try := func() error {
			got, holderErrs, crcBad = s.fetchFromHolders(ctx, g, pl, optFrom, want, replViews)
			if !got && !hasDecode(pl, s.rank) && allNoRoom(holderErrs) {
				return errors.Join(holderErrs...)
			}
			return nil
		}
		// Every holder refused for want of room (a lossy diff-mode
		// holder reserves the copy it restores: getDiffWhole) and no
		// decode may stand in: the holders are asked again as room
		// comes back, nothing held between tries.
		_ = retryNoRoom(ctx, restoreNoRoomWait, try)
		errs = append(errs, holderErrs...)
	}
	if !got && pl.ec != nil {
		if _, ok := pl.ec.pos[s.rank]; ok {
			start := time.Now()
			decode := func() error { return s.decodeRemote(ctx, g, pl, replViews) }
			if pl.ecDiff() {
				// Diff mode under EC: only base steps are coded; the
				// differentials since are replayed (eclog_restore.go).
				decode = func() error { return s.decodeReplay(ctx, g, pl.h, pl.logsOf(s.rank), pl, replViews) }
			}
			if err := retryNoRoom(ctx, restoreNoRoomWait, decode); err != nil {
				errs = append(errs, fmt.Errorf("decode from the erasure-coded stripe: %w", err))
				if ctx.Err() != nil || !s.durableTier() || !errors.Is(err, errNoRoom) && !errors.Is(err, ErrUnrecoverable) {
					return 0, s.corruptErr(g, crcBad, fmt.Errorf("the replicated regions: %w", errors.Join(errs...)))
				}
				// The durable tier may still have the state: tried below.
				decodeFailed = true
			} else {
				got = true
				s.h.log.Info("decoded from the erasure-coded stripe", "rank", s.rank, "step", g, "took", time.Since(start))
			}
		}
	}
	fromDisk := false
	if !got {
		// The cascade's last tier (diskrestore.go): no memory tier has
		// the rank's state, the durable tier may.
		if err := s.restoreFromDisk(ctx, g, views); err != nil {
			errs = append(errs, fmt.Errorf("the durable tier: %w", err))
		} else {
			got, fromDisk = true, true
		}
	}
	if !got {
		if decodeFailed {
			return 0, s.corruptErr(g, crcBad, fmt.Errorf("the replicated regions: %w", errors.Join(errs...)))
		}
		if hasSrc && src.Decode {
			return 0, s.corruptErr(g, crcBad, fmt.Errorf("rank %d restores by decode, but it is in no erasure-coding group", s.rank))
		}
		return 0, s.corruptErr(g, crcBad, fmt.Errorf("no holder has the replicated regions: %w", errors.Join(errs...)))
	}
	if pi := slices.IndexFunc(regions, func(r protect.Region) bool { return r.Name == "params" }); pi >= 0 && !fromDisk {
		got := false
		var all []int
		if s.h.cfg.Peers != nil {
			all = s.h.cfg.Peers(s.rank)
		}
		peers := preferFirst(src.Params, hasSrc, all)
		for _, pr := range peers {
			if pr == s.rank {
				continue
			}
			dst := map[string][]byte{"params": views[pi]}
			var err error
			if local := pl.svcs[pr]; local != nil {
				err = local.copySlot(g, "params", views[pi])
			} else {
				err = s.h.links.fetch(ctx, pl.hostOf(pr), linkHdr{kind: kindGetSlot, owner: s.rank, holder: pr, step: g}, []tableEntry{{name: "params"}}, dst)
			}
			if err == nil {
				got = true
				break
			}
			errs = append(errs, fmt.Errorf("data-parallel peer rank %d: %w", pr, err))
		}
		if !got {
			return 0, fmt.Errorf("no data-parallel peer has params: %w", errors.Join(errs...))
		}
	}
	if err := st.Commit(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	slot := st.Slot()
	s.slotStep[slot] = g
	s.sums[slot] = st.Sums()
	s.slotT[slot] = 0 // not known here: the holders check the next step's
	s.views[slot] = views
	s.slotEpoch[slot] = pl.epoch
	s.committed = g
	s.mu.Unlock()
	// The holders are asked whether they have g, and sent it if not
	// (resume): Replicated says g only then.
	return slot, nil
}

// stageForRestore discards what this host has from step g on (the slot
// may hold a corrupt g) and stages g. s.mu is held.
func (s *service) stageForRestore(g int64) (*ckpt.Staged, error) {
	// Discard what this host has from g on: the slot may hold a corrupt g.
	if g > 0 {
		if err := s.slots.Truncate(uint64(g - 1)); err != nil {
			return nil, err
		}
	} else if err := s.slots.Clear(); err != nil {
		return nil, err
	}
	for i, st := range s.slotStep {
		if st >= g {
			s.slotStep[i] = noStep
		}
	}
	st, err := s.slots.Stage(uint64(g))
	if err != nil {
		return nil, err
	}
	s.staged = nil
	return st, nil
}

// copySlot copies region name of this rank's slot holding step into dst,
// and checks the copy against the region's committed CRC32C.
func (s *service) copySlot(step int64, name string, dst []byte) error {
	return s.readSlot(step, []string{name}, func(t []tableEntry, data [][]byte) error {
		if len(data[0]) != len(dst) {
			return fmt.Errorf("region %q of %d bytes, want %d", name, len(data[0]), len(dst))
		}
		copy(dst, data[0])
		if got := crc32c.Checksum(dst); got != t[0].sum {
			return fmt.Errorf("region %q of step %d changed while it was copied (CRC32C %08x, committed %08x)", name, step, got, t[0].sum)
		}
		return nil
	})
}

// fetchFromHolders fetches the replicated regions of step g (want) into
// replViews from the first of holders that has them, each asked once in
// turn. It reports whether one had them, the others' errors, and the
// holder ranks whose copies failed their CRC32C.
func (s *service) fetchFromHolders(ctx context.Context, g int64, pl *placement, holders []int, want []tableEntry, replViews map[string][]byte) (bool, []error, []int) {
	var errs []error
	var crcBad []int
	for _, hr := range holders {
		dst := maps.Clone(replViews)
		var err error
		if host := pl.hostOf(hr); host == s.h.cfg.Host {
			err = s.h.store.copyOut(s.rank, g, dst)
		} else {
			err = s.h.links.fetch(ctx, host, linkHdr{kind: kindGet, owner: s.rank, holder: hr, step: g}, want, dst)
		}
		if err == nil {
			return true, errs, crcBad
		}
		if errors.Is(err, ErrCopyCRC) {
			crcBad = append(crcBad, hr)
		}
		errs = append(errs, fmt.Errorf("holder rank %d: %w", hr, err))
	}
	return false, errs, crcBad
}

// hasDecode reports whether rank r may be rebuilt from an erasure-coded
// stripe (it is in a group of pl).
func hasDecode(pl *placement, r int) bool {
	if pl.ec == nil {
		return false
	}
	_, ok := pl.ec.pos[r]
	return ok
}

// allNoRoom reports whether errs is not empty and each of them is a
// refusal for want of room (errNoRoom).
func allNoRoom(errs []error) bool {
	return len(errs) > 0 && !slices.ContainsFunc(errs, func(err error) bool { return !errors.Is(err, errNoRoom) })
}

// preferFirst returns rest with first (if ok) moved or added in front,
// each rank once.
func preferFirst(first int, ok bool, rest []int) []int {
	var out []int
	if ok {
		out = append(out, first)
	}
	for _, r := range rest {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}
