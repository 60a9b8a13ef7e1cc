package jobstatus

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Render writes s as the table `gorun status` prints: the job, its
// hosts (per host its ranks and the tiers' min/max steps), the spares
// left and the recent failures; then every rank's row if s has them and
// ranks is true.
func Render(w io.Writer, s *Snapshot, ranks bool) error {
	var b strings.Builder
	up := s.Now.Sub(s.Start).Round(time.Second)
	fmt.Fprintf(&b, "job %s  %s  pid %d  up %s  (started %s)\n", s.Job, s.State, s.PID, up, s.Start.Format(time.RFC3339))
	fmt.Fprintf(&b, "program: %s\n", strings.Join(append([]string{s.Prog}, s.Args...), " "))
	fmt.Fprintf(&b, "np %d  epoch %d  generation %d  G %s  D %s\n", s.NP, s.Epoch, s.Gen, step(s.G), stepPtr(s.D))
	fmt.Fprintf(&b, "redundancy %s  protect %s  recovery %s\n", s.Redundancy, s.Protect, s.Recovery)
	if s.MetricsURL != "" {
		fmt.Fprintf(&b, "metrics: %s\n", s.MetricsURL)
	}
	b.WriteByte('\n')
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tADDR\tSTATE\tRANKS\tCOMMITTED\tREPLICATED\tDURABLE")
	for _, h := range s.Hosts {
		rs := h.Ranks
		if rs == "" {
			rs = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, dash(h.Addr), h.State, rs, rangeText(h.Committed), rangeText(h.Replicated), rangeText(h.Durable))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	spares := "none"
	if len(s.Spares) > 0 {
		spares = strings.Join(s.Spares, ", ")
	}
	fmt.Fprintf(&b, "\nspares left: %d (%s)\n", len(s.Spares), spares)
	if len(s.Failures) == 0 {
		b.WriteString("failures: none\n")
	} else {
		b.WriteString("\nfailures:\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "EPOCH\tDETECTED\tCLASS\tDECISION\tHOST\tRANKS\tMOVED TO\tRECOVERY\tWHY")
		for _, f := range s.Failures {
			epoch := "-"
			if f.Epoch > 0 {
				epoch = strconv.FormatUint(f.Epoch, 10)
			}
			rec := "under way"
			switch {
			case f.RecoverySeconds != nil:
				rec = (time.Duration(*f.RecoverySeconds * float64(time.Second))).Round(time.Millisecond).String()
			case f.Superseded:
				rec = "superseded"
			case f.Done:
				rec = "-"
			case f.Decision == "wait" && f.Epoch == 0:
				rec = "waiting"
			}
			if f.Superseded && f.RecoverySeconds != nil {
				rec += " (superseded)"
			}
			// The ranks moved, or the failed rank.
			rs := f.Ranks
			if rs == "" && f.Rank >= 0 && f.Host != "" {
				rs = strconv.Itoa(f.Rank)
			}
			with := f.With
			if with != "" && f.Spare {
				with += " (spare)"
			}
			why := f.Why
			if why == "" {
				why = f.Cause
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", epoch, f.At.Format("15:04:05.000"), dash(f.Class), dash(f.Decision), dash(f.Host), dash(rs), dash(with), rec, why)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if ranks && len(s.Ranks) > 0 {
		b.WriteByte('\n')
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "RANK\tHOST\tCOMMITTED\tREPLICATED\tDURABLE\tRULE WAIT\t")
		for _, r := range s.Ranks {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Rank, r.Host, step(r.Committed), step(r.Replicated), step(r.Durable),
				time.Duration(r.WaitSeconds*float64(time.Second)).Round(time.Millisecond))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func step(s int64) string {
	if s < 0 {
		return "-"
	}
	return strconv.FormatInt(s, 10)
}

func stepPtr(s *int64) string {
	if s == nil {
		return "-"
	}
	return step(*s)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func rangeText(r *Range) string {
	switch {
	case r == nil:
		return "-"
	case r.Min == r.Max:
		return step(r.Min)
	}
	return step(r.Min) + ".." + step(r.Max)
}
