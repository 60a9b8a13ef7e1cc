package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/plan"
	"github.com/gorun/gorun/topology"
)

const planUsageHead = `Usage: gorun plan [flags]

Before launching: what a host failure will cost the job under
checkpoint-restart and under gorun's host replacement (DEADPOOL's disruption
model), the efficiency of each, a Monte Carlo of the time lost over the
job, the durable checkpoint interval PCcheck's formula recommends, what the
redundancy survives and its loss bound, and the spares the job needs.

`

const planUsageTail = `Units: durations 20s, 1h30m, 30d; sizes 256MiB, 10GB; bandwidths 10GB/s, or
bits per second 100Gbit/s (= 100Gb/s = 12.5GB/s). Units are case-sensitive:
B is a byte, b a bit.
`

// planInput is one input of a plan with where its value came from.
type planInput struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Source string `json:"source"` // given, measured, default, hostfile, trace, f*
	// Raw is the value in seconds, bytes, bytes/s or a count; for
	// redundancy, the hosts it survives losing at once (k of replicas:k
	// per host and its holders, M of ec:K+M per group).
	Raw float64 `json:"raw"`
}

// planSchema is the version of --json's schema (its keys:
// plan_json_test.go). It changes when a key is renamed or removed.
const planSchema = 1

// planOutput is what --json prints.
type planOutput struct {
	Schema int         `json:"schema"`
	Inputs []planInput `json:"inputs"`
	Result plan.Result `json:"result"`
}

// planDeps are the side effects of gorun plan, replaced in tests.
type planDeps struct {
	now    func() time.Time
	fs     plan.FS
	memBW  func() (float64, error)
	net    netJob // runs the network measurement job (plan_net.go)
	stdout io.Writer
}

func planMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "net-probe" {
		return runNetProbe(args[1:], stdout, stderr)
	}
	ctx, stop := planSignals()
	defer stop()
	deps := planDeps{now: time.Now, fs: plan.OSFS{}, net: runGorun, stdout: stdout}
	deps.memBW = func() (float64, error) { return plan.MeasureMemBW(64<<20, 8, deps.now) }
	return runPlan(ctx, args, deps, stderr)
}

// planSignals is the context gorun plan runs under: SIGINT or SIGTERM
// cancels it, so that a measurement under way stops and cleans up (the
// durable probe removes its file, the network probe's job is stopped
// with its whole process group) before gorun plan exits, instead of the
// signal killing it where it stands.
func planSignals() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func runPlan(ctx context.Context, args []string, deps planDeps, stderr io.Writer) int {
	out, asJSON, err := planFromArgs(ctx, args, deps)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(deps.stdout, planUsage())
		return exitOK
	case err != nil:
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "gorun plan: %v\nRun 'gorun plan -h' for usage.\n", err)
			return exitUsage
		}
		fmt.Fprintf(stderr, "gorun plan: %v\n", err)
		return exitError
	}
	if asJSON {
		enc := json.NewEncoder(deps.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "gorun plan: %v\n", err)
			return exitError
		}
		return exitOK
	}
	writePlanReport(deps.stdout, out)
	return exitOK
}

// planFromArgs parses the flags, measures what it can and computes the plan.
func planFromArgs(ctx context.Context, args []string, deps planDeps) (planOutput, bool, error) {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var v planFlagVals
	defineFlags(fs, planFlagSpecs(&v))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return planOutput{}, false, err
		}
		return planOutput{}, false, usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return planOutput{}, false, usagef("unexpected argument %q: gorun plan takes flags only", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	p := &planParser{set: set, str: v.str, ints: v.ints}
	in, trace, err := p.inputs(ctx, deps)
	if err != nil {
		return planOutput{}, false, err
	}
	runs := p.count("runs", 1000, 1)
	risk := p.fraction("spare-risk", 0.01)
	if p.err != nil {
		return planOutput{}, false, p.err
	}
	res, err := plan.Plan(in, trace, runs, v.seed, risk)
	if err != nil {
		return planOutput{}, false, p.planErr(err)
	}
	return planOutput{Schema: planSchema, Inputs: p.list, Result: res}, v.asJSON, nil
}

