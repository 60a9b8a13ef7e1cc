package launcher

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/phasetrace"
	"github.com/gorun/gorun/internal/wire"
)

// The job's loop drives a hotswap.Machine, which makes every failure
// decision (the failure window, restarts, lost hosts and their
// replacement, heartbeats, signals, the exit code): the loop turns what
// the agents, the rendezvous and the user send into the machine's events
// and carries out the actions it returns, in order. Time reaches the
// machine as the time since the job started; its next deadline is one
// timer, set again after every step. What the machine does not model
// stays here: --timeout, a broken stdout, the context, agents that never
// register, and an agent that cannot start before the job has.

// since is the machine's clock: the time since the job started.
func (j *job) since() time.Duration { return time.Since(j.t0) }

// step feeds e to the machine and carries out its actions.
func (j *job) step(e hotswap.Event) { j.steps(e) }

// steps feeds es to the machine in order, carrying out each one's
// actions, and sets the deadline timer once at the end (a progress report
// of a host's ranks is one scheduling, not one per rank; NextDeadline is
// O(1) after heartbeats and progress, O(hosts + ranks) after the rarer
// events).
func (j *job) steps(es ...hotswap.Event) {
	now := j.since()
	for _, e := range es {
		acts := j.m.Step(now, e)
		j.restarted, j.moved = false, nil
		for _, a := range acts {
			j.do(a)
		}
		j.flushPublish()
		if j.m.Stopped() && j.cause == nil {
			j.cause = &failure{code: j.m.ExitCode()}
		}
	}
	j.schedule()
}

