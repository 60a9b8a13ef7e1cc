package keeper

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/protect"
)

// persistOpen opens the rank's store once the rank said ProtectHello
// (its regions are known), if the job has a durable tier. A store that
// cannot be opened leaves the rank without one (reported: Off), and
// training goes on.
func (s *service) persistOpen() {
	cfg := s.h.cfg.Persist
	if !cfg.on() {
		return
	}
	p := &s.dur
	p.opMu.Lock()
	defer p.opMu.Unlock()
	p.mu.Lock()
	done := p.store != nil || p.closed || p.off != "" && !p.locked
	wasLocked := p.locked
	p.mu.Unlock()
	s.mu.Lock()
	regions := slices.Clone(s.regions)
	s.mu.Unlock()
	if done || regions == nil {
		return
	}
	dr := make([]durable.Region, len(regions))
	names := make([]string, len(regions))
	var size int64
	for i, r := range regions {
		dr[i], names[i] = durable.Region{Name: r.Name, Size: r.Size}, r.Name
		size += r.Size
	}
	st, err := durable.Open(cfg.Dir, s.rank, dr, durable.Options{Concurrency: cfg.maxInFlight(), Writers: cfg.Writers, ChunkSize: cfg.ChunkSize,
		Logger: slog.New(newQuietHandler(s.h.log.Handler(), durableLogEvery))})
	if err != nil {
		locked := errors.Is(err, durable.ErrLocked)
		switch {
		case locked && !wasLocked:
			s.h.log.Warn("the durable tier cannot open this rank's store, another host has it open: it writes no bases until it can (the memory tiers still protect it)",
				"rank", s.rank, "dir", cfg.Dir, "err", err)
		case !locked:
			s.h.log.Warn("the durable tier cannot open this rank's store: it writes no bases (the memory tiers still protect it)", "rank", s.rank, "dir", cfg.Dir, "err", err)
		}
		p.mu.Lock()
		p.off, p.locked = err.Error(), locked
		p.mu.Unlock()
		s.h.cfg.Changed()
		return
	}
	if wasLocked {
		s.h.log.Info("durable tier: the rank's store is no longer open elsewhere", "rank", s.rank)
	}
	// The markers the rank has on disk already (a rank whose store
	// another host wrote before this one took the rank over): its own,
	// each naming the version the store holds.
	markers := st.Marked()
	p.mu.Lock()
	p.markers = markers
	p.mu.Unlock()
	// A store another host wrote (a rank taken over) may hold versions
	// the watermark or X passed after that host's last reclaim: a fresh
	// store knows neither (durable: "Resuming and restoring"). The ones
	// this host applied: the loop applies the newer ones to every store
	// it finds open.
	s.h.dur.mu.Lock()
	d, x := s.h.dur.appliedD, s.h.dur.appliedX
	if s.h.dur.local == 0 {
		d, x = s.h.dur.d, s.h.dur.x
	}
	s.h.dur.mu.Unlock()
	s.reclaimStore(st, d, x)
	p.mu.Lock()
	markers = p.markers
	p.store, p.names, p.size = st, names, size
	p.off, p.locked = "", false
	p.n = max(cfg.Concurrency, 1)
	p.lastBase = noStep
	p.ctx, p.cancel = context.WithCancel(s.life)
	p.mu.Unlock()
	s.h.log.Info("durable tier: the rank's store is open", "rank", s.rank, "dir", cfg.Dir, "every", cfg.Every, "files", cfg.maxInFlight()+1, "markers", markers)
	s.h.cfg.Changed()
}

