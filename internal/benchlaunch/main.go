// Command benchlaunch compares the launch-to-exit wall time of gorun with
// Open MPI's mpirun and MPICH's Hydra mpiexec, each running `true` on N ranks
// (or -prog, e.g. an MPICH-built MPI program with -mpich, against Hydra, or
// an Open MPI-built one with -openmpi, against mpirun.openmpi).
//
// From the repository root (scripts/bench-launch.sh installs the MPIs first):
//
//	go run ./internal/benchlaunch -gorun ./bin/gorun -n 1,16,64 -rounds 15
//
// The launchers run interleaved, one of each per round with the order rotated
// every round, so drift in machine load hits them alike. Every run gets a
// process group of its own; a run still going after -timeout is killed with
// all its descendants, counted as a hang and left out of the statistics. A
// hang check then repeats -np 64 many times. A launcher that is not installed
// is skipped. With -phases it prints instead when gorun passed each phase
// of its launch (GORUN_DEBUG_PHASES, internal/phasetrace), median of -rounds.
//
// It is a benchmark: missed targets are printed, not fatal. The exit status
// is 1 if gorun is missing or exits non-zero in any run, 2 for bad flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// hangCheckN is the rank count of the hang check.
const hangCheckN = 64

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type config struct {
	gorun       string
	ns          []int
	rounds      int
	timeout     time.Duration
	hangRuns    int
	mpiHangRuns int
	skipMPI     bool
	phases      bool   // print gorun's launch phases instead (internal/phasetrace)
	prog        string // what the ranks run
	mpich       bool   // prog is an MPICH-built MPI program
	openmpi     bool   // prog is an Open MPI-built MPI program
}

// parseFlags parses args, reporting any error on stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := config{ns: []int{1, 16, 64}}
	fs := flag.NewFlagSet("benchlaunch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.gorun, "gorun", "./bin/gorun", "gorun binary")
	fs.Func("n", "comma-separated rank counts (default 1,16,64)", func(s string) (err error) {
		cfg.ns, err = parseNs(s)
		return err
	})
	fs.IntVar(&cfg.rounds, "rounds", 15, "timed rounds per N; a round runs each launcher once")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "per-run limit; a slower run is killed and counted as a hang")
	fs.IntVar(&cfg.hangRuns, "hang-runs", 100, fmt.Sprintf("gorun -np %d runs in the hang check", hangCheckN))
	fs.IntVar(&cfg.mpiHangRuns, "mpi-hang-runs", 20, fmt.Sprintf("-np %d runs of each MPI in the hang check", hangCheckN))
	fs.BoolVar(&cfg.skipMPI, "skip-mpi", false, "time gorun only")
	fs.BoolVar(&cfg.phases, "phases", false, "print the median time of each of gorun's launch phases (GORUN_DEBUG_PHASES) at every N, -rounds runs each, and nothing else")
	fs.StringVar(&cfg.prog, "prog", "true", "the program every rank runs")
	fs.BoolVar(&cfg.mpich, "mpich", false, "-prog is an MPICH-built MPI program (compared with Hydra only: Open MPI cannot run it)")
	fs.BoolVar(&cfg.openmpi, "openmpi", false, "-prog is an Open MPI 4-built MPI program (compared with mpirun.openmpi only: Hydra cannot run it)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	var err error
	switch {
	case fs.NArg() > 0:
		err = fmt.Errorf("benchlaunch: unexpected argument %q", fs.Arg(0))
	case cfg.mpich && cfg.openmpi:
		err = errors.New("benchlaunch: -mpich or -openmpi, not both")
	case cfg.rounds < 1, cfg.timeout <= 0, cfg.hangRuns < 0, cfg.mpiHangRuns < 0:
		err = errors.New("benchlaunch: -rounds and -timeout must be positive, hang runs not negative")
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
	}
	return cfg, err
}

// mpiBuilt is the MPI -prog is built with: "mpich", "openmpi" or "".
func (c config) mpiBuilt() string {
	switch {
	case c.mpich:
		return "mpich"
	case c.openmpi:
		return "openmpi"
	}
	return ""
}

