package main

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/gorun/gorun/internal/plan"
)

// human writes seconds as a rounded duration.
func human(s float64) string {
	if math.IsInf(s, 0) || math.IsNaN(s) || s > 1e12 {
		return fmt.Sprint(s)
	}
	d := time.Duration(s * float64(time.Second))
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// writePlanReport writes the readable report of gorun plan.
func writePlanReport(w io.Writer, out planOutput) {
	r := out.Result
	fmt.Fprintln(w, "Inputs:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, in := range out.Inputs {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", in.Name, in.Value, in.Source)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nSystem MTTF (MTTF_sys = MTTF/hosts): %s; expected failures over the job: %.3g\n", human(r.MTTFSys), r.Failures)
	fmt.Fprintf(w, "Per step, in-memory protection takes %s; a durable checkpoint takes T_w = %s to write\n\n", human(r.ProtectTime), human(r.WriteTime))

	fmt.Fprintln(w, "Expected cost per failure (DEADPOOL §IV):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\tcheckpoint-restart\thost replacement\t\n")
	row := func(name string, f func(plan.Strategy) string) {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", name, f(r.Checkpoint), f(r.HostReplace))
	}
	row("overhead (per failure)", func(s plan.Strategy) string { return human(s.Cost.Overhead) })
	row("restart / replace", func(s plan.Strategy) string { return human(s.Cost.Recover) })
	row("restore state", func(s plan.Strategy) string { return human(s.Cost.Restore) })
	row("replay", func(s plan.Strategy) string { return human(s.Cost.Replay) })
	row("E[C]", func(s plan.Strategy) string { return human(s.CostTotal) })
	row("efficiency η", func(s plan.Strategy) string { return fmt.Sprintf("%.4f", s.Efficiency) })
	if r.HostReplace.NoSpare > 0 {
		fmt.Fprintf(tw, "  failures finding no spare (expected)\t\t%.3g of %.3g\t\n", r.HostReplace.NoSpare, r.Failures)
		row("E[C], those at checkpoint-restart's", func(s plan.Strategy) string { return human(s.CostBlended) })
		row("efficiency η, the same", func(s plan.Strategy) string { return fmt.Sprintf("%.4f", s.EfficiencyBlended) })
	}
	row("expected lost over the job", func(s plan.Strategy) string { return human(s.ExpectedLost) })
	src := "exponential failures"
	if r.MonteCarlo.FromTrace {
		src = "the trace's failures; only where checkpoints and steps fall varies"
	}
	fmt.Fprintf(tw, "  Monte Carlo (%d runs, seed %d, %s):\t\t\t\n", r.MonteCarlo.Runs, r.MonteCarlo.Seed, src)
	row("  lost, mean", func(s plan.Strategy) string { return human(s.MonteCarlo.Mean) })
	row("  lost, p50", func(s plan.Strategy) string { return human(s.MonteCarlo.P50) })
	row("  lost, p99", func(s plan.Strategy) string { return human(s.MonteCarlo.P99) })
	tw.Flush()
	if fb := r.HostReplace.MonteCarlo.Fallbacks; fb > 0 {
		fmt.Fprintf(w, "  (host replacement ran out of spares: %.3g failures per run paid checkpoint-restart)\n", fb)
	}

	fmt.Fprintf(w, "\nDurable checkpoints: PCcheck's f* = ceil(T_w/(N·q·t)) = %d steps; the costs above are at %d\n", r.IntervalFStar, r.Interval)
	switch {
	case r.StallFraction > overheadOf(out):
		fmt.Fprintf(w, "  warning: at %d steps T_w > N·K·t: checkpointing stalls training by %.3g%% of its time\n", r.Interval, 100*r.StallFraction)
	case r.StallFraction > 0:
		fmt.Fprintf(w, "  at %d steps T_w > N·K·t: checkpointing stalls training by %.3g%% of its time, within --ckpt-overhead\n", r.Interval, 100*r.StallFraction)
	}
	fmt.Fprintf(w, "Redundancy: %s\n", r.Survives)
	fmt.Fprintf(w, "  loss bound (over %d units; window %s = max(step, replace + restore), while a lost host's state has fewer copies):\n", r.LossUnits, human(r.LossWindow))
	fmt.Fprintf(w, "  %.3g per window, %.3g over the job\n", r.LossPerWindow, r.LossPerJob)
	if r.HostReplace.NoSpare > 0 {
		fmt.Fprintf(w, "  (once spares run out a lost host's state stays exposed until a checkpoint-restart: not bounded here)\n")
	}
	fmt.Fprintf(w, "Spares: %d needed so that running out is less likely than %g; with the %d given: P(run out) = %.3g\n",
		r.SparesNeeded, r.SpareRisk, spareCount(out), r.PRunOut)
}

func spareCount(out planOutput) int {
	for _, in := range out.Inputs {
		if in.Name == "spares" {
			return int(in.Raw)
		}
	}
	return 0
}

func overheadOf(out planOutput) float64 {
	for _, in := range out.Inputs {
		if in.Name == "ckpt-overhead" {
			return in.Raw
		}
	}
	return 0
}
