// Command benchprotect measures what gorun's state protection costs a
// training step: dptrain on 4 ranks over two namespace hosts, with 256 MiB
// of optimizer state per rank, once without protection and once with
// dptrain --protect (replicas 1) in each gorun --protect-mode (-modes: full,
// every step's state whole to the holder; diff, the step's gradient and a
// base every -base-every steps), at emulated device time (--device-ms 500
// with --device-grad: the gradients come from the emulated accelerator, so
// the host CPU only runs the optimizer step, as on a GPU node) and again
// with real CPU arithmetic (the gradients computed and all-reduced on the
// CPU) in its place. Run as root from the repository root after make
// build (make bench-protect does both):
//
//	go run ./internal/benchprotect -gorun ./bin/gorun -dptrain ./bin/dptrain
//
// Every figure is printed beside a baseline measured in the same run: the
// step time with protection against the step time without it, and the
// replication's throughput against single-stream TCP between the same two
// namespaces (and over 127.0.0.1). Step times are the intervals between
// rank 0's "step N" lines (--log-every 1) as they arrive, after
// -warmup untimed steps. The protection's parts per step (staging copy into
// the shared-memory slot, commit with its CRC32C, the trainer's wait, the
// wait at the overwrite rule, replication) come from dptrain's and gorun
// -v's own counters. Bytes on the wire per step are every host's bytes
// sent onto the bridge (its veth's counter), between the arrivals of the
// first and last timed step lines: replication, bases and control plane
// alike.
//
// The hosts are network namespaces on a bridge (internal/testcluster);
// they, and every process in them, are removed at the end, also after an
// error or an interrupt. gorun -v's log of each run goes to a temporary
// directory, kept (and named) only when something failed.
//
// With -redundancy (make bench-ec: 4 hosts of one rank, full mode,
// replicas:1,ec:2+2) each protect mode runs once per gorun --redundancy
// value, the first the baseline: an erasure code's protection time per
// step is compared with the baseline's, and its per-rank throughput with
// ckpt.Codec's own over the same bytes (one stripe of K shards of one
// rank's state, encoded as the agents do, on one core and on all),
// measured in the same run before the gorun runs.
//
// It is a benchmark: a missed target is printed, not fatal. The exit
// status is 1 if a run fails or the set-up does, 2 for bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/topology"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type config struct {
	gorun, dptrain string
	ranks, hosts   int
	stateMiB       int
	batch          int
	deviceMs       int
	cpuCompute     int
	warmup, steps  int
	cpuSteps       int
	tcpBytes       int64
	tcpReps        int
	timeout        time.Duration
	stall          time.Duration
	keepLogs       bool
	stepTimes      bool     // print every timed step's time, per run
	modes          []string // protect modes run beside no protection
	// redundancies are the gorun --redundancy values each protect mode
	// runs with; the first is the others' baseline.
	redundancies []topology.Redundancy
	codecReps    int // rounds of each codec measurement (erasure codes only)
	baseEvery    int // gorun --base-every of the diff runs
	// The durable tier's overhead (persist.go): with ckpt set, full mode
	// without --ckpt-dir, then with it at each --ckpt-concurrency of ckpt
	// ("auto": the flag not given), a base every ckptEvery steps, in a
	// fresh directory under ckptDir each.
	ckpt       []string
	ckptEvery  int
	ckptDir    string
	ckptRounds int

	// Helper modes: one end of a TCP stream inside a namespace (tcp.go).
	tcpSink, tcpSource string
}

