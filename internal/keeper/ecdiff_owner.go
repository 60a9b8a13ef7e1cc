package keeper

// Diff mode under erasure coding, the owner's side (PROTOCOL.md "Erasure
// coding and diff mode"). Parity cannot absorb a differential, so only
// base steps are coded, and the differentials since the newest coded base
// are kept on M hosts other than the owner's.
//
// The schedule. Every rank of the job codes the same steps without
// talking to the others: b_0, the anchor, is the step the ranks resumed
// from in this placement (Placement.G, or the G of the last Restart); at
// the job's start (no such step) it is the first step the rank commits
// (0 for a trainer that counts from 0; the ranks of an SPMD job commit
// the same first step, so they agree), and b_{k+1} = b_k + B
// (DiffConfig.baseEvery). The schedule is over the
// steps the rank commits: a b_k the trainer skips (its Stage jumps past
// it) is not coded, and the next one after it is due (the ranks of an
// SPMD job skip the same steps). When the rank commits b_k, the
// replicator copies the slot's replicated regions into a snapshot and
// checks the copy against the commit's CRC32Cs (snapshotDue: the base
// refresh's snapshot of plain diff mode). From the snapshot:
//
//   - the refresh goes to the clear copy's holder (kinds 7 and 8, after
//     the differentials, or alone when the holder has no differential
//     to take), paced as the shares are below, by the same sharePace
//     (clearLimitLocked: unpaced, it went whole in the round after the
//     base's differential, and the step after a base paid for it),
//     preceded by baseH (kind 15: "H >= h"), so that the holder installs
//     a verified b_{k-1} before BeginBase(b_k) would drop it. That holder never gets a base of a
//     slot (plain diff mode's, at whatever step the slot holds): one
//     that cannot follow the differentials gets the snapshot whole, as a
//     base of exactly its step (planClearLocked), which it grafts onto
//     a store that holds the step (graftBase);
//   - the M shares go to the parity rows through ecSendLanes
//     (ecsend.go), given the snapshot's views, in the background
//     (sendShares), paced over the refresh's window as the clear copy's
//     refresh is (sharePace): by the time the rank commits b_k + i, at
//     most (i+1)/σ of the shard is encoded and sent, all of it from
//     b_k + σ - 1 on, so that the cap below never waits for the pacing.
//     Unpaced, the burst showed in the step time: with 64 MiB per rank,
//     2+2, a base every 8 steps (bench -modes diff, 8 interleaved runs),
//     the step after a base took 70 ms more than the run's others
//     (replicas:2's paced refresh: 13 ms). The schedule's first base is
//     not paced (the cap is the floor until it is coded), nor any while
//     the rank is not committing (a pause of twice its last step time
//     counts as a step: sharePace).
//
// Both start only once this host knows H >= b_{k-1} (the gate): the rows
// keep two buffers, and the holder's store one verified refresh, so b_k
// may not push out the base H still depends on. A rank that runs on its
// own data host has no clear copy: its snapshot is the data host's copy
// of its shard at b_k, retained (and served to restores, retainedBase)
// until H passes it.
//
// Base and the cap. Base_r is the newest b_k every row acknowledged the
// share of and the data host holds (the holder committed the refresh or
// got a base at b_k; or the snapshot is retained). Replicated_r is the
// minimum over the differentials' targets (the clear copy's holder and
// the log-only holders, which acknowledge a step only when they hold
// every record from H+1 to it) capped at:
//
//   - floor (the step the placement resumed from) while no base of the
//     schedule is coded: recovery then decodes at the old H and replays
//     up to floor. At the job's start (no floor) that is -1: no step is
//     recoverable before b_0, the first step committed, is coded (a loss
//     then starts the job again, as full mode does before its first
//     replication), and none is committed before b_0 that a decode could
//     not restore;
//   - Base_r + B + σ - 1 otherwise (σ = refreshSteps), and at most the
//     next base step while it is not snapshotted, so that its slot is not
//     staged over first (the overwrite rule needs G >= b to stage b+2).
//
// So G >= s implies, for every rank, a coded base H <= s and its records
// (H, s] on M hosts: s survives any M lost hosts.

import (
	"context"
	"slices"
	"time"
)

