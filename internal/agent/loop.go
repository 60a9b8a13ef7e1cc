package agent

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/gorun/gorun/gpu"
	controlplane "github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// The names of the goroutines the loop starts (group.Go).
const (
	taskEpochTables  = "epoch-table feed"
	taskGPUDiscovery = "GPU discovery"
)

// loop runs the agent, set up (l), until the job ends here: it starts the
// ranks with the first epoch table (once GPU discovery is done, or has
// timed out), passes the later ones on, handles the launcher's controls,
// the ranks' ends, the state protection's failures, a resume's and a
// roll-back's progress, and sends the heartbeats. It returns nil when the
// launcher says to exit; after a loss of the launcher (ctx ends), once
// the ranks are stopped (lost).
func (a *agent) loop(ctx context.Context, l *link) error {
	cfg := a.cfg
	tables, terr := a.feedTables(ctx, l.rv)

	// GPU discovery (NVML) can be slow, or hang on a broken GPU: it runs
	// beside the heartbeats, and the ranks start once it is done, or
	// CPU-only after gpuDiscoveryTimeout.
	gpuReady := a.discoverGPUs(ctx)
	gpuTimeout := time.NewTimer(gpuDiscoveryTimeout)
	defer gpuTimeout.Stop()
	defer func() {
		if a.gpus != nil {
			a.gpus.close()
		}
		select {
		case g := <-gpuReady: // discovery finished after all
			g.close()
		default:
		}
	}()

	hb := time.NewTicker(a.spec.HeartbeatInterval)
	defer hb.Stop()
	a.heartbeat()
	for {
		select {
		case g := <-gpuReady:
			gpuReady = nil
			if a.gpus != nil { // too late: running CPU-only already
				g.close()
				continue
			}
			a.gpus = g
			g.watch(ctx, a)
			if err := a.gpusKnown(); err != nil {
				return err
			}
		case <-gpuTimeout.C:
			if a.gpus != nil {
				continue
			}
			a.log.Warn("GPU discovery did not finish: running CPU-only", "after", gpuDiscoveryTimeout)
			a.gpus = &hostGPUs{binds: map[int]gpu.Binding{}}
			if err := a.gpusKnown(); err != nil {
				return err
			}
		case t := <-tables:
			// The launcher sends a restart before its epoch's table, on
			// the same connection: the restart is in control already, and
			// is handled first, so that the table is known to be the new
			// generation's.
			for more := true; more; {
				select {
				case m := <-l.control:
					if a.onControl(m) {
						return nil
					}
				default:
					more = false
				}
			}
			if a.fencedIn(t) {
				return a.fenced(t)
			}
			a.releaseMasterPort(t)
			if a.res != nil {
				// The ranks wait for their states (--resume): a new
				// epoch now would move them under the preload.
				err := fmt.Errorf("agent: --resume: epoch %d came before the ranks' states were rebuilt; not supported", t.Epoch)
				a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: err.Error()})
				return err
			}
			if a.ranks != nil {
				a.newEpoch(t)
				continue
			}
			if a.gpus == nil {
				a.pending = t
				continue
			}
			if err := a.begin(t); err != nil {
				return err
			}
		case err := <-terr:
			if ctx.Err() != nil {
				return a.lost(ctx)
			}
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: err.Error()})
			return fmt.Errorf("agent: %w", err)
		case m := <-l.control:
			if a.onControl(m) {
				return nil
			}
		case p := <-a.exits:
			a.exited(p)
		case f := <-a.prot.failures():
			a.failRank(f)
		case g := <-a.resumeTarget():
			a.resumeAt(g)
		case err := <-a.rollbackDone():
			if err := a.reloaded(err); err != nil {
				a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: truncateMsg(err.Error())})
				return fmt.Errorf("agent: %w", err)
			}
		case err := <-a.resumeDone():
			if err := a.resumed(err); err != nil {
				a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: truncateMsg(err.Error())})
				return fmt.Errorf("agent: %w", err)
			}
		case <-a.killAt:
			a.killAt = nil
			a.signalAll(syscall.SIGKILL, true)
		case <-hb.C:
			a.heartbeat()
			a.resumeHeartbeat()
			a.reachHeartbeat()
			if a.prot != nil && a.prot.host.Active() {
				// Reports are sent on change; this one replaces a lost one.
				a.prot.changed()
			}
		case <-ctx.Done():
			return a.lost(ctx)
		}
	}
}

// feedTables starts the feed of every epoch table of rv, in increasing
// epochs, to tables: the first starts the ranks, later ones are passed
// on to them. It ends with ctx; terr gets the error of the wait for the
// first table, if it fails.
func (a *agent) feedTables(ctx context.Context, rv *controlplane.AgentRendezvous) (tables <-chan *wire.EpochTable, terr <-chan error) {
	tc := make(chan *wire.EpochTable)
	ec := make(chan error, 1)
	a.tasks.Go(taskEpochTables, func() {
		for next := uint64(0); ; {
			t, err := rv.WaitEpoch(ctx, next)
			if err != nil {
				if next == 0 {
					ec <- err
				}
				return
			}
			select {
			case tc <- t:
			case <-ctx.Done():
				return
			}
			next = t.Epoch + 1
		}
	})
	return tc, ec
}

// discoverGPUs starts the discovery of the host's GPUs (openGPUs, or
// Config.discoverGPUs), whose result the returned channel (a.gpuReady)
// gets. A result that comes after the loop's end is closed by end.
func (a *agent) discoverGPUs(ctx context.Context) <-chan *hostGPUs {
	ready := make(chan *hostGPUs, 1)
	a.gpuReady = ready
	discover := openGPUs
	if a.cfg.discoverGPUs != nil {
		discover = a.cfg.discoverGPUs
	}
	a.tasks.Go(taskGPUDiscovery, func() { ready <- discover(ctx, a) })
	return ready
}

