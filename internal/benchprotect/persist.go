package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The durable tier's overhead (make bench-persist, issue 17): dptrain
// protected in full mode (replicas:1) without --ckpt-dir, then with a
// base every -ckpt-every steps at each -ckpt concurrency, one fresh
// checkpoint directory per run, in the same invocation: each run's step
// time beside the run without the durable tier, and what gorun -v says
// the saves took.

// persistTarget is PCcheck's figure: 3% at one checkpoint every 10 steps.
const persistTarget = 0.03

// parseCkpt parses -ckpt: "auto" or a concurrency of 1 to 8, each once.
func parseCkpt(v string) ([]string, error) {
	var out []string
	for c := range strings.SplitSeq(v, ",") {
		if n, err := strconv.Atoi(c); c != "auto" && (err != nil || n < 1 || n > 8) || slices.Contains(out, c) {
			return nil, fmt.Errorf("benchprotect: -ckpt %q: want auto or 1 to 8, comma-separated, each once", v)
		}
		out = append(out, c)
	}
	return out, nil
}

// ckptArgs adds the durable tier's flags at concurrency ckpt to args, in
// a fresh directory it returns (the caller removes it).
func (b *bench) ckptArgs(ckpt string, args *[]string) (string, error) {
	dir, err := os.MkdirTemp(b.cfg.ckptDir, "benchpersist-")
	if err != nil {
		return "", err
	}
	*args = append(*args, "--ckpt-dir", dir, "--ckpt-every", strconv.Itoa(b.cfg.ckptEvery))
	if ckpt != "auto" {
		*args = append(*args, "--ckpt-concurrency", ckpt)
	}
	return dir, nil
}

// durableTable is gorun -v's report of the durable tier, summed over the
// ranks.
type durableTable struct {
	committed               int64 // -1: none
	saves, skipped, failed  int64
	writePerSave, holdTotal time.Duration // means over the ranks
	mbps                    float64       // mean over the ranks
	n                       []int         // each rank's N at the end
	footprint               string
}

var (
	durableHeadRe = regexp.MustCompile(`(?m)^gorun: durable tier: \S+, a base every \d+ steps, (?:committed version step (\d+)|no version committed)$`)
	durableRowRe  = regexp.MustCompile(`^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)`)
	footprintRe   = regexp.MustCompile(`(?m)^durable footprint: (\S+)`)
)

// parseDurable parses the durable tier's report in gorun -v's stderr, or
// returns nil.
func parseDurable(stderr string) *durableTable {
	loc := durableHeadRe.FindAllStringSubmatchIndex(stderr, -1)
	if loc == nil {
		return nil
	}
	l := loc[len(loc)-1]
	t := &durableTable{committed: -1}
	if l[2] >= 0 {
		t.committed, _ = strconv.ParseInt(stderr[l[2]:l[3]], 10, 64)
	}
	var nw, nh, nr int
	for _, line := range strings.Split(stderr[l[1]:], "\n")[2:] {
		m := durableRowRe.FindStringSubmatch(line)
		if m == nil {
			break
		}
		num := func(i int) int64 { v, _ := strconv.ParseInt(m[i], 10, 64); return v }
		t.saves += num(2)
		t.skipped += num(3)
		t.failed += num(4)
		if d, err := time.ParseDuration(m[5]); err == nil {
			t.writePerSave += d
			nw++
		}
		if v, err := strconv.ParseFloat(m[6], 64); err == nil {
			t.mbps += v
			nr++
		}
		if d, err := time.ParseDuration(m[7]); err == nil {
			t.holdTotal += d
			nh++
		}
		t.n = append(t.n, int(num(8)))
	}
	if nw > 0 {
		t.writePerSave /= time.Duration(nw)
	}
	if nh > 0 {
		t.holdTotal /= time.Duration(nh)
	}
	if nr > 0 {
		t.mbps /= float64(nr)
	}
	if m := footprintRe.FindStringSubmatch(stderr[l[1]:]); m != nil {
		t.footprint = m[1]
	}
	return t
}

