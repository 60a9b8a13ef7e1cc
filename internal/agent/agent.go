// Package agent is gorun's per-host agent: started by the launcher (never
// by hand) on every host of a job, it registers with the launcher over the
// control plane, spawns the host's ranks with the environment contract,
// forwards their output, reports their exits, sends heartbeats, and stops
// them when told or when it loses the launcher. No process it starts
// outlives it: every rank runs in its own process group, which the agent
// kills whole.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/gpu"
	controlplane "github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/rank"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"
)

// startParallel is how many ranks an agent starts at once.
const startParallel = 8

// gpuDiscoveryTimeout bounds how long the ranks wait for GPU discovery.
const gpuDiscoveryTimeout = 30 * time.Second

// ErrLauncherLost is the cause of an agent's end when its launcher went away.
var ErrLauncherLost = errors.New("agent: launcher lost")

// ErrFenced is the cause of an agent's end when an epoch table marks its
// host fenced: the launcher declared the host lost and replaced it, so the
// agent kills its ranks, removes the job's files and exits.
var ErrFenced = errors.New("agent: this host was declared lost and fenced out of the job")

// ErrJobSpec is wrapped by the error of an agent that cannot use the job
// spec the launcher sent (an unknown protect mode or diff codec: a
// launcher of another build): it reports it and exits before starting
// anything.
var ErrJobSpec = errors.New("agent: unusable job spec")

// Config configures an agent.
type Config struct {
	Job        string
	Host       int    // index of this host in the launcher's host list
	Name       string // this host's name in the launcher's host list
	ControlURL string
	// Creds are this host's credentials (jobkey.HostCredentials): its
	// control-plane user, which may publish only this host's subjects,
	// the data-plane key it passes on to its ranks, and the replica-link
	// key. The agent never holds the job secret.
	Creds jobkey.HostCredentials
	// Launcher, when not nil, is a stream from the launcher (the agent's
	// stdin) whose end means the launcher is gone.
	Launcher io.Reader
	Logger   *slog.Logger
	// Dial, when not nil, replaces dialing ControlURL (the launcher's own
	// host runs its agent in-process), with the ControlOptions the agent
	// needs (its inbox).
	Dial func(ctx context.Context, o controlplane.ControlOptions) (*controlplane.Control, error)
	// Addr, when not empty, is the address this host is reached at;
	// otherwise the local address of the control connection.
	Addr string
	// ExitTimeout bounds how long the agent waits for killed ranks to be
	// reaped before it exits anyway (a process stuck in the kernel cannot
	// be waited for). Zero means 5 s.
	ExitTimeout time.Duration
	// ReadReach, when not nil, replaces the read of the ranks' reach on
	// the durable tier in dir (resumeReach), for --resume and roll-backs
	// alike (tests: a read of the checkpoint directory that hangs, a
	// host that never answers).
	ReadReach func(ctx context.Context, host int, dir string, ranks []int) *wire.ResumeReach

	// discoverGPUs, when not nil, replaces openGPUs (tests).
	discoverGPUs func(ctx context.Context, a *agent) *hostGPUs
	// newHost, when not nil, replaces rank.NewHost (tests: they see the
	// state protection's configuration).
	newHost func(rank.HostConfig) (*rank.Host, error)
	// shmDir, when not empty, replaces /dev/shm for Open MPI's
	// directories and their sweep (tests).
	shmDir string
	// slotDir, when not empty, replaces ckpt's directory (/dev/shm) for
	// the ranks' slot files and their sweeps (tests).
	slotDir string
	// sweeping, when not nil, is called by the start's sweep before it
	// sweeps (tests: a slow sweep).
	sweeping func()
}

