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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
	"github.com/nats-io/nats.go"
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
	secret  comm.Secret
	verbose bool
	srv     *ctlserver.Server
	ctl     *comm.Control
	subj    wire.Subjects
	out     *outputMux
	rv      *comm.Rendezvous
	fences  *comm.FenceCollector
	evlog   *eventLog    // --events, or nil
	status  *statusState // gorun status (status.go), or nil
	metrics *metrics     // --metrics (metrics.go), or nil

	hosts []*agentHost
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
	byHost := map[int]*agentHost{}
	local := newLocalMatcher()
	add := func(i int) *agentHost {
		h, ok := byHost[i]
		if !ok {
			x := cfg.Hosts[i]
			h = &agentHost{name: x.Name, topo: x, spare: x.Spare, local: local.match(x.Name) || x.Addr != "" && local.match(x.Addr), tail: &tail{}}
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

func (j *job) run(ctx context.Context) (code int, err error) {
	if j.secret, err = comm.NewSecret(); err != nil {
		return 0, err
	}
	// The secret stays in this process. Each agent gets its own host's
	// credentials (comm/secret.go): a remote one proves its nkey over TCP
	// (TLS unless on loopback), a local one its password in-process; the
	// server lets either publish only on its host's subjects. Without
	// remote hosts the server listens only for gorun status's clients
	// (Config.Registry, which the command line always sets: statusInit),
	// on loopback, nkey-authenticated, in plain text; without either it
	// does not listen at all.
	scfg := ctlserver.Config{Job: j.id, Bind: j.bind.listen, Addrs: j.bind.addrs, LocalPassword: j.secret.InProcessPassword(), Hosts: make([]ctlserver.HostUser, len(j.hosts))}
	for i, h := range j.hosts {
		c := j.secret.HostCredentials(i, nil)
		if h.local {
			scfg.Hosts[i].Password = c.InProcessPassword()
		} else if scfg.Hosts[i].Nkey, err = c.PublicKey(); err != nil {
			return 0, err
		}
	}
	scfg.HostDisconnected = func(host int, reason string) {
		j.log.Debug("agent's control connection closed", "host", j.hosts[host].name, "reason", reason)
		select {
		case j.dropped <- host:
		case <-j.quit:
		}
	}
	if err := j.statusInit(&scfg); err != nil {
		return 0, err
	}
	j.srv, err = ctlserver.Start(scfg)
	if err != nil {
		return 0, fmt.Errorf("launcher: control plane: %w", err)
	}
	defer j.srv.Shutdown()
	j.ctl, err = comm.DialInProcess(ctx, j.srv.InProcess(), j.secret, comm.ControlOptions{Name: "launcher"})
	if err != nil {
		return 0, fmt.Errorf("launcher: %w", err)
	}
	defer j.ctl.Close()
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
	j.fences = comm.NewFenceCollector(j.ctl.Conn, j.id, 0, len(j.hosts))
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

	rhosts := make([]comm.RendezvousHost, len(j.hosts))
	for i, h := range j.hosts {
		rhosts[i] = comm.RendezvousHost{Name: h.name, Ranks: slices.Clone(h.ranks), Spare: h.spare}
	}
	j.rv, err = comm.StartRendezvous(j.ctl.Conn, j.id, 0, rhosts, j.spec(), holderRows(j.holders), j.ecTable())
	if err != nil {
		return 0, fmt.Errorf("launcher: %w", err)
	}
	defer j.rv.Close()
	if j.diffEC() {
		if err := j.rv.SetDiffEC(holderRows(j.logs)); err != nil {
			return 0, fmt.Errorf("launcher: the first epoch table: %w", err)
		}
	}

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
	stopStarting()
	j.finish()
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

// stdinRank is the rank that reads the launcher's stdin, or wire.NoStdin.
func (j *job) stdinRank() int {
	if j.cfg.Stdin == nil {
		return wire.NoStdin
	}
	return j.cfg.StdinRank
}

// forwardStdin passes cfg.Stdin to the agent of the rank that reads it,
// once the ranks have started, a chunk at a time: each waits for the
// agent's answer that it is in the rank's pipe. It ends at end of file, when
// the rank's stdin closes, or with ctx.
//
// The rank may move to another host (a hot-swap): a chunk whose host is
// lost before it answers is sent whole to the new host once the rank has
// started there (what the lost rank had read is gone with it: stdin is a
// stream), and after end of file the forwarding stays until ctx ends, to
// close the stdin of a rank moved later, which would otherwise wait for
// input for ever.
func (j *job) forwardStdin(ctx context.Context) {
	select {
	case <-j.rv.Done():
	case <-ctx.Done():
		return
	}
	if d, ok := j.cfg.Stdin.(interface{ SetReadDeadline(time.Time) error }); ok {
		stop := context.AfterFunc(ctx, func() { _ = d.SetReadDeadline(time.Now()) })
		defer stop()
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := j.cfg.Stdin.Read(buf)
		if n > 0 {
			if _, ok := j.sendStdin(ctx, buf[:n]); !ok {
				return
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// End of file (or an unreadable stdin: EOF all the same).
			if host, ok := j.sendStdin(ctx, nil); ok {
				j.stdinEOFFollows(ctx, host)
			}
			return
		}
	}
}

// sendStdin sends b (nil: end of file) to the agent of the stdin rank's
// host, once the rank has started there, and reports whether the rank
// took it, and on which host. A host lost before it answered: b goes to
// the host the rank moves to.
func (j *job) sendStdin(ctx context.Context, b []byte) (int, bool) {
	for {
		st := j.stdinState()
		if st.started != st.host {
			// The rank moved and has not started on its new host yet:
			// that host's agent would find no pipe to write to.
			if !j.stdinChanges(ctx, st) {
				return -1, false
			}
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		go func() { // the request ends if the rank moves meanwhile
			if j.stdinMoves(rctx, st) {
				cancel()
			}
		}()
		m, err := j.ctl.RequestWithContext(rctx, j.subj.StdinTo(st.host), b)
		cancel()
		if err == nil {
			if len(m.Data) > 0 {
				j.log.Debug("the rank's stdin is closed", "why", string(m.Data))
				return st.host, false
			}
			return st.host, true
		}
		if ctx.Err() != nil {
			return -1, false
		}
		// The host did not answer: its agent is gone. The chunk goes to
		// the rank's next host, if the job goes on.
		j.log.Debug("stdin not forwarded; waiting for the rank's next host", "host", st.host, "err", err)
		if !j.stdinMoves(ctx, st) {
			return -1, false
		}
	}
}

// stdinEOFFollows, after end of file was delivered on host, closes the
// stdin of the stdin rank on each host it moves to, until ctx ends.
func (j *job) stdinEOFFollows(ctx context.Context, host int) {
	for {
		st := j.stdinState()
		if st.host == host && !j.stdinMoves(ctx, st) {
			return
		}
		var ok bool
		if host, ok = j.sendStdin(ctx, nil); !ok {
			return
		}
	}
}

// stdinView is where the stdin rank is, where it last started, and a
// channel closed when either changes.
type stdinView struct {
	host, started int
	changed       <-chan struct{}
}

func (j *job) stdinState() stdinView {
	j.tab.RLock()
	defer j.tab.RUnlock()
	return stdinView{j.rankHost[j.cfg.StdinRank], j.stdinStarted, j.tabChanged}
}

// stdinChanges waits until the stdin rank's host or start changes from
// st, and reports whether it did before ctx ended.
func (j *job) stdinChanges(ctx context.Context, st stdinView) bool {
	return j.stdinAwait(ctx, st, func(now stdinView) bool { return now.host != st.host || now.started != st.started })
}

// stdinMoves waits until the stdin rank runs on another host than
// st.host, and reports whether it did before ctx ended.
func (j *job) stdinMoves(ctx context.Context, st stdinView) bool {
	return j.stdinAwait(ctx, st, func(now stdinView) bool { return now.host != st.host })
}

// stdinAwait waits, from st, until done holds for the stdin rank's
// state, and reports whether it did before ctx ended.
func (j *job) stdinAwait(ctx context.Context, st stdinView, done func(stdinView) bool) bool {
	changed := st.changed
	for {
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
		now := j.stdinState()
		if done(now) {
			return true
		}
		changed = now.changed
	}
}

// stdinStartedOn records that the stdin rank's process started on host
// (its agent has the pipe): a chunk waiting for it may go there.
func (j *job) stdinStartedOn(host int) {
	j.tab.Lock()
	defer j.tab.Unlock()
	if j.stdinStarted != host {
		j.stdinStarted = host
		close(j.tabChanged)
		j.tabChanged = make(chan struct{})
	}
}

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
func (j *job) startLocal(ctx context.Context, h *agentHost) error {
	pr, pw := io.Pipe()
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	j.started(h, pw, cancel)
	addr := j.bind.localAgentAddr()
	creds := j.secret.HostCredentials(h.index, nil)
	cfg := agent.Config{
		Job: j.id, Host: h.index, Name: h.name, Creds: creds, Launcher: pr, Addr: addr,
		Logger: j.log.With("agent", h.name),
		Dial: func(ctx context.Context, o comm.ControlOptions) (*comm.Control, error) {
			return comm.DialInProcessHost(ctx, j.srv.InProcess(), creds, o)
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
func (j *job) heard(h *agentHost) {
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
func (j *job) hostDone(h *agentHost) bool {
	for _, r := range h.ranks {
		if !j.rankEnded[r] {
			return false
		}
	}
	return true
}

// closeStream closes h's launcher stream, if it has one.
func (j *job) closeStream(h *agentHost) {
	j.mu.Lock()
	s := h.stream
	h.stream = nil
	j.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

func (j *job) release(h *agentHost) {
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
func (j *job) outputPending() *agentHost {
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

// onGPUEvent records a GPU health report and tells the user. A fault
// that requires replacing the host is the machine's to act on (the loop
// passes it on); the others leave the job as it is.
func (j *job) onGPUEvent(h *agentHost, e *wire.Event) {
	g := e.GPU
	// A flapping GPU repeats itself: keep and print the first report of
	// each (host, GPU, kind, XID), then every 100th, with the count.
	key := fmt.Sprintf("%s/%d/%s/%d", h.name, g.Index, g.Kind, g.XID)
	if j.gpuSeen == nil {
		j.gpuSeen = map[string]int{}
	}
	j.gpuSeen[key]++
	n := j.gpuSeen[key]
	if n > 1 && n%100 != 0 {
		return
	}
	if n == 1 && len(j.gpuFailures) < maxGPUFailures {
		j.gpuFailures = append(j.gpuFailures, gpuFailure{host: h.name, report: *g, msg: e.Msg})
	}
	repeat := ""
	if n > 1 {
		repeat = fmt.Sprintf(" (%d times)", n)
	}
	ranks := "no rank"
	if len(g.Ranks) > 0 {
		ranks = "rank " + joinInts(g.Ranks)
		if len(g.Ranks) > 1 {
			ranks = "ranks " + joinInts(g.Ranks)
		}
	}
	j.log.Debug("GPU failure report", "host", h.name, "gpu", g.Index, "uuid", g.UUID, "class", g.Class, "xid", g.XID, "ranks", g.Ranks)
	j.out.report("GPU %d (%s) on host %s, used by %s: %s failure: %s%s", g.Index, g.UUID, h.name, ranks, g.Class, e.Msg, repeat)
}

// maxGPUFailures bounds the GPU reports a job keeps.
const maxGPUFailures = 10000

// gpuFailure is a GPU health report received from an agent.
type gpuFailure struct {
	host   string
	report wire.GPUReport
	msg    string
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
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

// started records how to reach and kill h's agent.
func (j *job) started(h *agentHost, stream io.WriteCloser, kill func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	h.stream, h.kill = stream, kill
}

func (j *job) hasAgent(h *agentHost) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return h.kill != nil
}

func (j *job) killAgent(h *agentHost) {
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
