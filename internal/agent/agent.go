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
	"time"

	controlplane "github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// startParallel is how many ranks an agent starts at once.
const startParallel = 8

// gpuDiscoveryTimeout bounds how long the ranks wait for GPU discovery.
const gpuDiscoveryTimeout = 30 * time.Second

// goroutineWait bounds how long Run, at its end, waits for the agent's
// goroutines once it has ended everything they wait on: those blocked
// outside its control (a hung GPU discovery, a rank stuck in the kernel)
// are then logged and left.
const goroutineWait = 2 * time.Second

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
	// stdin) whose end means the launcher is gone. Run closes it at its
	// end if it is an *io.PipeReader (the in-process agent's), whose Close
	// ends a Read in progress; any other stream (a process's stdin, even
	// an io.Closer: closing a blocking *os.File does not interrupt its
	// reader) is left to its reader, which ends with the process.
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
	// newHost, when not nil, replaces keeper.New (tests: they see the
	// state protection's configuration).
	newHost func(keeper.Config) (*keeper.Keeper, error)
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
	cfg Config
	// tasks owns every goroutine the agent starts; Run waits for them
	// (end).
	tasks group
	log   *slog.Logger
	subj  wire.Subjects
	ctl   *controlplane.Control
	spec  *wire.JobSpec
	// protect is the spec's protection settings (parseProtect).
	protect protectSettings
	out     *batcher
	dir     string      // private per-job directory, removed at exit
	jobDir  *heldJobDir // dir, held while the agent lives where TMPDIR is local (jobdir.go)
	// sockDir is the ranks' socket directory in /dev/shm (sockdir.go);
	// nil when the sockets are in dir.
	sockDir *heldJobDir
	// swept is closed when the start's sweep of ended agents' leftovers
	// (startSweep) is done; nil until it starts. cleanup waits for it.
	swept chan struct{}
	// mports is the MASTER_PORT pool, held until an epoch uses a port.
	mports *portPool

	ranks   []*rankProc
	exits   chan *rankProc
	done    chan struct{} // closed at Run's end (end), before it waits for its goroutines
	running int
	killAt  <-chan time.Time // SIGKILL deadline after a stop
	stopped bool             // a stop was ordered, or the agent is ending (lost, cleanup): start no rank from now on

	// The launcher's stdin, for the local rank that reads it: its first
	// pipe is set (or left nil) before stdinReady is closed; each restart
	// sets the new generation's.
	stdinReady chan struct{}
	stdin      *stdinRelay

	gpus     *hostGPUs          // the host's GPUs (none: CPU-only)
	gpuReady chan *hostGPUs     // GPU discovery's result (discoverGPUs), nil before it starts
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
	hadRanks  bool         // ranks were started here (an idle host has none left)
	listening map[int]bool // the ranks whose socket is listening
	pmiKVS    pmiKVS       // the job's PMI key-value space, as this host sees it
	ompi      openMPI      // Open MPI's bootstrap (openmpi.go)
	pmiWG     subgroup     // the PMI connections' goroutines
	pmiEnds   []*os.File   // their files, closed at the end
	env       []string     // the ranks' base environment
	addr      string       // the address this host registered
	tmp       string       // the ranks' TMPDIR

	// gorun --resume (resume.go): res is the resume in progress (nil:
	// none, or done); resumeT gets the launcher's first G meanwhile
	// (made before the G subscription, never replaced).
	res     *resumer
	resumeT chan int64
	// rb is a roll-back to the durable tier's work (rollback.go), or nil.
	rb *rollback

	// pending is the first epoch table, come while GPU discovery runs:
	// the ranks start with it once it is done (gpusKnown).
	pending *wire.EpochTable
}

// Run runs the agent until the launcher tells it to exit, the launcher is
// lost, or ctx ends. It returns nil after an orderly exit.
//
// It checks cfg, then sets up (setup: the control connection and its
// watchers, the subscriptions, the rendezvous, the registration, the
// listeners), runs the loop until the job ends here (loop), and shuts
// down: the ranks are stopped and reaped and the job's files removed
// (cleanup), setup is undone (link.close), and every goroutine the agent
// started has ended, or is logged (end).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ExitTimeout <= 0 {
		cfg.ExitTimeout = 5 * time.Second
	}
	becomeSubreaper(cfg.Logger)
	if err := cfg.check(); err != nil {
		return err
	}
	a := newAgent(cfg)
	ctx, cancel := context.WithCancelCause(ctx)
	defer a.end(cancel)
	l, err := a.setup(ctx, cancel)
	defer l.close(a)
	if errors.Is(err, errEndedBeforeRegistering) {
		// Stopped before it started, or ended (a spare that registers
		// after the ranks did): nothing to do here.
		a.log.Info("the job ended before this agent registered")
		return nil
	}
	if err != nil {
		return err
	}
	defer a.cleanup()
	return a.loop(ctx, l)
}

// check reports a configuration Run cannot use.
func (cfg *Config) check() error {
	if !wire.ValidJobID(cfg.Job) {
		return fmt.Errorf("agent: invalid job id %q", cfg.Job)
	}
	if cfg.Host < 0 || cfg.Host >= wire.MaxHosts || cfg.Creds.Host != cfg.Host {
		return fmt.Errorf("agent: host index %d, credentials of host %d", cfg.Host, cfg.Creds.Host)
	}
	return nil
}

// newAgent returns the agent of cfg, before its setup.
func newAgent(cfg Config) *agent {
	// Its own host's subjects: the only ones its user may publish on.
	a := &agent{cfg: cfg, log: cfg.Logger.With("host", cfg.Name), subj: wire.JobSubjects(cfg.Job).ForHost(cfg.Host), exits: make(chan *rankProc, 16), done: make(chan struct{}),
		stdinReady: make(chan struct{}), stdin: newStdinRelay()}
	a.pmiWG = newSubgroup(&a.tasks, "PMI server")
	return a
}

// end is the last of Run: ctx is cancelled (the epoch-table feed and GPU
// discovery end), a.done closed (the ranks' waiters stop offering their
// ends), the launcher's stream closed if it is a pipe (its watcher ends);
// then it waits for the agent's goroutines, at most goroutineWait, logs
// those left, and closes a GPU discovery's result that came after the
// loop ended.
func (a *agent) end(cancel context.CancelCauseFunc) {
	cancel(nil)
	close(a.done)
	var unstoppable []string
	if pr, ok := a.cfg.Launcher.(*io.PipeReader); ok {
		_ = pr.Close()
	} else if a.cfg.Launcher != nil {
		unstoppable = append(unstoppable, taskLauncherStream)
	}
	left := a.tasks.wait(goroutineWait, unstoppable...)
	select {
	case g := <-a.gpuReady:
		// GPU discovery finished after the loop's end (its deferred
		// check): its backend is released here.
		g.close()
	default:
	}
	switch {
	case len(left) == 0:
	case len(left) == 1 && left[0] == taskLauncherStream:
		a.log.Debug("the launcher's stream is left to its reader: it cannot be interrupted, and ends with the process")
	default:
		a.log.Warn("goroutines left running at exit", "after", goroutineWait, "left", left)
	}
}