type agent struct {
	cfg  Config
	log  *slog.Logger
	subj wire.Subjects
	ctl  *controlplane.Control
	spec *wire.JobSpec
	// protect is the spec's protection settings (parseProtect).
	protect protectSettings
	out     *batcher
	dir     string      // private per-job directory, removed at exit
	jobDir  *heldJobDir // dir, held while the agent lives where TMPDIR is local (jobdir.go)
	// swept is closed when the start's sweep of ended agents' leftovers
	// (startSweep) is done; nil until it starts. cleanup waits for it.
	swept chan struct{}
	// mports is the MASTER_PORT pool, held until an epoch uses a port.
	mports *portPool

	ranks   []*rankProc
	exits   chan *rankProc
	done    chan struct{} // closed when Run returns
	running int
	killAt  <-chan time.Time // SIGKILL deadline after a stop
	stopped bool             // a stop was ordered: start no rank from now on

	// The launcher's stdin, for the local rank that reads it: its first
	// pipe is set (or left nil) before stdinReady is closed; each restart
	// sets the new generation's.
	stdinReady chan struct{}
	stdin      *stdinRelay

	gpus     *hostGPUs          // the host's GPUs (none: CPU-only)
	socks    *rankSockets       // the ranks' GORUN_SOCKETs, once started
	fenceSub *nats.Subscription // the launcher's merged fences
	seq      uint64

	replicaLn net.Listener // the replication listener, until protection owns it
	prot      *protection  // state protection, once started

	// Restart in place (wire.OpRestart): the generation running, the
	// restart waiting for the old ranks to end and for its epoch's table,
	// the newest table and this host's places in it (none: an idle spare,
	// or a host whose ranks moved away).
	gen       uint64
	restart   *wire.Control
	table     *wire.EpochTable
	places    []wire.Placement
	hadRanks  bool           // ranks were started here (an idle host has none left)
	listening map[int]bool   // the ranks whose socket is listening
	pmiKVS    pmiKVS         // the job's PMI key-value space, as this host sees it
	ompi      openMPI        // Open MPI's bootstrap (openmpi.go)
	pmiWG     sync.WaitGroup // the PMI connections' goroutines
	pmiEnds   []*os.File     // their files, closed at the end
	env       []string       // the ranks' base environment
	addr      string         // the address this host registered
	tmp       string         // the ranks' TMPDIR

	// gorun --resume (resume.go): res is the resume in progress (nil:
	// none, or done); resumeT gets the launcher's first G meanwhile
	// (made before the G subscription, never replaced).
	res     *resumer
	resumeT chan int64
	// rb is a roll-back to the durable tier's work (rollback.go), or nil.
	rb *rollback
}

