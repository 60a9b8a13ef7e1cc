package hotswap

import (
	"fmt"
	"slices"
)

// Rolling the job back to the durable tier (issue 17's retrieval cascade
// for host replacement): when a lost host's rank has no copy of its state
// at G left in memory (its host and every holder lost), the job does not
// stop if it has a durable tier with a commit record (Config.Durable, a
// DiskCommitted event). The lost host's ranks move to their replacement
// as in any splice, in a new restart generation and epoch, and the
// machine asks the caller how far every rank reaches on disk
// ([GatherReach]): the committed base plus each rank's contiguous
// differentials. The caller answers with [DiskReach]; T is that step,
// and at most G. The machine then rolls the whole job back to T
// ([RollbackToDisk]: every host rebuilds every one of its ranks' states
// at T from disk, survivors too, whose slots hold newer steps), restarts
// every rank from T ([Restart] with G = T) and publishes the epoch with
// G = T, every rank restoring from its own slot. The copies at holders
// are of later steps: every shard is under-protected until re-sent.
//
// While the reach is gathered the survivors cannot train past G + 1 (the
// overwrite rule waits for G, which cannot pass without the lost ranks),
// the old generation's rank exits are ignored (the generation moved on),
// and a further host loss moves its ranks too and asks again (the epoch
// is superseded).
//
// Under erasure coding (full mode) the roll-back is the same: the
// replacement takes the lost host's places in its groups (ecSplice), and
// at T every clear copy and every parity share is marked missing: the
// rows and clear copies the survivors keep are of later steps (a restart
// to T empties the rows of steps after T, keeper.Keeper.Restart), so every
// owner re-encodes its shares of T from its reloaded slot and the rows
// count again once it reports Replicated, as after any splice.
//
// In diff mode under erasure coding the base schedule restarts from T:
// T is b_0, as the first committed step is at the job's start, H goes
// back to -1 (the launcher's and every host's, keeper.Keeper.RollBack) and
// every owner codes T again in the new placement. So at T every clear
// copy, parity share, log copy and retained snapshot is missing, and the
// caller reports Replicated only once H reached T and every rank coded
// its base there in the roll-back's epoch (ecdiff.go's rule for a
// splice, with G = T): until then a loss that memory cannot serve rolls
// back again. Nothing of the old schedule (its bases, their shares, the
// logs after them) is named by H again.

// GatherReach: epoch Epoch's ranks (RankHost of the Splice before it)
// must be rolled back to the durable tier: ask every host with ranks for
// its ranks' reach on disk from the commit record's step Base, and answer
// with a [DiskReach] of this epoch. The ranks are not restarted yet.
type GatherReach struct {
	Epoch uint64
	Base  int64
}

// RollbackToDisk: the job rolls back from step From (the G lost) to step
// T < From or = From, in generation Gen and epoch Epoch: every host
// rebuilds each of its ranks' states at T from the durable tier into its
// slots before it starts them, and the job's G becomes T. A Restart (G =
// T), the epoch's PublishEpoch and its RestorePlan (every rank from its
// own slot) follow.
type RollbackToDisk struct {
	Gen, Epoch uint64
	T, From    int64
}

// DiskCommitted: the job's commit record on the durable tier is at Step.
type DiskCommitted struct{ Step int64 }

// DiskReach answers a GatherReach of epoch Epoch: T is the newest step
// every rank's state can be rebuilt at from the durable tier, or Err says
// why none can.
type DiskReach struct {
	Epoch uint64
	T     int64
	Err   string
}

func (GatherReach) action()    {}
func (RollbackToDisk) action() {}
func (DiskCommitted) event()   {}
func (DiskReach) event()       {}

func (a GatherReach) String() string {
	return fmt.Sprintf("gather-reach epoch=%d base=%d", a.Epoch, a.Base)
}
func (a RollbackToDisk) String() string {
	return fmt.Sprintf("rollback-to-disk gen=%d epoch=%d t=%d from=%d", a.Gen, a.Epoch, a.T, a.From)
}
func (e DiskCommitted) String() string { return fmt.Sprintf("disk-committed step=%d", e.Step) }
func (e DiskReach) String() string {
	if e.Err != "" {
		return fmt.Sprintf("disk-reach epoch=%d err=%q", e.Epoch, e.Err)
	}
	return fmt.Sprintf("disk-reach epoch=%d t=%d", e.Epoch, e.T)
}