// parseFlags parses args, reporting any error on stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("benchprotect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.gorun, "gorun", "./bin/gorun", "gorun binary")
	fs.StringVar(&cfg.dptrain, "dptrain", "./bin/dptrain", "dptrain binary")
	fs.IntVar(&cfg.ranks, "ranks", 4, "ranks, spread evenly over the hosts")
	fs.IntVar(&cfg.hosts, "hosts", 2, "namespace hosts")
	fs.IntVar(&cfg.stateMiB, "state-mib", 256, "optimizer state per rank in MiB (12 bytes per parameter of its shard)")
	fs.IntVar(&cfg.batch, "batch", 0, "dptrain --batch (0: one sample per rank, the least CPU work)")
	fs.IntVar(&cfg.deviceMs, "device-ms", 500, "dptrain --device-ms of the device-time runs")
	fs.IntVar(&cfg.cpuCompute, "cpu-compute", 2, "dptrain --compute of the CPU-arithmetic runs (--device-ms 0); 0 skips them (2 adds about 250 ms of CPU per rank and step at 256 MiB: with 4 ranks on 2 CPUs, roughly the 500 ms of device time)")
	fs.IntVar(&cfg.warmup, "warmup", 2, "untimed steps at the start of each run")
	fs.IntVar(&cfg.steps, "steps", 150, "timed steps of each device-time run (its steady state is the last half: the protection's start-up, its first bases and first base refresh, falls in the first)")
	fs.IntVar(&cfg.cpuSteps, "cpu-steps", 10, "timed steps of each CPU-arithmetic run (which measures bytes on the wire, not the steady state)")
	fs.Int64Var(&cfg.tcpBytes, "tcp-bytes", 1<<30, "bytes per TCP throughput measurement")
	fs.IntVar(&cfg.tcpReps, "tcp-reps", 3, "TCP throughput measurements per path (the median is printed)")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Minute, "limit of each gorun run")
	fs.DurationVar(&cfg.stall, "stall", 3*time.Minute, "stop a run when rank 0 prints nothing for this long")
	fs.BoolVar(&cfg.keepLogs, "keep-logs", false, "keep gorun -v's logs even when every run succeeded")
	fs.BoolVar(&cfg.stepTimes, "step-times", false, "print every timed step's time (ms) of each run, to see where a mean differs from the median")
	modes := fs.String("modes", "full,diff", "gorun --protect-mode values to run, comma-separated, each beside the run without protection")
	redundancy := fs.String("redundancy", "replicas:1", "gorun --redundancy values each protect mode runs with, comma-separated (e.g. replicas:1,ec:2+2); the first is the baseline of the others, and with an erasure code the codec's throughput over the same bytes is measured too")
	fs.IntVar(&cfg.codecReps, "codec-reps", 3, "rounds of each codec throughput measurement (the best counts)")
	fs.IntVar(&cfg.baseEvery, "base-every", 50, "gorun --base-every of the diff runs; they time max(-steps, twice this) steps, so that their bytes on the wire count bases at their rate and their steady state (the last half) includes a base refresh")
	ckpt := fs.String("ckpt", "", "measure the durable tier instead: full mode without --ckpt-dir, then with it at each of these --ckpt-concurrency values, comma-separated (auto: the automatic default), e.g. auto,1,2,4")
	fs.IntVar(&cfg.ckptEvery, "ckpt-every", 10, "gorun --ckpt-every of the -ckpt runs")
	fs.IntVar(&cfg.ckptRounds, "ckpt-rounds", 2, "rounds of the -ckpt runs (each the run without --ckpt-dir, then one per concurrency)")
	fs.StringVar(&cfg.ckptDir, "ckpt-dir", "", "where the -ckpt runs' checkpoint directories go, one per run, removed after it (default: the temporary directory)")
	fs.StringVar(&cfg.tcpSink, "tcp-sink", "", "(internal) receive one TCP stream on this address")
	fs.StringVar(&cfg.tcpSource, "tcp-source", "", "(internal) send -tcp-bytes to this address")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.batch == 0 {
		cfg.batch = cfg.ranks
	}
	var err error
	for m := range strings.SplitSeq(*modes, ",") {
		if m != "full" && m != "diff" || slices.Contains(cfg.modes, m) {
			err = fmt.Errorf("benchprotect: -modes %q: want full and/or diff, comma-separated", *modes)
		}
		cfg.modes = append(cfg.modes, m)
	}
	if err == nil {
		cfg.redundancies, err = parseRedundancies(*redundancy)
	}
	if err == nil && *ckpt != "" {
		cfg.ckpt, err = parseCkpt(*ckpt)
	}
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("benchprotect: unexpected argument %q", fs.Arg(0))
	case cfg.hosts < 2 || cfg.ranks < cfg.hosts || cfg.ranks%cfg.hosts != 0:
		err = errors.New("benchprotect: want 2 or more hosts and a multiple of them as -ranks")
	case cfg.stateMiB < 1, cfg.batch < 1, cfg.deviceMs < 0, cfg.cpuCompute < 0:
		err = errors.New("benchprotect: -state-mib and -batch must be positive, -device-ms and -cpu-compute not negative")
	case cfg.warmup < 1 || cfg.steps < 1 || cfg.cpuSteps < 1:
		err = errors.New("benchprotect: -warmup, -steps and -cpu-steps must be at least 1")
	case cfg.tcpBytes < 1 || cfg.tcpReps < 1 || cfg.timeout <= 0 || cfg.stall <= 0:
		err = errors.New("benchprotect: -tcp-bytes, -tcp-reps, -timeout and -stall must be positive")
	case cfg.baseEvery < 1:
		err = errors.New("benchprotect: -base-every must be at least 1")
	case cfg.ckptEvery < 1 || cfg.ckptRounds < 1:
		err = errors.New("benchprotect: -ckpt-every and -ckpt-rounds must be at least 1")
	case cfg.codecReps < 1:
		err = errors.New("benchprotect: -codec-reps must be at least 1")
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
	}
	return cfg, err
}