// Run runs the agent until the launcher tells it to exit, the launcher is
// lost, or ctx ends. It returns nil after an orderly exit.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ExitTimeout <= 0 {
		cfg.ExitTimeout = 5 * time.Second
	}
	becomeSubreaper(cfg.Logger)
	if !wire.ValidJobID(cfg.Job) {
		return fmt.Errorf("agent: invalid job id %q", cfg.Job)
	}
	if cfg.Host < 0 || cfg.Host >= wire.MaxHosts || cfg.Creds.Host != cfg.Host {
		return fmt.Errorf("agent: host index %d, credentials of host %d", cfg.Host, cfg.Creds.Host)
	}
	// Its own host's subjects: the only ones its user may publish on.
	a := &agent{cfg: cfg, log: cfg.Logger.With("host", cfg.Name), subj: wire.JobSubjects(cfg.Job).ForHost(cfg.Host), exits: make(chan *rankProc, 16), done: make(chan struct{}),
		stdinReady: make(chan struct{}), stdin: newStdinRelay()}
	defer close(a.done)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	if cfg.Dial != nil {
		a.ctl, err = cfg.Dial(dctx, controlplane.ControlOptions{Name: "agent " + cfg.Name, InboxPrefix: a.subj.Inbox, Logger: a.log})
	} else {
		a.ctl, err = controlplane.DialControl(dctx, cfg.ControlURL, cfg.Creds, controlplane.ControlOptions{Name: "agent " + cfg.Name, InboxPrefix: a.subj.Inbox, Logger: a.log})
	}
	dcancel()
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer a.ctl.Close()

	// Losing the control connection or the launcher's stream ends the job here.
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() {
		select {
		case <-a.ctl.Lost():
			cancel(fmt.Errorf("%w: control connection closed", ErrLauncherLost))
		case <-stopWatch:
		}
	}()
	if cfg.Launcher != nil {
		go func() {
			_, _ = io.Copy(io.Discard, cfg.Launcher)
			cancel(fmt.Errorf("%w: its stream to this agent ended", ErrLauncherLost))
		}()
	}

	control := make(chan *nats.Msg, 64)
	csub, err := a.ctl.ChanSubscribe(a.subj.Control, control)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer csub.Unsubscribe()
	// Subscribed before registering: the launcher may send as soon as
	// the table is out.
	ssub, err := a.ctl.Subscribe(a.subj.StdinTo(cfg.Host), a.onStdin)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer ssub.Unsubscribe()
	rv, err := controlplane.JoinRendezvous(a.ctl.Conn, cfg.Job, cfg.Host)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer rv.Close()

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
	defer func() {
		if a.replicaLn != nil {
			a.replicaLn.Close()
		}
	}()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	a.mports = holdPorts(addr, masterPorts)
	defer a.mports.close()
	mports := a.mports.ports
	reg := &wire.Register{
		Version: wire.Version, Job: cfg.Job, Host: cfg.Host, Name: cfg.Name,
		Addr: addr, MasterPorts: mports, ReplicaPort: rport, Pid: os.Getpid(),
	}
	if len(mports) > 0 {
		reg.MasterPort = mports[0]
	}
	a.spec, err = rv.Register(rctx, reg)
	rcancel()
	if errors.Is(err, controlplane.ErrJobStopped) {
		// Stopped before it started, or ended (a spare that registers
		// after the ranks did): nothing to do here.
		a.log.Info("the job ended before this agent registered")
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if a.protect, err = parseProtect(a.spec); err != nil {
		a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: truncateMsg(err.Error())})
		return err
	}
	// An Open MPI program's ranks cannot bootstrap without the library:
	// this host fails the job before any rank starts.
	if a.spec.MPI == "openmpi" && wantsOpenMPI(a.spec) {
		if _, err := a.ompi.library(a); err != nil {
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: truncateMsg(err.Error())})
			return fmt.Errorf("agent: %w", err)
		}
	}
	a.addr = addr
	a.log.Info("registered", "addr", addr, "protect", a.protect.mode)
	a.out = newBatcher(a.ctl.Conn, a.subj.Output, a.subj.OutputDone, cfg.Host, a.spec.OutputDelay)
	asub, err := a.ctl.Subscribe(a.subj.OutputAck(cfg.Host), a.out.onAck)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer asub.Unsubscribe()

	// Every epoch table, in increasing epochs: the first starts the ranks,
	// later ones are passed on to them.
	tables := make(chan *wire.EpochTable)
	terr := make(chan error, 1)
	go func() {
		for next := uint64(0); ; {
			t, err := rv.WaitEpoch(ctx, next)
			if err != nil {
				if next == 0 {
					terr <- err
				}
				return
			}
			select {
			case tables <- t:
			case <-ctx.Done():
				return
			}
			next = t.Epoch + 1
		}
	}()

	defer a.cleanup()

	// GPU discovery (NVML) can be slow, or hang on a broken GPU: it runs
	// beside the heartbeats, and the ranks start once it is done, or
	// CPU-only after gpuDiscoveryTimeout.
	gpuReady := make(chan *hostGPUs, 1)
	discover := openGPUs
	if cfg.discoverGPUs != nil {
		discover = cfg.discoverGPUs
	}
	go func() { gpuReady <- discover(ctx, a) }()
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
	var pending *wire.EpochTable // the first table, waiting for the GPUs
	begin := func(t *wire.EpochTable) error {
		if r := a.restart; r != nil && t.Epoch < r.Epoch && !a.stopped {
			// A restart came before this host started its ranks: they
			// start in its generation, with its table, which follows.
			return nil
		}
		err := a.start(t)
		if a.ranks != nil && a.res == nil {
			close(a.stdinReady) // a resume closes it when its ranks start
		}
		if err != nil {
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: err.Error()})
			return fmt.Errorf("agent: %w", err)
		}
		return nil
	}
	gpusKnown := func() error {
		if t := pending; t != nil {
			pending = nil
			return begin(t)
		}
		return nil
	}

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
			if err := gpusKnown(); err != nil {
				return err
			}
		case <-gpuTimeout.C:
			if a.gpus != nil {
				continue
			}
			a.log.Warn("GPU discovery did not finish: running CPU-only", "after", gpuDiscoveryTimeout)
			a.gpus = &hostGPUs{binds: map[int]gpu.Binding{}}
			if err := gpusKnown(); err != nil {
				return err
			}
		case t := <-tables:
			// The launcher sends a restart before its epoch's table, on
			// the same connection: the restart is in control already, and
			// is handled first, so that the table is known to be the new
			// generation's.
			for more := true; more; {
				select {
				case m := <-control:
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
				pending = t
				continue
			}
			if err := begin(t); err != nil {
				return err
			}
		case err := <-terr:
			if ctx.Err() != nil {
				return a.lost(ctx)
			}
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: cfg.Host, Rank: -1, Msg: err.Error()})
			return fmt.Errorf("agent: %w", err)
		case m := <-control:
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
			// (rank.Host.Close, when the protection closes).
			a.prot.host.SetDurable(stepOr(c.D), stepOr(c.X))
		}
		return true
	}
	a.control(c)
	return false
}

