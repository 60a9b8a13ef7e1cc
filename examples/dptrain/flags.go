package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// errUsage marks errors in the command line or in how the job was launched
// (a world size that does not divide the batch); they exit with code 2.
var errUsage = errors.New("usage")

// usageError wraps errUsage with a message.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// maxParams bounds --params (2^34 parameters: 64 GiB of parameters per rank),
// so that a typo is an error rather than an out-of-memory crash.
const maxParams = 1 << 34

// defaultRebuildTimeout is --rebuild-timeout's default: enough for gorun
// to notice a lost host, start the replacement's ranks on a spare and
// have them restore their state.
const defaultRebuildTimeout = 2 * time.Minute

// maxCompute bounds --compute.
const maxCompute = 4096

// Config is what the command line sets.
type Config struct {
	Params   int    // number of parameters
	Steps    int    // optimizer steps
	Seed     uint64 // seed of the data stream and the initial parameters
	Batch    int    // global batch (samples per step, over all ranks)
	Compute  int    // rank K of the targets: multiply-adds per parameter and sample
	LogEvery int    // print the loss every LogEvery steps (0: first and last only)

	// DeviceTime is emulated accelerator time per step, during which the
	// host CPU is deliberately idle.
	DeviceTime time.Duration

	Adam adamHyper

	FailAtStep int            // step at which FailRank crashes itself; -1: never
	FailRank   int            // the rank that crashes
	FailSignal syscall.Signal // 0: exit(1); otherwise the signal it sends itself

	// DeviceGrad: the gradients come from the emulated accelerator (a
	// cheap deterministic function per parameter) instead of the CPU
	// computation and its reduction, and the parameters are gathered
	// only at the end, so that the host CPU is idle but for the optimizer
	// step, as on a GPU node (for benchmarks of what the host does).
	DeviceGrad bool

	// FailWipeState: before crashing, the rank overwrites its protected
	// state on its host, so that a restart restores it from another host.
	FailWipeState bool

	// Protect has gorun protect the optimizer state every step (package
	// rank) and resume from it when the ranks are restarted, or in place
	// when gorun moves the job to a new epoch (gorun --recovery in-place).
	Protect bool

	// RebuildTimeout bounds how long a rank waits, after it lost a peer
	// or its epoch, for the new epoch's world to form (with Protect);
	// 0: it does not wait, any loss ends it.
	RebuildTimeout time.Duration

	// CkptDir and CkptEvery: the checkpoint-restart baseline. Every
	// CkptEvery steps each rank writes its optimizer shard to
	// CkptDir/rank-<r>.ckpt, and resumes from it at start (ckpt.go).
	CkptDir   string
	CkptEvery int
}

// jobFlags are the flags that define the job, which every rank must share:
// all but those of fault injection (a rank gorun started to replace a lost
// one, or one that recovered, no longer crashes on purpose) and the local
// waiting bound.
func (c Config) jobFlags() string {
	c.FailAtStep, c.FailRank, c.FailSignal, c.FailWipeState = -1, 0, 0, false
	c.RebuildTimeout = 0
	return fmt.Sprintf("%+v", c)
}

const usageHead = `Usage: dptrain [flags]

A deterministic data-parallel trainer with a distributed (ZeRO-1) Adam
optimizer, run under gorun:

  gorun -np 4 -- dptrain --params 1M --steps 200 --seed 1

The same seed gives the same final hashes for every world size that divides
--batch. Counts take a suffix: K, M, G are powers of 1000 (1M = 1000000),
Ki, Mi, Gi powers of 1024 (1Mi = 1048576).

Flags:
`

