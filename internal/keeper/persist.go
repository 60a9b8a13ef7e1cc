package keeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/protect"
)

// The durable tier (gorun --ckpt-dir; package durable, DESIGN.md §5
// "Persistent tier", issue 17): every Every steps each rank's service
// writes its committed slot to disk as a base, PCcheck style, off the
// training path:
//
//   - On the commit of step s with s % Every == 0 the service starts a
//     durable.Store.Save of the slot holding s, on a goroutine of its own
//     (the service waits for it when it closes or truncates). Until the
//     save has read the slot (Save's copied), the slot is held: a stage
//     that would overwrite it waits (service.waitHold), beside the
//     overwrite rule's wait for G, and the wait is counted on its own
//     (DurableProgress.HoldNS). The save reads the slot through readSlot,
//     as the replicator's snapshots do: the slots stay mapped meanwhile.
//     The store writes its chunks with O_DIRECT, each copied once from
//     the slot, so the hold lasts as long as the save's chunk writes
//     reach the device; the next stage that overwrites the slot comes a
//     step after the base step's commit, and waits only when those
//     writes take longer than that step (a slow disk, many ranks on
//     one). A stage that waited has the rank's next saves write through
//     the page cache (durable.Store.CopyWaited, for
//     durable.PageCacheSaves saves, then O_DIRECT again): their holds
//     end with the copy into the page cache, the kernel writing the
//     pages back meanwhile.
//   - Up to N saves are in flight per rank; a base due when N are, or
//     when the store has no free base file (durable.ErrBusy), is skipped
//     and counted: the durable tier fell behind. Any other error (a full
//     or failing disk) abandons that version (durable never leaves a torn
//     one), is counted and logged once per burst, and training goes on,
//     protected by the memory tiers.
//   - N is --ckpt-concurrency, or automatic: 1 at first, then after each
//     save PCcheck's formula (durable.DefaultConcurrency) with the save's
//     measured write time and the step time measured between bases, at
//     most autoMaxConcurrency. The store is opened with the most saves
//     that may ever be in flight (the flag, or autoMaxConcurrency), so it
//     has that many plus one base files from the start: reopening a store
//     to grow it would have to wait for every save in flight, and its
//     files are preallocated once.
//   - Each save that completes leaves the rank's completion marker; the
//     service reports the steps of its markers (DurableProgress.Markers)
//     and its resolved step (DurableProgress.Resolved: the step before
//     its oldest save in flight, or its committed step; durable,
//     "Committing and abandoning"). The launcher decides every step up to
//     X, the minimum of the resolved steps and G: it commits the newest
//     step every rank has a marker of (only one at or below G: a step
//     after G may be rolled back by a recovery, which truncates the store
//     to G), abandons the others, and publishes the commit record's step
//     and X (wire.GlobalStep.D and X). The host then commits D in its own
//     directory when that is not the launcher's (per-host local disks;
//     if it cannot, it frees nothing until it can), and has every local
//     rank's store reclaim what is older than D and free every version
//     up to X but D's (Keeper.SetDurable, durable.Store.Abandon): so a rank
//     always gets its base files back, even when the ranks' saves that
//     failed or were skipped leave no step they all hold.
//   - A restore at G (a restart, an in-place recovery, a rank rebuilt on
//     a new host) first stops the rank's saves in flight and truncates its
//     store to G (durable.Store.Truncate): what the rank saved after G
//     belongs to a trajectory the job abandoned.
//   - One host at a time has a rank's store open (durable.Open locks it).
//     A host the rank left ends the rank's saves and closes its store
//     (persistClose, when the placement moves the rank away); a host
//     that takes a rank over while the old one still has the store open
//     (durable.ErrLocked: it has not learnt of the move, or is cut off)
//     reports the store off, counts each base due as failed and tries to
//     open the store again at each (persistReopen), training going on.

// PersistConfig configures the durable tier of a host's ranks
// (Config.Persist). The zero value has none.
type PersistConfig struct {
	// Dir is the job's checkpoint directory (gorun --ckpt-dir; "": no
	// durable tier).
	Dir string
	// Every: a base every Every steps (--ckpt-every, at least 1).
	Every int
	// Concurrency is the number of saves a rank allows in flight
	// (--ckpt-concurrency, 1 to durable.MaxConcurrency), or 0: automatic.
	Concurrency int
	// Overhead is the fraction of the step time the automatic
	// concurrency allows the saves to cost (--ckpt-overhead; 0 means
	// 0.03).
	Overhead float64
	// Writers and ChunkSize are the stores' durable.Options (0: the
	// package's defaults).
	Writers, ChunkSize int
}

