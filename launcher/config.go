package launcher

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// MPIKind is the MPI a program is built with (--mpi).
type MPIKind string

// The MPIs gorun bootstraps.
const (
	MPIAuto    MPIKind = ""        // look at the libmpi the program links
	MPIOpenMPI MPIKind = "openmpi" // Open MPI 4.x
	MPIMPICH   MPIKind = "mpich"   // MPICH and its derivatives (PMI-1 over PMI_FD)
)

// LauncherKind is how agents start on remote hosts (--launcher).
type LauncherKind string

// The ways agents start.
const (
	LauncherAuto  LauncherKind = ""      // srun inside a Slurm allocation without hosts given, else ssh
	LauncherSSH   LauncherKind = "ssh"   // the rsh command (--rsh), once per host
	LauncherSlurm LauncherKind = "slurm" // one srun for every remote host
	LauncherLocal LauncherKind = "local" // this host only
)

// Config describes a job. Zero durations take the defaults documented on
// each field.
type Config struct {
	Hosts         []topology.Host
	NP            int
	MapBy         topology.MapBy
	Oversubscribe bool
	// TP and PP are the tensor- and pipeline-parallel sizes of the job's
	// layout (--tp, --pp; 0 means 1): TP × PP must divide NP.
	TP, PP int
	// GPUsPerRank is how many GPUs each rank gets on hosts that have GPUs
	// (--gpus-per-rank; 0 = one each, shared round-robin when ranks
	// outnumber them).
	GPUsPerRank int
	// Replicas is how many other hosts keep a copy of each rank's
	// protected state (--replicas; state protection, package internal/keeper).
	// ReplicasSet says it was asked for: then a placement that cannot
	// give every rank that many holders is an error, where the default
	// (1) quietly protects on each rank's own host only.
	Replicas    int
	ReplicasSet bool
	// ECK and ECM, when ECK > 0, protect the state with an erasure code
	// in place of replicas (--redundancy ec:K+M; Replicas must be 0):
	// the hosts with ranks form groups of ECK data and ECM parity hosts
	// (topology.PlanEC, across racks when the hostfile names them), and
	// each group survives any ECM of its hosts lost. A job whose hosts
	// cannot form such groups is a ConfigError saying why.
	ECK, ECM int
	// ProtectMode is how each rank's protected state reaches its replica
	// holders (--protect-mode): ModeFull ("" too) copies every
	// committed step's state whole (any trainer); ModeDiff sends
	// each step's gradient and hyper-parameters, and the holders rebuild
	// the state by replay (trainers that declare the replay optimizer),
	// as Diff says. ModeDiff needs Replicas of 1 or more, or an erasure
	// code: then only base steps are coded, and each rank's
	// differentials since the newest coded base are kept on M hosts
	// (topology.ECLogHolders; protect/PROTOCOL.md "Erasure coding and diff
	// mode").
	ProtectMode ProtectMode
	// Diff configures ModeDiff; it must be zero in ModeFull.
	Diff DiffOptions
	// Durable configures the durable tier (--ckpt-dir and the flags that
	// go with it; durable.go): each rank's bases on disk every
	// Durable.Every steps, committed by the launcher. Zero: none.
	Durable DurableOptions
	// MaxRestarts is how many times the ranks are restarted in place
	// after a rank fails, resuming from the globally recoverable step
	// (--max-restarts, as torchrun's; 0 = a failure ends the job).
	MaxRestarts int
	// Spares makes the last Spares hosts spares (--spares), in addition
	// to those marked Spare in the hostfile: their agents start with the
	// job and wait, registered and heartbeating, to replace a lost host.
	Spares int
	// Recovery is how a recovery epoch treats the surviving ranks
	// (--recovery): restarted (the default) or kept running (in-place,
	// for programs that use gorun's rank client).
	Recovery hotswap.Recovery
	// OnNoSpare is what a host loss does when no spare is left
	// (--on-no-spare): move its ranks to a host with free slots (the
	// default), or stop the job.
	OnNoSpare hotswap.OnNoSpare
	// SuspectTimeout is how long a suspected host (its control
	// connection dropped, replication to it failed, a rank lost a peer
	// there) has to be heard from before it is lost (--suspect-timeout;
	// 0 = 1 s).
	SuspectTimeout time.Duration
	// HangTimeout: a rank that reported progress and then none for this
	// long has hung (--hang-timeout; 0 = off).
	HangTimeout time.Duration
	// Events, when not nil, receives the job's record as JSON
	// lines (--events; the schema is package internal/events's).
	Events io.Writer
	// Registry, when not "", is the directory of the user's registry of
	// running jobs (jobstatus.Dirs' first): the job registers there, or
	// in the first of RegistryFallback it can use when it cannot, and
	// serves its status to `gorun status` (status.go).
	Registry         string
	RegistryFallback []string
	// Metrics, when not "", is the address of the job's Prometheus
	// endpoint (--metrics; metrics.go): HOST:PORT, or :PORT for loopback;
	// port 0 picks a free one.
	Metrics string
	// MetricsListener, when not nil, is the endpoint's listener, opened
	// by the caller on Metrics's address (ListenMetrics) before it made
	// anything (an --events file): the job serves on it and closes it.
	MetricsListener net.Listener
	// NoPMI: the ranks get no PMI-1 connection (--pmi=false); by default
	// every rank does, so that MPICH-built programs run as under mpiexec.
	NoPMI bool
	// MPI is the MPI the program is built with (--mpi): MPIAuto (""), the
	// default, looks at the libmpi the program links; MPIOpenMPI gives the
	// ranks Open MPI 4's bootstrap (its flux PMI component over gorun's
	// PMI-1 client library) as well as PMI_FD; MPIMPICH only PMI_FD.
	MPI MPIKind
	// PMILibrary is the PMI-1 client library Open MPI ranks load
	// (libgorun-pmi.so); "" = the one beside the agent's executable.
	PMILibrary string
	// Launcher is how agents start on the other hosts (--launcher):
	// LauncherAuto (""), the default, is Slurm's srun inside a Slurm
	// allocation when no hosts are given, else the rsh command;
	// LauncherSSH, LauncherSlurm and LauncherLocal force one.
	Launcher LauncherKind

	Prog string
	Args []string
	Env  []string // KEY=VALUE for every rank (-x)
	Dir  string   // working directory of the ranks; "" = the launcher's, or home where that is missing

	TagOutput       bool
	TimestampOutput bool
	OutputDir       string // one directory per rank under it, instead of the terminal

	Timeout   time.Duration // 0 = none
	KillGrace time.Duration // SIGTERM → SIGKILL; 0 = 10 s; negative = kill at once

	Rsh       []string // command that runs a command on a host; nil = ["ssh"]
	AgentPath string   // gorun binary on remote hosts; "" = this executable
	// Bind is the control-plane listen address; "" = chosen: 127.0.0.1
	// when every host is this one, else the local address the kernel
	// routes to the remote hosts by.
	Bind string

	HeartbeatInterval time.Duration // 0 = 1 s
	HeartbeatTimeout  time.Duration // 0 = 10 × interval
	StartTimeout      time.Duration // agent start to registration; 0 = 60 s
	// ReachTimeout bounds how long the hosts with ranks may take to
	// report their ranks' reach on disk (--resume, a roll-back to
	// --ckpt-dir) once asked; 0 = 10 min (a read of every differential
	// since the committed step). A lost host is the machine's (heartbeats);
	// a live host still silent then stops the job, naming it.
	ReachTimeout      time.Duration
	MaxParallelStarts int           // agents starting at once; 0 = 128
	OutputDelay       time.Duration // how long agents may hold output; 0 = 5 ms

	// Stdin, when not nil, is passed to rank StdinRank (mpirun's --stdin;
	// rank 0 by default), with backpressure: gorun reads no faster than the
	// rank does. If it has a SetReadDeadline method (an *os.File), the job's
	// end stops the reading; otherwise a Read that blocks outlives Run.
	Stdin     io.Reader
	StdinRank int
	// Stdout and Stderr receive the ranks' output. When writing to Stdout
	// fails (a closed pipe: EPIPE), the job is stopped with exit code 141.
	Stdout, Stderr io.Writer
	Logger         *slog.Logger
	// Signals delivers the signals sent to gorun (SIGINT, SIGTERM, SIGHUP
	// stop the job with that signal; SIGUSR1, SIGUSR2 are forwarded to
	// every rank).
	Signals <-chan os.Signal

	dirExplicit bool // Dir was given, not defaulted
	// running, when not nil, is called with the job once its agents are
	// being started, before its loop runs (the package's tests: they
	// observe the job and play a host's failure).
	running func(*job)
	// agentConfig, when not nil, adjusts the configuration of each agent
	// run in this process before it starts (the package's tests: a host
	// whose read of the checkpoint directory hangs).
	agentConfig func(*agent.Config)
	// resolve and route, when not nil, replace the system's name
	// resolution and route lookup in the control plane's address choice
	// (bindaddr.go; the package's tests).
	resolve resolveFunc
	route   routeFunc
}