// persist runs the durable tier's benchmark: protected in full mode,
// without --ckpt-dir and then with it at each concurrency of -ckpt,
// -ckpt-rounds times in turn (the box's noise is larger than the figure
// measured: each round's runs are compared with the run without the
// durable tier of the same round), for the device-time variant (the
// accelerator's time emulated: the CPU runs the optimizer step and the
// protection) and, with -cpu-compute, the CPU-arithmetic one (every
// step's compute on the CPU: 4 ranks on 2 CPUs leave none idle). A first
// run with the durable tier, reported apart, warms the file system up:
// on a thin-provisioned virtual disk the first writes to blocks the file
// system never used are several times slower than the next ones.
func (b *bench) persist(ctx context.Context) error {
	cfg := &b.cfg
	red := cfg.redundancies[0]
	vs := []*variant{{name: fmt.Sprintf("device-ms %d", cfg.deviceMs), deviceMs: cfg.deviceMs, compute: 1}}
	if cfg.cpuCompute > 0 {
		vs = append(vs, &variant{name: fmt.Sprintf("CPU, compute %d", cfg.cpuCompute), compute: cfg.cpuCompute})
	}
	fmt.Fprintf(b.log, "benchprotect: warm-up run with the durable tier (not counted)\n")
	warm, err := b.runOnce(ctx, vs[0], "full", red, cfg.ckpt[0])
	if err != nil {
		return err
	}
	for _, v := range vs {
		bases := make([]*runResult, cfg.ckptRounds)
		runs := make([][]*runResult, len(cfg.ckpt)) // by concurrency, then round
		for i := range runs {
			runs[i] = make([]*runResult, cfg.ckptRounds)
		}
		for round := range cfg.ckptRounds {
			if bases[round], err = b.runOnce(ctx, v, "full", red, ""); err != nil {
				return err
			}
			for i, c := range cfg.ckpt {
				r, err := b.runOnce(ctx, v, "full", red, c)
				if err != nil {
					return err
				}
				if r.durable == nil {
					b.failed = true
					return fmt.Errorf("--ckpt-concurrency %s: no durable tier report in gorun -v's log", c)
				}
				runs[i][round] = r
			}
		}
		b.persistReport(v, warm, bases, runs)
		warm = nil // reported once
	}
	return nil
}

// ratios returns each round's mean step time of rs over the run without
// the durable tier of the same round, and their mean.
func ratios(rs, bases []*runResult) ([]float64, float64) {
	qs := make([]float64, len(rs))
	var sum float64
	for i, r := range rs {
		qs[i] = float64(mean(r.steps)) / float64(mean(bases[i].steps))
		sum += qs[i]
	}
	return qs, sum / float64(len(qs))
}