// persistDueLocked returns the save of step, just committed in slot, if
// it is a base step of the durable tier, with slot held until the save
// has read it; nil otherwise (no durable tier, not a base step, or
// skipped: N saves in flight already). s.mu is held.
func (s *service) persistDueLocked(step int64, slot int) *baseSave {
	cfg := s.h.cfg.Persist
	if !cfg.on() || step%int64(cfg.Every) != 0 {
		return nil
	}
	p := &s.dur
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.store == nil && p.locked && !p.closed {
		// The store is open elsewhere: this base fails, and the store is
		// tried again.
		p.failed++
		if !p.reopening {
			p.reopening = true
			p.retries.Add(1)
			go s.persistReopen()
		}
		return nil
	}
	if p.store == nil || p.stopping {
		return nil
	}
	now := time.Now()
	if p.lastBase >= 0 && step > p.lastBase {
		p.stepTime = now.Sub(p.lastBaseAt) / time.Duration(step-p.lastBase)
	}
	p.lastBase, p.lastBaseAt = step, now
	if p.inflight >= p.n {
		p.skipped++
		return nil
	}
	if s.holds[slot] != nil {
		// A save of the step the slot held before still reads it; a
		// stage never overwrote the slot, so this cannot happen.
		p.skipped++
		return nil
	}
	h := make(chan struct{})
	s.holds[slot] = h
	p.inflight++
	if p.flying == nil {
		p.flying = map[int64]bool{}
	}
	p.flying[step] = true
	p.wg.Add(1)
	return &baseSave{step: step, slot: slot, hold: h, ctx: p.ctx}
}

// persistReopen tries to open the rank's store again, after Open found
// it open elsewhere (persist.retries).
func (s *service) persistReopen() {
	p := &s.dur
	defer p.retries.Done()
	s.persistOpen()
	p.mu.Lock()
	p.reopening = false
	p.mu.Unlock()
	s.h.cfg.Changed()
}

// releaseHold lets stages overwrite slot again, if h still holds it.
func (s *service) releaseHold(slot int, h chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holds[slot] == h {
		s.holds[slot] = nil
		close(h)
	}
}

// heldLocked returns the hold of the slot the next stage overwrites (the
// one not holding the newest committed step), or nil. s.mu is held.
func (s *service) heldLocked() chan struct{} {
	for i, h := range s.holds {
		if h != nil && (s.committed < 0 || s.slotStep[i] != s.committed) {
			return h
		}
	}
	return nil
}

// waitHold waits until no save reads the slot the next stage overwrites,
// and returns how long that took; the wait ends early with an error when
// ctx ends or the service stops. A wait has the rank's next saves write
// through the page cache (durable.Store.CopyWaited): their holds end
// with the copy into the page cache, not the device's writes.
func (s *service) waitHold(ctx context.Context) (time.Duration, error) {
	var waited time.Duration
	defer func() {
		if waited > 0 {
			s.dur.holdNS.Add(int64(waited))
			s.dur.mu.Lock()
			st := s.dur.store
			s.dur.mu.Unlock()
			if st != nil {
				st.CopyWaited()
			}
		}
	}()
	for {
		s.mu.Lock()
		h := s.heldLocked()
		s.mu.Unlock()
		if h == nil {
			return waited, nil
		}
		start := time.Now()
		s.dur.waiting.Add(1)
		var err error
		select {
		case <-h:
		case <-ctx.Done():
			err = ctx.Err()
		case <-s.life.Done():
			err = ErrStopping
		}
		s.dur.waiting.Add(-1)
		waited += time.Since(start)
		if err != nil {
			return waited, err
		}
	}
}

// testHookSave, if set (by tests), replaces the store's Save: what a
// save does with the slot's views, and when it calls copied.
var testHookSave func(ctx context.Context, st *durable.Store, step int64, src [][]byte, sums []uint32, copied func()) error

// runSave writes b's step from its slot, then accounts for the save. It
// runs on its own goroutine (persist.wg), and releases the hold once the
// save has read the slot (or failed before).
func (s *service) runSave(b *baseSave) {
	p := &s.dur
	defer p.wg.Done()
	p.mu.Lock()
	st, names := p.store, p.names
	p.mu.Unlock()
	save := st.Save
	if testHookSave != nil {
		save = func(ctx context.Context, step int64, src [][]byte, sums []uint32, copied func()) error {
			return testHookSave(ctx, st, step, src, sums, copied)
		}
	}
	if b.ctx.Err() != nil {
		// Stopped before it began (a restore or the end).
		s.releaseHold(b.slot, b.hold)
		s.saved(b, b.ctx.Err(), 0)
		return
	}
	start := time.Now()
	var err error
	started := false
	done := make(chan struct{})
	rerr := s.readSlot(b.step, names, func(t []tableEntry, data [][]byte) error {
		sums := make([]uint32, len(t))
		for i, e := range t {
			sums[i] = e.sum
		}
		copied := make(chan struct{})
		var once sync.Once
		started = true
		go func() { // runSave waits for it (done)
			defer close(done)
			err = save(b.ctx, b.step, data, sums, func() { once.Do(func() { close(copied) }) })
		}()
		// The views are valid only in here (readSlot): wait for the save
		// to have read them.
		select {
		case <-copied:
		case <-done:
		}
		return nil
	})
	s.releaseHold(b.slot, b.hold)
	if started {
		<-done
	} else {
		err = rerr
	}
	s.saved(b, err, time.Since(start))
}