// autoMaxConcurrency caps the automatic concurrency: a rank's store
// keeps this many plus one base files, each the size of its state.
const autoMaxConcurrency = 4

// defaultOverhead is --ckpt-overhead's default: PCcheck's 3%.
const defaultOverhead = 0.03

func (c PersistConfig) on() bool { return c.Dir != "" }

// maxInFlight is the number of saves a rank's store is opened for.
func (c PersistConfig) maxInFlight() int {
	if c.Concurrency > 0 {
		return c.Concurrency
	}
	return autoMaxConcurrency
}

func (c PersistConfig) overhead() float64 {
	if c.Overhead > 0 {
		return c.Overhead
	}
	return defaultOverhead
}

// check validates c (Config.Persist).
func (c PersistConfig) check() error {
	if !c.on() {
		return nil
	}
	switch {
	case !filepath.IsAbs(c.Dir):
		return fmt.Errorf("rank: checkpoint directory %q is not absolute", c.Dir)
	case c.Every < 1:
		return fmt.Errorf("rank: a base every %d steps", c.Every)
	case c.Concurrency < 0 || c.Concurrency > durable.MaxConcurrency:
		return fmt.Errorf("rank: durable concurrency %d, want 0 to %d", c.Concurrency, durable.MaxConcurrency)
	case c.Overhead < 0 || c.Overhead >= 1:
		return fmt.Errorf("rank: durable overhead %v, want 0 to 1", c.Overhead)
	}
	return nil
}

// DurableProgress is one local rank's durable tier (Progress.Durable).
type DurableProgress struct {
	// Markers are the steps of the rank's completion markers not
	// reclaimed, ascending, none after Progress.Committed.
	Markers []int64
	// Resolved is the rank's resolved step (package durable, "Committing
	// and abandoning"), at most Progress.Committed: the step before its
	// oldest save in flight, or Committed when none is. Every save of a
	// step at or before it has ended, and Markers up to it are final.
	Resolved int64
	// Saves written, skipped because the durable tier fell behind, and
	// failed (I/O errors); their write time and bytes.
	Saves, Skipped, Failed int64
	WriteNS, Bytes         int64
	// HoldNS is the stages' total wait for a save to finish reading the
	// slot they were about to overwrite.
	HoldNS int64
	// N is the number of saves allowed in flight now.
	N int
	// Regions are the rank's regions while the host knows of no commit
	// record yet (nil after): the launcher writes the job's manifest from
	// them before it commits.
	Regions []protect.Region
	// Off says why the rank has no store (it could not be opened).
	Off string
	// Log are the counters of the rank's differential log on disk (diff
	// mode, see difflog.go), or nil without one: its dropped steps are
	// gaps the disk's reach stops before until the next committed base.
	Log *difflog.WriterStats
}

// persist is one rank's durable tier (service.dur). Its fields are
// guarded by mu, except the immutable ones set by open; the holds on the
// slots are the service's (service.holds, under its mu). Lock order:
// service.mu, then persist.mu.
type persist struct {
	opMu sync.Mutex // serializes open, truncate, reclaim and close of the store

	mu       sync.Mutex
	store    *durable.Store
	names    []string // the rank's regions, in order
	size     int64    // their bytes
	off      string   // why there is no store
	markers  []int64  // ascending
	n        int      // saves allowed in flight
	inflight int
	flying   map[int64]bool // the steps of the saves in flight (inflight of them)
	saves    int64
	skipped  int64
	failed   int64
	writeNS  int64
	bytes    int64
	// failing: the last save failed (a burst of failures is logged once).
	failing bool
	// The step time, measured between the commits of two bases.
	lastBase   int64
	lastBaseAt time.Time
	stepTime   time.Duration
	// ctx ends the saves in flight (a truncate or close cancels it);
	// stopping refuses new ones while the saves are waited for.
	ctx      context.Context
	cancel   context.CancelFunc
	stopping bool
	wg       sync.WaitGroup

	// locked: the store is open elsewhere (durable.ErrLocked: the
	// rank's old host still has it); each base due counts as failed and
	// has the store opened again (persistReopen, one at a time, on a goroutine
	// of retries), until closed.
	locked, reopening, closed bool
	retries                   sync.WaitGroup

	holdNS  atomic.Int64
	waiting atomic.Int32 // stages waiting for a hold
}

// baseSave is one save due: the step, the slot holding it and its hold.
type baseSave struct {
	step int64
	slot int
	hold chan struct{}
	ctx  context.Context
}

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