// planParser turns flags into plan.Inputs, recording each value's source;
// the first error sticks in err.
type planParser struct {
	set  map[string]bool
	str  map[string]*string
	ints map[string]*int
	list []planInput
	err  error
}

func (p *planParser) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}

func (p *planParser) record(name, value, source string, raw float64) {
	p.list = append(p.list, planInput{Name: name, Value: value, Source: source, Raw: raw})
}

// planFlags names the flag of each field of plan.Inputs (and of
// plan.Plan's other arguments).
var planFlags = map[string]string{
	"MTTFHost": "--mttf", "Hosts": "--hosts", "RanksPerHost": "--ranks-per-host", "Step": "--step",
	"StateBytes": "--state", "MemBW": "--mem-bw", "NetBW": "--net-bw", "DurableBW": "--durable-bw",
	"Restart": "--restart", "Replace": "--replace", "Interval": "--interval", "Concurrency": "--ckpt-concurrency",
	"Overhead": "--ckpt-overhead", "Spares": "--spares", "Redundancy": "--redundancy", "JobLength": "--job-length",
	"Runs": "--runs", "SpareRisk": "--spare-risk",
}

// planErr rewords an error of the plan package as a usage error naming
// the flag (a plan.FieldError), or returns it as it is.
func (p *planParser) planErr(err error) error {
	var fe *plan.FieldError
	if errors.As(err, &fe) {
		name := cmp.Or(planFlags[fe.Field], fe.Field)
		switch {
		case fe.Field == "MTTFHost" && p.set["trace"]:
			name = "--trace"
		case fe.Field == "DurableBW" && p.set["durable-bw-total"]:
			name = "--durable-bw-total"
		case fe.Field == "Hosts" && p.set["hostfile"]:
			name = "--hostfile"
		}
		return usagef("%s %s", name, fe.Msg)
	}
	if errors.Is(err, plan.ErrInput) {
		return usagef("%s", strings.TrimPrefix(err.Error(), plan.ErrInput.Error()+": "))
	}
	return err
}

// unitErr rewords a plan.ErrInput from a unit parser as a usage error
// naming the flag.
func unitErr(name string, err error) error {
	return usagef("--%s %s", name, strings.TrimPrefix(err.Error(), plan.ErrInput.Error()+": "))
}

// text returns a string flag's value and its source ("given", or
// "default" for def); def "" means the flag is required, and its absence
// is a usage error (ok false).
func (p *planParser) text(name, def string) (v, src string, ok bool) {
	if p.set[name] {
		return *p.str[name], "given", true
	}
	if def == "" {
		p.fail(usagef("--%s is required", name))
		return "", "", false
	}
	return def, "default", true
}

// duration reads a duration flag; def "" means required (unless
// optional), and the value must be positive unless zeroOK.
func (p *planParser) duration(name, def string, zeroOK bool) float64 {
	v, src, ok := p.text(name, def)
	if !ok {
		return 0
	}
	d, err := plan.ParseDuration(v)
	switch {
	case err != nil:
		p.fail(unitErr(name, err))
	case d < 0 || (d == 0 && !zeroOK):
		p.fail(usagef("--%s %s: must be positive", name, v))
	}
	p.record(name, d.String(), src, d.Seconds())
	return d.Seconds()
}

func (p *planParser) size(name, def string) float64 {
	v, src, ok := p.text(name, def)
	if !ok {
		return 0
	}
	n, err := plan.ParseSize(v)
	switch {
	case err != nil:
		p.fail(unitErr(name, err))
	case n == 0:
		p.fail(usagef("--%s %s: must be positive", name, v))
	}
	p.record(name, plan.FormatBytes(n), src, n)
	return n
}