// stateBytes is one rank's protected state (dptrain's optimizer shard).
func (cfg *config) stateBytes() int64 {
	return 12 * (cfg.params() / int64(cfg.ranks))
}

// params is dptrain's --params: stateMiB of optimizer state (m, v and the
// master weights, 12 bytes per parameter) on each rank's shard.
func (cfg *config) params() int64 {
	return int64(cfg.ranks) * (int64(cfg.stateMiB) << 20 / 12)
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2 // already reported
	}
	switch {
	case cfg.tcpSink != "":
		err = sinkMain(cfg.tcpSink, stdout)
	case cfg.tcpSource != "":
		err = sourceMain(cfg.tcpSource, cfg.tcpBytes, stdout)
	default:
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
		defer stop()
		b := &bench{cfg: cfg, out: stdout, log: stderr}
		err = b.benchmark(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "benchprotect: %v\n", err)
		return 1
	}
	return 0
}

// variant is one kind of step (device time, or CPU arithmetic), run
// without protection and with each protect mode.
type variant struct {
	name     string
	deviceMs int
	compute  int
	base     *runResult
	prot     []*modeRun // in cfg.modes' order
}

// modeRun is a variant's run with one protect mode and redundancy.
type modeRun struct {
	mode string
	red  topology.Redundancy
	r    *runResult
}

// timedSteps is how many steps a run of mode times: for diff two base
// periods, so that its bytes on the wire count bases at their rate and
// its steady state (the last half) holds a base refresh after the first
// (sent from the buffers the first one left).
func (cfg *config) timedSteps(v *variant, mode string) int {
	n := cfg.steps
	if v.deviceMs == 0 && len(cfg.ckpt) == 0 {
		// (The durable tier's runs time -steps in both variants: their
		// figures come from the steps after each base.)
		n = cfg.cpuSteps
	}
	if mode == "diff" {
		return max(n, 2*cfg.baseEvery)
	}
	return n
}

// bench holds one benchmark session.
type bench struct {
	cfg      config
	out, log io.Writer
	hosts    *cluster
	hostfile string
	logDir   string
	failed   bool // keep the logs
}