// parseFlags parses the command line. It returns flag.ErrHelp after printing
// the usage for -h, and an error wrapping errUsage for a bad command line.
func parseFlags(args []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("dptrain", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	params := countFlag(1_000_000)
	batch := countFlag(64)
	steps := countFlag(200)
	fs.Var(&params, "params", "number of parameters (a `count`): 4 bytes each on every rank, plus 16 each (Adam m and v, master weight, gradient) spread over the ranks")
	fs.Var(&steps, "steps", "number of optimizer steps (a `count`)")
	seed := fs.Uint64("seed", 1, "`seed` of the data stream and initial parameters")
	fs.Var(&batch, "batch", "samples per step over all ranks (a `count`), split evenly (the world size must divide it)")
	compute := fs.Int("compute", 1, "CPU work: multiply-adds per parameter and sample (the rank of the synthetic targets; changes the model)")
	deviceMs := fs.Float64("device-ms", 0, "emulated accelerator time per step, in `ms`, during which the host CPU is idle (a sleep)")
	lr := fs.Float64("lr", 0.01, "Adam learning rate")
	beta1 := fs.Float64("beta1", 0.9, "Adam β1")
	beta2 := fs.Float64("beta2", 0.999, "Adam β2")
	eps := fs.Float64("eps", 1e-8, "Adam ε")
	wd := fs.Float64("weight-decay", 0, "decoupled weight decay (AdamW); 0 is plain Adam")
	logEvery := fs.Int("log-every", 10, "print the loss every `N` steps (0: first and last step only)")
	failAt := fs.Int("fail-at-step", -1, "crash at the start of this `step` (-1: never); only in the first run, not after gorun restarted the ranks")
	failRank := fs.Int("fail-rank", 0, "the `rank` that crashes with --fail-at-step")
	deviceGrad := fs.Bool("device-grad", false, "take the gradients from the emulated accelerator (a cheap deterministic function) instead of computing and reducing them on the CPU; parameters are gathered only at the end and no loss is printed")
	failWipe := fs.Bool("fail-wipe-state", false, "with --fail-at-step and --protect: before crashing, overwrite this rank's protected state on its host (both slots), so that gorun must restore it from a replica on another host")
	protect := fs.Bool("protect", false, "protect the optimizer state in memory every step with gorun's rank service, and resume from it after a restart")
	failSignal := fs.String("fail-signal", "", "crash by sending this `signal` to itself (KILL, ABRT, TERM, INT) instead of exiting with code 1")
	rebuild := fs.Duration("rebuild-timeout", defaultRebuildTimeout, "with --protect: after losing a peer or its epoch, how long a rank waits for gorun's new epoch (--recovery in-place) to rebuild its world in place, before it ends with the error (0: do not wait)")
	ckptDir := fs.String("ckpt-dir", "", "checkpoint-restart baseline: write each rank's optimizer shard to `dir`/rank-<r>.ckpt every --ckpt-every steps, and resume from it at start")
	ckptEvery := fs.Int("ckpt-every", 0, "with --ckpt-dir: checkpoint every `N` steps (after steps N-1, 2N-1, ...)")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usageHead)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return Config{}, err
		}
		return Config{}, usageError("%v (dptrain -h lists the flags)", err)
	}
	if fs.NArg() > 0 {
		return Config{}, usageError("unexpected argument %q", fs.Arg(0))
	}
	c := Config{
		Params:         int(params),
		Steps:          int(steps),
		Seed:           *seed,
		Batch:          int(batch),
		Compute:        *compute,
		LogEvery:       *logEvery,
		FailAtStep:     *failAt,
		FailRank:       *failRank,
		Protect:        *protect,
		DeviceGrad:     *deviceGrad,
		FailWipeState:  *failWipe,
		RebuildTimeout: *rebuild,
		CkptDir:        *ckptDir,
		CkptEvery:      *ckptEvery,
	}
	switch {
	case c.Params < 1 || c.Params > maxParams:
		return c, usageError("--params %d: want 1 to %d", c.Params, maxParams)
	case c.Batch < 1 || c.Batch > maxBatch:
		return c, usageError("--batch %d: want 1 to %d", c.Batch, maxBatch)
	case c.Compute < 1 || c.Compute > maxCompute:
		return c, usageError("--compute %d: want 1 to %d", c.Compute, maxCompute)
	case c.LogEvery < 0:
		return c, usageError("--log-every %d: want 0 or more", c.LogEvery)
	case !(*deviceMs >= 0 && *deviceMs <= 3.6e6):
		return c, usageError("--device-ms %v: want 0 to 3600000", *deviceMs)
	case c.FailAtStep < -1 || c.FailAtStep >= c.Steps && c.FailAtStep != -1:
		return c, usageError("--fail-at-step %d: want a step in [0, %d) or -1", c.FailAtStep, c.Steps)
	case c.FailWipeState && (!c.Protect || c.FailAtStep < 0):
		return c, usageError("--fail-wipe-state needs --protect and --fail-at-step")
	case c.FailRank < 0:
		return c, usageError("--fail-rank %d: want 0 or more", c.FailRank)
	case c.RebuildTimeout < 0:
		return c, usageError("--rebuild-timeout %v: want 0 or more", c.RebuildTimeout)
	case c.CkptEvery < 0:
		return c, usageError("--ckpt-every %d: want 0 or more", c.CkptEvery)
	case (c.CkptDir == "") != (c.CkptEvery == 0):
		return c, usageError("--ckpt-dir and --ckpt-every go together")
	case c.CkptDir != "" && c.Protect:
		return c, usageError("--ckpt-dir is the checkpoint-restart baseline; --protect replaces it: use one of them")
	}
	c.DeviceTime = time.Duration(*deviceMs * float64(time.Millisecond))
	if *failSignal != "" {
		sig, ok := signals[strings.TrimPrefix(strings.ToUpper(*failSignal), "SIG")]
		if !ok {
			return c, usageError("--fail-signal %q: want one of KILL, ABRT, TERM, INT", *failSignal)
		}
		c.FailSignal = sig
	}
	var err error
	if c.Adam, err = parseAdam(*lr, *beta1, *beta2, *eps, *wd); err != nil {
		return c, err
	}
	return c, nil
}