// rollback is a roll-back to the durable tier waiting for the ranks'
// reach on disk.
type rollback struct {
	epoch uint64
	from  int64  // the G lost
	what  string // "rank R's state at step G is lost with hosts X, Y (no replica left)", lostState
	cause string
}

// canRollback reports whether a loss that memory cannot serve can be
// rolled back to the durable tier instead of stopping the job.
func (m *Machine) canRollback() bool {
	return m.cfg.Durable && m.disk >= 0 && m.g >= 0
}

// lostState names the first rank whose state at G no memory tier holds
// (not in its own slot, no valid copy at a live holder), and the hosts it
// went with: those lost since the last recovery ended (its own and its
// holders').
//
// Under EC the rank is the first one neither in the clear (its own slot,
// its clear copy) nor decodable from its stripe.
//
// When every rank's optimizer state survives, what memory cannot serve
// is the restore plan's: why is its error (no data-parallel peer of a
// rank holds its parameters, say), and it is the reason given.
func (m *Machine) lostState(why string) string {
	r := -1
	for x, h := range m.rankHost {
		if m.ec != nil {
			if ok, _ := m.decodable(x); !m.direct(x) && !ok {
				r = x
				break
			}
			continue
		}
		if !(m.localOK[x] && m.alive[h]) && m.copyHolder(x) < 0 {
			r = x
			break
		}
	}
	hs := slices.Clone(m.lostHosts)
	if r < 0 {
		if len(hs) == 0 {
			return fmt.Sprintf("the job's state at step %d cannot be restored from memory (%s)", m.g, why)
		}
		return fmt.Sprintf("the job's state at step %d cannot be restored from memory with %s lost (%s)", m.g, m.hostList(hs), why)
	}
	if len(hs) == 0 {
		hs = []int{m.rankHost[r]}
	}
	what := "no replica left"
	if m.holders != nil && m.corrupt[r] != "" {
		what = "no valid replica left: " + m.corrupt[r]
	}
	if m.ec != nil {
		p := m.ec.at[r]
		what = fmt.Sprintf("fewer than %d of the %d shards of its stripe of erasure-coding group %d left", m.ec.k, m.ec.k+m.ec.m, p.group)
	}
	return fmt.Sprintf("rank %d's state at step %d is lost with %s (%s)", r, m.g, m.hostList(hs), what)
}

// beginRollback: the ranks moved (from lost host h to with) cannot be
// restored from memory; the epoch begins, and the caller is asked for
// the ranks' reach on disk. why is the error that made memory fail
// (recoverable's or the restore plan's).
func (m *Machine) beginRollback(l awaitingLoss, with int, isSpare bool, moved []int, why string) {
	from, what := m.g, ""
	if m.rb != nil {
		from, what = m.rb.from, m.rb.what // a further loss while gathering
	} else {
		what = m.lostState(why)
	}
	m.gen++
	m.resetEnded()
	m.beginEpoch(l.cause, l.detected, m.now)
	m.rb = &rollback{epoch: m.epoch, from: from, what: what, cause: l.cause}
	how := "spare"
	if !isSpare {
		how = "host with free slots"
	}
	m.report("%s; %s; moving ranks %s to %s %s (epoch %d) and rolling the job back to --ckpt-dir (commit record at step %d): reading how far every rank reaches there",
		l.cause, what, ints(moved), how, m.names[with], m.epoch, m.disk)
	m.emit(Splice{Epoch: m.epoch, Lost: l.host, With: with, LostName: m.names[l.host], WithName: m.names[with], Ranks: moved, Spare: isSpare},
		GatherReach{Epoch: m.epoch, Base: m.disk})
}

