package launcher

import (
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
)

// Carrying out the machine's actions (do): fencing a lost host,
// splicing its ranks onto a spare, restarting the ranks, publishing the
// epoch's table and reporting a recovery's timeline.

// do carries out one action of the machine.
func (j *job) do(a hotswap.Action) {
	j.statusAction(a)
	switch a.(type) {
	case hotswap.Report, hotswap.Abort, hotswap.Timeline:
		// Reported to the user as they are: logging them too (-v) would
		// say everything twice.
	default:
		j.log.Debug("hot-swap", "action", a.String())
	}
	switch a := a.(type) {
	case hotswap.Report:
		j.out.report("%s", a.Msg)
	case hotswap.Abort:
		j.evlog.record(j.since(), evAbort{Code: a.Code, Msg: a.Msg})
		if j.cause == nil {
			j.cause = &failure{code: a.Code, msg: a.Msg}
			j.out.report("%s", a.Msg)
		} else {
			j.log.Debug("further failure", "msg", a.Msg)
		}
	case hotswap.StopRanks:
		if !j.stopping || a.Signal != syscall.SIGTERM {
			j.stopRanks(a.Signal, a.Grace)
		}
	case hotswap.KillAll:
		j.killed = true
		j.broadcast(&wire.Control{Op: wire.OpKill})
	case hotswap.Forward:
		j.log.Debug("forwarding signal", "signal", a.Signal)
		j.broadcast(&wire.Control{Op: wire.OpSignal, Signal: int(a.Signal)})
	case hotswap.Probe:
		// Its answer is a heartbeat, passed on at once (heard).
		j.hosts[a.Host].probed.Store(true)
		j.broadcast(&wire.Control{Op: wire.OpProbe, Host: a.Host})
	case hotswap.Fence:
		j.fence(a)
	case hotswap.Splice:
		j.splice(a)
	case hotswap.Restart:
		j.restartRanks(a)
	case hotswap.GatherReach:
		j.gatherReach(a)
	case hotswap.RollbackToDisk:
		j.rollbackTo(a)
	case hotswap.PublishEpoch:
		j.flushPublish()
		j.publish = &a
	case hotswap.RestorePlan:
		j.publishEpoch(&a)
	case hotswap.UnderProtected:
		j.evlog.record(j.since(), evUnder{Epoch: a.Epoch, Owners: a.Owners})
		g := int64(-1)
		if j.rec != nil {
			g = j.rec.g
		}
		if j.under == nil {
			j.under = map[int]int64{}
		}
		if a.Corrupt {
			g = max(g, a.Step+1)
			if j.underPast == nil {
				j.underPast = map[int]int64{}
			}
		}
		for _, o := range a.Owners {
			j.under[o] = g
			if a.Corrupt {
				j.underPast[o] = a.Step
			}
		}
	case hotswap.Protected:
		j.evlog.record(j.since(), evProtected{})
		j.under, j.underPast = nil, nil
	case hotswap.Timeline:
		j.timeline(a)
	case hotswap.Failed:
		j.recordFailed(a)
	}
}

// fence cuts lost host a.Host off: the rendezvous leaves it out of every
// later table, its messages are dropped, its stream is closed (an agent
// still there takes that as the launcher's end, stops its ranks and
// exits) and an agent in this process is ended. Its ranks are done here;
// a splice that follows moves them.
func (j *job) fence(a hotswap.Fence) {
	h := j.hosts[a.Host]
	j.evlog.record(j.since(), evFence{Host: h.name})
	j.rv.Fence(a.Host)
	j.cutOff(h)
	if h.local {
		j.killAgent(h)
	}
	if j.resuming {
		if err := j.resumeLost(a.Host); err != nil {
			j.resume, j.resuming = nil, false
			j.fail(ExitFailure, "%v; stopping the job", err)
		}
	}
}