// ecBase is a replicator's base schedule in diff mode under EC. r.mu
// guards it.
type ecBase struct {
	// seq and gen: the placement and restart generation the schedule
	// was anchored in (a new one rebases it).
	seq   uint64
	gen   uint64
	set   bool
	floor int64 // the step the ranks resumed from (-1: the job's start)
	// anchor is b_0: floor, or at the job's start the first step
	// committed (-1 until it is known).
	anchor int64
	next   int64 // the next base step to snapshot (-1: none yet)
	// first is the first step the rank committed in restart generation
	// firstGen, if hasFirst, whatever the schedule (committed records
	// it).
	first    int64
	firstGen uint64
	hasFirst bool
	// coded are the coded bases of the schedule (Base_r is the newest),
	// the last few.
	coded []int64
	// retained are the snapshots of coded bases kept because the rank
	// runs on its data host (its shard's only copy there), oldest
	// first, until H passes them.
	retained []*refresh
	// held are the bytes reserved against the host's replica-memory
	// reserve for each snapshot taken on the rank's data host, while it
	// is the current refresh or retained; heldBytes their sum, with a
	// reservation made for a snapshot being taken (ecdiff_mem.go).
	held      map[*refresh]uint64
	heldBytes uint64
	// noRoom is one more than the last base step whose snapshot the
	// reserve refused (logged once), first at noRoomSince.
	noRoom      int64
	noRoomSince time.Time
	noRoomRetry *time.Timer // runs the loop again while a snapshot waits (retrySnapLocked)
	paceRetry   *time.Timer // runs the loop again while the clear copy's refresh waits at its pacing (pacedRetryLocked)
	// shares is the send of the current refresh's shares in flight, or
	// nil; stopping is the last one cancelled (dropRefLocked), which may
	// still run: the next run waits for it before it sends (the runs
	// share the encoder's block and the share buffers, r.ec).
	shares, stopping *shareRun
	// resumedEpoch is the epoch of the placement the rank last resumed
	// under (truncateDiffs: a restart or a restore), 0 if none: every
	// step it sent since is of that placement's trajectory.
	resumedEpoch uint64
	// lastStep is the newest step the rank committed, at lastAt (zero:
	// none yet), and stepTime the time between its last two commits (0:
	// not known): what a share send's pacing starts from (sharePace).
	lastStep int64
	lastAt   time.Time
	stepTime time.Duration
}

// testHookShareWait, if set, is called when a share send starts to wait
// for the cancelled one before it (tests).
var testHookShareWait func(r *replicator)

// shareRun is one background send of a base's shares: cancel ends it,
// done is closed when it has; pace paces it (nil: unpaced).
type shareRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	pace   *sharePace
}

// base returns Base_r, or -1.
func (b *ecBase) base() int64 {
	if len(b.coded) == 0 {
		return noStep
	}
	return b.coded[len(b.coded)-1]
}

// schedLocked brings the schedule to placement p and the host's restart
// generation: a new placement or generation rebases it at the step the
// ranks resumed from. r.mu is held.
func (r *replicator) schedLocked(p *placement) *ecBase {
	b := &r.ecb
	h := r.s.h
	h.gmu.Lock()
	gen, resumed := h.gen, h.resumed
	h.gmu.Unlock()
	if b.set && b.seq == p.seq && b.gen == gen {
		return b
	}
	floor := max(p.g, resumed)
	if b.set && b.gen == gen && floor < b.floor {
		floor = b.floor
	}
	b.set, b.seq, b.gen = true, p.seq, gen
	b.floor, b.anchor = floor, floor
	if floor < 0 {
		b.anchor = noStep
		if b.hasFirst && b.firstGen == gen {
			b.anchor = b.first
		}
	}
	b.next = b.anchor
	// The bases coded under the old schedule stay coded (the old H);
	// they do not count as this schedule's.
	b.coded = nil
	if r.ref != nil && (b.anchor < 0 || r.ref.step != b.anchor || r.ref.gen != gen) {
		// Another step, or a snapshot labelled with an older restart
		// generation, whose shares every row refuses now: the anchor's
		// slot is snapshotted again (the cap keeps it).
		r.dropRefLocked()
	}
	if r.ref != nil {
		b.next = b.anchor + r.every()
		// The anchor's snapshot stays, and its shares' send with it: no
		// base of this schedule is coded, so the cap is the floor until
		// this one is, and its send goes unpaced from here on.
		r.liftPaceLocked()
	}
	return b
}

// firstCommitLocked records step, committed in restart generation gen,
// if it is the first of gen: at the job's start it fixes the schedule's
// anchor. r.mu is held.
func (r *replicator) firstCommitLocked(gen uint64, step int64) {
	b := &r.ecb
	if b.hasFirst && b.firstGen == gen {
		return
	}
	b.first, b.firstGen, b.hasFirst = step, gen, true
	if b.set && b.gen == gen && b.floor < 0 && b.anchor < 0 {
		b.anchor, b.next = step, step
	}
}

// logFloorLocked returns the oldest step a log-only holder's log may
// begin at (it takes the differentials after it): the step the schedule
// resumed from, or at the job's start the step before the first one the
// rank committed in this generation (its differential is the first
// record), or -1. r.mu is held.
func (r *replicator) logFloorLocked() int64 {
	b := &r.ecb
	if b.floor < 0 && b.hasFirst && b.firstGen == r.s.h.Gen() {
		return max(b.floor, b.first-1)
	}
	return b.floor
}

// every returns B, the base schedule's period.
func (r *replicator) every() int64 { return int64(r.s.h.cfg.Diff.baseEvery()) }

