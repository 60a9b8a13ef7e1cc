package launcher

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/wire"
)

// How the job ends: the first failure (fail), stopping the ranks, waiting
// for their output (drainOutput), the exit code, and the agents' exit
// (finish).

// fail records the first failure and stops the job.
func (j *job) fail(code int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if j.cause == nil {
		j.cause = &failure{code: code, msg: msg}
		j.out.report("%s", msg)
	} else {
		j.log.Debug("further failure", "msg", msg)
	}
	j.stop(syscall.SIGTERM)
}

// stop orders every agent to stop its ranks with sig, then SIGKILL after
// the grace period.
func (j *job) stop(sig syscall.Signal) {
	if j.stopping {
		return
	}
	j.stopRanks(sig, j.cfg.KillGrace)
}

// stopRanks orders every agent to stop its ranks with sig, SIGKILL after
// grace. Before the epoch table is out no rank has started: the
// rendezvous is cancelled so none ever does, and every rank is done.
func (j *job) stopRanks(sig syscall.Signal, grace time.Duration) {
	j.stopping = true
	if j.rv.Cancel() {
		j.noRanks = true
		for r := range j.world {
			j.rankGone(r)
		}
	}
	j.broadcast(&wire.Control{Op: wire.OpStop, Signal: int(sig), Grace: grace})
}

func (j *job) broadcast(c *wire.Control) {
	if err := j.ctl.Publish(j.subj.Control, wire.Marshal(c)); err != nil {
		j.log.Warn("cannot send to agents", "op", c.Op, "err", err)
	}
	_ = j.ctl.Flush()
}

// rankGone marks a rank ended and reports whether that was news.
func (j *job) rankGone(r int) bool {
	if r < 0 || r >= j.world || j.rankEnded[r] {
		return false
	}
	j.rankEnded[r] = true
	j.ranksEnded++
	return true
}

// hostDone reports whether every rank of h has ended in the current
// generation. A restart starts them all again, so it is read from the ranks
// rather than kept: the agent's own EventAgentDone may be of a generation
// the launcher has already left.
func (j *job) hostDone(h *hostAgent) bool {
	for _, r := range h.ranks {
		if !j.rankEnded[r] {
			return false
		}
	}
	return true
}

// closeStream closes h's launcher stream, if it has one.
func (j *job) closeStream(h *hostAgent) {
	j.mu.Lock()
	s := h.stream
	h.stream = nil
	j.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

func (j *job) release(h *hostAgent) {
	if !h.released {
		h.released = true
		<-j.sem
	}
}

// outputFailed acts on the failure of gorun's stdout: the output went
// away, so the job stops, as a pipeline would.
func (j *job) outputFailed(err error) {
	code := ExitFailure
	if errors.Is(err, syscall.EPIPE) {
		code = 128 + int(syscall.SIGPIPE)
	}
	j.fail(code, "cannot write the job's output (%v); stopping the job", err)
}

// drainOutput waits, once every rank has ended, until the ranks' output
// is all written: until every host that is still there has sent the end
// marker of its output of this generation (the agents send it once their
// ranks' pipes are read to the end, which flow control may hold back well
// after the ranks' exits were handled), and the lanes have written
// everything posted before it. A reader that does not read holds gorun
// here as it would hold cat; meanwhile the hosts it waits for are still
// watched (heartbeats, agent ends), and a host lost here is a failure
// whose output is complete as it is. An interrupt, or ctx, gives up on
// the output (at once if the user already asked to kill at once): on the
// ranks', not on the reports of gorun's own already posted, such as the
// one that said it kills every rank (outputMux.abandon).
func (j *job) drainOutput(ctx context.Context) {
	if j.killed {
		j.out.abandon()
		return
	}
	stop := make(chan struct{})
	var drained chan struct{} // once every end marker is in
	defer func() {
		close(stop)
		if drained != nil {
			<-drained
		}
	}()
	tick := time.NewTicker(min(j.cfg.HeartbeatInterval, time.Second))
	defer tick.Stop()
	for {
		var ends <-chan struct{}
		if drained == nil {
			ends = j.out.flow.changes()
			if j.outputPending() == nil {
				drained = make(chan struct{})
				go func() {
					defer close(drained)
					j.out.drain(stop)
				}()
			}
		}
		select {
		case <-drained:
			return
		case <-ends:
		case err := <-j.out.failed:
			j.outputFailed(err)
		case e := <-j.events:
			j.log.Debug("event after the ranks' end", "kind", e.Kind, "host", e.Host)
		case <-j.beats: // lastSeen has them
		case <-j.progress:
		case <-j.dropped:
		case r := <-j.statusRequests():
			j.answerStatus(r)
		case x := <-j.agentExits:
			j.agentGone(x)
		case now := <-tick.C:
			if h := j.outputPending(); h != nil && drained == nil {
				if seen := time.Unix(0, h.lastSeen.Load()); now.Sub(seen) > j.cfg.HeartbeatTimeout {
					j.cutOff(h)
					j.fail(ExitFailure, "host %s lost before all its output arrived: no heartbeat from its agent for %v", h.name, now.Sub(seen).Round(time.Millisecond))
				}
			}
		case sig := <-j.cfg.Signals:
			s, _ := sig.(syscall.Signal)
			if s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
				continue
			}
			if j.cause == nil {
				j.cause = &failure{code: 128 + int(s), msg: "interrupted by " + hotswap.SignalName(s)}
			}
			j.out.abandon()
			return
		case <-ctx.Done():
			if j.cause == nil {
				j.cause = &failure{code: ExitFailure, msg: fmt.Sprintf("stopped: %v", context.Cause(ctx))}
			}
			j.out.abandon()
			return
		}
	}
}