// persistHost is a host's side of the durable tier's watermark: the
// newest commit record and resolved step the launcher published
// (SetDurable), applied by its loop (Keeper.persistLoop).
type persistHost struct {
	mu sync.Mutex
	d  int64 // the newest watermark published, or -1
	x  int64 // the newest resolved step published, or -1
	// appliedD and appliedX are the watermark and resolved step the loop
	// is applying or applied last (-1: none), and local whether the
	// host's directory is its own (1: it writes a commit record there
	// too; 0: the launcher's; -1: not known yet). A store opened in a
	// directory of the host's own starts from what was applied, never
	// from a watermark whose commit record the directory may not hold.
	appliedD, appliedX int64
	local              int
	kick               chan struct{}
	// rounds counts the loop's rounds that took a new watermark up,
	// applied or not (tests wait for them).
	rounds int
	// doneD and doneX are the watermark and resolved step the loop
	// applied whole (every local store reclaimed; -1: none), and
	// roundDone is closed, and replaced, at the end of each of its
	// rounds: Close waits on them (persistFinish). closing: Close is
	// waiting (tests look).
	doneD, doneX int64
	roundDone    chan struct{}
	closing      bool
}

// D returns the newest durable watermark (the job's commit record) the
// launcher published to this host, or -1.
func (h *Keeper) D() int64 {
	d, _ := h.durable()
	return d
}

// X returns the newest durable resolved step the launcher published to
// this host, or -1.
func (h *Keeper) X() int64 {
	_, x := h.durable()
	return x
}

// durable returns the newest durable watermark and resolved step the
// launcher published to this host (-1: none).
func (h *Keeper) durable() (d, x int64) {
	h.dur.mu.Lock()
	defer h.dur.mu.Unlock()
	return h.dur.d, h.dur.x
}

// SetD takes a newer durable watermark d: SetDurable(d, -1).
func (h *Keeper) SetD(d int64) { h.SetDurable(d, noStep) }

// SetDurable takes a newer durable watermark d, the step of the job's
// commit record (wire.GlobalStep.D), and a newer resolved step x
// (wire.GlobalStep.X: every step up to it other than d is abandoned);
// older ones and -1 are ignored. The host's loop commits d in the host's
// own directory, when that is not the launcher's, and has every local
// rank's store reclaim what a recovery at d cannot need and free the
// versions abandoned. It does nothing without a durable tier.
func (h *Keeper) SetDurable(d, x int64) {
	if !h.cfg.Persist.on() {
		return
	}
	h.dur.mu.Lock()
	if d <= h.dur.d && x <= h.dur.x {
		h.dur.mu.Unlock()
		return
	}
	h.dur.d, h.dur.x = max(h.dur.d, d), max(h.dur.x, x)
	h.dur.mu.Unlock()
	select {
	case h.dur.kick <- struct{}{}:
	default:
	}
	h.cfg.Changed() // the reports stop carrying the regions
}

// startPersist starts the host's watermark loop, with a durable tier.
func (h *Keeper) startPersist() {
	if !h.cfg.Persist.on() {
		return
	}
	h.dur.kick = make(chan struct{}, 1)
	h.dur.doneD, h.dur.doneX = noStep, noStep
	h.dur.roundDone = make(chan struct{})
	h.wg.Add(1)
	go h.persistLoop()
}

// persistCloseWait bounds how long Close waits for the host's loop to
// apply the newest watermark and resolved step (persistFinish): below
// the launcher's wait for its agents to exit (launcher.exitWait), which
// kills those that stay.
const persistCloseWait = 2 * time.Second

// persistFinish waits, at most persistCloseWait, until the host's loop
// has applied the newest watermark and resolved step published
// (SetDurable) to every local store: the end of a job, where the
// launcher's last commit reaches the host as it is told to exit
// (wire.OpExit carries it), must not leave behind it the versions and
// markers the commit record makes useless. Close calls it before it
// stops the loop; a host that cannot (its stores slow or failing, its
// own commit record not written) says what it leaves.
func (h *Keeper) persistFinish() {
	if !h.cfg.Persist.on() || h.dur.kick == nil {
		return
	}
	timeout := time.NewTimer(persistCloseWait)
	defer timeout.Stop()
	for {
		h.dur.mu.Lock()
		h.dur.closing = true
		d, x, doneD, doneX, round := h.dur.d, h.dur.x, h.dur.doneD, h.dur.doneX, h.dur.roundDone
		h.dur.mu.Unlock()
		if d <= doneD && x <= doneX {
			return
		}
		select {
		case <-round:
		case <-timeout.C:
			h.log.Warn("durable tier: closing before the last commit record was applied: this host's ranks may keep versions and markers it makes useless, and versions it abandoned, in the checkpoint directory (a --resume ignores them and frees them)",
				"dir", h.cfg.Persist.Dir, "committed", d, "resolved", x, "applied", doneD, "applied resolved", doneX, "waited", persistCloseWait)
			return
		case <-h.life.Done():
			return
		}
	}
}

