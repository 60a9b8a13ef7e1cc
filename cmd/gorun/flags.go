package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/gpu"
	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

var (
	errHelp    = errors.New("help requested")
	errVersion = errors.New("version requested")
)

// runOptions are the parsed flags of `gorun [run]`.
type runOptions struct {
	np            int
	hostfile      string
	hostList      string
	mapBy         string
	exports       []string
	oversubscribe bool
	tp, pp        int
	gpusPerRank   int
	replicas      int
	replicasSet   bool
	ecK, ecM      int // --redundancy ec:K+M (ecK 0: replicas)
	protectMode   protect.ProtectMode
	diff          launcher.DiffOptions
	durable       launcher.DurableOptions // ckpt_flags.go
	maxRestarts   int
	spares        int
	onNoSpare     string
	recovery      string
	suspect       time.Duration
	hang          time.Duration
	events        string
	metrics       string
	pmi           bool
	mpi           string
	launcher      string
	tagOutput     bool
	timestamp     bool
	outputDir     string
	timeout       time.Duration
	killGrace     time.Duration
	rsh           string
	launchAgent   string
	bind          string
	wdir          string
	hbInterval    time.Duration
	hbTimeout     time.Duration
	startTimeout  time.Duration
	stdin         string
	rshConcurrent int
	verbose       bool
	prog          string
	args          []string
}