// lost handles the end of the launcher: stop the ranks, then return.
func (a *agent) lost(ctx context.Context) error {
	err := context.Cause(ctx)
	a.log.Warn("stopping ranks", "cause", err)
	a.stop(syscall.SIGTERM, a.spec.KillGrace)
	deadline := time.After(a.spec.KillGrace + a.cfg.ExitTimeout)
	for a.running > 0 {
		select {
		case p := <-a.exits:
			a.exited(p)
		case <-a.killAt:
			a.killAt = nil
			a.signalAll(syscall.SIGKILL, true)
		case <-deadline:
			return err
		}
	}
	return err
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

// startSweep starts, once, the sweep of what ended agents of any job
// left on the host (their job directories, slot files, Open MPI
// directories, MPICH segment files), off the launch's critical path: a
// /tmp may hold many names. cleanup waits for it.
func (a *agent) startSweep() {
	if a.swept != nil {
		return
	}
	done := make(chan struct{})
	a.swept = done
	shm, slots, log, hook, mp := a.shmDir(), a.slotOpt(), a.log, a.cfg.sweeping, hostMPICHSweep()
	go func() {
		defer close(done)
		if hook != nil {
			hook()
		}
		sweepSlots(slots, shm, mp, log)
		sweepJobDirsLog("", log)
	}()
}

// start creates the job's private directory and starts this host's ranks.
func (a *agent) start(t *wire.EpochTable) error {
	if a.cfg.Host >= len(t.Hosts) {
		return fmt.Errorf("epoch table has %d hosts, this is host %d", len(t.Hosts), a.cfg.Host)
	}
	// A restart that came before the ranks started here (GPU discovery
	// took long) is over already: they start in its generation, from G.
	// A host that joins later (a spare) starts in the table's generation.
	restartG := int64(-1)
	if r := a.restart; r != nil {
		a.restart, a.gen, restartG = nil, r.Gen, r.G
	} else if t.Gen > a.gen {
		a.gen, restartG = t.Gen, t.G
	}
	if a.stopped {
		// The stop overtook the table: start nothing. The table is
		// kept, so that a later one accounts only for the ranks it
		// places here anew.
		a.startSweep()
		a.ranks = []*rankProc{}
		a.table, a.places = t, a.hostPlaces(t)
		a.notStarted(t, a.places)
		return nil
	}
	jd, err := makeJobDir(os.TempDir(), a.cfg.Job, nil)
	if err != nil {
		return err
	}
	a.jobDir, a.dir = jd, jd.path
	// Swept after the job directory is held: a sweep started before
	// would find it made and not yet locked, take it for an ended
	// agent's, and this agent would make another.
	a.startSweep()
	dir := jd.path
	// The ranks of a host share one temporary directory (TMPDIR) inside the
	// job directory; directory operations are slow enough on some file
	// systems to show in the launch time of many ranks.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("creating job directory: %w", err)
	}
	if d := a.spec.Dir; d != "" && !a.spec.DirExplicit {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			home, herr := os.UserHomeDir()
			if herr != nil {
				home = "/"
			}
			a.log.Warn("the launcher's working directory is missing here; ranks start in the home directory", "dir", d, "home", home)
			a.spec.Dir = home
		}
	}
	places := a.hostPlaces(t)
	a.env = glooEnv(baseEnv(os.Environ(), a.spec.Env), a.addr, ifaceOf)
	a.tmp = tmp
	a.table, a.places = t, places
	a.socks = newRankSockets(a, t, len(places))
	a.pmiKVS.setEpoch(t)
	fsub, err := a.ctl.Subscribe(a.subj.Fence, a.socks.fenceDone)
	if err != nil {
		return fmt.Errorf("subscribing to fences: %w", err)
	}
	fsub.SetPendingLimits(-1, -1)
	a.fenceSub = fsub
	// Only the first table's ranks resume from disk: a host that joins
	// later (a spare) restores its ranks from the others, as without.
	resume := a.protect.resume && a.gen == 0 && t.Epoch == 0 && len(places) > 0
	if resume {
		a.resumeT = make(chan int64, 1)
	}
	prot, err := a.startProtection(t, a.replicaLn)
	a.replicaLn = nil // protection owns it, or closed it
	if err != nil {
		return fmt.Errorf("state protection: %w", err)
	}
	a.prot = prot
	a.socks.prot = prot.host
	if a.gen > 0 {
		if err := prot.host.Restart(a.gen, restartG); err != nil {
			return fmt.Errorf("state protection: %w", err)
		}
	}
	if resume {
		// The ranks start once their states are back (resume.go).
		a.beginResume(t, places)
	} else if err := a.launch(t, places, true); err != nil {
		return err
	}
	if len(places) == 0 && !a.idle(t) {
		a.out.endGen(a.gen)
		a.event(&wire.Event{Kind: wire.EventAgentDone, Host: a.cfg.Host, Rank: -1})
	}
	if t.Hosts[a.cfg.Host].Spare {
		a.log.Info("idle spare: waiting for ranks", "epoch", t.Epoch)
	}
	a.event(&wire.Event{Kind: wire.EventEpoch, Host: a.cfg.Host, Rank: -1, Gen: a.gen, Epoch: t.Epoch})
	return nil
}