func (b *bench) benchmark(ctx context.Context) (err error) {
	cfg := &b.cfg
	for _, p := range []*string{&cfg.gorun, &cfg.dptrain} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%w (run make build first)", err)
		}
		*p = abs
	}
	if b.logDir, err = os.MkdirTemp("", "benchprotect-"); err != nil {
		return err
	}
	defer func() {
		if b.failed || err != nil || cfg.keepLogs {
			fmt.Fprintf(b.log, "benchprotect: gorun -v logs kept in %s\n", b.logDir)
		} else {
			os.RemoveAll(b.logDir)
		}
	}()
	start := time.Now()
	p := cfg.params()
	fmt.Fprintf(b.out, "benchprotect: dptrain on %d ranks, %d namespace hosts (%d ranks each), --params %d: %.1f MiB of optimizer state per rank, --batch %d, %d untimed + %d timed steps per device-time run (%d with CPU arithmetic); %d CPUs\n",
		cfg.ranks, cfg.hosts, cfg.ranks/cfg.hosts, p, float64(12*(p/int64(cfg.ranks)))/(1<<20), cfg.batch, cfg.warmup, cfg.steps, cfg.cpuSteps, runtime.NumCPU())

	b.hosts, err = newHosts(cfg.hosts, b.log)
	defer func() {
		if cerr := b.hosts.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("removing the namespace hosts: %w", cerr))
		}
	}()
	if err != nil {
		return err
	}
	if b.hostfile, err = b.hosts.writeHostfile(b.logDir, cfg.ranks/cfg.hosts); err != nil {
		return err
	}
	if len(cfg.ckpt) > 0 {
		if err := b.persist(ctx); err != nil {
			return err
		}
		fmt.Fprintf(b.out, "benchprotect: %.0f s in all\n", time.Since(start).Seconds())
		return nil
	}

	lo, ho, err := b.tcpRates(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(b.out, "TCP, one stream of %.0f MiB, median of %d: 127.0.0.1 %.0f MB/s; host 0 -> host 1 over the bridge %.0f MB/s\n",
		float64(cfg.tcpBytes)/(1<<20), cfg.tcpReps, lo, ho)
	var rates []codecRate
	for _, r := range cfg.redundancies {
		if !r.EC() {
			continue
		}
		rate, err := measureCodec(r.ECK, r.ECM, cfg.stateBytes(), cfg.codecReps)
		if err != nil {
			return err
		}
		rates = append(rates, rate)
		debug.FreeOSMemory() // the stripe's buffers: the runs need the memory
		fmt.Fprintf(b.out, "codec %s, one stripe of %d shards of %s, best of %d: ckpt.Codec's shares (Share of each, 4 MiB at a time, XORed into %d\n"+
			"  parity rows) %.0f MB/s on one core, %.0f MB/s on %d; reedsolomon Encode of the stripe (raw) %.0f MB/s on one core\n",
			r, r.ECK, mib(float64(cfg.stateBytes())), cfg.codecReps, r.ECM, rate.oneCore, rate.all, runtime.GOMAXPROCS(0), rate.raw)
	}

	vs := []*variant{{name: fmt.Sprintf("device-ms %d", cfg.deviceMs), deviceMs: cfg.deviceMs, compute: 1}}
	if cfg.cpuCompute > 0 {
		vs = append(vs, &variant{name: fmt.Sprintf("CPU, compute %d", cfg.cpuCompute), compute: cfg.cpuCompute})
	}
	for _, v := range vs {
		if v.base, err = b.runOnce(ctx, v, "", topology.Redundancy{}, ""); err != nil {
			return err
		}
		for _, m := range cfg.modes {
			for _, red := range cfg.redundancies {
				r, err := b.runOnce(ctx, v, m, red, "")
				if err != nil {
					return err
				}
				v.prot = append(v.prot, &modeRun{mode: m, red: red, r: r})
			}
		}
	}
	b.report(vs, ho, lo)
	if len(rates) > 0 || len(cfg.redundancies) > 1 {
		for _, v := range vs {
			ecReport(b.out, v, cfg.redundancies[0], rates, float64(cfg.stateBytes()), cfg.ranks, ho)
		}
	}
	fmt.Fprintf(b.out, "benchprotect: %.0f s in all\n", time.Since(start).Seconds())
	return nil
}

// runResult is what one gorun run measured.
type runResult struct {
	steps  []time.Duration // timed steps
	wire   float64         // bytes on the wire per timed step (every host's, every kind)
	msStep float64         // dptrain's own ms/step over all its steps
	client *clientStats    // rank 0's protection figures (with protection)
	table  *protTable      // gorun -v's protection table (with protection)
	// sources are the gradient sources of the ranks' holders in gorun
	// -v's last differential-protection table (diff mode), by rank.
	sources []string
	wall    time.Duration
	durable *durableTable // gorun -v's durable tier report (with -ckpt)
	// span is the time from step 0's line (or the first one printed) to
	// the last step's, warm-up included: the steps whose stages the
	// durable tier's wait counts.
	span time.Duration
}