// parseNs parses a comma-separated list of positive rank counts.
func parseNs(s string) ([]int, error) {
	var ns []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("benchlaunch: bad rank count %q", f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// bench holds one benchmark session. It is not safe for concurrent use.
type bench struct {
	cfg        config
	out        io.Writer
	gorunFails int
	reported   map[string]int // failures and hangs seen per launcher
}

// maxReported is how many failures and hangs of each launcher are printed.
const maxReported = 3

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2 // already reported
	}
	b := &bench{cfg: cfg, out: stdout, reported: map[string]int{}}
	if cfg.phases {
		for _, n := range cfg.ns {
			if err := b.phases(n); err != nil {
				fmt.Fprintln(stderr, err)
				return 1
			}
		}
		return 0
	}
	status := b.benchmark()
	if b.gorunFails > 0 {
		fmt.Fprintf(stderr, "benchlaunch: gorun exited non-zero in %d run(s)\n", b.gorunFails)
		status = 1
	}
	return status
}

// medians maps launcher name and N to the median wall time; a launcher
// without a successful run at some N has no entry there.
type medians map[string]map[int]time.Duration

func (b *bench) benchmark() int {
	fmt.Fprintf(b.out, "benchlaunch: %d rounds per N, timeout %v, %d CPUs\n", b.cfg.rounds, b.cfg.timeout, runtime.NumCPU())
	ls := b.installed()
	if len(ls) == 0 || ls[0].name != "gorun" {
		fmt.Fprintf(b.out, "benchlaunch: gorun not found at %s; nothing to compare\n", b.cfg.gorun)
		return 1
	}
	for _, l := range ls { // warm-up, untimed
		b.run(l, b.cfg.ns[0])
	}
	med := b.timeRounds(ls)
	b.printRatios(med)
	hangs := b.hangCheck(ls)
	if b.cfg.openmpi {
		fmt.Fprintf(b.out, "\ntarget: %s under gorun no slower than under mpirun.openmpi (gorun/openmpi <= 1.0) at N=16,64: %s; gorun hangs = 0: %s (mpirun.openmpi: %d)\n",
			b.cfg.prog, verdict(med["gorun"], med["openmpi"], []int{16, 64}, 1, true), met(hangs["gorun"] == 0), hangs["openmpi"])
		return 0
	}
	if b.cfg.mpich {
		fmt.Fprintf(b.out, "\ntarget: %s under gorun no slower than under Hydra (gorun/hydra <= 1.0) at N=16,64: %s; gorun hangs = 0: %s\n",
			b.cfg.prog, verdict(med["gorun"], med["hydra"], []int{16, 64}, 1, true), met(hangs["gorun"] == 0))
		return 0
	}
	fmt.Fprintf(b.out, "\ntargets: gorun < openmpi at every N: %s; gorun/hydra <= 1.0 at N=16,64: %s; gorun hangs = 0: %s\n",
		verdict(med["gorun"], med["openmpi"], b.cfg.ns, 1, false),
		verdict(med["gorun"], med["hydra"], []int{16, 64}, 1, true),
		met(hangs["gorun"] == 0))
	return 0
}

// installed prints the launchers and returns those found, with resolved paths.
func (b *bench) installed() []launcher {
	var ls []launcher
	for _, l := range launchers(b.cfg.gorun, b.cfg.skipMPI, b.cfg.prog, b.cfg.mpiBuilt()) {
		path, err := exec.LookPath(l.path)
		if err != nil {
			fmt.Fprintf(b.out, "  %-8s skipped (not installed): %s\n", l.name, l.path)
			continue
		}
		l.path = path
		fmt.Fprintf(b.out, "  %-8s %s %s", l.name, path, strings.Join(l.args, " "))
		if v := versionOf(path, l.version); v != "" {
			fmt.Fprintf(b.out, "   [%s]", v)
		}
		fmt.Fprintln(b.out)
		ls = append(ls, l)
	}
	return ls
}