// ProtectMode is how a job's protected state reaches the replica holders
// (gorun --protect-mode; the agents' protect.ProtectMode).
type ProtectMode string

// The protect modes.
const (
	ModeFull ProtectMode = "full"
	ModeDiff ProtectMode = "diff"
)

// DiffOptions configure differential protection (Config.ProtectMode
// ModeDiff). Zero fields take the defaults they name. Every agent,
// spares and later ones included, gets them in the job's spec.
type DiffOptions struct {
	// Fold: a holder folds an owner's differential log into its base once
	// the log holds this many steps (--diff-fold; 1 to MaxDiffFold, 0 =
	// 8). A holder then holds about (2 + Fold/3) times each owner's
	// optimizer state with the raw codec (see keeper.DiffConfig).
	Fold int
	// BaseEvery: each holder gets a fresh base every this many steps, in
	// paced chunks (--base-every; 1 to MaxBaseEvery, 0 = 100).
	BaseEvery int
	// Codec is how the gradients are encoded, in protect.ParseDiffCodec's
	// form (--diff-codec; "" = raw, lossless). It travels to the agents
	// as this string.
	Codec string
}

// Bounds of DiffOptions.
const (
	MaxDiffFold  = wire.MaxDiffFold
	MaxBaseEvery = wire.MaxBaseEvery
)

