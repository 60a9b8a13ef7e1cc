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

// persist runs the durable tier's benchmark: the device-time variant,
// protected in full mode, without --ckpt-dir and then with it at each
// concurrency of -ckpt, -ckpt-rounds times in turn (the box's noise is
// larger than the figure measured: each round's runs are compared with
// the run without the durable tier of the same round). A first run with
// the durable tier, reported apart, warms the file system up: on a
// thin-provisioned virtual disk the first writes to blocks the file
// system never used are several times slower than the next ones.
func (b *bench) persist(ctx context.Context) error {
	cfg := &b.cfg
	red := cfg.redundancies[0]
	v := &variant{name: fmt.Sprintf("device-ms %d", cfg.deviceMs), deviceMs: cfg.deviceMs, compute: 1}
	fmt.Fprintf(b.log, "benchprotect: warm-up run with the durable tier (not counted)\n")
	warm, err := b.runOnce(ctx, v, "full", red, cfg.ckpt[0])
	if err != nil {
		return err
	}
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

// persistReport prints a column per concurrency beside the runs without
// the durable tier; the durable tier's own figures are the last round's.
func (b *bench) persistReport(v *variant, warm *runResult, bases []*runResult, runs [][]*runResult) {
	cfg := &b.cfg
	const w = 18
	var sb strings.Builder
	fmt.Fprintf(&sb, "\ndurable tier: dptrain protected (full, %s), %s, a base of %s per rank every %d steps, %d timed steps per run, %d rounds\n",
		cfg.redundancies[0], v.name, mib(float64(cfg.stateBytes())), cfg.ckptEvery, cfg.steps, cfg.ckptRounds)
	row := func(label string, f func(i int, rs []*runResult) string) {
		fmt.Fprintf(&sb, "%-46s", label)
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
	row("--ckpt-concurrency", func(i int, _ []*runResult) string { return cfg.ckpt[i] })
	row("step without --ckpt-dir: mean, each round", func(int, []*runResult) string {
		return each(bases, func(r *runResult) string { return fmt.Sprintf("%.0f", float64(mean(r.steps))/1e6) }) + " ms"
	})
	row("step with it: mean, each round", func(_ int, rs []*runResult) string {
		return each(rs, func(r *runResult) string { return fmt.Sprintf("%.0f", float64(mean(r.steps))/1e6) }) + " ms"
	})
	row("  with / without, each round", func(_ int, rs []*runResult) string {
		qs, _ := ratios(rs, bases)
		s := make([]string, len(qs))
		for i, q := range qs {
			s[i] = fmt.Sprintf("%.3f", q)
		}
		return strings.Join(s, " ")
	})
	row("  with / without, mean of the rounds", func(_ int, rs []*runResult) string {
		_, q := ratios(rs, bases)
		return fmt.Sprintf("%.3f (%+.1f%%)", q, 100*(q-1))
	})
	row("  medians, last round", func(_ int, rs []*runResult) string {
		return ratioStr(median(rs[len(rs)-1].steps), median(bases[len(bases)-1].steps))
	})
	row("  slowest step, without / with (last round)", func(_ int, rs []*runResult) string {
		return fmt.Sprintf("%.0f / %.0f ms", float64(slices.Max(bases[len(bases)-1].steps))/1e6, float64(slices.Max(rs[len(rs)-1].steps))/1e6)
	})
	row("bases saved / skipped / failed (all ranks)", func(_ int, rs []*runResult) string {
		d := last(rs)
		return fmt.Sprintf("%d / %d / %d", d.saves, d.skipped, d.failed)
	})
	row("  write time per base (rank mean)", func(_ int, rs []*runResult) string { return msf(last(rs).writePerSave) })
	row("  MB/s per rank (mean)", func(_ int, rs []*runResult) string { return fmt.Sprintf("%.0f", last(rs).mbps) })
	row("  stages' wait for a save (rank mean, total)", func(_ int, rs []*runResult) string { return msf(last(rs).holdTotal) })
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
	fmt.Fprintf(&sb, "warm-up run (--ckpt-concurrency %s, not counted): step mean %s, write time per base %s, stages' wait %s\n",
		cfg.ckpt[0], msf(mean(warm.steps)), msf(warm.durable.writePerSave), msf(warm.durable.holdTotal))
	for i, rs := range runs {
		_, q := ratios(rs, bases)
		verdict := "met"
		if q-1 > persistTarget {
			verdict = "MISSED"
		}
		fmt.Fprintf(&sb, "target: step-time overhead <= %.0f%% (PCcheck, a checkpoint every 10 steps): --ckpt-concurrency %s %+.1f%%, %s\n",
			100*persistTarget, cfg.ckpt[i], 100*(q-1), verdict)
	}
	fmt.Fprint(b.out, sb.String())
}
