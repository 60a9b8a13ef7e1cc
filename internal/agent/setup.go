package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	controlplane "github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// The names of the goroutines setup starts (group.Go).
const (
	taskControlLost    = "control connection watch"
	taskLauncherStream = "launcher stream watch"
)

// errEndedBeforeRegistering: the job was stopped, or had ended, when this
// agent registered (a spare that registers after the ranks did). Run
// returns nil: there is nothing to do here.
var errEndedBeforeRegistering = errors.New("agent: the job ended before this agent registered")

// link is what setup made, for the loop: the launcher's controls, the
// rendezvous whose epoch tables the loop follows, and what close undoes.
type link struct {
	control chan *nats.Msg                // the launcher's controls (a.subj.Control)
	rv      *controlplane.AgentRendezvous // joined; its tables are the epochs'
	// The subscriptions to the controls, to stdin, to the output's
	// acknowledgements.
	csub, ssub, asub *nats.Subscription
	stopWatch        chan struct{} // ends the control connection's watch
}

// setup connects the agent to its launcher: it dials the control plane
// and watches the connection and the launcher's stream (their end cancels
// ctx with ErrLauncherLost), subscribes to the controls and to stdin,
// joins the rendezvous, opens the replication listener, holds the
// MASTER_PORT pool, registers (the job spec comes back), checks the spec
// and subscribes to the output's acknowledgements. It returns the link,
// never nil, whose close undoes what setup did, whether or not it
// succeeded.
func (a *agent) setup(ctx context.Context, cancel context.CancelCauseFunc) (*link, error) {
	cfg := a.cfg
	l := &link{}
	var err error
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	if cfg.Dial != nil {
		a.ctl, err = cfg.Dial(dctx, controlplane.ControlOptions{Name: "agent " + cfg.Name, InboxPrefix: a.subj.Inbox, Logger: a.log})
	} else {
		a.ctl, err = controlplane.DialControl(dctx, cfg.ControlURL, cfg.Creds, controlplane.ControlOptions{Name: "agent " + cfg.Name, InboxPrefix: a.subj.Inbox, Logger: a.log})
	}
	dcancel()
	if err != nil {
		a.ctl = nil
		return l, fmt.Errorf("agent: %w", err)
	}

	// Losing the control connection or the launcher's stream ends the job here.
	l.stopWatch = make(chan struct{})
	a.watchLauncher(l.stopWatch, cancel)

	l.control = make(chan *nats.Msg, 64)
	if l.csub, err = a.ctl.ChanSubscribe(a.subj.Control, l.control); err != nil {
		return l, fmt.Errorf("agent: %w", err)
	}
	// Subscribed before registering: the launcher may send as soon as
	// the table is out.
	if l.ssub, err = a.ctl.Subscribe(a.subj.StdinTo(cfg.Host), a.onStdin); err != nil {
		return l, fmt.Errorf("agent: %w", err)
	}
	if l.rv, err = controlplane.JoinRendezvous(a.ctl.Conn, cfg.Job, cfg.Host); err != nil {
		return l, fmt.Errorf("agent: %w", err)
	}

	addr := cfg.Addr
	if tcp, ok := a.ctl.LocalAddr().(*net.TCPAddr); ok && addr == "" {
		addr = tcp.IP.String()
	}
	if addr == "" {
		addr = "127.0.0.1"
	}
	rln, rport, err := listenReplicas(addr)
	if err != nil {
		a.log.Warn("state protection cannot replicate to this host", "err", err)
	}
	a.replicaLn = rln
	a.mports = holdPorts(addr, masterPorts)
	mports := a.mports.ports
	reg := &wire.Register{
		Version: wire.Version, Job: cfg.Job, Host: cfg.Host, Name: cfg.Name,
		Addr: addr, MasterPorts: mports, ReplicaPort: rport, Pid: os.Getpid(),
	}
	if len(mports) > 0 {
		reg.MasterPort = mports[0]
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	a.spec, err = l.rv.Register(rctx, reg)
	rcancel()
	if errors.Is(err, controlplane.ErrJobStopped) {
		return l, errEndedBeforeRegistering
	}
	if err != nil {
		return l, fmt.Errorf("agent: %w", err)
	}
	if a.protect, err = parseProtect(a.spec); err != nil {
		a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: truncateMsg(err.Error())})
		return l, err
	}
	// An Open MPI program's ranks cannot bootstrap without the library:
	// this host fails the job before any rank starts.
	if a.spec.MPI == "openmpi" && wantsOpenMPI(a.spec) {
		if _, err := a.ompi.library(a); err != nil {
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: truncateMsg(err.Error())})
			return l, fmt.Errorf("agent: %w", err)
		}
	}
	a.addr = addr
	a.log.Info("registered", "addr", addr, "protect", a.protect.mode)
	a.out = newBatcher(a.ctl.Conn, a.subj.Output, a.subj.OutputDone, cfg.Host, a.spec.OutputDelay)
	if l.asub, err = a.ctl.Subscribe(a.subj.OutputAck(cfg.Host), a.out.onAck); err != nil {
		return l, fmt.Errorf("agent: %w", err)
	}
	return l, nil
}

// watchLauncher starts the watches of the launcher: the end of the control
// connection, until stop is closed, and the end of the launcher's stream
// (Config.Launcher), until it ends or Run closes it (end). Either cancels
// ctx with ErrLauncherLost.
func (a *agent) watchLauncher(stop <-chan struct{}, cancel context.CancelCauseFunc) {
	a.tasks.Go(taskControlLost, func() {
		select {
		case <-a.ctl.Lost():
			cancel(fmt.Errorf("%w: control connection closed", ErrLauncherLost))
		case <-stop:
		}
	})
	if r := a.cfg.Launcher; r != nil {
		a.tasks.Go(taskLauncherStream, func() {
			_, _ = io.Copy(io.Discard, r)
			cancel(fmt.Errorf("%w: its stream to this agent ended", ErrLauncherLost))
		})
	}
}

// close undoes setup, in the reverse of its order: the subscription to
// the output's acknowledgements, the MASTER_PORT pool, the replication
// listener (unless the state protection took it), the rendezvous, the
// subscriptions to stdin and the controls, the watch of the control
// connection, and the connection itself.
func (l *link) close(a *agent) {
	unsubscribe := func(s *nats.Subscription) {
		if s != nil {
			_ = s.Unsubscribe()
		}
	}
	unsubscribe(l.asub)
	if a.mports != nil {
		a.mports.close()
	}
	if a.replicaLn != nil {
		a.replicaLn.Close()
	}
	if l.rv != nil {
		l.rv.Close()
	}
	unsubscribe(l.ssub)
	unsubscribe(l.csub)
	if l.stopWatch != nil {
		close(l.stopWatch)
	}
	if a.ctl != nil {
		a.ctl.Close()
	}
}