const usageText = `Usage: gorun [flags] [--] PROG [ARGS...]

Starts copies (ranks) of PROG across hosts, mpirun style, and returns the
exit code of the rank that failed first (0 when all succeed).

Placement:
  -np, -n N               number of ranks (default: every slot)
  --hostfile, -f, --machinefile FILE
                          hosts, Open MPI (node slots=4) or MPICH (node:4) form;
                          Slurm lists node[01-04] expand; rack=, switch=, spare
  -H, --host LIST         hosts inline: h1:2,h2,node[1-3]:4
  --map-by slot|node      fill each host's slots first, or round-robin (default slot)
  --oversubscribe         allow more ranks than slots
  --tp N, --pp N          tensor- and pipeline-parallel sizes (default 1), in
                          Megatron rank order; -np must be a multiple of
                          tp × pp. Ranks get GORUN_TP_SIZE, GORUN_PP_SIZE and
                          GORUN_DP_SIZE
  --gpus-per-rank G        GPUs per rank on hosts with GPUs (default: one each,
                          shared round-robin when ranks outnumber them); ranks
                          get CUDA_VISIBLE_DEVICES and CPUs near their GPUs
  (no hostfile or -H: this host, with one slot per GPU, or per CPU without GPUs)

Fault tolerance:
  --redundancy replicas:K|ec:K+M
                          how each rank's protected state survives lost hosts:
                          replicas:K, whole copies on K other hosts of its
                          data-parallel group (default replicas:1 where the hosts
                          allow it; asked for explicitly, it must be met); ec:K+M,
                          an erasure code over groups of K data and M parity
                          hosts (across racks when the hostfile names them):
                          any M hosts of a group may be lost, at (K+M)/K times
                          the state's memory instead of K+1 times. The hosts
                          with ranks must form whole groups and each group's
                          ranks must divide by K; -v says what the job survives.
                          With --protect-mode diff only the bases are coded
                          and M is at most 16
  --replicas K            the same as --redundancy replicas:K (0 to 8)
  --protect-mode full|diff
                          full: every step's protected state is copied whole to
                          its holders (any trainer); diff: only each step's
                          gradient and hyper-parameters, with a base every
                          --base-every steps; holders rebuild the state by replay
                          (trainers that declare the replay optimizer, e.g.
                          examples/dptrain). Default full
  --diff-fold N           diff: holders fold the log into the base every N steps
                          (1 to 4096, default 8); a holder holds about
                          (2 + N/3) x each owner's optimizer state with the raw
                          codec (full mode: 2x). Under --redundancy ec nothing
                          folds (base refreshes take the place of folds)
  --base-every B          diff: a fresh base every B steps, sent in paced chunks
                          (1 to 2^31, default 100); under --redundancy ec only
                          the bases are coded and each log holder keeps up to
                          about B steps per rank (warned above 4 x --diff-fold)
  --diff-codec raw|int8[:B]|topk:K
                          diff: how gradients are encoded; raw (default) is
                          lossless and restores bitwise, int8 (blocks of B
                          elements, default 256) and topk (the fraction K of the
                          largest entries, 0 < K <= 1) are lossy
  --max-restarts N        restart every rank in place up to N times after a rank
                          fails, resuming from the step every rank can recover
                          (default 0: a failure ends the job)
  --spares K              hold the last K hosts back as spares (as the hostfile's
                          spare keyword does): their agents start with the job and
                          a spare replaces a lost host, which the job survives
  --on-no-spare free-slots|abort
                          a host lost with no spare left: move its ranks to hosts
                          with free slots (default), or stop the job
  --recovery restart|in-place
                          after a host is replaced, restart every rank from the
                          recoverable step (default), or keep the survivors running
                          (programs using gorun's rank client only)
  --suspect-timeout S     a host suspected (control connection dropped, replication
                          to it failed, a peer lost there) is lost unless heard from
                          within S seconds (default 1)
  --hang-timeout S        a rank that reported progress and then none for S seconds
                          has hung (default 0: off)
  --events FILE           write the job's record (launch, samples, failures,
                          recoveries, exit) as JSON lines to FILE; gorun report
                          FILE makes a page of it
  --metrics ADDR          serve Prometheus metrics at http://ADDR/metrics (":9400":
                          loopback; port 0 picks one, shown by gorun status and -v)

Durable checkpoints (the whole job lost: gorun --resume):
  --ckpt-dir DIR          every --ckpt-every steps each rank's protected state is
                          written to DIR (a shared file system, or the same path
                          on a local disk of each host), several saves in flight,
                          and committed once every rank's is on disk; DIR must
                          exist, be writable, and hold no other job's checkpoints
  --ckpt-every B          a base every B steps (1 to 2^31, default 100)
  --ckpt-concurrency N    saves in flight per rank (1 to 8; default: automatic,
                          PCcheck's formula from the measured write and step
                          times, at most 4)
  --ckpt-overhead Q       the fraction of the step time the automatic concurrency
                          lets the saves cost (0 < Q < 1, default 0.03)
  --diff-batch N          --protect-mode diff: differentials reach DIR in batches
                          of N steps (1 to 4096, default 5)
  --resume                resume the job DIR holds from its last committed version

MPI programs:
  --pmi[=false]           serve the PMI-1 protocol to every rank (PMI_FD, as Hydra
                          does), so that MPICH-built programs start under gorun
                          as under mpiexec (default true)
  --mpi auto|openmpi|mpich
                          the MPI the program is built with (default auto: the
                          libmpi it links); Open MPI 4 ranks also get its flux
                          bootstrap over gorun's PMI-1 client library

Environment:
  -x VAR                  export VAR from gorun's environment to every rank
  -x VAR=value            set VAR for every rank
  --wdir DIR              working directory of the ranks (default: the current one)

Input and output:
  --stdin RANK|none       which rank reads gorun's standard input (default 0;
                          the others read /dev/null)
  --tag-output[=false]    prefix every line with [rank] (default true)
  --timestamp-output      prefix every line with the time
  --output-filename DIR   write DIR/rank.N/stdout and stderr instead of the terminal

Control:
  --timeout SECONDS       stop the job after this long (exit code 124)
  --kill-grace SECONDS    time between SIGTERM and SIGKILL when stopping (default 10)
  --rsh CMD               how agents start on remote hosts (default "ssh";
                          e.g. "ip netns exec"); the local host needs none
  --launch-agent PATH     gorun binary on remote hosts (default: this one's path)
  --rsh-concurrent N      agents being started at once (default 128)
  --bind ADDR             control-plane address (default: 127.0.0.1 when every
                          host is this one, else the address routing to the hosts)
  --launcher auto|ssh|slurm|local
                          how agents start on the other hosts (default auto:
                          srun inside a Slurm allocation given no hosts, else --rsh)
  --agent-start-timeout S an agent must register this soon after it is started
                          (default 60)
  --heartbeat-interval S  agent heartbeat interval (default 1)
  --heartbeat-timeout S   a host is lost after this long without one (default 10)
  -v, --verbose           say what gorun does
  --version               print the version
  -h, --help              this text

Signals: SIGINT, SIGTERM and SIGHUP stop every rank (the same signal, then
SIGKILL after the grace period; a second one kills at once); SIGUSR1 and
SIGUSR2 are forwarded to every rank. Every rank gets RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, OMPI_COMM_WORLD_* and GORUN_* variables.

gorun ckpt ls|show|verify DIR inspects a checkpoint directory.
gorun report EVENTS [-o FILE] makes an HTML page of an --events file.
gorun plan [flags] says what failures will cost a job before it runs (gorun plan -h).
gorun status [JOB] [--json] [--watch] shows a running job (gorun status -h).
gorun clean [-n] removes what your ended jobs left on this host (gorun clean -h).
`

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// seconds is a duration flag given in (fractional) seconds, or as a Go
// duration such as 1m30s.
type seconds struct{ d *time.Duration }

