package launcher

import (
	"context"
	"syscall"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/phasetrace"
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