// The defaults of DiffOptions' zero fields.
const (
	defaultDiffFold  = 8
	defaultBaseEvery = 100
	defaultDiffCodec = "raw"
)

// ErrConfig is matched (errors.Is) by every error that says the
// configuration is wrong, as opposed to a failure while running.
var ErrConfig = errors.New("launcher: bad configuration")

// ConfigError says what is wrong with a configuration, in words for the
// user of the command line.
type ConfigError struct {
	Msg string
	Err error // the underlying error, if any
}

func (e *ConfigError) Error() string { return e.Msg }

// Unwrap returns ErrConfig and the underlying error.
func (e *ConfigError) Unwrap() []error { return []error{ErrConfig, e.Err} }

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if cfg.Prog == "" {
		return cfg, &ConfigError{Msg: "no program to run"}
	}
	if cfg.NP < 1 {
		return cfg, &ConfigError{Msg: "-np must be at least 1"}
	}
	if cfg.GPUsPerRank < 0 {
		return cfg, &ConfigError{Msg: fmt.Sprintf("--gpus-per-rank %d: want 0 or more", cfg.GPUsPerRank)}
	}
	cfg.TP, cfg.PP = max(cfg.TP, 1), max(cfg.PP, 1)
	if _, err := topology.NewLayout(cfg.NP, cfg.TP, cfg.PP); err != nil {
		return cfg, &ConfigError{Msg: fmt.Sprintf("--tp %d --pp %d: %v", cfg.TP, cfg.PP, strings.TrimPrefix(err.Error(), "topology: bad parallel layout: ")), Err: err}
	}
	if cfg.Stdin != nil && (cfg.StdinRank < 0 || cfg.StdinRank >= cfg.NP) {
		return cfg, &ConfigError{Msg: fmt.Sprintf("--stdin %d: the job has ranks 0 to %d", cfg.StdinRank, cfg.NP-1)}
	}
	if len(cfg.Hosts) == 0 {
		return cfg, &ConfigError{Msg: "no hosts"}
	}
	if err := cfg.markSpares(); err != nil {
		return cfg, err
	}
	if err := cfg.checkProtect(); err != nil {
		return cfg, err
	}
	if err := cfg.checkDurable(); err != nil {
		return cfg, err
	}
	if cfg.SuspectTimeout < 0 || cfg.HangTimeout < 0 {
		return cfg, &ConfigError{Msg: fmt.Sprintf("--suspect-timeout %v, --hang-timeout %v: want 0 or more", cfg.SuspectTimeout, cfg.HangTimeout)}
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = 10 * time.Second
	}
	if cfg.KillGrace < 0 {
		cfg.KillGrace = 0
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = time.Second
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = 10 * cfg.HeartbeatInterval
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	if cfg.ReachTimeout <= 0 {
		cfg.ReachTimeout = defaultReachTimeout
	}
	if cfg.MaxParallelStarts <= 0 {
		cfg.MaxParallelStarts = 128
	}
	if cfg.OutputDelay <= 0 {
		cfg.OutputDelay = 5 * time.Millisecond
	}
	if len(cfg.Rsh) == 0 {
		cfg.Rsh = []string{"ssh"}
	}
	if cfg.Stdout == nil {
		cfg.Stdout = io.Discard
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.dirExplicit = cfg.Dir != ""
	if cfg.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return cfg, fmt.Errorf("launcher: working directory: %w", err)
		}
		cfg.Dir = wd
	}
	if cfg.AgentPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return cfg, fmt.Errorf("launcher: finding own executable: %w", err)
		}
		cfg.AgentPath = exe
	}
	return cfg, nil
}