// begin starts the ranks with table t, the first here, unless a restart
// came before: they start in its generation, with its table, which
// follows.
func (a *agent) begin(t *wire.EpochTable) error {
	if r := a.restart; r != nil && t.Epoch < r.Epoch && !a.stopped {
		return nil
	}
	err := a.start(t)
	if a.ranks != nil && a.res == nil {
		close(a.stdinReady) // a resume closes it when its ranks start
	}
	if err != nil {
		a.event(&wire.Event{Kind: wire.EventAgentError, Host: a.cfg.Host, Rank: -1, Msg: err.Error()})
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// gpusKnown starts the ranks with the first table, if it came while GPU
// discovery ran.
func (a *agent) gpusKnown() error {
	if t := a.pending; t != nil {
		a.pending = nil
		return a.begin(t)
	}
	return nil
}

// onControl handles a message from the launcher; exit says it said to exit.
func (a *agent) onControl(m *nats.Msg) (exit bool) {
	c, err := wire.DecodeControl(m.Data)
	if err != nil {
		a.log.Warn("ignoring control message", "err", err)
		return false
	}
	if c.Op == wire.OpExit {
		a.log.Info("exiting as told")
		if a.prot != nil && (c.D != nil || c.X != nil) {
			// The durable tier's last watermark and resolved step, whether
			// or not the G that carried them was handled before: the
			// host applies them (bounded) before it closes its stores
			// (keeper.Keeper.Close, when the protection closes).
			a.prot.host.SetDurable(stepOr(c.D), stepOr(c.X))
		}
		return true
	}
	a.control(c)
	return false
}

func (a *agent) control(c *wire.Control) {
	if c.Op == wire.OpStop || c.Op == wire.OpKill {
		a.stopped = true
		a.abortResume()
	}
	switch c.Op {
	case wire.OpSignal:
		a.log.Info("forwarding signal", "signal", syscall.Signal(c.Signal))
		a.signalAll(syscall.Signal(c.Signal), false)
	case wire.OpStop:
		a.stop(syscall.Signal(c.Signal), c.Grace)
	case wire.OpKill:
		a.signalAll(syscall.SIGKILL, true)
	case wire.OpRestart:
		a.beginRestart(c)
	case wire.OpReach:
		a.reachDisk(c)
	case wire.OpProbe:
		if c.Host == a.cfg.Host {
			a.heartbeat() // the launcher suspects this host: a sign of life now
		}
	}
}

// stop sends sig to every running rank and arms SIGKILL after grace.
func (a *agent) stop(sig syscall.Signal, grace time.Duration) {
	if grace <= 0 {
		a.signalAll(syscall.SIGKILL, true)
		return
	}
	a.signalAll(sig, true)
	if a.killAt == nil {
		a.killAt = time.After(grace)
	}
}

func (a *agent) signalAll(sig syscall.Signal, stopping bool) {
	for _, p := range a.ranks {
		if p.ended {
			continue
		}
		if stopping {
			p.stopped.Store(true)
		}
		p.signal(sig)
	}
}

func (a *agent) heartbeat() {
	a.seq++
	_ = a.ctl.Publish(a.subj.Heartbeat, wire.Marshal(&wire.Heartbeat{Host: a.cfg.Host, Seq: a.seq}))
}

func (a *agent) event(e *wire.Event) {
	if err := a.ctl.Publish(a.subj.Events, wire.Marshal(e)); err != nil {
		a.log.Warn("cannot report event", "err", err)
	}
}

// exited reports a rank's end. Its output has been sent before, unless
// flow control holds it back; once every rank has ended, the batcher
// sends the end of the generation's output after the last of it.
func (a *agent) exited(p *rankProc) {
	p.ended = true
	a.running--
	e := p.exitEvent(a.cfg.Host)
	if a.prot != nil {
		// Its restore in this generation failed on copies failing
		// their CRC32C: the launcher counts them lost if the exit is a
		// failure (a note of an earlier generation's restore is
		// dropped).
		if step, hs, ok := a.prot.host.TakeCorruptCopies(e.Rank); ok {
			e.Corrupt = &wire.CorruptCopies{Step: step, Holders: hs}
			a.log.Warn("the rank's restore found its replica copies corrupt", "rank", e.Rank, "step", step, "holders", hs)
		}
	}
	a.log.Info("rank ended", "rank", e.Rank, "code", e.Code, "signal", e.Signal, "stopped", e.Stopped)
	// (An Open MPI rank whose MPI_Init fails exits 1; a rank killed, by
	// gorun or a signal, says nothing of its bootstrap.)
	if e.Code > 0 && e.Signal == 0 && !e.Abort && !e.Stopped && p.killedBy.Load() == nil && p.pmiState.Load() == pmiNone && p.startErr == nil {
		a.ompi.rankFailed(a, e.Rank)
	}
	// The end is reported before the fences the rank left are failed:
	// ranks elsewhere that fail because of them (MPICH ranks in MPI_Init
	// abort) are then reported after it, on the same connection, so the
	// job ends with this rank's status (an MPI_Abort's code), not theirs.
	a.event(e)
	if a.socks != nil && !p.movedAway {
		// (A rank moved away does not fail this epoch's fences, nor
		// those of its successor here if it is placed here again.)
		a.socks.rankEnded(p.place.Rank, p.gen)
	}
	if a.running == 0 {
		a.out.endGen(a.gen)
		if a.restart != nil {
			a.tryRestart()
			return
		}
		if !a.idle(a.table) {
			a.event(&wire.Event{Kind: wire.EventAgentDone, Host: a.cfg.Host, Rank: -1})
		}
	}
}