// timeRounds runs the interleaved rounds for every N and prints one table row
// per launcher and N.
func (b *bench) timeRounds(ls []launcher) medians {
	med := medians{}
	fmt.Fprintf(b.out, "\n%-6s %-8s %9s %9s %9s %5s %5s %5s\n", "N", "launcher", "median", "p10", "p90", "ok", "hang", "fail")
	for _, n := range b.cfg.ns {
		samples := make([]sample, len(ls))
		for r := range b.cfg.rounds {
			for _, i := range roundOrder(r, len(ls)) {
				samples[i].add(b.run(ls[i], n))
			}
		}
		for i, l := range ls {
			s, k := samples[i], len(samples[i].times)
			if k > 0 {
				if med[l.name] == nil {
					med[l.name] = map[int]time.Duration{}
				}
				med[l.name][n] = median(s.times)
			}
			fmt.Fprintf(b.out, "%-6d %-8s %9s %9s %9s %5d %5d %5d\n", n, l.name,
				ms(median(s.times), k), ms(percentile(s.times, 10), k), ms(percentile(s.times, 90), k), k, s.hangs, s.fails)
		}
	}
	return med
}

// printRatios prints one summary line per N.
func (b *bench) printRatios(med medians) {
	fmt.Fprintln(b.out)
	for _, n := range b.cfg.ns {
		fmt.Fprintf(b.out, "N=%-4d", n)
		for _, l := range launchers(b.cfg.gorun, false, b.cfg.prog, "") {
			fmt.Fprintf(b.out, "  %s %s", l.name, msOr(med[l.name], n))
		}
		for _, mpi := range []string{"openmpi", "hydra"} {
			fmt.Fprintf(b.out, "  gorun/%s %s", mpi, ratio(med["gorun"], med[mpi], n))
		}
		fmt.Fprintln(b.out)
	}
}

// hangCheck runs each launcher many times at hangCheckN and returns the
// number of hangs per launcher.
func (b *bench) hangCheck(ls []launcher) map[string]int {
	fmt.Fprintln(b.out)
	hangs := map[string]int{}
	for _, l := range ls {
		runs := b.cfg.mpiHangRuns
		if l.name == "gorun" {
			runs = b.cfg.hangRuns
		}
		var s sample
		for range runs {
			s.add(b.run(l, hangCheckN))
		}
		hangs[l.name] = s.hangs
		fmt.Fprintf(b.out, "hang check: %-8s -np %d %s x%d: %d hung, %d failed\n", l.name, hangCheckN, b.cfg.prog, runs, s.hangs, s.fails)
	}
	return hangs
}

// run runs l once with n ranks, reporting the first few failures and hangs
// of each launcher; a gorun failure also fails the benchmark.
func (b *bench) run(l launcher, n int) result {
	r := runOnce(l.path, l.argv(n), b.cfg.timeout)
	if r.outcome == failed && l.name == "gorun" {
		b.gorunFails++
	}
	if r.outcome != ok {
		if b.reported[l.name]++; b.reported[l.name] <= maxReported {
			fmt.Fprintf(b.out, "  ! %s -np %d: %v\n", l.name, n, r.err)
		}
	}
	return r
}

// verdict reports whether gorun/other < limit (or <= limit if orEqual) at
// every N in ns where both have a median, and "n/a" if there is no such N.
func verdict(gorun, other map[int]time.Duration, ns []int, limit float64, orEqual bool) string {
	compared := 0
	for _, n := range ns {
		g, okG := gorun[n]
		o, okO := other[n]
		if !okG || !okO {
			continue
		}
		compared++
		q := float64(g) / float64(o)
		if q > limit || (q == limit && !orEqual) {
			return fmt.Sprintf("NOT met (N=%d %.2f)", n, q)
		}
	}
	if compared == 0 {
		return "n/a"
	}
	return "met"
}

func met(b bool) string {
	if b {
		return "met"
	}
	return "NOT met"
}

func ms(d time.Duration, count int) string {
	if count == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func msOr(m map[int]time.Duration, n int) string {
	d, ok := m[n]
	if !ok {
		return "-"
	}
	return ms(d, 1)
}

func ratio(num, den map[int]time.Duration, n int) string {
	a, okA := num[n]
	d, okD := den[n]
	if !okA || !okD || d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(d))
}
