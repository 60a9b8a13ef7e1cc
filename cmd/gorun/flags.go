package main

import (
	"context"
	"errors"
	"flag"
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

// parseRun parses the flags of a job. Go's flag package accepts -flag and
// --flag alike, which covers mpirun's mix of both.
func parseRun(args []string, stderr io.Writer) (*runOptions, error) {
	o := &runOptions{tagOutput: true, mapBy: "slot"}
	fs := flag.NewFlagSet("gorun", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var a runFlagArgs
	defineFlags(fs, runFlags(o, &a))

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		return nil, usagef("%v", err)
	}
	if a.help {
		return nil, errHelp
	}
	if a.version {
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
	if err := o.parseRedundancy(a.redundancy, set); err != nil {
		return nil, err
	}
	if err := o.parseProtect(a.protectMode, set); err != nil {
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

// The defaults of the duration flags that have one.
const (
	defaultSuspect   = time.Second
	defaultKillGrace = 10 * time.Second
	defaultHeartbeat = time.Second
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