// outputPending returns a host whose output may still be coming: one
// whose ranks of this generation all ended and whose agent is there, but
// whose end marker has not arrived; or nil. A host lost, whose agent
// ended, or whose ranks did not all report their end, sent all it will.
func (j *job) outputPending() *hostAgent {
	if j.noRanks {
		return nil
	}
	for _, h := range j.hosts {
		if h.lost || h.ended || !h.registered || len(h.ranks) == 0 || h.ranGen != j.gen+1 || !j.hostDone(h) {
			continue
		}
		if !j.out.flow.complete(h.index, j.gen) {
			return h
		}
	}
	return nil
}

// exitCode is the job's exit code: the first cause's, else the
// machine's (0 when nothing went wrong).
func (j *job) exitCode() int {
	if j.cause != nil {
		return j.cause.code
	}
	return j.m.ExitCode()
}

// finish tells the agents to exit, waits a bounded time for them, kills
// those that stay, and waits for the launcher's goroutines. An agent that
// registers from now on (a spare still starting as the ranks ended) may
// have subscribed too late for the exit: the rendezvous, ended first,
// tells it at its registration instead.
func (j *job) finish() {
	j.rv.End()
	j.broadcast(j.exitControl())
	deadline := time.NewTimer(exitWait)
	defer deadline.Stop()
	pending := 0
	for _, h := range j.hosts {
		if !h.ended && j.hasAgent(h) {
			pending++
		}
	}
	for pending > 0 {
		select {
		case x := <-j.agentExits:
			if !j.hosts[x.host].ended {
				j.hosts[x.host].ended = true
				pending--
			}
		case <-j.events:
		case <-j.beats:
		case <-j.progress:
		case <-j.dropped:
		case r := <-j.statusRequests():
			j.answerStatus(r)
		case <-deadline.C:
			for _, h := range j.hosts {
				if !h.ended && j.hasAgent(h) {
					j.out.report("agent on host %s did not exit; killing it", h.name)
					j.killAgent(h)
				}
			}
			pending = 0
		}
	}
	for _, h := range j.hosts {
		j.closeStream(h)
	}
	// Drain what the goroutines still send while they end.
	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			return
		case <-j.agentExits:
		case <-j.events:
		case <-j.beats:
		case <-j.progress:
		case <-j.dropped:
		case <-time.After(exitWait):
			j.log.Warn("agents still running after exit; leaving")
			return
		}
	}
}

// exitControl is the OpExit that ends the agents. With a durable tier it
// carries D and X as last published: the launcher decides nothing from
// here on (no progress is taken in after the ranks ended), and an agent
// that has not handled the G that carried them (it raced the exit: the
// commit decided as the ranks ended) applies them before it closes its
// stores (keeper.Keeper.Close; bounded, the agent warns if it cannot).
func (j *job) exitControl() *wire.Control {
	c := &wire.Control{Op: wire.OpExit}
	if j.dur != nil && j.prog != nil {
		c.D, c.X = j.prog.durable()
	}
	return c
}