// signals are the signals --fail-signal accepts.
var signals = map[string]syscall.Signal{
	"KILL": syscall.SIGKILL,
	"ABRT": syscall.SIGABRT,
	"TERM": syscall.SIGTERM,
	"INT":  syscall.SIGINT,
}

// parseAdam checks the hyper-parameters and rounds them to float32.
func parseAdam(lr, beta1, beta2, eps, wd float64) (adamHyper, error) {
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) && math.Abs(x) <= math.MaxFloat32 }
	switch {
	case !finite(lr) || lr <= 0:
		return adamHyper{}, usageError("--lr %v: want a positive number", lr)
	case !finite(beta1) || beta1 < 0 || beta1 >= 1:
		return adamHyper{}, usageError("--beta1 %v: want 0 ≤ β1 < 1", beta1)
	case !finite(beta2) || beta2 < 0 || beta2 >= 1:
		return adamHyper{}, usageError("--beta2 %v: want 0 ≤ β2 < 1", beta2)
	case !finite(eps) || eps <= 0:
		return adamHyper{}, usageError("--eps %v: want a positive number", eps)
	case !finite(wd) || wd < 0 || lr*wd >= 1:
		return adamHyper{}, usageError("--weight-decay %v: want 0 ≤ λ and lr·λ < 1", wd)
	}
	h := adamHyper{lr: float32(lr), beta1: float32(beta1), beta2: float32(beta2), eps: float32(eps), weightDecay: float32(wd)}
	if h.beta1 >= 1 || h.beta2 >= 1 || h.lr == 0 || h.eps == 0 {
		return adamHyper{}, usageError("Adam hyper-parameters out of float32 range (β rounds to 1, or lr or ε to 0)")
	}
	return h, nil
}

// countFlag is a non-negative count with an optional suffix: K, M, G (powers
// of 1000) or Ki, Mi, Gi (powers of 1024).
type countFlag int64

func (c *countFlag) String() string { return strconv.FormatInt(int64(*c), 10) }

func (c *countFlag) Set(s string) error {
	n, err := parseCount(s)
	if err != nil {
		return err
	}
	*c = countFlag(n)
	return nil
}

// parseCount parses a count such as 1000, 1M, 2.5K, 1Mi or 4Gi.
func parseCount(s string) (int64, error) {
	num, mult := s, int64(1)
	for _, suf := range []struct {
		s string
		m int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}} {
		if strings.HasSuffix(s, suf.s) {
			num, mult = strings.TrimSuffix(s, suf.s), suf.m
			break
		}
	}
	if n, err := strconv.ParseInt(num, 10, 64); err == nil {
		if n < 0 || n > math.MaxInt64/mult {
			return 0, fmt.Errorf("count %q out of range", s)
		}
		return n * mult, nil
	}
	// A fraction with a suffix (1.5M) must give a whole number.
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 1 || math.IsNaN(f) || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("bad count %q: want a whole number with an optional K, M, G, Ki, Mi or Gi suffix", s)
	}
	n := f * float64(mult)
	if n != math.Trunc(n) {
		return 0, fmt.Errorf("count %q is not a whole number", s)
	}
	return int64(n), nil
}