// bandwidth reads a bandwidth flag, or takes measure's figure, or def.
func (p *planParser) bandwidth(name string, measure func() (float64, error), measuredFrom, def string) float64 {
	if p.set[name] {
		bw, err := plan.ParseBandwidth(*p.str[name])
		if err != nil {
			p.fail(unitErr(name, err))
		}
		p.record(name, plan.FormatBandwidth(bw), "given", bw)
		return bw
	}
	if measure != nil {
		bw, err := measure()
		if err != nil {
			p.fail(fmt.Errorf("--%s: %w", name, err))
			return 0
		}
		p.record(name, plan.FormatBandwidth(bw), "measured "+measuredFrom, bw)
		return bw
	}
	bw, _ := plan.ParseBandwidth(def)
	p.record(name, plan.FormatBandwidth(bw), "default", bw)
	return bw
}

// count reads an integer flag that must be at least lo.
func (p *planParser) count(name string, def, lo int) int {
	v, src := *p.ints[name], "given"
	if !p.set[name] {
		v, src = def, "default"
	}
	if v < lo {
		p.fail(usagef("--%s must be at least %d, not %d", name, lo, v))
	}
	p.record(name, strconv.Itoa(v), src, float64(v))
	return v
}

// fraction reads a flag in (0, 1).
func (p *planParser) fraction(name string, def float64) float64 {
	v, src := def, "default"
	if p.set[name] {
		f, err := strconv.ParseFloat(*p.str[name], 64)
		if err != nil || !(f > 0 && f < 1) {
			p.fail(usagef("--%s %s: want a number between 0 and 1", name, *p.str[name]))
		}
		v, src = f, "given"
	}
	p.record(name, strconv.FormatFloat(v, 'g', -1, 64), src, v)
	return v
}