// persistLoop applies each new watermark and resolved step: a commit
// record in the host's directory if the launcher does not write there (a
// directory on a local disk of each host: it has no manifest, which the
// launcher writes before its first commit), then every local rank's
// reclaim and abandon. A commit record it cannot write stops it there:
// the ranks free nothing past the record the host's directory durably
// holds (its version must stay, and the new record's too), and the
// record is tried again every persistRetry, or at the next watermark. It
// runs until the host stops; Close first waits, bounded, for it to apply
// the newest watermark (persistFinish).
func (h *Keeper) persistLoop() {
	defer h.wg.Done()
	dir := h.cfg.Persist.Dir
	applied, appliedX := int64(noStep), int64(noStep)
	local := -1 // unknown; 1: commit here too; 0: the launcher's directory (persistHost.local)
	var retry <-chan time.Time
	failing := false
	for {
		select {
		case <-h.dur.kick:
		case <-retry:
		case <-h.life.Done():
			return
		}
		retry = nil
		d, x := h.durable()
		if d <= applied && x <= appliedX {
			continue
		}
		if local < 0 {
			local = 0
			if _, err := durable.ReadManifest(dir); errors.Is(err, durable.ErrNoManifest) {
				local = 1
			}
			h.dur.mu.Lock()
			h.dur.local = local
			h.dur.mu.Unlock()
		}
		ok := true
		if local == 1 && d > applied {
			if err := durable.Commit(dir, d); err != nil {
				ok = false
				if !failing {
					h.log.Warn("durable tier: cannot write the commit record in this host's directory: its ranks reclaim nothing until it can (tried again every second)",
						"dir", dir, "step", d, "err", err)
				}
				retry = time.After(persistRetry)
			} else if failing {
				h.log.Warn("durable tier: the commit record is written in this host's directory again", "dir", dir, "step", d)
			}
			failing = !ok
		}
		if ok {
			// Before the stores: one that opens meanwhile starts from
			// these, or is open when its turn comes (persistReclaim
			// waits for its open).
			h.dur.mu.Lock()
			h.dur.appliedD, h.dur.appliedX = d, x
			h.dur.mu.Unlock()
			for _, s := range h.place().svcs {
				if h.life.Err() != nil {
					return
				}
				s.persistReclaim(d, x)
			}
			applied, appliedX = d, x
		}
		h.dur.mu.Lock()
		h.dur.rounds++
		if ok {
			h.dur.doneD, h.dur.doneX = d, x
		}
		close(h.dur.roundDone)
		h.dur.roundDone = make(chan struct{})
		h.dur.mu.Unlock()
		h.cfg.Changed()
	}
}

// persistRetry is how long a host waits before it tries again a commit
// record it could not write in its own directory.
const persistRetry = time.Second

// durableLogEvery is how often at most a store's log says the same thing:
// a full or failing disk has it retry (and warn) at every save.
const durableLogEvery = 30 * time.Second

// quietHandler passes a record on only if no record with its message
// passed in the last every: the durable stores' warnings, which a full
// disk repeats at every save and reclaim, once per rank and period.
type quietHandler struct {
	next  slog.Handler
	every time.Duration
	state *quietState
}

type quietState struct {
	mu   sync.Mutex
	last map[string]time.Time // by message
}

func newQuietHandler(next slog.Handler, every time.Duration) *quietHandler {
	return &quietHandler{next: next, every: every, state: &quietState{last: map[string]time.Time{}}}
}

func (q *quietHandler) Enabled(ctx context.Context, l slog.Level) bool { return q.next.Enabled(ctx, l) }

func (q *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	st := q.state
	st.mu.Lock()
	last, seen := st.last[r.Message]
	pass := !seen || r.Time.Sub(last) >= q.every
	if pass {
		st.last[r.Message] = r.Time
	}
	st.mu.Unlock()
	if !pass {
		return nil
	}
	return q.next.Handle(ctx, r)
}

func (q *quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &quietHandler{next: q.next.WithAttrs(as), every: q.every, state: q.state}
}

func (q *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{next: q.next.WithGroup(name), every: q.every, state: q.state}
}