// hostPlaces returns this host's places in t (none if t has fewer hosts).
func (a *agent) hostPlaces(t *wire.EpochTable) []wire.Placement {
	if a.cfg.Host >= len(t.Hosts) {
		return nil
	}
	return t.Placements()[a.cfg.Host]
}

// idle says whether table t leaves this host without ranks for now: it is
// a spare, or its ranks moved away. An idle host never reports itself
// done (EventAgentDone): it may get ranks in a later table, and ends with
// OpExit, its launcher's end or a fence.
func (a *agent) idle(t *wire.EpochTable) bool {
	return len(a.hostPlaces(t)) == 0 && (a.hadRanks || a.cfg.Host < len(t.Hosts) && t.Hosts[a.cfg.Host].Spare)
}

// fencedIn says whether t marks this host fenced.
func (a *agent) fencedIn(t *wire.EpochTable) bool {
	return a.cfg.Host < len(t.Hosts) && t.Hosts[a.cfg.Host].Fenced
}

// fenced ends the agent of a host that table t fenced: Run's cleanup
// kills the ranks and removes the job's files.
func (a *agent) fenced(t *wire.EpochTable) error {
	a.log.Warn("this host is fenced out of the job: killing its ranks and exiting", "epoch", t.Epoch)
	return fmt.Errorf("%w (epoch %d)", ErrFenced, t.Epoch)
}

// listen makes sure rank has its socket, before it starts (so that it is
// there when the rank looks); a rank placed here again keeps its own. It
// runs on launch's start goroutines, one rank each: it only reads
// a.listening, which launch updates once they have all returned, and
// reports whether the socket listens.
func (a *agent) listen(rank int) bool {
	if a.listening[rank] {
		return true
	}
	if err := a.socks.listen(rank, a.socks.name(rank)); err != nil {
		a.log.Warn("rank socket", "rank", rank, "err", err)
		return false
	}
	return true
}

// notStarted accounts for places, ranks of this host in table t (the
// newest), of generation a.gen, that will not start because the job is
// stopping: each is reported ended, stopped, so that the launcher is not
// left waiting for them. If no rank runs here, this agent is then done
// (unless it is idle: it says nothing then); otherwise the end of the
// last rank running says so (exited).
func (a *agent) notStarted(t *wire.EpochTable, places []wire.Placement) {
	for _, pl := range places {
		a.event(&wire.Event{Kind: wire.EventExited, Host: a.cfg.Host, Rank: pl.Rank, Gen: a.gen, Stopped: true, Msg: "not started: the job is stopping"})
	}
	if a.running > 0 {
		return
	}
	a.out.endGen(a.gen)
	if !a.idle(t) {
		a.event(&wire.Event{Kind: wire.EventAgentDone, Host: a.cfg.Host, Rank: -1})
	}
}