// medianF is the median of xs (the mean of the middle two when even).
func medianF(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// baseWindow returns how many steps after a base step count as its
// window: the save starts when the base step commits, and its copies,
// CRCs and writes fall in the steps that follow, as many as its write
// time spans (ceil(write/step), plus the base step's next one, in which
// the save starts), at most every-1 so that steps outside the windows
// remain. cut says the write time spans more steps than that: a slowdown
// past the window falls among the other steps, and B understates it.
func baseWindow(write, step time.Duration, every int) (after int, cut bool) {
	after = 1
	if step > 0 {
		after = int((write+step-1)/step) + 1
	}
	if after > every-1 {
		return every - 1, true
	}
	return after, false
}

// windowExcess compares, within one run, the steps in the windows after
// base steps (steps s+1 to s+after for every base step s with its whole
// window timed) with the other timed steps: it returns the ratio of
// their mean step times (1: no difference) and the windows' share of the
// steps, with ok false when the run has no whole window or no other step
// to compare (too few steps, or windows that cover them all). first is
// the step of steps[0]. The same figure of a run without the durable
// tier (whose "base steps" are only positions) is the noise floor; the
// difference of the two ratios, times the windows' share of the steps,
// is the step-time overhead attributable to the saves, measured within
// runs, free of the drift between runs.
func windowExcess(steps []time.Duration, first, every, after int) (ratio, share float64, ok bool) {
	var in, out time.Duration
	var nIn, nOut int
	last := first + len(steps) - 1
	for i, d := range steps {
		s := first + i
		base := (s - 1) / every * every // the newest base step before s
		k := s - base
		switch {
		case base >= first-1 && k >= 1 && k <= after && base+after <= last:
			in += d
			nIn++
		case k >= 1 && k <= after && (base < first-1 || base+after > last):
			// A window cut off by the run's ends: in neither.
		default:
			out += d
			nOut++
		}
	}
	if nIn == 0 || nOut == 0 {
		return 0, 0, false
	}
	return float64(in) / float64(nIn) / (float64(out) / float64(nOut)), float64(nIn) / float64(nIn+nOut), true
}

// attribution is figure B of one round.
type attribution struct {
	q     float64 // the overhead attributed to the saves' windows
	after int     // the window's steps after a base
	ok    bool    // false: the run cannot be judged so (windowExcess)
	cut   bool    // the save's write time outlasts the window (baseWindow)
}

// attributed is the overhead the saves' windows show in r over base,
// each measured within its run (windowExcess), with windows sized from
// r's write time per base and mean step time (baseWindow); base's
// windows are the same steps.
func (b *bench) attributed(r, base *runResult) attribution {
	cfg := &b.cfg
	var write time.Duration
	if r.durable != nil {
		write = r.durable.writePerSave
	}
	after, cut := baseWindow(write, mean(r.steps), cfg.ckptEvery)
	ew, share, okw := windowExcess(r.steps, cfg.warmup, cfg.ckptEvery, after)
	eb, _, okb := windowExcess(base.steps, cfg.warmup, cfg.ckptEvery, after)
	if !okw || !okb {
		return attribution{after: after, cut: cut}
	}
	return attribution{q: (ew - eb) * share, after: after, ok: true, cut: cut}
}

// persistReport prints a column per concurrency beside the runs without
// the durable tier; the durable tier's own figures are the last round's
// unless said.
func (b *bench) persistReport(v *variant, warm *runResult, bases []*runResult, runs [][]*runResult) {
	cfg := &b.cfg
	const w = 24
	var sb strings.Builder
	fmt.Fprintf(&sb, "\ndurable tier: dptrain protected (full, %s), %s, a base of %s per rank every %d steps, %d timed steps per run, %d rounds\n",
		cfg.redundancies[0], v.name, mib(float64(cfg.stateBytes())), cfg.ckptEvery, cfg.steps, cfg.ckptRounds)
	row := func(label string, f func(i int, rs []*runResult) string) {
		fmt.Fprintf(&sb, "%-50s", label)
		for i, rs := range runs {
			fmt.Fprintf(&sb, " %*s", w, f(i, rs))
		}
		sb.WriteByte('\n')
	}
	last := func(rs []*runResult) *durableTable { return rs[len(rs)-1].durable }
	each := func(rs []*runResult, f func(r *runResult) string) string {
		s := make([]string, len(rs))
		for i, r := range rs {
			s[i] = f(r)
		}
		return strings.Join(s, " ")
	}
	pct := func(qs []float64) string {
		s := make([]string, len(qs))
		for i, q := range qs {
			s[i] = fmt.Sprintf("%+.1f", 100*q)
		}
		return strings.Join(s, " ") + " %"
	}
	spread := func(qs []float64) string {
		return fmt.Sprintf("%+.1f%% (%+.1f..%+.1f)", 100*medianF(qs), 100*slices.Min(qs), 100*slices.Max(qs))
	}
	overheads := func(rs []*runResult) []float64 {
		qs, _ := ratios(rs, bases)
		for i := range qs {
			qs[i]--
		}
		return qs
	}
	attributions := func(rs []*runResult) []attribution {
		as := make([]attribution, len(rs))
		for i, r := range rs {
			as[i] = b.attributed(r, bases[i])
		}
		return as
	}
	// attributed returns the rounds' B that can be judged, and whether
	// any round's window was cut short of its save's write time.
	attributed := func(rs []*runResult) (qs []float64, cut bool) {
		for _, a := range attributions(rs) {
			if a.ok {
				qs = append(qs, a.q)
			}
			cut = cut || a.cut
		}
		return qs, cut
	}
	waits := func(rs []*runResult) []float64 {
		// The stages' wait for the slot (rank mean), counted over the
		// whole run, over the time of the same steps: from step 0's line
		// to the last's (warm-up included; no stage before step 0's
		// commit waits for a save).
		qs := make([]float64, len(rs))
		for i, r := range rs {
			qs[i] = float64(r.durable.holdTotal) / float64(r.span)
		}
		return qs
	}
	row("--ckpt-concurrency", func(i int, _ []*runResult) string { return cfg.ckpt[i] })
	row("step without --ckpt-dir: mean, each round", func(int, []*runResult) string {
		return each(bases, func(r *runResult) string { return fmt.Sprintf("%.0f", float64(mean(r.steps))/1e6) }) + " ms"
	})
	row("step with it: mean, each round", func(_ int, rs []*runResult) string {
		return each(rs, func(r *runResult) string { return fmt.Sprintf("%.0f", float64(mean(r.steps))/1e6) }) + " ms"
	})
	row("A. with / without - 1, each round (paired)", func(_ int, rs []*runResult) string { return pct(overheads(rs)) })
	row("   median (min..max)", func(_ int, rs []*runResult) string { return spread(overheads(rs)) })
	row("B. steps after a base vs others, each round", func(_ int, rs []*runResult) string {
		return each(rs, func(r *runResult) string {
			a := b.attributed(r, bases[slices.Index(rs, r)])
			if !a.ok {
				return "n/a"
			}
			return fmt.Sprintf("%+.1f", 100*a.q)
		}) + " %"
	})
	row("   median (min..max)", func(_ int, rs []*runResult) string {
		if qs, _ := attributed(rs); len(qs) > 0 {
			return spread(qs)
		}
		return "cannot judge"
	})
	row("   window: steps after a base, each round", func(_ int, rs []*runResult) string {
		return each(rs, func(r *runResult) string {
			a := b.attributed(r, bases[slices.Index(rs, r)])
			if a.cut {
				return fmt.Sprintf("%d(cut)", a.after)
			}
			return strconv.Itoa(a.after)
		})
	})
	row("C. stages' wait / run's step time, each round", func(_ int, rs []*runResult) string { return pct(waits(rs)) })
	row("slowest step, without / with (last round)", func(_ int, rs []*runResult) string {
		return fmt.Sprintf("%.0f / %.0f ms", float64(slices.Max(bases[len(bases)-1].steps))/1e6, float64(slices.Max(rs[len(rs)-1].steps))/1e6)
	})
	row("bases saved / skipped / failed (all ranks)", func(_ int, rs []*runResult) string {
		d := last(rs)
		return fmt.Sprintf("%d / %d / %d", d.saves, d.skipped, d.failed)
	})
	row("  write time per base (rank mean)", func(_ int, rs []*runResult) string { return msf(last(rs).writePerSave) })
	row("  MB/s per rank (mean)", func(_ int, rs []*runResult) string { return fmt.Sprintf("%.0f", last(rs).mbps) })
	row("  stages' wait for a save (rank mean, total)", func(_ int, rs []*runResult) string {
		return each(rs, func(r *runResult) string { return fmt.Sprintf("%.0f", float64(r.durable.holdTotal)/1e6) }) + " ms"
	})
	row("  N at the end, by rank", func(_ int, rs []*runResult) string {
		s := make([]string, len(last(rs).n))
		for i, n := range last(rs).n {
			s[i] = strconv.Itoa(n)
		}
		return strings.Join(s, ",")
	})
	row("  committed step / last step", func(_ int, rs []*runResult) string {
		return fmt.Sprintf("%d / %d", last(rs).committed, cfg.warmup+cfg.steps-1)
	})
	row("  footprint", func(_ int, rs []*runResult) string { return last(rs).footprint })
	if warm != nil {
		fmt.Fprintf(&sb, "warm-up run (--ckpt-concurrency %s, not counted): step mean %s, write time per base %s, stages' wait %s\n",
			cfg.ckpt[0], msf(mean(warm.steps)), msf(warm.durable.writePerSave), msf(warm.durable.holdTotal))
	}
	fmt.Fprintf(&sb, "A is the whole run's step time over the run without the durable tier of the same round: it carries the drift between runs on a shared box.\n"+
		"B is measured within each run: the mean of the steps after each base (its window: as many as the save's write time per base spans, plus one,\n"+
		"at most -ckpt-every - 1; \"cut\" when the write outlasts that) over the other steps', less the same figure of the run without the durable tier of\n"+
		"the round, times the windows' share of the steps (n/a: no whole window or no other step to compare); C is the part of the run's step time,\n"+
		"warm-up included, the stages spent waiting for a save to read its slot.\n")
	verdict := func(q float64) string {
		if q > persistTarget {
			return "MISSED"
		}
		return "met"
	}
	for i, rs := range runs {
		a := medianF(overheads(rs))
		bs := "cannot judge (no round with a whole window and other steps)"
		if qs, cut := attributed(rs); len(qs) > 0 {
			bq := medianF(qs)
			bs = fmt.Sprintf("%+.1f%% %s", 100*bq, verdict(bq))
			if cut {
				bs += " (a window shorter than the save's write time: B may understate)"
			}
		}
		fmt.Fprintf(&sb, "target: step-time overhead <= %.0f%% (PCcheck, a checkpoint every 10 steps), %s, --ckpt-concurrency %s: A (paired, median of %d) %+.1f%% %s; B (within runs, median) %s\n",
			100*persistTarget, v.name, cfg.ckpt[i], len(rs), 100*a, verdict(a), bs)
	}
	fmt.Fprint(b.out, sb.String())
}