// saved accounts for the save of b that ended with err after took.
func (s *service) saved(b *baseSave, err error, took time.Duration) {
	p := &s.dur
	cfg := s.h.cfg.Persist
	d, x := s.h.durable()
	p.mu.Lock()
	p.inflight--
	delete(p.flying, b.step)
	wasFailing := p.failing
	switch {
	case err == nil:
		p.saves++
		p.writeNS += int64(took)
		p.bytes += p.size
		// A save the watermark or X passed while it was written was
		// freed, unmarked (durable.Store.Save): it has no marker to
		// report. (A save in flight keeps X below its step: this is
		// the store's rule, not something that happens.)
		if i, found := slices.BinarySearch(p.markers, b.step); !found && b.step >= d && (b.step > x || b.step == d) {
			p.markers = slices.Insert(p.markers, i, b.step)
		}
		p.failing = false
		if cfg.Concurrency == 0 {
			p.n = min(durable.DefaultConcurrency(took, p.stepTime, cfg.Every, cfg.overhead()), cfg.maxInFlight())
		}
	case b.ctx.Err() != nil || errors.Is(err, durable.ErrClosed):
		// Abandoned by a restore or the end: nothing to count.
		p.mu.Unlock()
		return
	case errors.Is(err, durable.ErrBusy):
		p.skipped++
	default:
		p.failed++
		p.failing = true
	}
	n := p.n
	p.mu.Unlock()
	switch {
	case err == nil && wasFailing:
		s.h.log.Warn("durable tier: saves succeed again", "rank", s.rank, "step", b.step)
	case err == nil:
		s.h.log.Debug("durable tier: base saved", "rank", s.rank, "step", b.step, "took", took, "concurrency", n)
	case errors.Is(err, durable.ErrBusy):
		s.h.log.Debug("durable tier: base skipped, the saves before it are not done", "rank", s.rank, "step", b.step, "err", err)
	case !wasFailing:
		s.h.log.Warn("durable tier: a base could not be saved; training goes on, protected by the memory tiers (logged once until a save succeeds)",
			"rank", s.rank, "step", b.step, "err", err)
	}
	s.h.cfg.Changed()
}

// stopSaves cancels the rank's saves in flight and waits for them; new
// ones are refused until resumeSaves. persist.opMu is held.
func (p *persist) stopSaves() {
	p.mu.Lock()
	if p.store == nil {
		p.mu.Unlock()
		return
	}
	p.stopping = true
	p.cancel()
	p.mu.Unlock()
	p.wg.Wait()
}

// resumeSaves lets saves start again, under a new context of life.
func (p *persist) resumeSaves(life context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.store == nil {
		return
	}
	p.ctx, p.cancel = context.WithCancel(life)
	p.stopping = false
}

// persistTruncate forgets what the rank saved after step g (-1: all): a
// restore at g. The saves in flight are cancelled first (they may be of
// steps after g, and durable.Store.Truncate runs beside none).
func (s *service) persistTruncate(g int64) {
	p := &s.dur
	p.opMu.Lock()
	defer p.opMu.Unlock()
	p.stopSaves()
	p.mu.Lock()
	st := p.store
	p.mu.Unlock()
	if st == nil {
		return
	}
	err := st.Truncate(g)
	p.mu.Lock()
	// Even when Truncate failed: a marker after g is never of the
	// trajectory the rank resumes, and must not be reported.
	p.markers = slices.DeleteFunc(p.markers, func(m int64) bool { return m > g })
	p.lastBase = noStep
	p.mu.Unlock()
	p.resumeSaves(s.life)
	if err != nil {
		s.h.log.Warn("durable tier: cannot forget what the rank saved after the step it resumes from", "rank", s.rank, "step", g, "err", err)
	}
	s.h.cfg.Changed()
}