// rollbackInPlace: rank failure f, with no restore plan from memory
// (why, the plan's error: a rank's every copy lost or corrupt), rolls
// the job back to the durable tier. Every rank stays where it is; the
// epoch begins, in a new generation, and the caller is asked for the
// ranks' reach on disk, as after a splice (beginRollback).
func (m *Machine) rollbackInPlace(f *rankFailure, why string) {
	what := m.lostState(why)
	m.gen++
	m.resetEnded()
	m.beginEpoch(f.what, f.at, -1)
	m.rb = &rollback{epoch: m.epoch, from: m.g, what: what, cause: f.what}
	m.report("%s; %s; restarting every rank in place (epoch %d) rolled back to --ckpt-dir (commit record at step %d): reading how far every rank reaches there",
		f.what, what, m.epoch, m.disk)
	m.emit(GatherReach{Epoch: m.epoch, Base: m.disk})
}

// onCopiesCorrupt keeps e for the rank's exit, which follows it: a
// report with an exit that is no failure, or of another generation, is
// stale (the restore that found the copies was not that exit's).
func (m *Machine) onCopiesCorrupt(e CopiesCorrupt) {
	if m.rank(e.Rank) {
		m.corruptSeen[e.Rank] = &e
	}
}

// markCorrupt marks the copies of e.Rank's shard at e.Holders invalid,
// as a lost holder's: a restore of G found them failing their CRC32C,
// and the rank failed. The shard is under-protected until the owner
// re-sends a copy of a step after G (UnderProtected with Corrupt: a
// Replicated for it counts once G passed e.Step). It reports whether it
// marked any: the rank's failure is then part of the recovery that ran
// the restore (restoreAgain).
func (m *Machine) markCorrupt(e CopiesCorrupt) bool {
	if m.holders == nil || e.Step != m.g || m.g < 0 || m.stopped {
		return false // of another G: stale
	}
	var marked []int
	for _, x := range e.Holders {
		i := slices.Index(m.holders[e.Rank], x)
		if i < 0 || !m.copyOK[e.Rank][i] {
			continue
		}
		m.setCopy(e.Rank, i, false)
		marked = append(marked, x)
	}
	if len(marked) == 0 {
		return false
	}
	m.corruptStep[e.Rank] = max(m.corruptStep[e.Rank], e.Step)
	slices.Sort(marked)
	who := "holder rank " + ints(marked)
	if len(marked) > 1 {
		who = "holder ranks " + ints(marked)
	}
	note := fmt.Sprintf("the copy of step %d at %s failed its CRC32C", e.Step, who)
	if len(marked) > 1 {
		note = fmt.Sprintf("the copies of step %d at %s failed their CRC32C", e.Step, who)
	}
	if m.corrupt[e.Rank] != "" {
		note = m.corrupt[e.Rank] + "; " + note
	}
	m.corrupt[e.Rank] = note
	m.report("rank %d's restore: %s; marked invalid", e.Rank, note)
	m.announced = true
	m.report("under-protected: %d optimizer shards lost a copy (of %d) until it is re-sent", m.under, m.k())
	m.emit(UnderProtected{Epoch: m.epoch, Owners: []int{e.Rank}, Corrupt: true, Step: e.Step})
	return true
}

// restoreAgain: rank failure f followed a restore that found copies
// failing their CRC32C (m.restoreBad's). It is part of the recovery that
// ran the restore (a host loss's splice, or a restart already counted),
// not a new failure: it is not charged to --max-restarts nor counted by
// the crash-loop rule. The ranks restart where they are from another
// valid copy (the corrupt ones are marked invalid), or the job rolls
// back to the durable tier, or it stops naming the rank and the cause.
func (m *Machine) restoreAgain(f *rankFailure) {
	if gone := m.deadWithRanks(); gone != "" {
		m.abort(f.status, "%s; cannot restart the ranks: %s; stopping the job", f.what, gone)
		return
	}
	r := m.restoreBad
	sources, perr := m.plan()
	switch {
	case perr == "":
		if v := m.violation(sources); v != "" {
			m.abort(ExitFailure, "%s; cannot restart: invariant %s", f.what, v)
			return
		}
		m.restartEvery(f, fmt.Sprintf("rank %d's restore found copies failing their CRC32C: restoring every rank again from the valid copies (not counted against --max-restarts)", r), sources)
	case m.canRollback():
		m.rollbackInPlace(f, perr)
	default:
		m.abort(f.status, "%s; cannot restart: %s; stopping the job", f.what, perr)
	}
}