// MarkSpares returns a copy of hosts with the last spares of them marked
// Spare (--spares), in addition to those the hostfile marks, and an error
// naming --spares when that leaves no host to run ranks.
func MarkSpares(hosts []topology.Host, spares int) ([]topology.Host, error) {
	n := len(hosts)
	if spares < 0 || spares >= n {
		return nil, &ConfigError{Msg: fmt.Sprintf("--spares %d: the job has %d hosts; want 0 to %d (at least one host must run ranks)", spares, n, n-1)}
	}
	hosts = slices.Clone(hosts)
	for i := n - spares; i < n; i++ {
		hosts[i].Spare = true
	}
	if !slices.ContainsFunc(hosts, func(h topology.Host) bool { return !h.Spare }) {
		return nil, &ConfigError{Msg: fmt.Sprintf("--spares %d: with the hostfile's spares, all %d hosts are spares; at least one must run ranks", spares, n)}
	}
	return hosts, nil
}

// markSpares marks cfg's spare hosts (MarkSpares) and checks that the
// hosts left for ranks can run them.
func (cfg *Config) markSpares() error {
	hosts, err := MarkSpares(cfg.Hosts, cfg.Spares)
	if err != nil {
		return err
	}
	cfg.Hosts = hosts
	spares, slots := 0, 0
	for _, h := range hosts {
		if h.Spare {
			spares++
		} else {
			slots += h.Slots
		}
	}
	if spares > 0 && slots < cfg.NP && !cfg.Oversubscribe {
		return &ConfigError{Msg: fmt.Sprintf("--spares %d: the %d spare hosts leave %d slots for -np %d ranks", cfg.Spares, spares, slots, cfg.NP)}
	}
	return nil
}

// ecDiffBaseRatio is how many --diff-fold a --base-every may be under
// erasure coding before the launcher warns of the logs' memory.
const ecDiffBaseRatio = 4

// ECDiffWarning is the launcher's warning about a configuration that
// runs but costs memory, or "": --protect-mode diff under --redundancy
// ec:K+M with --base-every above 4 × --diff-fold. Only base steps are
// erasure coded there, so the differentials after the newest coded base
// cannot fold into one: each of a rank's M log holders keeps up to
// base-every + refresh steps of them (protect/PROTOCOL.md "Erasure coding and
// diff mode"). cfg must have been checked (the defaults filled in).
func (cfg *Config) ECDiffWarning() string {
	d := cfg.Diff
	if cfg.ECK == 0 || cfg.ProtectMode != ModeDiff || d.BaseEvery <= ecDiffBaseRatio*d.Fold {
		return ""
	}
	refresh := max(1, min(d.BaseEvery/2, d.Fold))
	return fmt.Sprintf("--protect-mode diff with --redundancy ec:%d+%d and --base-every %d (more than %d x --diff-fold %d): "+
		"the differentials after the newest coded base cannot fold, so each of a rank's %d log holders keeps up to %d steps of them (base-every %d + refresh %d) for each rank it holds; "+
		"a --base-every near --diff-fold keeps memory near diff mode's with replicas",
		cfg.ECK, cfg.ECM, d.BaseEvery, ecDiffBaseRatio, d.Fold, cfg.ECM, d.BaseEvery+refresh, d.BaseEvery, refresh)
}