// schedule sets the deadline timer to the machine's next deadline.
func (j *job) schedule() {
	j.deadline.Stop()
	if d, ok := j.m.NextDeadline(); ok {
		j.deadline.Reset(max(d-j.since(), 0))
	}
}

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
func (j *job) cutOff(h *agentHost) {
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

// loop runs the job until every rank has ended (or cannot be waited for)
// and returns the exit code.
func (j *job) loop(ctx context.Context) int {
	var timeout <-chan time.Time
	if j.cfg.Timeout > 0 {
		t := time.NewTimer(j.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	// Housekeeping, not decisions: G again for agents that missed it,
	// agents that do not register, the bound on a stop's wait.
	tick := time.NewTicker(min(j.cfg.HeartbeatInterval, time.Second))
	defer tick.Stop()
	var stopDeadline time.Time
	for j.ranksEnded < j.world {
		if j.stopping && stopDeadline.IsZero() {
			// Agents SIGKILL after the grace period; this is how long their reports may take.
			stopDeadline = time.Now().Add(j.cfg.KillGrace + j.cfg.HeartbeatTimeout)
		}
		select {
		case e := <-j.events:
			j.onEvent(e)
		case u := <-j.progress:
			j.onProgress(u)
		case r := <-j.resumes:
			j.onResume(r)
		case h := <-j.beats:
			j.step(hotswap.Heartbeat{Host: h})
		case h := <-j.dropped:
			if !j.hosts[h].fenced.Load() && !j.hosts[h].ended {
				j.step(hotswap.ControlDropped{Host: h})
			}
		case <-j.deadline.C:
			j.step(hotswap.Tick{})
		case x := <-j.agentExits:
			j.onAgentExit(x)
		case i := <-j.rv.Registered():
			phasetrace.Mark("agent-registered")
			h := j.hosts[i]
			h.registered = true
			j.release(h)
			j.log.Debug("agent registered", "host", h.name, "spare", h.spare)
			j.step(hotswap.AgentRegistered{Host: i, Spare: h.spare})
		case sig := <-j.cfg.Signals:
			s, _ := sig.(syscall.Signal)
			j.step(hotswap.Signal{Sig: s})
		case r := <-j.statusRequests():
			j.answerStatus(r)
		case err := <-j.out.failed:
			j.outputFailed(err)
		case <-timeout:
			j.fail(ExitTimeout, "job exceeded its time limit of %v (--timeout); stopping it", j.cfg.Timeout)
		case now := <-tick.C:
			j.checkStarts(now)
			j.metricsTick()
			j.prog.republish()
			j.durableTick(now)
			j.reachTick(now)
			if !stopDeadline.IsZero() && now.After(stopDeadline) {
				j.out.report("%d ranks did not report their end; giving up on them", j.world-j.ranksEnded)
				j.drainOutput(ctx)
				return j.exitCode()
			}
		case <-ctx.Done():
			j.fail(ExitFailure, "stopped: %v", context.Cause(ctx))
			ctx = context.Background()
		}
	}
	j.drainOutput(ctx)
	return j.exitCode()
}

// onEvent turns an agent's event into the machine's.
func (j *job) onEvent(e *wire.Event) {
	h := j.hosts[e.Host]
	switch e.Kind {
	case wire.EventStarted:
		phasetrace.Mark("rank-started")
		j.log.Debug("rank started", "rank", e.Rank, "host", h.name, "pid", e.Pid, "generation", e.Gen)
		h.ranGen = max(h.ranGen, e.Gen+1)
		if j.resuming && j.waitingToResume(-1) == nil {
			j.resuming = false
		}
		if j.cfg.Stdin != nil && e.Rank == j.cfg.StdinRank && j.rankHost[e.Rank] == e.Host {
			j.stdinStartedOn(e.Host)
		}
		if j.rec != nil {
			j.rec.started(j, e)
		}
	case wire.EventExited:
		phasetrace.Mark("rank-exited")
		if e.Gen != j.gen || j.rankHost[e.Rank] != e.Host {
			return // of an earlier generation, killed by the restart, or of a host it left
		}
		if !j.rankGone(e.Rank) {
			return
		}
		j.log.Debug("rank ended", "rank", e.Rank, "host", h.name, "status", e.ExitStatus(), "stopped", e.Stopped)
		if c := e.Corrupt; c != nil {
			// Before the exit: the machine marks them with a failed
			// exit and decides on it without them.
			j.step(hotswap.CopiesCorrupt{Rank: e.Rank, Step: c.Step, Holders: c.Holders})
		}
		j.step(hotswap.RankExited{Rank: e.Rank, Host: e.Host, Pid: e.Pid, Gen: e.Gen, Code: e.Code,
			Signal: syscall.Signal(e.Signal), Abort: e.Abort, Stopped: e.Stopped, Msg: e.Msg})
	case wire.EventAgentError:
		j.out.report("agent on host %s failed: %s", h.name, e.Msg)
		j.step(hotswap.AgentExited{Host: e.Host, Why: "it failed: " + e.Msg})
	case wire.EventAgentDone:
		// Carries no generation; the ranks' own exits tell (hostDone).
		j.log.Debug("agent has no rank running", "host", h.name)
	case wire.EventGPU:
		j.onGPUEvent(h, e)
		// Permanent faults (package gpu classifies them) go to the
		// machine, which replaces the host; the others are reported only
		// (onGPUEvent did, without repeating a flapping GPU).
		if e.GPU.Class == wire.GPUPermanent {
			j.step(hotswap.GPUHealth{Host: e.Host, GPU: e.GPU.Index, Class: hotswap.GPUPermanent, Msg: e.Msg})
		}
	case wire.EventEpoch:
		phasetrace.Mark("agent-table")
		j.log.Debug("agent has the epoch's table", "host", h.name, "epoch", e.Epoch)
		h.epoch = max(h.epoch, e.Epoch)
		if j.rec != nil {
			j.rec.tableIn(j, e.Host, e.Epoch)
		}
	case wire.EventReplFailed:
		if e.Peer < len(j.hosts) {
			j.log.Debug("replication failed", "from", h.name, "to", j.hosts[e.Peer].name, "why", e.Msg)
			j.step(hotswap.ReplicationFailed{From: e.Host, To: e.Peer})
		}
	case wire.EventPeerLost:
		// Only a loss in the current world says something: ranks of a
		// superseded generation or epoch lose their peers as a restart or
		// a new epoch ends their communicators.
		if e.Rank < j.world && j.rankHost[e.Rank] == e.Host && e.Gen == j.gen && e.Epoch == j.epoch {
			j.step(hotswap.PeerLost{Rank: e.Rank, Peers: e.Peers})
		}
	}
}

// onProgress aggregates a host's progress report into G, and tells the
// machine each rank's newer committed step, a new G, under-protected
// owners whose copies are back, and the recovery's stages.
func (j *job) onProgress(u *wire.UpProgress) {
	j.metricsProgress(u)
	oldG := j.prog.G()
	before := make([]int64, len(u.Ranks))
	for i, r := range u.Ranks {
		before[i] = -1
		if r.Rank < j.world {
			before[i] = j.prog.rank(r.Rank).Committed
		}
	}
	if err := j.prog.handle(u); err != nil {
		j.log.Warn("bad progress report", "host", u.Host, "err", err)
		return
	}
	if u.Gen != j.gen {
		return
	}
	// The new G first: handle has already published it (and H) to the
	// agents, which act on it at once (in diff mode under EC they
	// truncate logs through H and release older bases), so an epoch the
	// machine publishes on any later event of this report must resume
	// from it, not from the G before (whose H the hosts may have dropped).
	if g := j.prog.G(); g > oldG {
		j.step(hotswap.GPublished{G: g})
	}
	var prog []hotswap.Event
	for i, r := range u.Ranks {
		if r.Committed > before[i] {
			prog = append(prog, hotswap.Progress{Rank: r.Rank, Step: r.Committed})
		}
	}
	if len(prog) > 0 {
		j.steps(prog...)
	}
	for _, o := range j.reprotected(u) {
		delete(j.under, o)
		delete(j.underPast, o)
		j.step(hotswap.Replicated{Owner: o})
	}
	if j.rec != nil {
		j.rec.progress(j, u)
	}
	j.durableProgress(u)
}

// reprotected returns, after report u was taken in, the under-protected
// owners whose copies are back for the epoch they wait on (j.under: the G
// it resumed from), in rank order.
//
// Outside diff mode under EC, an owner of u's whose Replicated reached
// that G in a report taken under the epoch's placement (see
// wire.UpProgress.Epoch: before it, Replicated is of the old holders).
//
// In diff mode under EC, every owner at once, when H reached that G and
// every rank coded its base there under the epoch's placement
// (progress.codedIn): a replacement's roles hold each rank's state only
// from that base on (its clear copy's store, parity rows and logs start
// there), and a decode restores H, so a role is valid only once H is a
// base it holds. One owner's base at G is not enough: until the last
// rank codes it, H stays below G.
func (j *job) reprotected(u *wire.UpProgress) []int {
	if len(j.under) == 0 {
		return nil
	}
	if j.diffEC() {
		h, coded := j.prog.H(), j.prog.codedIn()
		var back []int
		for o, g := range j.under {
			if h >= g && coded >= g {
				back = append(back, o)
			}
		}
		slices.Sort(back)
		return back
	}
	if u.Epoch < j.epoch {
		return nil
	}
	var back []int
	for _, r := range u.Ranks {
		g, ok := j.under[r.Rank]
		if s, corrupt := j.underPast[r.Rank]; corrupt && j.prog.G() <= s {
			continue
		}
		if ok && r.Replicated >= g {
			back = append(back, r.Rank)
		}
	}
	return back
}

// onAgentExit acts on the end of an agent while the job runs. Before the
// first table, a host with ranks that cannot start its agent stops the
// job (nothing has started); any other end is a lost host, for the
// machine to decide on.
func (j *job) onAgentExit(x agentExit) {
	h := j.hosts[x.host]
	h.ended = true
	j.release(h)
	if h.lost {
		return
	}
	detail := ""
	if t := h.tail.String(); t != "" {
		detail = "\n" + indent(t)
	}
	why := "exited"
	if x.err != nil {
		why = x.err.Error()
	}
	switch {
	case !h.registered && !h.spare:
		j.cutOff(h)
		j.fail(ExitFailure, "cannot start agent on host %s: %s%s", h.name, why, detail)
		return
	case !h.registered:
		j.out.report("cannot start agent on spare host %s: %s%s; the job goes on without it", h.name, why, detail)
		why = "it could not start: " + why
	case len(h.ranks) > 0 && j.hostDone(h):
		j.log.Warn("agent ended after its ranks", "host", h.name, "err", x.err)
	default:
		j.out.report("agent on host %s ended unexpectedly: %s%s", h.name, why, detail)
	}
	j.step(hotswap.AgentExited{Host: h.index, Why: why})
}

// agentGone records the end of an agent once the ranks have all ended.
func (j *job) agentGone(x agentExit) {
	h := j.hosts[x.host]
	h.ended = true
	j.release(h)
	if !h.lost {
		j.log.Debug("agent ended after the ranks", "host", h.name, "err", x.err)
	}
}

// checkStarts handles agents that do not register within the start
// timeout: as an agent that could not start.
func (j *job) checkStarts(now time.Time) {
	for _, h := range j.hosts {
		if h.lost || h.ended || h.registered || now.Sub(h.started) <= j.cfg.StartTimeout {
			continue
		}
		j.killAgent(h)
		h.ended = true
		j.onAgentExit(agentExit{host: h.index, err: fmt.Errorf("not registered after %v", j.cfg.StartTimeout)})
	}
}

// watch follows a recovery epoch to its stages and reports them to the
// machine (hotswap.RecoveryReport): published once every host with ranks
// has the epoch's table (wire.EventEpoch); with state to restore (G >= 0),
// restored once every rank was served a Restore since (its Restores
// rose) and resumed once every rank also committed a step after G;
// without, resumed once the ranks that had to start have.
type watch struct {
	epoch    uint64
	gen      uint64
	g        int64
	in       []bool // hosts that have the table
	waiting  int    // hosts with ranks that do not yet
	base     []int64
	restored []bool
	resumed  []bool
	nRest    int
	nRes     int
	start    []bool // ranks that must start (no state to restore)
	nStart   int
	stages   [3]bool
}

// newWatch follows epoch, resuming from g, published in this step:
// restarted says every rank was started again (a new generation), else
// moved are the ranks that start on a new host.
func (j *job) newWatch(epoch uint64, g int64, restarted bool, moved []int) *watch {
	w := &watch{epoch: epoch, gen: j.gen, g: g, in: make([]bool, len(j.hosts))}
	for _, h := range j.hosts {
		if len(h.ranks) > 0 {
			w.waiting++
		}
	}
	if g >= 0 {
		// A new generation counts its Restores from 0; in place, the
		// survivors' count goes on.
		w.base = make([]int64, j.world)
		w.restored = make([]bool, j.world)
		w.resumed = make([]bool, j.world)
		if !restarted {
			// A moved rank's service on its new host counts from 0 too.
			for r := range w.base {
				if !slices.Contains(moved, r) {
					w.base[r] = j.prog.rank(r).Restores
				}
			}
		}
		return w
	}
	// Nothing to restore: the epoch resumes once its new processes run.
	w.start = make([]bool, j.world)
	for r := range w.start {
		if restarted || slices.Contains(moved, r) {
			w.start[r] = true
			w.nStart++
		}
	}
	return w
}

func (w *watch) report(j *job, s hotswap.Stage) {
	if w.stages[s] {
		return
	}
	w.stages[s] = true
	j.step(hotswap.RecoveryReport{Epoch: w.epoch, Stage: s})
}

func (w *watch) tableIn(j *job, host int, epoch uint64) {
	if epoch != w.epoch || w.in[host] || len(j.hosts[host].ranks) == 0 {
		return
	}
	w.in[host] = true
	w.waiting--
	if w.waiting == 0 {
		w.report(j, hotswap.StagePublished)
	}
}

func (w *watch) started(j *job, e *wire.Event) {
	if w.start == nil || e.Gen != w.gen || e.Rank >= len(w.start) || !w.start[e.Rank] || j.rankHost[e.Rank] != e.Host {
		return
	}
	w.start[e.Rank] = false
	w.nStart--
	if w.nStart == 0 {
		w.report(j, hotswap.StageResumed)
	}
}

func (w *watch) progress(j *job, u *wire.UpProgress) {
	if w.base == nil || u.Gen != w.gen {
		return
	}
	for _, p := range u.Ranks {
		r := p.Rank
		if r < 0 || r >= len(w.restored) || j.rankHost[r] != u.Host {
			continue // a host the rank has left: its counts are not the rank's now
		}
		if !w.restored[r] && p.Restores > w.base[r] {
			w.restored[r] = true
			w.nRest++
		}
		if w.restored[r] && !w.resumed[r] && p.Committed > w.g {
			w.resumed[r] = true
			w.nRes++
		}
	}
	if j.rec != w {
		return
	}
	if w.nRest == len(w.restored) {
		w.report(j, hotswap.StageRestored)
	}
	if j.rec == w && w.nRes == len(w.resumed) {
		w.report(j, hotswap.StageResumed)
	}
}
