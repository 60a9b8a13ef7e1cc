package keeper

import (
	"context"
	"fmt"
	"path/filepath"
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