// persistReclaim frees what a recovery at the job's commit record d
// cannot need, and what the launcher abandoned, every step up to x other
// than d (-1: none), with the rank's markers of those steps.
func (s *service) persistReclaim(d, x int64) {
	p := &s.dur
	p.opMu.Lock()
	defer p.opMu.Unlock()
	p.mu.Lock()
	st := p.store
	p.mu.Unlock()
	if st == nil {
		return
	}
	s.reclaimStore(st, d, x)
	s.h.cfg.Changed()
}

// reclaimStore has st reclaim before d and abandon up to x (each -1:
// none), and forgets the markers it freed. persist.opMu is held.
func (s *service) reclaimStore(st *durable.Store, d, x int64) {
	p := &s.dur
	if d >= 0 {
		freed, err := st.Reclaim(d)
		switch {
		case err != nil:
			// ErrNoVersion: the rank does not hold d here (its directory
			// is not the one the commit was made from); nothing was
			// freed (Abandon frees those versions below).
			s.h.log.Debug("durable tier: nothing reclaimed", "rank", s.rank, "committed", d, "err", err)
		case freed > 0:
			s.h.log.Debug("durable tier: reclaimed", "rank", s.rank, "committed", d, "files", freed)
		}
		if err == nil {
			p.mu.Lock()
			p.markers = slices.DeleteFunc(p.markers, func(m int64) bool { return m < d })
			p.mu.Unlock()
		}
	}
	if x >= 0 {
		freed, err := st.Abandon(d, x)
		if err != nil {
			s.h.log.Warn("durable tier: cannot free every version the launcher abandoned (tried again at the next)", "rank", s.rank, "committed", d, "resolved", x, "err", err)
		} else if freed > 0 {
			s.h.log.Debug("durable tier: abandoned", "rank", s.rank, "committed", d, "resolved", x, "files", freed)
		}
		// Whatever Abandon managed: the launcher never commits those
		// steps, and does not want their markers.
		p.mu.Lock()
		p.markers = slices.DeleteFunc(p.markers, func(m int64) bool { return m <= x && m != d })
		p.mu.Unlock()
	}
}

// persistClose ends the rank's saves and closes its store (the service
// is closing: its life has ended).
func (s *service) persistClose() error {
	p := &s.dur
	p.mu.Lock()
	p.closed = true // no store opens from now on
	p.mu.Unlock()
	p.retries.Wait() // before opMu, which a retry takes
	p.opMu.Lock()
	defer p.opMu.Unlock()
	p.stopSaves()
	p.mu.Lock()
	st := p.store
	p.store = nil
	p.mu.Unlock()
	if st == nil {
		return nil
	}
	return st.Close()
}

// persistProgress returns the rank's durable progress, its markers up to
// committed (the rank's Committed in the same report), or nil when the
// job has no durable tier or the rank has not opened its store yet.
func (s *service) persistProgress(committed int64) *DurableProgress {
	if !s.h.cfg.Persist.on() {
		return nil
	}
	var regions []protect.Region
	if s.h.D() < 0 {
		s.mu.Lock() // before p.mu: see persist
		regions = slices.Clone(s.regions)
		s.mu.Unlock()
	}
	p := &s.dur
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.store == nil && p.off == "" {
		return nil
	}
	d := &DurableProgress{Saves: p.saves, Skipped: p.skipped, Failed: p.failed, WriteNS: p.writeNS, Bytes: p.bytes,
		HoldNS: p.holdNS.Load(), Off: p.off, Resolved: max(committed, noStep)}
	// A save of a step at or before committed began at its commit, under
	// s.mu, before committed was read: it is in flying, until saved()
	// takes it out and adds its marker, both under p.mu.
	for st := range p.flying {
		d.Resolved = min(d.Resolved, st-1)
	}
	if p.store != nil {
		d.N = p.n
	}
	for _, m := range p.markers {
		if m <= committed {
			d.Markers = append(d.Markers, m)
		}
	}
	if p.store != nil {
		d.Regions = regions
	}
	if s.dlog != nil {
		st := s.dlog.Stats()
		d.Log = &st
	}
	return d
}