// cutOff marks h lost for good and its ranks ended (nobody will report
// them), and closes its stream.
func (j *job) cutOff(h *hostAgent) {
	h.lost = true
	h.fenced.Store(true)
	for _, r := range h.ranks {
		j.rankGone(r)
	}
	j.closeStream(h)
	j.release(h)
}

// splice moves a.Ranks from lost host a.Lost to a.With in the launcher's
// tables: rank → host, the hosts' rank lists, progress aggregation and
// output ownership. The ranks start there with the epoch's table.
func (j *job) splice(a hotswap.Splice) {
	j.evlog.record(j.since(), evSplice{Epoch: a.Epoch, Lost: a.LostName, With: a.WithName, Ranks: a.Ranks, Spare: a.Spare})
	lost, with := j.hosts[a.Lost], j.hosts[a.With]
	j.tab.Lock()
	for _, r := range a.Ranks {
		j.rankHost[r] = a.With
	}
	lost.ranks = slices.DeleteFunc(lost.ranks, func(r int) bool { return slices.Contains(a.Ranks, r) })
	with.ranks = append(with.ranks, a.Ranks...)
	close(j.tabChanged)
	j.tabChanged = make(chan struct{})
	j.tab.Unlock()
	j.prog.move(a.Ranks, a.Lost, a.With)
	if j.stopping {
		return // they are not started again
	}
	if j.cfg.Recovery == hotswap.RecoveryInPlace && !j.prog.used() && j.m.Gen() == j.gen {
		// The ranks must rebuild their communicators for the new epoch,
		// which takes gorun's rank client: these never opened the rank
		// socket (not one progress report).
		j.fail(ExitFailure, "--recovery in-place: the program never opened gorun's rank socket (no rank reported progress), so its surviving ranks cannot join a new epoch; run it with --recovery restart")
		return
	}
	j.moved = append(j.moved, a.Ranks...)
	for _, r := range a.Ranks {
		if j.rankEnded[r] {
			j.rankEnded[r] = false
			j.ranksEnded--
		}
	}
}

// restartRanks starts restart generation a.Gen: every rank is stopped and
// started again in epoch a.Epoch, resuming from step a.G. The epoch's
// table follows (PublishEpoch).
func (j *job) restartRanks(a hotswap.Restart) {
	if j.stopping {
		return
	}
	j.evlog.record(j.since(), evRestart{Epoch: a.Epoch, Gen: a.Gen, G: a.G})
	j.gen, j.epoch = a.Gen, a.Epoch
	j.prog.restart(a.Gen)
	if j.verbose {
		j.out.report("%s", j.prog.table(j.cfg.ProtectMode, j.cfg.Diff))
	}
	// Every host runs ranks again: its agent's end is a failure again.
	clear(j.rankEnded)
	j.ranksEnded = 0
	j.restarted = true
	j.setFencePlacement(a.Epoch)
	c := &wire.Control{Op: wire.OpRestart, Gen: a.Gen, Epoch: a.Epoch, G: a.G}
	if j.rollbackT >= 0 && j.rollbackT == a.G {
		c.Disk = true // every rank's state at G from disk (rollback.go)
	}
	j.rollbackT = -1
	j.broadcast(c)
}

// flushPublish publishes a PublishEpoch that came without its restore
// plan.
func (j *job) flushPublish() {
	if j.publish != nil {
		j.publishEpoch(nil)
	}
}

