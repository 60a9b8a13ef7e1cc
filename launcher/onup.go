package launcher

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// Starting the agents (startAgents, startLocal), and taking in what they
// send up (onUp, heard).

// startAgents starts every agent, at most cap(sem) at a time between start
// and registration.
func (j *job) startAgents(ctx context.Context, sem chan struct{}) {
	if j.srun != nil {
		j.startSrun() // every remote agent, with one srun (slurm.go)
	}
	for _, h := range j.hosts {
		if j.srun != nil && !h.local {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var err error
		if h.local {
			err = j.startLocal(ctx, h)
		} else {
			err = j.startRemote(ctx, h)
		}
		if err != nil {
			j.agentExits <- agentExit{host: h.index, err: err}
		}
	}
}

// startLocal runs the launcher host's agent in this process.
func (j *job) startLocal(ctx context.Context, h *hostAgent) error {
	pr, pw := io.Pipe()
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	j.started(h, pw, cancel)
	addr := j.bind.localAgentAddr()
	creds := j.secret.HostCredentials(h.index, nil)
	cfg := agent.Config{
		Job: j.id, Host: h.index, Name: h.name, Creds: creds, Launcher: pr, Addr: addr,
		Logger: j.log.With("agent", h.name),
		Dial: func(ctx context.Context, o control.ControlOptions) (*control.Control, error) {
			c, err := control.DialInProcessHost(ctx, j.srv.InProcess(), creds, o)
			if err == nil && !j.serverWatchesDrops() {
				j.watchInProcess(actx, h.index, c)
			}
			return c, err
		},
	}
	if j.cfg.agentConfig != nil {
		j.cfg.agentConfig(&cfg)
	}
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		defer cancel()
		err := agent.Run(actx, cfg)
		j.agentExits <- agentExit{host: h.index, err: err}
	}()
	return nil
}

// watchInProcess reports the close of host's in-process control
// connection c as the server's watcher would (hostDisconnected), until
// the agent's run ends (life, which startLocal cancels when agent.Run
// returns) or the job is over. The loop ignores it for a host that ended
// or was fenced, as it does the server's.
func (j *job) watchInProcess(life context.Context, host int, c *control.Control) {
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		select {
		case <-c.Lost():
			j.hostDisconnected(host, "in-process connection closed")
		case <-life.Done():
		case <-j.quit:
		}
	}()
}

// onUp handles every message agents send, in the order they sent them.
// It never waits for output to be written: frames are posted to the
// output mux, whose lanes write them, and events go to the loop. So a
// stalled reader of gorun's output delays neither the heartbeats' record
// nor the events, and an event is handled after the output its host sent
// before it was posted (drainOutput counts on that). The host a message
// speaks for is the host of its subject (the server lets each agent
// publish only on its own): a message naming another host, or a rank of
// another host, is dropped.
func (j *job) onUp(m *nats.Msg) {
	from, kind, ok := j.subj.ParseUp(m.Subject)
	if !ok || from >= len(j.hosts) {
		j.log.Warn("message on unknown subject", "subject", m.Subject)
		return
	}
	switch kind {
	case wire.UpKindOutput:
		if err := j.out.frame(from, m.Data); err != nil {
			j.log.Warn("bad output frame", "host", from, "err", err)
		}
	case wire.UpKindOutputEnd:
		d, err := wire.DecodeOutputDone(m.Data)
		if err == nil && d.Host != from {
			err = fmt.Errorf("output end of host %d", d.Host)
		}
		if err == nil {
			err = j.out.flow.ended(from, d.Gen, d.Bytes)
		}
		if err != nil {
			j.log.Warn("bad output end", "host", from, "err", err)
		}
	case wire.UpKindHeartbeat:
		hb, err := wire.DecodeHeartbeat(m.Data)
		if err == nil && hb.Host != from {
			err = fmt.Errorf("heartbeat of host %d", hb.Host)
		}
		if err != nil {
			j.log.Warn("bad heartbeat", "host", from, "err", err)
			return
		}
		j.heard(j.hosts[from])
	case wire.UpKindEvents:
		e, err := wire.DecodeEvent(m.Data)
		switch {
		case err != nil:
		case e.Host != from:
			err = fmt.Errorf("event of host %d", e.Host)
		case e.Rank >= j.world || e.Rank >= 0 && !j.owns(from, e.Rank):
			err = fmt.Errorf("event of rank %d, which is not the host's", e.Rank)
		}
		if err != nil {
			j.log.Warn("bad event", "host", from, "err", err)
			return
		}
		if j.hosts[from].fenced.Load() {
			return // a lost host is cut off: nothing it says counts
		}
		j.hosts[from].lastSeen.Store(time.Now().UnixNano())
		select {
		case j.events <- e:
		case <-j.quit:
		}
	case wire.UpKindFence:
		if j.hosts[from].fenced.Load() {
			return // a lost host is cut off
		}
		if err := j.fences.Handle(from, m.Data); err != nil {
			j.log.Warn("bad fence", "host", from, "err", err)
		}
	case wire.UpKindResume:
		r, err := wire.DecodeResumeReach(m.Data)
		if err == nil && r.Host != from {
			err = fmt.Errorf("resume reach of host %d", r.Host)
		}
		if err != nil {
			j.log.Warn("bad resume reach", "host", from, "err", err)
			return
		}
		if j.hosts[from].fenced.Load() {
			return
		}
		select {
		case j.resumes <- r:
		case <-j.quit:
		}
	case wire.UpKindProgress:
		u, err := wire.DecodeUpProgress(m.Data)
		if err == nil && u.Host != from {
			err = fmt.Errorf("progress of host %d", u.Host)
		}
		if err != nil {
			j.log.Warn("bad progress report", "host", from, "err", err)
			return
		}
		if j.hosts[from].fenced.Load() {
			return
		}
		// The loop aggregates it: G, the machine's progress and the
		// recovery stages follow the same tables as a splice.
		select {
		case j.progress <- u:
		case <-j.quit:
		}
	default:
		j.log.Warn("message on unknown subject", "subject", m.Subject)
	}
}

// heard records a heartbeat of h and passes it on to the loop, at most
// once per half heartbeat interval per host: a job of 10,000 hosts does
// not flood the loop, and the machine still hears of every host well
// within its heartbeat timeout.
func (j *job) heard(h *hostAgent) {
	now := time.Now().UnixNano()
	h.lastSeen.Store(now)
	if h.fenced.Load() {
		return
	}
	last := h.beatSent.Load()
	probed := h.probed.Swap(false)
	if !probed && now-last < int64(j.cfg.HeartbeatInterval/2) || !h.beatSent.CompareAndSwap(last, now) {
		return
	}
	// Never blocking: onUp carries every message of every agent (output
	// too), and the loop does not read beats once the ranks ended. A beat
	// dropped here is no loss: lastSeen has it, and the host's next one
	// comes within the interval.
	select {
	case j.beats <- h.index:
	default:
	}
}

// owns reports whether host runs rank in the current epoch.
func (j *job) owns(host, rank int) bool {
	j.tab.RLock()
	defer j.tab.RUnlock()
	return rank >= 0 && rank < len(j.rankHost) && j.rankHost[rank] == host
}