func (p *planParser) inputs(ctx context.Context, deps planDeps) (plan.Inputs, []plan.Failure, error) {
	var in plan.Inputs
	// hosts and spares: --hosts, or a hostfile's
	var hostfileSpares = -1
	var netHosts []string // the first two hosts of --hostfile with ranks
	switch {
	case p.set["hosts"] && p.set["hostfile"]:
		return in, nil, usagef("--hosts and --hostfile: give one of them")
	case p.set["hostfile"]:
		hosts, err := topology.ReadHostfile(*p.str["hostfile"])
		if err != nil {
			return in, nil, usagef("--hostfile: %v", err)
		}
		hostfileSpares = 0
		for _, h := range hosts {
			if h.Spare {
				hostfileSpares++
			} else {
				in.Hosts++
				if len(netHosts) < 2 {
					netHosts = append(netHosts, h.Name)
				}
			}
		}
		if in.Hosts == 0 {
			return in, nil, usagef("--hostfile %s: every host is a spare", *p.str["hostfile"])
		}
		p.record("hosts", strconv.Itoa(in.Hosts), "hostfile", float64(in.Hosts))
	case p.set["hosts"]:
		in.Hosts = p.count("hosts", 0, 1)
	default:
		return in, nil, usagef("--hosts or --hostfile is required")
	}
	in.RanksPerHost = p.count("ranks-per-host", 1, 1)
	if hostfileSpares >= 0 && !p.set["spares"] {
		in.Spares = hostfileSpares
		p.record("spares", strconv.Itoa(in.Spares), "hostfile", float64(in.Spares))
	} else {
		in.Spares = p.count("spares", 0, 0)
	}

	// failures: --mttf or --trace
	var trace []plan.Failure
	switch {
	case p.set["mttf"] && p.set["trace"]:
		return in, nil, usagef("--mttf and --trace: give one of them")
	case p.set["trace"]:
		f, err := os.Open(*p.str["trace"])
		if err != nil {
			return in, nil, usagef("--trace: %v", err)
		}
		var start time.Time
		if p.set["trace-start"] {
			if start, err = time.Parse(time.RFC3339Nano, *p.str["trace-start"]); err != nil {
				f.Close()
				return in, nil, usagef("--trace-start %q: want an RFC 3339 timestamp, e.g. 2026-01-05T10:00:00Z", *p.str["trace-start"])
			}
		}
		trace, err = plan.ParseTrace(f, *p.str["trace"], start)
		f.Close()
		if err != nil {
			return in, nil, usagef("--trace %v", err)
		}
		last := trace[len(trace)-1].At
		in.JobLength = p.duration("job-length", last.String(), false)
		n := 0
		for _, f := range trace {
			if f.At.Seconds() <= in.JobLength {
				n++
			}
		}
		if n == 0 {
			return in, nil, usagef("--trace %s: no failures before --job-length %v", *p.str["trace"], time.Duration(in.JobLength*1e9))
		}
		// one host's MTTF that gives n failures over the job on average
		in.MTTFHost = in.JobLength * float64(in.Hosts) / float64(n)
		p.record("mttf", time.Duration(in.MTTFHost*1e9).Round(time.Second).String(), "trace", in.MTTFHost)
	case p.set["trace-start"]:
		return in, nil, usagef("--trace-start applies with --trace only")
	case p.set["mttf"]:
		in.MTTFHost = p.duration("mttf", "", false)
		in.JobLength = p.duration("job-length", "", false)
	default:
		return in, nil, usagef("--mttf or --trace is required")
	}
	if p.err != nil {
		return in, nil, p.err
	}

	in.Step = p.duration("step", "", false)
	in.StateBytes = p.size("state", "")
	in.Restart = p.duration("restart", "10m", true)
	in.Replace = p.duration("replace", "30s", true)
	// as gorun's default: replicas:1 where the hosts allow it
	r, err := topology.Redundancy{Replicas: min(1, in.Hosts-1)}, error(nil)
	src := "default"
	if p.set["redundancy"] {
		r, err = topology.ParseRedundancy(*p.str["redundancy"])
		src = "given"
		if err != nil {
			p.fail(usagef("--redundancy %s", strings.TrimPrefix(err.Error(), topology.ErrRedundancy.Error()+": ")))
		}
	}
	in.Redundancy = r
	survives := r.Replicas
	if r.EC() {
		survives = r.ECM
	}
	p.record("redundancy", r.String(), src, float64(survives))
	if p.set["interval"] {
		in.Interval = p.count("interval", 0, 1)
		if p.err == nil && float64(in.Interval)*in.Step > in.JobLength {
			p.fail(usagef("--interval %d: %d steps of %v are longer than the job (%v)", in.Interval, in.Interval,
				time.Duration(in.Step*1e9), time.Duration(in.JobLength*1e9)))
		}
	} else {
		in.Interval = 1 // f*, once T_w is known (below)
		p.record("interval", "", "", 0)
	}
	in.Concurrency = p.count("ckpt-concurrency", 1, 1)
	in.Overhead = p.fraction("ckpt-overhead", 0.03)
	if p.err != nil {
		return in, nil, p.err
	}

	// Every check that needs no measuring is made before any measuring:
	// the flags' contradictions, the units of the bandwidths given, and
	// plan.Inputs.Validate with stand-in bandwidths.
	if !p.set["hostfile"] && (p.set["rsh"] || p.set["bind"]) {
		return in, nil, usagef("--rsh and --bind apply with --hostfile only (to measure the network)")
	}
	if p.set["measure-size"] && !p.set["durable-dir"] && (!p.set["hostfile"] || p.set["net-bw"]) {
		return in, nil, usagef("--measure-size applies with --durable-dir or --hostfile only")
	}
	var durable []string
	for _, n := range []string{"durable-bw", "durable-bw-total", "durable-dir"} {
		if p.set[n] {
			durable = append(durable, "--"+n)
		}
	}
	if len(durable) > 1 {
		return in, nil, usagef("%s: give one of them", strings.Join(durable, " and "))
	}
	for _, n := range []string{"mem-bw", "net-bw", "durable-bw", "durable-bw-total"} {
		if p.set[n] {
			if _, err := plan.ParseBandwidth(*p.str[n]); err != nil {
				return in, nil, unitErr(n, err)
			}
		}
	}
	measureSize := 0.0
	if (len(netHosts) == 2 && !p.set["net-bw"]) || p.set["durable-dir"] {
		size, err := plan.ParseSize(cmp.Or(*p.str["measure-size"], "256MiB"))
		if err != nil || size == 0 {
			return in, nil, usagef("--measure-size %s: want a positive size", *p.str["measure-size"])
		}
		measureSize = size
	}
	if p.set["durable-dir"] {
		if fi, err := os.Stat(*p.str["durable-dir"]); err != nil || !fi.IsDir() {
			return in, nil, usagef("--durable-dir %s: not a directory", *p.str["durable-dir"])
		}
	}
	stand := in
	stand.MemBW, stand.NetBW, stand.DurableBW = 1, 1, 1
	if err := stand.Validate(); err != nil {
		return in, nil, p.planErr(err)
	}

	// bandwidths, measured last
	in.MemBW = p.bandwidth("mem-bw", deps.memBW, "(memory copy here)", "")
	var measureNetBW func() (float64, error)
	netFrom := ""
	if len(netHosts) == 2 && !p.set["net-bw"] {
		p.record("measure-size", plan.FormatBytes(measureSize), sourceOf(p.set["measure-size"]), measureSize)
		netFrom = "between " + netHosts[0] + " and " + netHosts[1]
		measureNetBW = func() (float64, error) {
			return measureNet(ctx, deps.net, netHosts[0], netHosts[1], int64(measureSize), *p.str["rsh"], *p.str["bind"])
		}
	}
	in.NetBW = p.bandwidth("net-bw", measureNetBW, netFrom, "1.25GB/s")
	switch {
	case p.set["durable-bw-total"]:
		// the storage's aggregate bandwidth, shared by every host writing
		total, _ := plan.ParseBandwidth(*p.str["durable-bw-total"])
		in.DurableBW = total / float64(in.Hosts)
		p.record("durable-bw", plan.FormatBandwidth(in.DurableBW)+" per host",
			fmt.Sprintf("given: --durable-bw-total %s shared by %d hosts", plan.FormatBandwidth(total), in.Hosts), in.DurableBW)
	case p.set["durable-dir"]:
		dir := *p.str["durable-dir"]
		if measureNetBW == nil {
			p.record("measure-size", plan.FormatBytes(measureSize), sourceOf(p.set["measure-size"]), measureSize)
		}
		in.DurableBW = p.bandwidth("durable-bw", func() (float64, error) {
			return plan.MeasureDurableBW(ctx, deps.fs, dir, int64(measureSize), deps.now)
		}, "in "+dir+", one host alone (an upper bound of each host's share while every host writes)", "")
	default:
		in.DurableBW = p.bandwidth("durable-bw", nil, "", "1GB/s")
		if !p.set["durable-bw"] {
			p.list[len(p.list)-1].Source = "default, per host"
		} else {
			p.list[len(p.list)-1].Source = "given, per host"
		}
	}
	if !p.set["interval"] && p.err == nil {
		// PCcheck's f*, within the job
		f := plan.IntervalFor(in.WriteTime(), in.Concurrency, 1+in.Overhead, in.Step)
		src := "f* (PCcheck Eq. 3; no --interval given)"
		if most := max(1, int(in.JobLength/in.Step)); f > most {
			f, src = most, "the job's length in steps (f* is longer; no --interval given)"
		}
		in.Interval = f
		for i := range p.list {
			if p.list[i].Name == "interval" {
				p.list[i] = planInput{Name: "interval", Value: strconv.Itoa(f), Source: src, Raw: float64(f)}
			}
		}
	}
	return in, trace, p.err
}

func sourceOf(given bool) string {
	if given {
		return "given"
	}
	return "default"
}