// launch starts places, ranks of this host in table t, in restart
// generation a.gen. With all, they are all of the generation's ranks here
// (a start or a restart: every rank before them has ended); otherwise
// they join ranks that run on (ranks newly placed here in an epoch of
// the same generation: in-place recovery).
func (a *agent) launch(t *wire.EpochTable, places []wire.Placement, all bool) error {
	// Every rank's GPUs first: a host without enough fails before any
	// rank starts.
	genv := make([][]string, len(places))
	for i, pl := range places {
		var err error
		if genv[i], err = a.gpus.env(a.spec, pl); err != nil {
			return err
		}
	}
	ompiEnv, err := a.ompiEnv(t)
	if err != nil {
		return err
	}
	if all {
		a.socks.launched(a.gen)
		a.ranks = []*rankProc{} // not nil: the ranks have started
		// The previous generation's connections were closed when its
		// ranks ended (their serving goroutines close them).
		a.pmiEnds = a.pmiEnds[:0]
	}
	procs := make([]*rankProc, len(places))
	pmiMine := make([]*os.File, len(places))
	prog := lookProg(a.spec.Prog)
	for i, pl := range places {
		procs[i] = &rankProc{place: pl, gen: a.gen, prog: prog}
		if !a.spec.NoPMI {
			mine, theirs, err := pmiSocketPair()
			if err != nil {
				for _, p := range procs[:i] {
					p.pmi.Close()
				}
				for _, f := range pmiMine[:i] {
					f.Close()
				}
				return err
			}
			procs[i].pmi, pmiMine[i] = theirs, mine
		}
	}
	for _, f := range pmiMine {
		if f != nil {
			a.pmiEnds = append(a.pmiEnds, f)
		}
	}
	if a.prot != nil {
		// A new process restores anew: a note of an earlier one's
		// failed restore is not its to report.
		for _, p := range procs {
			a.prot.host.ForgetCorruptCopies(p.place.Rank)
		}
	}
	a.ranks = append(a.ranks, procs...)
	a.running += len(places)
	a.hadRanks = a.hadRanks || len(places) > 0
	// Starting a process is mostly waiting for the kernel to exec it, so
	// several starts at once overlap that latency; each start makes its
	// rank's socket first (creating a file is slow on some file systems:
	// the kernel serializes creations in one directory, but they overlap
	// the other ranks' forks).
	listened := make([]bool, len(places))
	var g errgroup.Group
	g.SetLimit(startParallel)
	for i, p := range procs {
		g.Go(func() error {
			pl := p.place
			listened[i] = a.listen(pl.Rank)
			renv := mergeEnv(rankEnv(a.env, a.spec, t, pl, a.socks.name(pl.Rank), a.tmp), genv[i], restartEnv(a.gen, a.spec.MaxRestarts), ompiEnv)
			stdin := pl.Rank == a.spec.StdinRank
			err := p.start(a.spec, renv, stdin, a.out, a.exits, a.done)
			if stdin {
				if p.stdin != nil {
					a.stdin.set(p.stdin)
				} else {
					a.stdin.set(nil) // not started: no pipe (a nil *os.File is not a nil io.WriteCloser)
				}
			}
			if err != nil {
				if p.pmi != nil {
					p.pmi.Close()
				}
				if f := pmiMine[i]; f != nil {
					f.Close()
				}
				a.log.Warn("cannot start rank", "rank", pl.Rank, "err", err)
				return nil
			}
			if f := pmiMine[i]; f != nil {
				a.pmiWG.Add(1)
				go a.servePMI(p, f, t.World)
			}
			a.gpus.pin(a, pl.Rank, p.pid)
			a.event(&wire.Event{Kind: wire.EventStarted, Host: a.cfg.Host, Rank: pl.Rank, Pid: p.pid, Gen: p.gen})
			return nil
		})
	}
	err = g.Wait()
	if a.listening == nil {
		a.listening = map[int]bool{}
	}
	for i, ok := range listened {
		if ok {
			a.listening[places[i].Rank] = true
		}
	}
	return err
}

// onStdin writes the launcher's stdin into the pipe of the rank that
// reads it, answering once the bytes are in (or that the pipe is closed).
// It runs on the subscription's goroutine; a rank that does not read
// blocks it, and so the launcher, which waits for the answer.
func (a *agent) onStdin(m *nats.Msg) {
	answer := func(s string) { _ = m.Respond([]byte(s)) }
	select {
	case <-a.stdinReady:
	case <-a.done:
		answer("closed: the agent has stopped")
		return
	}
	ok, err := a.stdin.write(m.Data)
	switch {
	case !ok:
		answer("closed: no rank here reads stdin")
	case err != nil:
		answer("closed: " + err.Error())
	default:
		answer("")
	}
}