func (s seconds) String() string {
	if s.d == nil {
		return "0"
	}
	return strconv.FormatFloat(s.d.Seconds(), 'g', -1, 64)
}

func (s seconds) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || f > 1e9 {
			return fmt.Errorf("%s seconds is out of range", v)
		}
		*s.d = time.Duration(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return fmt.Errorf("%q is not a number of seconds", v)
	}
	*s.d = d
	return nil
}

// parseRun parses the flags of a job. Go's flag package accepts -flag and
// --flag alike, which covers mpirun's mix of both.
func parseRun(args []string, stderr io.Writer) (*runOptions, error) {
	o := &runOptions{tagOutput: true, mapBy: "slot"}
	fs := flag.NewFlagSet("gorun", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&o.np, "np", 0, "")
	fs.IntVar(&o.np, "n", 0, "")
	for _, n := range []string{"hostfile", "f", "machinefile"} {
		fs.StringVar(&o.hostfile, n, "", "")
	}
	fs.StringVar(&o.hostList, "H", "", "")
	fs.StringVar(&o.hostList, "host", "", "")
	fs.StringVar(&o.mapBy, "map-by", "slot", "")
	fs.Var((*stringList)(&o.exports), "x", "")
	fs.BoolVar(&o.oversubscribe, "oversubscribe", false, "")
	fs.IntVar(&o.tp, "tp", 1, "")
	fs.IntVar(&o.pp, "pp", 1, "")
	fs.IntVar(&o.gpusPerRank, "gpus-per-rank", 0, "")
	fs.IntVar(&o.replicas, "replicas", 1, "")
	redundancy := fs.String("redundancy", "", "")
	protectMode := fs.String("protect-mode", string(protect.ModeFull), "")
	fs.IntVar(&o.diff.Fold, "diff-fold", defaultDiffFold, "")
	fs.IntVar(&o.diff.BaseEvery, "base-every", defaultBaseEvery, "")
	fs.StringVar(&o.diff.Codec, "diff-codec", defaultDiffCodec, "")
	o.durableFlags(fs)
	fs.IntVar(&o.maxRestarts, "max-restarts", 0, "")
	fs.IntVar(&o.spares, "spares", 0, "")
	fs.StringVar(&o.onNoSpare, "on-no-spare", "free-slots", "")
	fs.StringVar(&o.recovery, "recovery", "restart", "")
	o.suspect = time.Second
	fs.Var(seconds{&o.suspect}, "suspect-timeout", "")
	fs.Var(seconds{&o.hang}, "hang-timeout", "")
	fs.StringVar(&o.events, "events", "", "")
	fs.StringVar(&o.metrics, "metrics", "", "")
	fs.BoolVar(&o.pmi, "pmi", true, "")
	fs.StringVar(&o.mpi, "mpi", "auto", "")
	fs.StringVar(&o.launcher, "launcher", "auto", "")
	fs.BoolVar(&o.tagOutput, "tag-output", true, "")
	fs.BoolVar(&o.timestamp, "timestamp-output", false, "")
	fs.StringVar(&o.outputDir, "output-filename", "", "")
	fs.Var(seconds{&o.timeout}, "timeout", "")
	o.killGrace = 10 * time.Second
	fs.Var(seconds{&o.killGrace}, "kill-grace", "")
	fs.StringVar(&o.rsh, "rsh", "ssh", "")
	fs.StringVar(&o.launchAgent, "launch-agent", "", "")
	fs.StringVar(&o.bind, "bind", "", "")
	fs.StringVar(&o.wdir, "wdir", "", "")
	o.hbInterval = time.Second
	fs.Var(seconds{&o.hbInterval}, "heartbeat-interval", "")
	fs.Var(seconds{&o.hbTimeout}, "heartbeat-timeout", "")
	fs.Var(seconds{&o.startTimeout}, "agent-start-timeout", "")
	fs.IntVar(&o.rshConcurrent, "rsh-concurrent", 128, "")
	fs.StringVar(&o.stdin, "stdin", "0", "")
	fs.BoolVar(&o.verbose, "v", false, "")
	fs.BoolVar(&o.verbose, "verbose", false, "")
	help := fs.Bool("h", false, "")
	fs.BoolVar(help, "help", false, "")
	version := fs.Bool("version", false, "")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		return nil, usagef("%v", err)
	}
	if *help {
		return nil, errHelp
	}
	if *version {
		return nil, errVersion
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if (set["np"] || set["n"]) && o.np < 1 {
		return nil, usagef("-np must be at least 1, not %d", o.np)
	}
	if o.gpusPerRank < 0 {
		return nil, usagef("--gpus-per-rank must be 0 or more, not %d", o.gpusPerRank)
	}
	if o.replicas < 0 || o.replicas > 8 {
		return nil, usagef("--replicas must be 0 to 8, not %d", o.replicas)
	}
	o.replicasSet = set["replicas"]
	if err := o.parseRedundancy(*redundancy, set); err != nil {
		return nil, err
	}
	if err := o.parseProtect(*protectMode, set); err != nil {
		return nil, err
	}
	if err := o.parseDurable(set); err != nil {
		return nil, err
	}
	if o.maxRestarts < 0 {
		return nil, usagef("--max-restarts must be 0 or more, not %d", o.maxRestarts)
	}
	if o.spares < 0 {
		return nil, usagef("--spares must be 0 or more, not %d", o.spares)
	}
	if o.onNoSpare != "free-slots" && o.onNoSpare != "abort" {
		return nil, usagef("--on-no-spare %s: want free-slots or abort", o.onNoSpare)
	}
	if o.recovery != "restart" && o.recovery != "in-place" {
		return nil, usagef("--recovery %s: want restart or in-place", o.recovery)
	}
	switch o.mpi {
	case "auto", "openmpi", "mpich":
	default:
		return nil, usagef("--mpi %s: want auto, openmpi or mpich", o.mpi)
	}
	switch o.launcher {
	case "auto", "ssh", "slurm", "local":
	default:
		return nil, usagef("--launcher %s: want auto, ssh, slurm or local", o.launcher)
	}
	if o.suspect <= 0 {
		return nil, usagef("--suspect-timeout must be positive")
	}
	if set["events"] && strings.TrimSpace(o.events) == "" {
		return nil, usagef("--events is empty")
	}
	if set["metrics"] {
		if _, port, err := net.SplitHostPort(o.metrics); err != nil || !validPort(port) {
			return nil, usagef("--metrics %q: want HOST:PORT or :PORT", o.metrics)
		}
	}
	if o.tp < 1 || o.pp < 1 {
		return nil, usagef("--tp and --pp must be at least 1, not %d and %d", o.tp, o.pp)
	}
	if o.hostfile != "" && o.hostList != "" {
		return nil, usagef("give hosts with --hostfile or -H, not both")
	}
	if o.rshConcurrent < 1 {
		return nil, usagef("--rsh-concurrent must be at least 1")
	}
	if o.hbInterval <= 0 {
		return nil, usagef("--heartbeat-interval must be positive")
	}
	if set["timeout"] && o.timeout <= 0 {
		return nil, usagef("--timeout must be positive")
	}
	if fs.NArg() == 0 {
		return nil, usagef("no program to run: gorun [flags] [--] PROG [ARGS...]")
	}
	o.prog, o.args = fs.Arg(0), fs.Args()[1:]
	if strings.TrimSpace(o.rsh) == "" {
		return nil, usagef("--rsh is empty")
	}
	return o, nil
}