// runOnce runs dptrain once under gorun on the namespace hosts, with
// protect mode mode and redundancy red ("": without protection, where red
// is unused), and with ckpt set the durable tier at that concurrency
// (persist.go).
func (b *bench) runOnce(ctx context.Context, v *variant, mode string, red topology.Redundancy, ckpt string) (*runResult, error) {
	cfg := &b.cfg
	protect := mode != ""
	total := cfg.warmup + cfg.timedSteps(v, mode)
	name := strings.ReplaceAll(v.name, " ", "")
	name = strings.ReplaceAll(name, ",", "-")
	dp := []string{cfg.dptrain, "--params", strconv.FormatInt(cfg.params(), 10), "--steps", strconv.Itoa(total),
		"--batch", strconv.Itoa(cfg.batch), "--compute", strconv.Itoa(v.compute), "--device-ms", strconv.Itoa(v.deviceMs),
		"--log-every", "1", "--seed", "1"}
	if v.deviceMs > 0 {
		// The accelerator's work, gradients included, is emulated: the
		// host CPU only runs the optimizer step (and the protection).
		dp = append(dp, "--device-grad")
	}
	args := []string{"-v", "--hostfile", b.hostfile, "--rsh", "ip netns exec", "--bind", b.hosts.BridgeAddr,
		"-np", strconv.Itoa(cfg.ranks), "--timeout", strconv.Itoa(int(cfg.timeout.Seconds()))}
	if protect {
		dp = append(dp, "--protect")
		name += "-" + mode + "-" + strings.NewReplacer(":", "", "+", "-").Replace(red.String())
		args = append(args, "--protect-mode", mode, "--redundancy", red.String())
		if mode == "diff" {
			args = append(args, "--base-every", strconv.Itoa(cfg.baseEvery))
		}
	}
	if ckpt != "" {
		dir, err := b.ckptArgs(ckpt, &args)
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		name += "-ckpt-" + ckpt
	}
	args = append(append(args, "--"), dp...)
	logPath := filepath.Join(b.logDir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "%s %s\n", cfg.gorun, strings.Join(args, " "))
	what := "none"
	if protect {
		what = mode + ", " + red.String()
	}
	if ckpt != "" {
		what += ", --ckpt-concurrency " + ckpt
	}
	fmt.Fprintf(b.log, "benchprotect: %s, protection %s: %d steps ...", v.name, what, total)

	// A job that stops making progress (replication that never succeeds
	// holds every rank at the overwrite rule) is stopped.
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(cfg.stall, func() { cancel(fmt.Errorf("rank 0 printed nothing for %v", cfg.stall)) })
	defer stall.Stop()
	cmd := exec.CommandContext(rctx, cfg.gorun, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // gorun stops the ranks
	cmd.WaitDelay = 30 * time.Second
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	resc := make(chan stdoutResult, 1)
	go func() {
		resc <- readStdout(out, func() stamp {
			stall.Reset(cfg.stall)
			w, _ := b.hosts.wireBytes() // a failed read shows as a missing figure
			return stamp{at: time.Now(), wire: w}
		})
	}()
	res := <-resc
	werr := cmd.Wait()
	r := &runResult{msStep: res.msStep, client: res.client, wall: time.Since(start)}
	fmt.Fprintf(b.log, " %.0f s\n", r.wall.Seconds())
	logText, rerr := os.ReadFile(logPath)
	var job string
	r.table, job = parseTable(string(logText))
	r.durable = parseDurable(string(logText))
	r.sources = parseDiffSources(string(logText))
	b.removeLeftovers(job)

	fail := func(err error) (*runResult, error) {
		b.failed = true
		return nil, fmt.Errorf("%s, protection %q: %w\nlast lines of rank 0:\n  %s\ngorun's log: %s",
			v.name, mode, err, strings.Join(res.lines, "\n  "), logPath)
	}
	switch {
	case rctx.Err() != nil:
		return fail(context.Cause(rctx))
	case werr != nil:
		return fail(fmt.Errorf("gorun: %w", werr))
	case rerr != nil:
		return fail(rerr)
	case res.badLine != nil:
		return fail(res.badLine)
	case protect && (res.client == nil || r.table == nil || len(r.table.rows) != cfg.ranks):
		return fail(errors.New("no protection figures from dptrain or gorun -v"))
	}
	if r.steps, err = stepTimes(res.stepAt, cfg.warmup, total-1); err != nil {
		return fail(err)
	}
	if r.wire, err = wirePerStep(res.stepWire, cfg.warmup, total-1); err != nil {
		return fail(err)
	}
	for s := range cfg.warmup { // step 0's line, or the first there is
		if a, ok := res.stepAt[s]; ok {
			r.span = res.stepAt[total-1].Sub(a)
			break
		}
	}
	if cfg.stepTimes {
		fmt.Fprintf(b.log, "benchprotect: %s, protection %q: timed steps (ms):", v.name, mode)
		for _, d := range r.steps {
			fmt.Fprintf(b.log, " %.0f", float64(d)/float64(time.Millisecond))
		}
		fmt.Fprintln(b.log)
	}
	return r, nil
}

// removeLeftovers removes what a job of this id may have left in /dev/shm
// (its slot files) and in the temporary directory (the agents' job
// directories), which gorun itself removes when nothing went wrong, and
// says so if there was any.
func (b *bench) removeLeftovers(job string) {
	if job == "" {
		return
	}
	var left []string
	for _, pat := range []string{"/dev/shm/gorun-" + job + ".*", filepath.Join(os.TempDir(), "gorun-"+job+"-*")} {
		m, _ := filepath.Glob(pat)
		left = append(left, m...)
	}
	for _, f := range left {
		os.RemoveAll(f)
	}
	if len(left) > 0 {
		fmt.Fprintf(b.log, "benchprotect: removed %d files job %s left: %s\n", len(left), job, strings.Join(left, " "))
	}
}