// onDiskReach rolls the job back to the step every rank reaches on disk,
// or stops it.
func (m *Machine) onDiskReach(e DiskReach) {
	rb := m.rb
	if rb == nil || e.Epoch != rb.epoch || m.stopped {
		return
	}
	m.rb = nil
	if e.Err != "" || e.T < 0 {
		why := e.Err
		if why == "" {
			why = "no step every rank reaches"
		}
		m.abort(ExitFailure, "%s; %s, and the job cannot roll back to --ckpt-dir: %s; stopping the job", rb.cause, rb.what, why)
		return
	}
	t := min(e.T, rb.from)
	m.g = t
	// Every copy is re-sent from T: no corrupt mark of a later step
	// holds a Replicated back.
	for o := range m.corruptStep {
		m.corruptStep[o], m.corrupt[o] = -1, ""
	}
	for r := range m.lastStep {
		m.lastStep[r] = min(m.lastStep[r], t)
		m.localOK[r] = true // its host rebuilds it from disk
	}
	// The copies the holders keep are of later steps; under EC so are
	// the parity rows: every share is encoded again from T.
	for o, hs := range m.holders {
		for i := range hs {
			m.setCopy(o, i, false)
		}
		if m.ec != nil {
			for j := range m.ec.share[o] {
				m.setShare(o, j, false)
			}
		}
		if m.diffEC() {
			// The schedule restarts from T: no log copy or retained
			// snapshot holds anything of it yet.
			for i := range m.logs[o] {
				m.setLog(o, i, false)
			}
			if len(m.holders[o]) == 0 {
				m.setRetained(o, false)
			}
		}
	}
	sources := make([]Source, len(m.rankHost))
	for r, h := range m.rankHost {
		sources[r] = Source{Rank: r, Local: true, OptRank: r, OptHost: h, ParamsRank: r, ParamsHost: h}
	}
	if v := m.violation(sources); v != "" {
		m.abort(ExitFailure, "%s; %s, and the roll-back's epoch would break invariant %s; stopping the job", rb.cause, rb.what, v)
		return
	}
	lost := "steps"
	if rb.from-t == 1 {
		lost = "step"
	}
	m.report("%s: rolling the job back to step %d from --ckpt-dir (%d %s lost)", rb.what, t, rb.from-t, lost)
	m.emit(RollbackToDisk{Gen: m.gen, Epoch: m.epoch, T: t, From: rb.from},
		Restart{Gen: m.gen, Epoch: m.epoch, G: t})
	m.publish(sources)
	if m.under > 0 {
		owners := make([]int, 0, m.under)
		for o, n := range m.missing {
			if n > 0 {
				owners = append(owners, o)
			}
		}
		m.announced = true
		switch {
		case m.diffEC():
			m.report("under-protected: %d optimizer shards have no coded base (ec:%d+%d) of step %d until every rank codes it again (the base schedule restarts there); %s", len(owners), m.ec.k, m.ec.m, t, m.ecReport())
		case m.ec != nil:
			m.report("under-protected: %d optimizer shards have no clear copy or parity share (ec:%d+%d) of step %d until they are encoded again; %s", len(owners), m.ec.k, m.ec.m, t, m.ecReport())
		default:
			m.report("under-protected: %d optimizer shards have no copy of step %d until it is re-sent", len(owners), t)
		}
		m.emit(UnderProtected{Epoch: m.epoch, Owners: owners})
	}
}

// noteLost records host h among the hosts lost since the last recovery
// ended (for the roll-back's report).
func (m *Machine) noteLost(h int) {
	if m.rec == nil && m.rb == nil && len(m.awaiting) == 0 {
		m.lostHosts = m.lostHosts[:0]
	}
	m.lostHosts = append(m.lostHosts, h)
}