// capLocked returns the most Replicated may say (see the top of this
// file). r.mu is held.
func (r *replicator) capLocked(p *placement) int64 {
	b := r.schedLocked(p)
	base := b.base()
	if b.anchor < 0 {
		return noStep // nothing committed yet
	}
	if base < b.anchor {
		return b.floor // -1 at the job's start
	}
	r.skipLocked(b)
	if r.ref != nil && r.ref.step > base {
		// The next base is snapshotted: σ steps to send it in.
		return r.ref.step + r.s.h.cfg.Diff.refreshSteps() - 1
	}
	// b.next is not snapshotted yet: its slot must stay.
	return b.next
}

// skipLocked moves the schedule's next base past the base steps the
// rank skipped: those before its newest committed step that no slot
// holds (a base step it committed stays in a slot until it is
// snapshotted: the cap). r.mu is held.
func (r *replicator) skipLocked(b *ecBase) {
	if b.next < 0 {
		return
	}
	s := r.s
	s.mu.Lock()
	c, slots := s.committed, s.slotStep
	s.mu.Unlock()
	for b.next < c && !slices.Contains(slots[:], b.next) {
		b.next += r.every()
	}
}

// baseIn returns Progress.Base under placement p for a rank whose
// Replicated is repl: the newest coded base <= repl, or -1.
func (r *replicator) baseIn(p *placement, repl int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.schedLocked(p)
	for i := len(b.coded) - 1; i >= 0; i-- {
		if b.coded[i] <= repl {
			return b.coded[i]
		}
	}
	return noStep
}

// ownData reports whether the rank runs on its own data host under p (no
// clear copy elsewhere: its snapshot is the data host's copy).
func (r *replicator) ownData(p *placement) bool { return len(p.targets(r.s.rank)) == 0 }

// gateOpen reports whether the base ref may be sent: no base of the
// schedule is coded yet (it is the schedule's first), or this host knows
// H >= the one before it (the newest coded: b_{k-1}, or an earlier one
// when the rank skipped base steps). r.mu is held.
func (r *replicator) gateOpen(ref *refresh) bool {
	b := &r.ecb
	base := b.base()
	return base < 0 || base < b.anchor || ref.step <= b.anchor || r.s.h.H() >= base
}

// snapshotDueEC takes the snapshot of the next base step once the rank
// committed it (see the top of this file); it runs in the loop, between
// rounds, as snapshotDue.
func (r *replicator) snapshotDueEC() {
	s := r.s
	p := s.h.place()
	s.mu.Lock()
	c := s.committed
	var names []string
	var size uint64
	for _, i := range s.repl {
		names = append(names, s.regions[i].Name)
		size += uint64(s.regions[i].Size)
	}
	s.mu.Unlock()
	gen0 := s.h.Gen() // a failure below is this generation's
	r.mu.Lock()
	b := r.schedLocked(p)
	r.settleSnapsLocked()
	if r.ref != nil || b.next < 0 || c < b.next || r.failed || r.stopped {
		r.mu.Unlock()
		return
	}
	r.skipLocked(b)
	step := b.next
	if c < step {
		r.mu.Unlock()
		return
	}
	seq := b.seq
	// On its data host the snapshot is the shard's copy there, retained
	// until H passes it: reserved against the host's replica-memory
	// reserve before it is allocated (ecdiff_mem.go).
	var held uint64
	if r.ownData(p) {
		stuck, err := r.holdSnapLocked(step, size)
		if stuck {
			// For good (ecdiff_mem.go): the rank fails, its error
			// naming the reserve, rather than stalling the job.
			r.failed = true
			r.mu.Unlock()
			if s.h.Gen() == gen0 {
				// (A restart since would have this loop's
				// failure taken for its new process's.)
				s.fail(gen0, err)
			}
			return
		}
		if err != nil {
			r.mu.Unlock()
			return
		}
		held = size
	}
	r.mu.Unlock()
	unhold := func() {
		r.mu.Lock()
		r.unholdSnapLocked(held)
		r.mu.Unlock()
	}
	gen := s.h.Gen() // before the slot is read: see send
	s.mu.Lock()
	slot := slices.Index(s.slotStep[:], step)
	var epoch uint64
	if slot >= 0 {
		epoch = s.slotEpoch[slot]
	}
	s.mu.Unlock()
	if slot < 0 {
		// Staged over since: the next round finds it skipped.
		unhold()
		return
	}
	ref, err := r.snapshot(step, names)
	if err != nil {
		unhold()
		s.h.log.Debug("base snapshot postponed", "rank", s.rank, "step", step, "err", err)
		return
	}
	ref.gen, ref.epoch = gen, epoch
	n := s.h.cfg.Diff.refreshSteps()
	ref.budget = max(1, (int64(len(ref.buf))+n-1)/n)
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.schedLocked(p); b.seq != seq || b.next != step || r.ref != nil || s.h.Gen() != gen || r.stopped {
		ref.rb.release() // rebased meanwhile
		r.unholdSnapLocked(held)
		return
	}
	r.ref, r.refStep = ref, step
	r.heldSnapLocked(ref, held)
	clear(r.refProg)
	b.next = step + r.every()
	if r.ownData(p) {
		ref.data = true
	}
}
