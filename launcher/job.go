package launcher

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/phasetrace"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// Exit codes of gorun's own making (rank failures give the rank's status).
const (
	ExitFailure = 1   // an agent or host failed
	ExitTimeout = 124 // --timeout expired, as timeout(1)
)

// exitWait bounds how long the launcher waits for agents to leave after
// telling them to, beyond which it kills them.
const exitWait = 5 * time.Second

// failure is the reason a job stops before all its ranks ended well.
type failure struct {
	code int
	msg  string
}

type job struct {
	cfg     Config
	log     *slog.Logger
	id      string
	mpi     MPIKind // the program's MPI, as resolveMPI found it ("" unknown)
	secret  jobkey.Secret
	verbose bool
	srv     *ctlserver.Server
	ctl     *control.Control
	subj    wire.Subjects
	out     *outputMux
	rv      *control.Rendezvous
	fences  *control.FenceCollector
	evlog   *eventLog    // --events, or nil
	status  *statusState // gorun status (status.go), or nil
	// statusKey is the status credential's key pair in the making
	// (statusInit takes it), or nil.
	statusKey *statusKey
	metrics   *metrics // --metrics (metrics.go), or nil

	hosts []*hostAgent
	// gpuFailures are the distinct GPU health reports received, in order;
	// gpuSeen counts each kind's repeats.
	gpuFailures []gpuFailure
	gpuSeen     map[string]int
	remote      int        // hosts whose agent is not in this process
	bind        bindChoice // where the control plane listens, and what each agent dials
	world       int

	// tab guards rankHost and every host's ranks: the loop changes them
	// (a splice), onUp and the output lanes read them.
	tab sync.RWMutex
	// rankHost maps a rank to its host index.
	rankHost []int
	// tabChanged is closed, and replaced, when a splice moves ranks or
	// the stdin rank starts on another host (stdinStarted).
	tabChanged chan struct{}
	// stdinStarted is the host where the process of the rank that reads
	// stdin last started; -1 before it did.
	stdinStarted int
	// holders[r] are the ranks holding rank r's replicas (state
	// protection), or nil.
	holders [][]int
	// ecGroups are the erasure-coding groups of a job run with
	// --redundancy ec:K+M (host indices into hosts), nil otherwise:
	// placeRedundancy's (topology.PlanEC) at the start (holders are then
	// the clear copies' holders), each epoch's as the machine publishes
	// them (a replacement in the lost host's places) after. It is the one
	// source of every epoch table's EC (ecTable).
	ecGroups []topology.ECGroup
	// logs[r] are, in diff mode under EC, rank r's log-only holders
	// (topology.ECLogHolders at the start, each epoch's as the machine
	// publishes them after), nil otherwise: the one source of every
	// epoch table's Logs.
	logs [][]int
	prog *progress
	dur  *durableTier // the durable tier (durable.go), or nil
	// resume gathers the hosts' reach on disk (--resume, resume.go):
	// nil without, or once T is decided.
	resume  *resumeGather
	resumes chan *wire.ResumeReach
	// resuming: --resume, and a host's ranks of the first table have not
	// started yet (their agents wait for T and rebuild their states: a
	// new epoch would move them under the preload). A host lost then
	// stops the job (resumeLost).
	resuming bool
	// reach gathers the hosts' reach on disk for a roll-back to the
	// durable tier (rollback.go), nil without one under way; rollbackT
	// is the step the next Restart rolls back to (-1: none).
	reach     *resumeGather
	rollbackT int64

	events     chan *wire.Event
	progress   chan *wire.UpProgress
	beats      chan int // hosts heard from, at most one per host per half heartbeat interval
	dropped    chan int // hosts whose agent's control connection closed
	agentExits chan agentExit
	wg         sync.WaitGroup // agent goroutines
	sem        chan struct{}  // start slots
	quit       chan struct{}  // closed when the job is over

	mu sync.Mutex // guards every host's kill and stream

	srun *srunStep // the step of the remote agents under --launcher slurm (slurm.go), or nil

	// State owned by the loop.
	m        *hotswap.Machine      // the failure decisions (package hotswap)
	t0       time.Time             // the job's start: the machine's clock is time since t0
	deadline *time.Timer           // the machine's next deadline (NextDeadline)
	rec      *watch                // the recovery epoch being followed, or nil
	publish  *hotswap.PublishEpoch // waiting for its RestorePlan
	// What the current step's actions did: restarted every rank, moved
	// these to another host.
	restarted bool
	moved     []int
	under     map[int]int64 // under-protected owners → the G their copies must reach
	// underPast: under-protected owners whose copies failed their CRC32C
	// at a step → that step; G must pass it too (hotswap.UnderProtected's
	// Corrupt: until then a holder may keep the corrupt copy).
	underPast map[int]int64
	// cause is why the job stops, once it does: the machine's decision
	// (Abort, an interrupt) or the launcher's own (--timeout, a broken
	// stdout, an agent that cannot start before the job has).
	cause      *failure
	stopping   bool
	rankEnded  []bool
	ranksEnded int
	killed     bool
	noRanks    bool   // the job stopped before any rank started
	gen        uint64 // restart generation
	epoch      uint64
}