// parseRedundancy checks --redundancy (set names the flags given) and
// keeps it in o: replicas:K as --replicas K would, ec:K+M in place of the
// default replica. It and --replicas together are an error, even when
// they agree.
func (o *runOptions) parseRedundancy(v string, set map[string]bool) error {
	if !set["redundancy"] {
		return nil
	}
	if set["replicas"] {
		return usagef("--redundancy %s and --replicas %d: give one of them (--replicas K is --redundancy replicas:K)", v, o.replicas)
	}
	r, err := topology.ParseRedundancy(v)
	if err != nil {
		return usagef("--redundancy %s", strings.TrimPrefix(err.Error(), topology.ErrRedundancy.Error()+": "))
	}
	o.replicas, o.replicasSet = r.Replicas, true
	o.ecK, o.ecM = r.ECK, r.ECM
	return nil
}

// The diff-mode flags' defaults.
const (
	defaultDiffFold  = 8
	defaultBaseEvery = 100
	defaultDiffCodec = "raw"
)

// parseProtect checks --protect-mode and the diff-mode flags (set names
// the flags given) and keeps them in o: the diff settings only in diff
// mode, where they are given to the launcher whole (defaults included).
func (o *runOptions) parseProtect(mode string, set map[string]bool) error {
	m, err := protect.ParseProtectMode(mode)
	if err != nil {
		return usagef("--protect-mode %s: want full or diff", mode)
	}
	o.protectMode = m
	if m != protect.ModeDiff {
		for _, f := range []string{"diff-fold", "base-every", "diff-codec"} {
			if set[f] {
				return usagef("--%s only applies with --protect-mode diff", f)
			}
		}
		o.diff = launcher.DiffOptions{}
		return nil
	}
	if o.replicas == 0 && o.ecK == 0 {
		return usagef("--protect-mode diff sends each step to the replica holders: it needs --replicas 1 or more, not 0")
	}
	if o.diff.Fold < 1 || o.diff.Fold > launcher.MaxDiffFold {
		return usagef("--diff-fold must be 1 to %d, not %d", launcher.MaxDiffFold, o.diff.Fold)
	}
	if o.diff.BaseEvery < 1 || int64(o.diff.BaseEvery) > launcher.MaxBaseEvery {
		return usagef("--base-every must be 1 to 2^31, not %d", o.diff.BaseEvery)
	}
	if _, err := protect.ParseDiffCodec(o.diff.Codec); err != nil {
		return usagef("--diff-codec: %v", err)
	}
	return nil
}

