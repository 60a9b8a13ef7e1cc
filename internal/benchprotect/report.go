package main

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"
)

// overheadTarget is the target for the step-time overhead of
// protection at device time (DEADPOOL: none measurable; TierCheck 10-15%;
// PCcheck 3% at one checkpoint per 10 steps).
const overheadTarget = 0.01

func mean(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	var s time.Duration
	for _, x := range xs {
		s += x
	}
	return s / time.Duration(len(xs))
}

func median(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func msf(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// ratioStr prints a/b as "1.034 (+3.4%)".
func ratioStr(a, b time.Duration) string {
	if b <= 0 {
		return "-"
	}
	q := float64(a) / float64(b)
	return fmt.Sprintf("%.3f (%+.1f%%)", q, 100*(q-1))
}

// services sums the per-rank table: the overwrite-rule wait per staged
// step, the mean replication time per replicated step, the mean of the
// ranks' replication throughputs, and the smallest replicated step.
func (t *protTable) services() (ruleWait, repl time.Duration, mbps float64, minRepl int64) {
	var wait time.Duration
	var stages int64
	var nRepl int
	minRepl = -1
	for i, r := range t.rows {
		wait += r.ruleWait
		stages += r.stages
		if r.replPerStep > 0 {
			repl += r.replPerStep
			mbps += r.replMBps
			nRepl++
		}
		if i == 0 || r.replicated < minRepl {
			minRepl = r.replicated
		}
	}
	if stages > 0 {
		ruleWait = wait / time.Duration(stages)
	}
	if nRepl > 0 {
		repl /= time.Duration(nRepl)
		mbps /= float64(nRepl)
	}
	return ruleWait, repl, mbps, minRepl
}

// column is one protected run of the report, beside its variant's run
// without protection.
type column struct {
	v *variant
	m *modeRun
}

// full returns the variant's run in full mode, or nil.
func (v *variant) full() *runResult {
	for _, m := range v.prot {
		if m.mode == "full" {
			return m.r
		}
	}
	return nil
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// report prints one column per variant and protect mode.
func (b *bench) report(vs []*variant, hostMBps, loMBps float64) {
	cfg := &b.cfg
	var cols []column
	for _, v := range vs {
		for _, m := range v.prot {
			cols = append(cols, column{v, m})
		}
	}
	const w = 26
	var sb strings.Builder
	row := func(label string, f func(c column) string) {
		fmt.Fprintf(&sb, "%-46s", label)
		for _, c := range cols {
			fmt.Fprintf(&sb, " %*s", w, f(c))
		}
		sb.WriteByte('\n')
	}
	prot := func(f func(c *clientStats, t *protTable) string) func(c column) string {
		return func(c column) string { return f(c.m.r.client, c.m.r.table) }
	}
	fmt.Fprintln(&sb)
	row("", func(c column) string { return c.v.name })
	row("gorun --protect-mode", func(c column) string {
		if c.m.mode == "diff" {
			// The gradient source its holders used at the end: "local
			// peer" where dptrain declares a reduced gradient (no
			// --device-grad), the network otherwise.
			return "diff (" + sourceOf(c.m.r.sources) + ")"
		}
		return c.m.mode
	})
	row("gorun --redundancy", func(c column) string { return c.m.red.String() })
	row("step, no protection: mean", func(c column) string { return msf(mean(c.v.base.steps)) })
	row("step, protected: mean", func(c column) string { return msf(mean(c.m.r.steps)) })
	row("  protected / unprotected, means", func(c column) string { return ratioStr(mean(c.m.r.steps), mean(c.v.base.steps)) })
	row("  protected / unprotected, medians", func(c column) string {
		return ratioStr(median(c.m.r.steps), median(c.v.base.steps))
	})
	row("  steady state: last half of the steps, mean", func(c column) string { return msf(mean(lastHalf(c.m.r.steps))) })
	row("    / unprotected, last half too", func(c column) string {
		return ratioStr(mean(lastHalf(c.m.r.steps)), mean(lastHalf(c.v.base.steps)))
	})
	row("  start-up: first half's time beyond unprotected", func(c column) string {
		first := c.m.r.steps[:len(c.m.r.steps)-len(lastHalf(c.m.r.steps))]
		return fmt.Sprintf("%.2f s", (sum(first) - time.Duration(len(first))*mean(c.v.base.steps)).Seconds())
	})
	row("  step after a base: excess over the others", func(c column) string {
		if c.m.mode != "diff" {
			return "-"
		}
		ex, n, ok := afterBaseExcess(c.m.r.steps, cfg.warmup, cfg.baseEvery)
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%s (%d)", msf(ex), n)
	})
	spread := func(r *runResult) string {
		return fmt.Sprintf("%.0f-%.0f ms", float64(slices.Min(r.steps))/1e6, float64(slices.Max(r.steps))/1e6)
	}
	row("  step range, no protection", func(c column) string { return spread(c.v.base) })
	row("  step range, protected", func(c column) string { return spread(c.m.r) })
	row("  timed steps, no / with protection", func(c column) string {
		return fmt.Sprintf("%d / %d", len(c.v.base.steps), len(c.m.r.steps))
	})
	row("  dptrain's ms/step (all steps), no / with", func(c column) string {
		return fmt.Sprintf("%.0f / %.0f", c.v.base.msStep, c.m.r.msStep)
	})
	row("  device time / unprotected step", func(c column) string {
		if c.v.deviceMs == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(time.Duration(c.v.deviceMs)*time.Millisecond)/float64(mean(c.v.base.steps)))
	})
	row("bytes on the wire per step (all hosts' veths)", func(c column) string { return mib(c.m.r.wire) })
	row("  without protection", func(c column) string { return mib(c.v.base.wire) })
	row("  protected / full mode's", func(c column) string {
		if f := c.v.full(); f != nil && f.wire > 0 {
			return fmt.Sprintf("%.3f", c.m.r.wire/f.wire)
		}
		return "-"
	})
	row("per step of protection (rank 0's client):", func(column) string { return "" })
	row("  staging copy into the shm slot", prot(func(c *clientStats, _ *protTable) string { return msf(c.copy) }))
	row("  commit (service's CRC32C)", prot(func(c *clientStats, _ *protTable) string { return msf(c.commit) }))
	row("  wait at the overwrite rule", prot(func(c *clientStats, _ *protTable) string { return msf(c.ruleWait) }))
	row("  trainer blocked in Wait", prot(func(c *clientStats, _ *protTable) string { return msf(c.wait) }))
	row("per step, mean of the ranks' services:", func(column) string { return "" })
	row("  wait at the overwrite rule", prot(func(_ *clientStats, t *protTable) string {
		rw, _, _, _ := t.services()
		return msf(rw)
	}))
	row("  replication to the holders (parity hosts)", prot(func(_ *clientStats, t *protTable) string {
		_, repl, _, _ := t.services()
		return msf(repl)
	}))
	row("replication MB/s per rank (mean)", prot(func(_ *clientStats, t *protTable) string {
		_, _, mbps, _ := t.services()
		return fmt.Sprintf("%.0f", mbps)
	}))
	row(fmt.Sprintf("  / TCP host 0 -> 1 (%.0f MB/s)", hostMBps), prot(func(_ *clientStats, t *protTable) string {
		_, _, mbps, _ := t.services()
		return fmt.Sprintf("%.3f", mbps/hostMBps)
	}))
	row(fmt.Sprintf("  / TCP 127.0.0.1 (%.0f MB/s)", loMBps), prot(func(_ *clientStats, t *protTable) string {
		_, _, mbps, _ := t.services()
		return fmt.Sprintf("%.3f", mbps/loMBps)
	}))
	row("G / lowest replicated step / last step", func(c column) string {
		_, _, _, minRepl := c.m.r.table.services()
		return fmt.Sprintf("%d / %d / %d", c.m.r.table.g, minRepl, cfg.warmup+cfg.timedSteps(c.v, c.m.mode)-1)
	})
	fmt.Fprint(b.out, sb.String())

	dev := vs[0]
	fmt.Fprintln(b.out)
	for _, m := range dev.prot {
		// Judged in steady state: what every step of a long job costs.
		// The protection's start-up (the first touch of the memory its
		// buffers, bases and logs hold, the first bases sent whole) is a
		// one-time cost, printed beside it, and in the mean of all steps.
		steady := lastHalf(m.r.steps)
		q := float64(mean(steady))/float64(mean(lastHalf(dev.base.steps))) - 1
		all := float64(mean(m.r.steps))/float64(mean(dev.base.steps)) - 1
		fmt.Fprintf(b.out, "target: --protect-mode %s --redundancy %s overhead <= %.0f%% at %s, steady state (last %d of %d timed steps against the last half of the unprotected run, ratio of means): %s (%+.1f%%; all %d steps, start-up included: %+.1f%%)\n",
			m.mode, m.red, 100*overheadTarget, dev.name, len(steady), len(m.r.steps), verdict(q <= overheadTarget), 100*q, len(m.r.steps), 100*all)
	}
	if f := dev.full(); f != nil && f.wire > 0 {
		for _, m := range dev.prot {
			if m.mode == "diff" {
				q := m.r.wire / f.wire
				fmt.Fprintf(b.out, "target: diff's bytes on the wire per step (bases included: %d timed steps, a base every %d) <= %.2f x full's: %s (%.3f)\n",
					len(m.r.steps), cfg.baseEvery, wireTarget, verdict(q <= wireTarget), q)
			}
		}
	}
	// The local-peer source: the CPU variant's diff run (dptrain's
	// gradients are all-reduced there, so every holder's host has them).
	for _, v := range vs[1:] {
		f := v.full()
		for _, m := range v.prot {
			if m.mode != "diff" || f == nil {
				continue
			}
			// The all-reduce's bytes are on the wire here too: the
			// protection's are those beyond the unprotected run's.
			d, fu := m.r.wire-v.base.wire, f.wire-v.base.wire
			if fu <= 0 {
				continue
			}
			q := d / fu
			fmt.Fprintf(b.out, "target: diff (%s)'s bytes on the wire per step at %s, beyond the unprotected run's (bases included) <= %.2f x full's: %s (%.3f: %s against %s)\n",
				sourceOf(m.r.sources), v.name, localWireTarget, verdict(q <= localWireTarget && sourceOf(m.r.sources) == "local peer"), q, mib(d), mib(fu))
		}
	}
	if frac := float64(time.Duration(dev.deviceMs)*time.Millisecond) / float64(mean(dev.base.steps)); frac < 0.5 {
		fmt.Fprintf(b.out, "note: the %d ms of device time are only %.0f%% of the unprotected step: dptrain's host CPU work dominates it (every rank\n"+
			"  computes the gradient of all %d parameters for its samples and all-reduces 8 bytes per parameter), so with %d ranks\n"+
			"  on %d CPUs the protection's copy, CRC and replication compete with the training for the CPUs, unlike on a GPU\n"+
			"  node whose host CPU idles during device time.\n",
			dev.deviceMs, 100*frac, cfg.params(), cfg.ranks, runtime.NumCPU())
	}
	// What the hosts' link allows at best: every rank's state crosses it
	// once per step per replica.
	perStep := float64(cfg.ranks) * float64(12*(cfg.params()/int64(cfg.ranks)))
	bound := time.Duration(perStep / (hostMBps * 1e6) * float64(time.Second))
	fmt.Fprintf(b.out, "bound: replicating every rank's state each step moves %.0f MiB across the hosts' link: %v at the single-stream\n"+
		"  TCP rate between the namespaces, against an unprotected step of %v (a lossless differential is a third of it:\n"+
		"  one float32 gradient per parameter against the master weight and two moments)\n",
		perStep/(1<<20), bound.Round(time.Millisecond), mean(dev.base.steps).Round(time.Millisecond))
	if len(vs) > 1 {
		fmt.Fprintf(b.out, "%s: no target (CPU arithmetic on every rank: measures CPU contention, not the design)\n", vs[1].name)
	}
}

// wireTarget is the target for diff mode's bytes on the wire per
// step, bases included, against full mode's (network gradient source).
const wireTarget = 0.4

// localWireTarget is the target for diff mode's bytes on the wire
// per step with the local-peer gradient source, against full mode's.
const localWireTarget = 0.05

// sourceOf names the gradient source of a diff run's holders from -v's
// per-rank sources: one they all used, else "mixed" ("?" if unknown).
func sourceOf(srcs []string) string {
	if len(srcs) == 0 {
		return "?"
	}
	for _, s := range srcs[1:] {
		if s != srcs[0] {
			return "mixed"
		}
	}
	return strings.ReplaceAll(srcs[0], "-", " ")
}

// lastHalf returns the last half of a run's step times (the larger half
// of an odd count): the steady state, after the protection's start-up.
func lastHalf(steps []time.Duration) []time.Duration { return steps[len(steps)/2:] }

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// afterBaseExcess returns how much longer the step after a base is than
// the others, in a diff run whose timed steps (steps[i] is step first+i)
// have a base every every steps from step 0: the median of the steps s
// with s mod every = 1 less the median of the rest, with how many steps
// after a base there were; ok false when there are none, or nothing else.
func afterBaseExcess(steps []time.Duration, first, every int) (ex time.Duration, n int, ok bool) {
	if every < 2 {
		return 0, 0, false
	}
	var after, rest []time.Duration
	for i, d := range steps {
		if (first+i)%every == 1 {
			after = append(after, d)
		} else {
			rest = append(rest, d)
		}
	}
	if len(after) == 0 || len(rest) == 0 {
		return 0, 0, false
	}
	return median(after) - median(rest), len(after), true
}