// NewJobID returns a fresh job id.
func NewJobID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// Run runs the job described by cfg and returns gorun's exit code. An error
// means the job could not be set up at all; errors.Is(err, ErrConfig)
// tells a usage error.
func Run(ctx context.Context, c Config) (int, error) {
	phasetrace.Mark("run")
	sk := newStatusKey(c.Registry != "")
	if sk != nil {
		defer sk.wait()
	}
	cfg, err := c.withDefaults()
	if err != nil {
		return 0, err
	}
	exe, _ := os.Executable()
	mpi, err := cfg.resolveMPI(exe)
	if err != nil {
		return 0, err
	}
	assign, err := topology.MapRanks(cfg.Hosts, topology.MapOptions{NP: cfg.NP, By: cfg.MapBy, Oversubscribe: cfg.Oversubscribe})
	if err != nil {
		return 0, &ConfigError{Msg: strings.TrimPrefix(err.Error(), "topology: "), Err: err}
	}
	j := &job{
		cfg: cfg, log: cfg.Logger, id: NewJobID(), world: cfg.NP, mpi: mpi,
		verbose:      cfg.Logger.Enabled(ctx, slog.LevelDebug),
		events:       make(chan *wire.Event, 1024),
		progress:     make(chan *wire.UpProgress, 1024),
		resumes:      make(chan *wire.ResumeReach, 64),
		beats:        make(chan int, max(1024, 2*len(cfg.Hosts))),
		dropped:      make(chan int, 1024),
		agentExits:   make(chan agentExit, 16),
		rankEnded:    make([]bool, cfg.NP),
		rankHost:     make([]int, cfg.NP),
		tabChanged:   make(chan struct{}),
		statusKey:    sk,
		stdinStarted: -1,
		quit:         make(chan struct{}),
		rollbackT:    -1,
	}
	if cfg.Events != nil {
		j.evlog = newEventLog(cfg.Events, cfg.Logger)
	}
	j.subj = wire.JobSubjects(j.id)
	// Agents run on the hosts that got ranks and on the spares, in
	// hostfile order.
	byHost := map[int]*hostAgent{}
	local := newLocalMatcher()
	add := func(i int) *hostAgent {
		h, ok := byHost[i]
		if !ok {
			x := cfg.Hosts[i]
			h = &hostAgent{name: x.Name, topo: x, spare: x.Spare, local: local.match(x.Name) || x.Addr != "" && local.match(x.Addr), tail: &tail{}}
			byHost[i] = h
		}
		return h
	}
	for _, a := range assign {
		h := add(a.Host)
		h.ranks = append(h.ranks, a.Rank)
	}
	for i, x := range cfg.Hosts {
		if x.Spare {
			add(i)
		}
	}
	keys := make([]int, 0, len(byHost))
	for k := range byHost {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	remote := 0
	for _, k := range keys {
		h := byHost[k]
		h.index = len(j.hosts)
		j.hosts = append(j.hosts, h)
		for _, r := range h.ranks {
			j.rankHost[r] = h.index
		}
		if !h.local {
			remote++
		}
	}
	j.remote = remote
	if err := j.placeRedundancy(assign); err != nil {
		return 0, err
	}
	phasetrace.Mark("plan")
	if err := j.setBind(ctx); err != nil {
		if ie, ok := errors.AsType[*interruptedError](err); ok {
			fmt.Fprintf(cfg.Stderr, "gorun: %s while resolving the hosts' names; no rank started\n", hotswap.SignalName(ie.sig))
			return 128 + int(ie.sig), nil
		}
		return 0, err
	}
	if remote > 0 && cfg.Launcher == LauncherSlurm {
		o, err := probeSrun(ctx)
		if err != nil {
			return 0, err
		}
		j.srun = newSrunStep(j, o)
	}
	if j.m, err = hotswap.New(j.machineConfig()); err != nil {
		if errors.Is(err, hotswap.ErrConfig) {
			return 0, &ConfigError{Msg: strings.TrimPrefix(err.Error(), hotswap.ErrConfig.Error()+": "), Err: err}
		}
		return 0, fmt.Errorf("launcher: %w", err)
	}
	phasetrace.Mark("bind")
	return j.run(ctx)
}

// machineConfig is the job as package hotswap sees it: its hosts are the
// job's (j.hosts, spares included), in the same order.
func (j *job) machineConfig() hotswap.Config {
	c := hotswap.Config{
		World: j.world, Hosts: make([]topology.Host, len(j.hosts)), Assign: slices.Clone(j.rankHost),
		TP: j.cfg.TP, PP: j.cfg.PP, Holders: j.holders, EC: j.ecGroups, Diff: j.cfg.ProtectMode == ModeDiff, Logs: j.logs,
		Durable:     j.cfg.Durable.Dir != "",
		MaxRestarts: j.cfg.MaxRestarts, Recovery: j.cfg.Recovery, OnNoSpare: j.cfg.OnNoSpare,
		Oversubscribe:    j.cfg.Oversubscribe,
		SuspectTimeout:   j.cfg.SuspectTimeout,
		HeartbeatTimeout: j.cfg.HeartbeatTimeout,
		HangTimeout:      j.cfg.HangTimeout,
		KillGrace:        j.cfg.KillGrace,
	}
	if c.KillGrace == 0 {
		c.KillGrace = -1 // at once (the machine's zero is its default)
	}
	for i, h := range j.hosts {
		c.Hosts[i] = h.topo
	}
	return c
}

// serverConfig is the control-plane server's configuration, without the
// status clients' key (statusInit adds it): each host's agent admitted
// with its own credentials, and the drops of the remote agents'
// connections watched (j.dropped). An in-process agent's connection is
// not watched: it runs in this process, which notices its end without
// the server, and watching needs the server's system account, whose
// start, watcher connection and connect events were about 5% of gorun's
// CPU at -np 1 (perf), for nothing in a job of local hosts only.
func (j *job) serverConfig() (ctlserver.Config, error) {
	scfg := ctlserver.Config{Job: j.id, Bind: j.bind.listen, Addrs: j.bind.addrs, LocalPassword: j.secret.InProcessPassword(), Hosts: make([]ctlserver.HostUser, len(j.hosts))}
	for i, h := range j.hosts {
		c := j.secret.HostCredentials(i, nil)
		if h.local {
			scfg.Hosts[i].Password = c.InProcessPassword()
			continue
		}
		var err error
		if scfg.Hosts[i].Nkey, err = control.PublicKey(c); err != nil {
			return scfg, err
		}
	}
	if j.serverWatchesDrops() {
		scfg.HostDisconnected = j.hostDisconnected
	}
	return scfg, nil
}

// serverWatchesDrops says whether the control plane reports the drops of
// the agents' connections (hostDisconnected): only when some host's agent
// is remote, since the watcher costs the server its system account.
// Without one, each in-process agent's connection is watched where it is
// dialed (startLocal: watchInProcess), so that a dropped connection makes
// its host suspect as soon, not only once its agent has stopped its ranks
// and ended.
func (j *job) serverWatchesDrops() bool {
	for _, h := range j.hosts {
		if !h.local {
			return true
		}
	}
	return false
}

// hostDisconnected hands the drop of host's control connection to the
// loop (ctlserver.Config.HostDisconnected).
func (j *job) hostDisconnected(host int, reason string) {
	j.log.Debug("agent's control connection closed", "host", j.hosts[host].name, "reason", reason)
	select {
	case j.dropped <- host:
	case <-j.quit:
	}
}

func (j *job) run(ctx context.Context) (code int, err error) {
	if j.secret, err = jobkey.NewSecret(); err != nil {
		return 0, err
	}
	// The secret stays in this process. Each agent gets its own host's
	// credentials (internal/jobkey/secret.go): a remote one proves its nkey over TCP
	// (TLS unless on loopback), a local one its password in-process; the
	// server lets either publish only on its host's subjects. Without
	// remote hosts the server listens only for gorun status's clients
	// (Config.Registry, which the command line always sets: statusInit),
	// on loopback, nkey-authenticated, in plain text; without either it
	// does not listen at all.
	scfg, err := j.serverConfig()
	if err != nil {
		return 0, err
	}
	phasetrace.Mark("host-keys")
	if err := j.statusInit(&scfg); err != nil {
		return 0, err
	}
	phasetrace.Mark("status-nkey")
	j.srv, err = ctlserver.Start(scfg)
	if err != nil {
		return 0, fmt.Errorf("launcher: control plane: %w", err)
	}
	phasetrace.Mark("server-up")
	defer phasetrace.Mark("server-shutdown") // after it
	defer j.srv.Shutdown()
	j.ctl, err = control.DialInProcess(ctx, j.srv.InProcess(), j.secret, control.ControlOptions{Name: "launcher"})
	if err != nil {
		return 0, fmt.Errorf("launcher: %w", err)
	}
	defer j.ctl.Close()
	phasetrace.Mark("launcher-dialed")
	j.log.Debug("control plane up", "url", j.srv.URL(), "job", j.id, "hosts", len(j.hosts), "ranks", j.world)

	j.out = newOutputMux(j.cfg.Stdout, j.cfg.Stderr, j.world, j.cfg.TagOutput, j.cfg.TimestampOutput, j.cfg.OutputDir)
	j.out.owns = j.owns
	j.out.flow = newOutputFlow(len(j.hosts), wire.OutputAckEvery, func(host int, n uint64) {
		if err := j.ctl.Publish(j.subj.OutputAck(host), wire.Marshal(&wire.OutputAck{Host: host, Bytes: n})); err != nil {
			j.log.Warn("cannot acknowledge output", "host", host, "err", err)
		}
	})
	defer j.out.close()
	j.reportBind()
	j.reportSurvives()
	if w := j.cfg.ECDiffWarning(); w != "" {
		j.log.Warn(w) // on the terminal once, with -v or not, as the launcher's other warnings
	}
	j.fences = control.NewFenceCollector(j.ctl.Conn, j.id, 0, len(j.hosts))
	hostRanks := j.placement()
	// The spares run no rank: they send no fence part.
	if err := j.fences.SetPlacement(0, hostRanks); err != nil {
		return 0, fmt.Errorf("launcher: %w", err)
	}
	j.prog = newProgress(hostRanks, slices.Clone(j.rankHost), func(g *wire.GlobalStep) {
		if err := j.ctl.Publish(j.subj.G, wire.Marshal(g)); err != nil {
			j.log.Warn("cannot publish G", "err", err)
		}
	})
	if j.diffEC() {
		j.prog.trackH()
	}
	j.dur = j.newDurableTier()
	if j.dur != nil && j.dur.committed >= 0 {
		j.m.Step(0, hotswap.DiskCommitted{Step: j.dur.committed}) // (no action)
	}
	if j.cfg.Durable.Resume {
		base, err := durable.ReadCommitted(j.cfg.Durable.Dir) // checked by withDefaults
		if err != nil {
			return 0, &ConfigError{Msg: fmt.Sprintf("--resume: %v", err), Err: err}
		}
		j.resume = newResumeGather(hostRanks, j.world, base)
		j.resume.names, j.resume.limit = j.hostNames(), j.cfg.ReachTimeout
		j.resuming = true
	}
	up, err := j.ctl.Subscribe(j.subj.Up, j.onUp)
	if err != nil {
		return 0, fmt.Errorf("launcher: %w", err)
	}
	up.SetPendingLimits(-1, -1)
	defer up.Unsubscribe()

	rhosts := make([]control.RendezvousHost, len(j.hosts))
	for i, h := range j.hosts {
		rhosts[i] = control.RendezvousHost{Name: h.name, Ranks: slices.Clone(h.ranks), Spare: h.spare}
	}
	j.rv, err = control.StartRendezvous(j.ctl.Conn, j.id, 0, rhosts, j.spec(), holderRows(j.holders), j.ecTable())
	if err != nil {
		return 0, fmt.Errorf("launcher: %w", err)
	}
	defer j.rv.Close()
	if j.diffEC() {
		if err := j.rv.SetDiffEC(holderRows(j.logs)); err != nil {
			return 0, fmt.Errorf("launcher: the first epoch table: %w", err)
		}
	}

	phasetrace.Mark("rendezvous")
	if err := j.metricsStart(); err != nil {
		return 0, err
	}
	defer j.metricsStop()

	sctx, stopStarting := context.WithCancel(ctx)
	defer stopStarting()
	sem := make(chan struct{}, j.cfg.MaxParallelStarts)
	j.sem = sem
	now := time.Now()
	j.t0 = now
	j.deadline = time.NewTimer(time.Hour)
	j.deadline.Stop()
	defer j.deadline.Stop()
	j.schedule()
	for _, h := range j.hosts {
		h.started = now
		h.lastSeen.Store(now.UnixNano())
	}
	j.recordLaunch()
	phasetrace.Mark("agents-start")
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		j.startAgents(sctx, sem)
	}()
	// Off the launch's critical path: waited for, and undone, on every
	// exit path.
	defer j.statusStart()()
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		j.recordProgress(sctx)
	}()
	if j.cfg.Stdin != nil {
		if d, ok := j.cfg.Stdin.(interface{ SetReadDeadline(time.Time) error }); ok && d.SetReadDeadline(time.Time{}) == nil {
			j.wg.Add(1)
			go func() {
				defer j.wg.Done()
				j.forwardStdin(sctx)
			}()
		} else {
			// A read from a terminal (not pollable) cannot be interrupted: the
			// goroutine ends at the next line typed, at end of file, or with
			// the process. Nothing waits for it.
			go j.forwardStdin(sctx)
		}
	}

	if j.cfg.running != nil {
		j.cfg.running(j)
	}
	code = j.loop(ctx)
	phasetrace.Mark("loop-end")
	stopStarting()
	j.finish()
	phasetrace.Mark("finished")
	j.recordExit(code)
	// After the agents' exit: the durable tier's footprint is what stays,
	// the last commit's reclamation done.
	if j.verbose && j.prog.used() {
		j.out.report("%s", j.prog.table(j.cfg.ProtectMode, j.cfg.Diff))
		if j.dur != nil {
			j.out.report("%s", j.durableTable())
		}
	}
	close(j.quit)
	return code, nil
}