// config turns the options into a launcher configuration, reading the
// hostfile and checking what can be checked before anything starts.
func (o *runOptions) config(stdout, stderr io.Writer) (launcher.Config, error) {
	cfg := launcher.Config{
		NP: o.np, Oversubscribe: o.oversubscribe, TP: o.tp, PP: o.pp, GPUsPerRank: o.gpusPerRank,
		Replicas: o.replicas, ReplicasSet: o.replicasSet, ECK: o.ecK, ECM: o.ecM, ProtectMode: launcher.ProtectMode(o.protectMode), Diff: o.diff, Durable: o.durable, MaxRestarts: o.maxRestarts, NoPMI: !o.pmi,
		Prog: o.prog, Args: o.args, Metrics: o.metrics,
		TagOutput: o.tagOutput, TimestampOutput: o.timestamp, OutputDir: o.outputDir,
		Timeout: o.timeout, KillGrace: o.killGrace,
		Rsh: strings.Fields(o.rsh), AgentPath: o.launchAgent, Bind: o.bind,
		MPI: launcher.MPIKind(strings.TrimSuffix(o.mpi, "auto")), Launcher: launcher.LauncherKind(strings.TrimSuffix(o.launcher, "auto")),
		HeartbeatInterval: o.hbInterval, HeartbeatTimeout: o.hbTimeout,
		StartTimeout: o.startTimeout, MaxParallelStarts: o.rshConcurrent,
		Spares: o.spares, SuspectTimeout: o.suspect, HangTimeout: o.hang,
		Stdout: stdout, Stderr: stderr,
	}
	if o.onNoSpare == "abort" {
		cfg.OnNoSpare = hotswap.OnNoSpareAbort
	}
	if o.recovery == "in-place" {
		cfg.Recovery = hotswap.RecoveryInPlace
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = -1 // --kill-grace 0: SIGKILL at once
	}
	var err error
	if cfg.MapBy, err = topology.ParseMapBy(o.mapBy); err != nil {
		return cfg, usagef("--map-by: %v", err)
	}
	cfg.Launcher = o.launcherKind(os.Getenv)
	fromSlurm := cfg.Launcher == launcher.LauncherSlurm && o.hostfile == "" && o.hostList == ""
	switch {
	case fromSlurm:
		// The allocation's nodes; those the ranks do not need are spares.
		if cfg.Hosts, err = slurmHosts(os.Getenv, o.gpusPerRank); err == nil {
			cfg.Hosts, cfg.NP, err = slurmSpares(cfg.Hosts, cfg.NP, o.spares)
			cfg.Spares, o.spares = 0, 0
		}
	case o.hostfile != "":
		cfg.Hosts, err = topology.ReadHostfile(o.hostfile)
	case o.hostList != "":
		cfg.Hosts, err = topology.ParseHostList(o.hostList)
		if err != nil {
			err = usagef("-H: %v", err)
		}
	default:
		// This host: a slot per GPU, as torchrun --nproc-per-node gpu,
		// or per CPU on a host without GPUs.
		slots := runtime.NumCPU()
		if n := localGPUs(); n > 0 {
			slots = max(n/max(o.gpusPerRank, 1), 1)
		}
		cfg.Hosts = []topology.Host{{Name: "localhost", Slots: slots, Source: "default"}}
	}
	if _, ok := errors.AsType[*usageError](err); err != nil && !ok {
		err = usagef("%v", err)
	}
	if err != nil {
		return cfg, err
	}
	marked, err := launcher.MarkSpares(cfg.Hosts, o.spares)
	if err != nil {
		return cfg, usagef("%v", err)
	}
	if cfg.NP == 0 {
		// As many ranks as the hosts that run ranks have slots.
		for _, h := range marked {
			if !h.Spare {
				cfg.NP += h.Slots
			}
		}
	}
	switch o.stdin {
	case "none":
	default:
		r, err := strconv.Atoi(o.stdin)
		if err != nil || r < 0 {
			return cfg, usagef("--stdin %s: want a rank or none", o.stdin)
		}
		if r >= cfg.NP {
			return cfg, usagef("--stdin %d: the job has ranks 0 to %d", r, cfg.NP-1)
		}
		cfg.Stdin, cfg.StdinRank = os.Stdin, r
	}
	if cfg.Env, err = exports(o.exports, os.LookupEnv); err != nil {
		return cfg, err
	}
	if cfg.Dir = o.wdir; cfg.Dir != "" {
		if cfg.Dir, err = filepath.Abs(cfg.Dir); err != nil {
			return cfg, usagef("--wdir: %v", err)
		}
	}
	if o.outputDir != "" {
		if cfg.OutputDir, err = filepath.Abs(o.outputDir); err != nil {
			return cfg, usagef("--output-filename: %v", err)
		}
	}
	isLocal := launcher.LocalHostMatcher()
	for i, h := range cfg.Hosts {
		if !marked[i].Spare && isLocal(h.Name) {
			if cfg.Dir != "" {
				if st, err := os.Stat(cfg.Dir); err != nil {
					return cfg, usagef("--wdir %s: %v", o.wdir, errors.Unwrap(err))
				} else if !st.IsDir() {
					return cfg, usagef("--wdir %s is not a directory", o.wdir)
				}
			}
			if err := checkProgram(o.prog, cfg.Dir); err != nil {
				return cfg, err
			}
			break
		}
	}
	if cfg.Launcher == launcher.LauncherSlurm {
		dropSlurmTaskEnv() // gorun's step task (sbatch's) is not its ranks': the local agent's inherit this environment
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return cfg, nil
}

// exports resolves -x arguments into KEY=VALUE pairs.
func exports(xs []string, lookup func(string) (string, bool)) ([]string, error) {
	var env []string
	for _, x := range xs {
		name, value, hasValue := strings.Cut(x, "=")
		if !validEnvName(name) {
			return nil, usagef("-x %s: %q is not a valid variable name", x, name)
		}
		if !hasValue {
			v, ok := lookup(name)
			if !ok {
				return nil, usagef("-x %s: %s is not set in gorun's environment", x, name)
			}
			value = v
		}
		env = append(env, name+"="+value)
	}
	return env, nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkProgram fails early, with exit code 2, when the program cannot be
// found here. (A program missing on a remote host is reported by its agent.)
func checkProgram(prog, dir string) error {
	if strings.ContainsRune(prog, '/') {
		p := prog
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		st, err := os.Stat(p)
		switch {
		case err != nil:
			return usagef("program %s: %v", prog, errors.Unwrap(err))
		case st.IsDir():
			return usagef("program %s is a directory", prog)
		case st.Mode()&0o111 == 0:
			return usagef("program %s is not executable", prog)
		}
		return nil
	}
	if _, err := exec.LookPath(prog); err != nil {
		return usagef("program %q not found in PATH", prog)
	}
	return nil
}

// localGPUs counts this host's GPUs (those of CUDA_VISIBLE_DEVICES, when
// set): 0 without a driver or on any error, which the agent reports. A
// driver that does not answer within 10 s counts as none (the call is left
// to finish on its own).
func localGPUs() int {
	count := make(chan int, 1)
	go func() {
		b, err := gpu.Open(context.Background(), gpu.Options{Host: "localhost"})
		if err != nil {
			count <- 0
			return
		}
		defer b.Close()
		devs, _ := gpu.Restrict(b.Devices(), os.Getenv("CUDA_VISIBLE_DEVICES"))
		count <- len(devs)
	}()
	select {
	case n := <-count:
		return n
	case <-time.After(10 * time.Second):
		return 0
	}
}

// validPort reports whether p is a port number (0: any free one).
func validPort(p string) bool {
	_, err := strconv.ParseUint(p, 10, 16)
	return err == nil
}