// newEpoch takes a later epoch's table, once this host's ranks have
// started: the state protection switches to its placement, the ranks
// running get the table (their collectives then fail with
// comm.ErrEpochChanged until they rebuild), and the launcher is told this
// host has it (EventEpoch).
//
// A table of a later generation than the ranks' restarts them in it (as
// wire.OpRestart does, which the launcher sends first; a host that missed
// it restarts all the same). The restart then starts the table's ranks of
// this host: a spare gets the ranks it replaces, a host whose ranks moved
// away starts none. A table of the same generation (in-place recovery)
// starts just the ranks newly placed here, in its epoch, and kills those
// no longer placed here; the others run on. Once the job is stopping, no
// rank starts: those a table places here anew are reported ended
// (notStarted), as they would have been had the table come before the
// stop.
func (a *agent) newEpoch(t *wire.EpochTable) {
	a.log.Info("new epoch", "epoch", t.Epoch, "generation", t.Gen)
	if t.Gen > a.gen && (a.restart == nil || t.Gen > a.restart.Gen) {
		a.beginRestart(&wire.Control{Op: wire.OpRestart, Gen: t.Gen, Epoch: t.Epoch, G: t.G})
	}
	prev, places := a.places, a.hostPlaces(t)
	if a.socks != nil {
		a.socks.setEpoch(t, len(places))
	}
	if a.prot != nil {
		if err := a.prot.setTable(t); err != nil {
			a.log.Error("state protection cannot follow the new epoch", "err", err)
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: a.cfg.Host, Rank: -1, Msg: "state protection: " + err.Error()})
		}
	}
	a.pmiKVS.setEpoch(t)
	a.table, a.places = t, places
	switch fresh := a.newlyPlaced(prev); {
	case a.restart != nil:
		a.tryRestart()
	case t.Gen != a.gen:
		// A table of a generation the ranks have left: nothing to start.
	case a.stopped:
		// (A rank no longer placed here ends by the stop.)
		if len(fresh) > 0 {
			a.notStarted(t, fresh)
		}
	default:
		a.replace(t, fresh)
	}
	a.event(&wire.Event{Kind: wire.EventEpoch, Host: a.cfg.Host, Rank: -1, Gen: a.gen, Epoch: t.Epoch})
}

// replace carries out an in-place epoch change of this host to table t:
// ranks running that t no longer places here are killed (as stopped:
// their end is no failure), and fresh, the ranks t newly places here,
// start.
func (a *agent) replace(t *wire.EpochTable, fresh []wire.Placement) {
	for _, p := range a.ranks {
		if !p.ended && !a.placed(p.place.Rank) {
			a.log.Info("killing a rank moved away from this host", "rank", p.place.Rank, "epoch", t.Epoch)
			p.movedAway = true
			p.stopped.Store(true)
			p.signal(syscall.SIGKILL)
		}
	}
	if len(fresh) == 0 {
		return
	}
	a.log.Info("starting ranks newly placed here", "epoch", t.Epoch, "ranks", len(fresh))
	if err := a.launch(t, fresh, false); err != nil {
		a.event(&wire.Event{Kind: wire.EventAgentError, Host: a.cfg.Host, Rank: -1, Msg: err.Error()})
	}
}

// newlyPlaced returns the places of this host in the current table whose
// ranks prev, its places in the table before, did not have.
func (a *agent) newlyPlaced(prev []wire.Placement) []wire.Placement {
	var fresh []wire.Placement
	for _, pl := range a.places {
		if !slices.ContainsFunc(prev, func(q wire.Placement) bool { return q.Rank == pl.Rank }) {
			fresh = append(fresh, pl)
		}
	}
	return fresh
}