// spec is the job's spec, the same for every agent (spares, and hosts that
// join later, included): what an agent needs to start its ranks and
// protect their state.
func (j *job) spec() *wire.JobSpec {
	return &wire.JobSpec{
		Prog: j.cfg.Prog, Args: j.cfg.Args, Env: j.cfg.Env, Dir: j.cfg.Dir, DirExplicit: j.cfg.dirExplicit,
		KillGrace: j.cfg.KillGrace, HeartbeatInterval: j.cfg.HeartbeatInterval, OutputDelay: j.cfg.OutputDelay,
		StdinRank: j.stdinRank(), TP: j.cfg.TP, PP: j.cfg.PP, GPUsPerRank: j.cfg.GPUsPerRank,
		MaxRestarts: j.cfg.MaxRestarts, NoPMI: j.cfg.NoPMI, MPI: string(j.mpi), PMILibrary: j.cfg.PMILibrary,
		ProtectMode: string(j.cfg.ProtectMode), DiffFold: j.cfg.Diff.Fold, BaseEvery: j.cfg.Diff.BaseEvery, DiffCodec: j.cfg.Diff.Codec,
		CkptDir: j.cfg.Durable.Dir, CkptEvery: j.cfg.Durable.Every, CkptConcurrency: j.cfg.Durable.Concurrency, CkptOverhead: j.cfg.Durable.Overhead,
		DiffBatch: j.cfg.Durable.DiffBatch, Resume: j.cfg.Durable.Resume,
	}
}

// started records how to reach and kill h's agent.
func (j *job) started(h *hostAgent, stream io.WriteCloser, kill func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	h.stream, h.kill = stream, kill
}

func (j *job) hasAgent(h *hostAgent) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return h.kill != nil
}

func (j *job) killAgent(h *hostAgent) {
	j.mu.Lock()
	kill := h.kill
	j.mu.Unlock()
	if kill != nil {
		kill()
	}
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