// checkProtect checks the redundancy, the protect mode and its settings,
// and fills in the defaults of diff mode's.
func (cfg *Config) checkProtect() error {
	if cfg.ECK != 0 || cfg.ECM != 0 {
		if cfg.ECK < 1 || cfg.ECM < 1 || cfg.ECK > topology.MaxECShards-cfg.ECM {
			return &ConfigError{Msg: fmt.Sprintf("--redundancy ec:%d+%d: want K >= 1 data and M >= 1 parity hosts, K+M at most %d", cfg.ECK, cfg.ECM, topology.MaxECShards)}
		}
		if cfg.Replicas != 0 {
			return &ConfigError{Msg: fmt.Sprintf("--redundancy ec:%d+%d and --replicas %d: give one of them", cfg.ECK, cfg.ECM, cfg.Replicas)}
		}
	}
	if cfg.ProtectMode == "" {
		cfg.ProtectMode = ModeFull
	}
	m := cfg.ProtectMode
	if m != ModeFull && m != ModeDiff {
		return &ConfigError{Msg: fmt.Sprintf("--protect-mode %s: want full or diff", cfg.ProtectMode)}
	}
	d := &cfg.Diff
	if m != ModeDiff {
		for _, f := range []struct {
			flag string
			set  bool
		}{{"--diff-fold", d.Fold != 0}, {"--base-every", d.BaseEvery != 0}, {"--diff-codec", d.Codec != ""}} {
			if f.set {
				return &ConfigError{Msg: f.flag + " only applies with --protect-mode diff"}
			}
		}
		return nil
	}
	if cfg.Replicas < 1 && cfg.ECK == 0 {
		return &ConfigError{Msg: fmt.Sprintf("--protect-mode diff sends each step to the replica holders: it needs --replicas 1 or more, not %d", cfg.Replicas)}
	}
	if cfg.ECM > wire.MaxHolders {
		// A rank on its own data host has M log-only holders: an epoch
		// table with more is refused by every agent.
		return &ConfigError{Msg: fmt.Sprintf("--redundancy ec:%d+%d with --protect-mode diff: at most %d parity hosts, not %d: "+
			"each rank's differentials after its newest coded base are kept on M hosts besides its own, and a rank keeps at most %d holders; use --protect-mode full, or M <= %d",
			cfg.ECK, cfg.ECM, wire.MaxHolders, cfg.ECM, wire.MaxHolders, wire.MaxHolders)}
	}
	if d.Fold < 0 || d.Fold > MaxDiffFold {
		return &ConfigError{Msg: fmt.Sprintf("--diff-fold %d: want 1 to %d", d.Fold, MaxDiffFold)}
	}
	if d.BaseEvery < 0 || int64(d.BaseEvery) > MaxBaseEvery {
		return &ConfigError{Msg: fmt.Sprintf("--base-every %d: want 1 to 2^31", d.BaseEvery)}
	}
	if d.Fold == 0 {
		d.Fold = defaultDiffFold
	}
	if d.BaseEvery == 0 {
		d.BaseEvery = defaultBaseEvery
	}
	if d.Codec == "" {
		d.Codec = defaultDiffCodec
	}
	if len(d.Codec) > wire.MaxProtectString {
		return &ConfigError{Msg: fmt.Sprintf("--diff-codec: %d bytes is too long", len(d.Codec))}
	}
	if err := agent.CheckDiffCodec(d.Codec); err != nil {
		return &ConfigError{Msg: fmt.Sprintf("--diff-codec: %v", err), Err: err}
	}
	return nil
}