// placed says whether the current table places rank on this host.
func (a *agent) placed(rank int) bool {
	return slices.ContainsFunc(a.places, func(pl wire.Placement) bool { return pl.Rank == rank })
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

// cleanup kills whatever is left of every rank's process group, waits a
// bounded time for the ranks to be reaped, and removes the job's files.
func (a *agent) cleanup() {
	for _, p := range a.ranks {
		p.signal(syscall.SIGKILL) // ranks still running (an ended rank's group was killed when it ended)
	}
	deadline := time.After(a.cfg.ExitTimeout)
wait:
	for a.running > 0 {
		select {
		case p := <-a.exits:
			a.exited(p)
		case <-deadline:
			for _, p := range a.ranks {
				if !p.ended {
					a.log.Error("rank did not end after SIGKILL; leaving it", "rank", p.place.Rank, "pid", p.pid)
				}
			}
			break wait
		}
	}
	live := map[int]bool{}
	for _, p := range a.ranks {
		if !p.ended {
			live[p.pid] = true
		}
	}
	killOrphans(a.cfg.Job, live, time.Now().Add(a.cfg.ExitTimeout), a.log)
	a.stdin.close()
	if a.fenceSub != nil {
		_ = a.fenceSub.Unsubscribe()
	}
	if a.socks != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a.socks.close(ctx)
		cancel()
	}
	for _, f := range a.pmiEnds {
		f.Close() // ends the PMI connections still served
	}
	a.pmiWG.Wait()
	a.stopResume() // its goroutines use the protection
	a.stopRollback()
	if a.prot != nil {
		a.prot.close()
	}
	if a.out != nil {
		a.out.Close()
	}
	a.ompi.removeDir(a)
	if err := a.jobDir.remove(); err != nil {
		a.log.Warn("cannot remove job directory", "err", err)
	}
	// Agents of this job killed on this host (or another sharing its
	// file systems: network namespaces) left their directories.
	if a.swept != nil {
		<-a.swept
	}
	sweepJobDirsLog(a.cfg.Job, a.log)
	sweepJobSlots(a.slotOpt(), a.cfg.Job, a.log)

	if a.ctl != nil {
		_ = a.ctl.FlushTimeout(2 * time.Second)
	}
	// Last, so that the job's own files and the flush never wait on it
	// (it may wait up to mpichMinAge): the job's Open MPI directories,
	// and, the ranks being gone, MPICH segment files one of them left
	// (killed in MPI_Init), used by nobody now.
	sweepShmLog(a.shmDir(), a.cfg.Job, hostMPICHSweep(), true, a.log)
}

// masterPorts is how many MASTER_PORT candidates an agent registers
// (wire.Register.MasterPorts): the epochs whose rank 0 is on its host
// take them in turn.
const masterPorts = 4

// portPool is an agent's MASTER_PORT pool. Its ports stay bound, by
// sockets the agent owns that never listen, so that no outgoing
// connection on the host takes one as its local port before the epoch
// that uses it, and a rank connecting early to one is refused (a
// TCPStore client retries a refused connection; one a listener had
// accepted and then reset, it does not). Each is released just before
// the ranks of the epoch that uses it start, and the rest when the agent
// stops. Only the agent's main goroutine uses it.
type portPool struct {
	ports []int       // distinct, in registration order
	held  map[int]int // port → the bound socket's descriptor
}

// holdPorts binds up to n distinct TCP ports on addr (an IP address; the
// unspecified one when addr is not), all at once, so the kernel gives
// distinct ones.
func holdPorts(addr string, n int) *portPool {
	p := &portPool{held: make(map[int]int, n)}
	for range n {
		fd, port, err := bindPort(addr)
		if err != nil {
			break
		}
		p.ports = append(p.ports, port)
		p.held[port] = fd
	}
	return p
}

// bindPort binds a TCP socket to a free port of addr, without listening
// and without SO_REUSEADDR (so that nothing else binds the port, even with
// it), and returns its descriptor and port.
func bindPort(addr string) (fd, port int, err error) {
	family := syscall.AF_INET
	var sa syscall.Sockaddr = &syscall.SockaddrInet4{}
	if ip := net.ParseIP(addr); ip != nil {
		if ip4 := ip.To4(); ip4 != nil {
			sa4 := &syscall.SockaddrInet4{}
			copy(sa4.Addr[:], ip4)
			sa = sa4
		} else {
			family = syscall.AF_INET6
			sa6 := &syscall.SockaddrInet6{}
			copy(sa6.Addr[:], ip.To16())
			sa = sa6
		}
	}
	fd, err = syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("socket: %w", err)
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("bind: %w", err)
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("getsockname: %w", err)
	}
	switch a := got.(type) {
	case *syscall.SockaddrInet4:
		port = a.Port
	case *syscall.SockaddrInet6:
		port = a.Port
	}
	if port == 0 {
		syscall.Close(fd)
		return -1, 0, errors.New("bind gave no port")
	}
	return fd, port, nil
}

// release closes port's socket, if the pool holds it.
func (p *portPool) release(port int) {
	if fd, ok := p.held[port]; ok {
		syscall.Close(fd)
		delete(p.held, port)
	}
}

// close releases every port still held.
func (p *portPool) close() {
	for port := range p.held {
		p.release(port)
	}
}

// releaseMasterPort releases table t's MASTER_PORT, one of this host's
// pool, when t places rank 0 here: its ranks start next.
func (a *agent) releaseMasterPort(t *wire.EpochTable) {
	if a.mports == nil {
		return
	}
	for _, pl := range a.hostPlaces(t) {
		if pl.Rank == 0 {
			a.mports.release(t.MasterPort)
			return
		}
	}
}
