package launcher

import (
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/phasetrace"
	"github.com/gorun/gorun/internal/wire"
)

// Feeding the machine: what the agents report (their events, progress
// and ends, or their not registering) turned into the machine's events.

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
	case wire.EventAbort:
		// Before the rank's exit, and before its peers' failures that
		// its death causes (its agent flushed it before the kill): the
		// machine's decision waits for the rank's exit.
		if e.Gen != j.gen || j.rankHost[e.Rank] != e.Host {
			return // of an earlier generation, or of a host it left
		}
		j.log.Debug("rank called MPI_Abort", "rank", e.Rank, "host", h.name, "code", e.Code, "generation", e.Gen)
		j.step(hotswap.RankAborted{Rank: e.Rank, Host: e.Host, Pid: e.Pid, Gen: e.Gen, Code: e.Code, Msg: e.Msg})
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