// publishEpoch publishes the pending epoch with restore plan p (nil:
// every rank from its own slot): the table every agent acts on.
func (j *job) publishEpoch(p *hotswap.RestorePlan) {
	a := j.publish
	j.publish = nil
	if a == nil || j.stopping {
		return
	}
	if a.EC != nil {
		j.ecGroups = a.EC // the table below carries the epoch's groups
	}
	if a.Logs != nil {
		j.logs = a.Logs // a spare in a lost host's log roles, or a vacant role
	}
	m := control.Membership{Ranks: j.placement(), Gen: j.gen, G: a.G, Holders: holderRows(a.Holders), EC: j.ecTable(),
		Logs: holderRows(j.logs), H: j.epochH(a.G)}
	if p != nil && p.Epoch == a.Epoch {
		m.Restore = restoreRows(p.Sources)
	}
	for r, h := range a.RankHost {
		if j.rankHost[r] != h {
			j.fail(ExitFailure, "internal error: epoch %d places rank %d on host %d, the launcher's table on host %d; stopping the job", a.Epoch, r, h, j.rankHost[r])
			return
		}
	}
	if a.Holders != nil {
		j.holders = a.Holders
	}
	j.epoch = a.Epoch
	j.prog.setEpoch(a.Epoch)
	j.setFencePlacement(a.Epoch)
	if _, err := j.rv.Publish(a.Epoch, m); err != nil {
		j.fail(ExitFailure, "cannot publish epoch %d: %v; stopping the job", a.Epoch, err)
		return
	}
	j.evlog.record(j.since(), evPublish{Epoch: a.Epoch, Gen: j.gen, G: a.G, Restore: len(m.Restore)})
	j.rec = j.newWatch(a.Epoch, a.G, j.restarted, j.moved)
}

// restoreRows returns the epoch table's restore rows of a restore plan:
// one per rank that does not restore from its own slot, in rank order.
// A rank decoded from its erasure-coding stripe (Source.Decode) has no
// optimizer-shard source: its row's Opt is the rank itself, unused
// (RestoreRow.Decode).
func restoreRows(sources []hotswap.Source) []wire.RestoreRow {
	var rows []wire.RestoreRow
	for _, s := range sources {
		switch {
		case s.Decode:
			rows = append(rows, wire.RestoreRow{Rank: s.Rank, Opt: s.Rank, Params: s.ParamsRank, Decode: true})
		case !s.Local:
			rows = append(rows, wire.RestoreRow{Rank: s.Rank, Opt: s.OptRank, Params: s.ParamsRank})
		}
	}
	return rows
}

// placement is every host's ranks now (per host index; nil: none): a
// spare's and a fenced host's are nil.
func (j *job) placement() [][]int {
	ranks := make([][]int, len(j.hosts))
	for i, h := range j.hosts {
		ranks[i] = slices.Clone(h.ranks)
	}
	return ranks
}

// setFencePlacement moves the address fences to epoch, whose members are
// the hosts that run ranks in it (not the idle spares nor the fenced
// hosts, which send no part). Call it before the epoch's table goes out.
func (j *job) setFencePlacement(epoch uint64) {
	if err := j.fences.SetPlacement(epoch, j.placement()); err != nil {
		j.fail(ExitFailure, "internal error: epoch %d: %v; stopping the job", epoch, err)
	}
}

// timeline reports a recovery epoch's record (-v) and writes it to
// --events.
func (j *job) timeline(t hotswap.Timeline) {
	if j.rec != nil && j.rec.epoch == t.Epoch {
		j.rec = nil
	}
	j.evlog.timeline(t, j.since())
	if j.verbose {
		j.out.report("recovery epoch %d (%s): %s", t.Epoch, t.Cause, timelineText(t))
	}
}

func timelineText(t hotswap.Timeline) string {
	at := func(d time.Duration) string {
		if d < 0 {
			return "-"
		}
		return d.Round(time.Millisecond).String()
	}
	s := fmt.Sprintf("detected %s, classified %s, replaced %s, published %s, restored %s, resumed %s",
		at(t.Detected), at(t.Classified), at(t.Replaced), at(t.Published), at(t.Restored), at(t.Resumed))
	if t.Resumed >= 0 && t.Detected >= 0 {
		s += fmt.Sprintf(" (%s from failure to resume)", (t.Resumed - t.Detected).Round(time.Millisecond))
	}
	if t.Superseded {
		s += "; superseded by a later failure"
	}
	return s
}
