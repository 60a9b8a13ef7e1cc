package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is the summary of one fault kind.
type Row struct {
	Kind           Kind    `json:"kind"`
	Injected       int     `json:"injected"`
	Within         int     `json:"within"`
	Survived       int     `json:"survived_equal_hash"`
	Beyond         int     `json:"beyond"`
	Reported       int     `json:"reported"`
	SurvivedBeyond int     `json:"survived_beyond"`
	Refused        int     `json:"refused"`
	NotInjected    int     `json:"not_injected"`
	NotLanded      int     `json:"not_landed"`
	NotRun         int     `json:"not_run"`       // the faulty job never ran (Run.NotRun)
	InjectFailed   int     `json:"inject_failed"` // injecting failed (Run.InjectErr)
	Skipped        int     `json:"skipped"`
	Failed         int     `json:"failed"`
	KnownDefects   int     `json:"known_defects"`
	Leaks          int     `json:"leaks"`
	Cleaned        int     `json:"removed_by_gorun_clean"` // leftovers of jobs every agent (or every host with ranks) of which was SIGKILLed
	RecoveryMedian float64 `json:"recovery_median_s"`      // detected → resumed, -1: none
	RecoveryMax    float64 `json:"recovery_max_s"`
	DetectMedian   float64 `json:"detect_median_s"` // fault → detected, -1: none
}

// Summary is a whole suite's result.
type Summary struct {
	Seed            uint64    `json:"seed"`
	Kinds           string    `json:"kinds,omitempty"` // the fault kinds drawn, "" for all
	Runs            int       `json:"runs"`
	Rows            []Row     `json:"rows"`
	Total           Row       `json:"total"`
	RunMedian       float64   `json:"run_median_s"` // wall time per run, reference included when it ran
	TotalTime       float64   `json:"total_s"`
	Mismatches      int       `json:"precheck_mismatches"`
	FailedRuns      []int     `json:"failed_runs"`
	KnownDefectRuns []int     `json:"known_defect_runs,omitempty"`
	RunsRecords     []Run     `json:"run_records"`
	Verdicts        []Verdict `json:"verdicts"` // Verdicts[i] is RunsRecords[i]'s
}

// Summarize tallies runs with their verdicts.
func Summarize(seed uint64, kinds string, runs []Run, verdicts []Verdict, total time.Duration) Summary {
	s := Summary{Seed: seed, Kinds: kinds, Runs: len(runs), TotalTime: total.Seconds(), RunsRecords: runs, Verdicts: verdicts, FailedRuns: []int{}}
	rows := map[Kind]*Row{}
	for _, k := range Kinds {
		rows[k] = &Row{Kind: k}
	}
	rec := map[Kind][]float64{}
	det := map[Kind][]float64{}
	var times []float64
	for i, r := range runs {
		v := verdicts[i]
		row := rows[r.Fault.Kind]
		times = append(times, r.Seconds+r.ReferenceSeconds)
		if r.Mismatch != "" {
			s.Mismatches++
		}
		switch v.Class {
		case Failed:
			s.FailedRuns = append(s.FailedRuns, r.Index)
			row.Failed++
		case KnownDefect:
			s.KnownDefectRuns = append(s.KnownDefectRuns, r.Index)
			row.KnownDefects++
		}
		row.Leaks += len(r.Leaks)
		row.Cleaned += len(r.Cleaned)
		switch {
		case r.Skipped != "":
			row.Skipped++
			continue
		case r.Refused:
			row.Refused++
			continue
		case r.NotRun != "":
			row.NotRun++
			continue
		case r.InjectErr != "":
			row.InjectFailed++
			continue
		case r.NotInjected != "":
			row.NotInjected++
			continue
		case r.NotLanded:
			row.NotLanded++
			continue
		}
		row.Injected++
		if r.Within {
			row.Within++
			if v.Class == Survived {
				row.Survived++
			}
		} else {
			row.Beyond++
			switch v.Class {
			case Reported:
				row.Reported++
			case SurvivedBeyond:
				row.SurvivedBeyond++
			}
		}
		if r.DetectToResume >= 0 {
			rec[r.Fault.Kind] = append(rec[r.Fault.Kind], r.DetectToResume)
		}
		if r.FaultToDetect >= 0 {
			det[r.Fault.Kind] = append(det[r.Fault.Kind], r.FaultToDetect)
		}
	}
	var allRec, allDet []float64
	for _, k := range Kinds {
		row := rows[k]
		row.RecoveryMedian, row.RecoveryMax = median(rec[k]), maxOf(rec[k])
		row.DetectMedian = median(det[k])
		allRec, allDet = append(allRec, rec[k]...), append(allDet, det[k]...)
		s.Rows = append(s.Rows, *row)
		t := &s.Total
		t.Injected += row.Injected
		t.Within += row.Within
		t.Survived += row.Survived
		t.Beyond += row.Beyond
		t.Reported += row.Reported
		t.SurvivedBeyond += row.SurvivedBeyond
		t.Refused += row.Refused
		t.NotInjected += row.NotInjected
		t.NotLanded += row.NotLanded
		t.NotRun += row.NotRun
		t.InjectFailed += row.InjectFailed
		t.Skipped += row.Skipped
		t.Failed += row.Failed
		t.KnownDefects += row.KnownDefects
		t.Leaks += row.Leaks
		t.Cleaned += row.Cleaned
	}
	s.Total.Kind = "total"
	s.Total.RecoveryMedian, s.Total.RecoveryMax, s.Total.DetectMedian = median(allRec), maxOf(allRec), median(allDet)
	s.RunMedian = median(times)
	return s
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return -1
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return -1
	}
	return slices.Max(xs)
}

// secs formats seconds, "-" for none.
func secs(x float64) string {
	if x < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

// WriteTable prints the summary table.
func (s Summary) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "chaos: seed %d, %d runs, %.0f s in all, median %.1f s per run (its reference included when it ran)\n",
		s.Seed, s.Runs, s.TotalTime, s.RunMedian)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fault\tinjected\twithin\tsurvived=hash\tbeyond\treported\tsurvived-beyond\trefused\tnot-injected\tnot-landed\tnot-run\tinject-failed\tskipped\tFAILED\tknown-defect\tleaks\tgorun-clean\trecovery-med\trecovery-max\tdetect-med\t")
	for _, r := range append(slices.Clone(s.Rows), s.Total) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", r.Kind, r.Injected, r.Within, r.Survived,
			r.Beyond, r.Reported, r.SurvivedBeyond, r.Refused, r.NotInjected, r.NotLanded, r.NotRun, r.InjectFailed, r.Skipped, r.Failed, r.KnownDefects, r.Leaks, r.Cleaned,
			secs(r.RecoveryMedian), secs(r.RecoveryMax), secs(r.DetectMedian))
	}
	tw.Flush()
	fmt.Fprintf(w, "removed by gorun clean: %d (leftovers of jobs every agent, or every host with ranks, of which was SIGKILLed; none other left)\n", s.Total.Cleaned)
	if s.Mismatches > 0 {
		fmt.Fprintf(w, "precheck and gorun disagreed on refusing %d configurations\n", s.Mismatches)
	}
	for _, i := range s.KnownDefectRuns {
		fmt.Fprintf(w, "known defect (reported, not fixed yet; not counted as a failure), run %d: %s\n", i, ReplayLine(s.Seed, i, s.Kinds))
	}
	if len(s.FailedRuns) > 0 {
		var b strings.Builder
		for _, i := range s.FailedRuns {
			fmt.Fprintf(&b, "\n  run %d: %s", i, ReplayLine(s.Seed, i, s.Kinds))
		}
		fmt.Fprintf(w, "FAILED runs:%s\n", b.String())
	}
}

// WriteJSON writes the summary, every run's record included, as JSON.
func (s Summary) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}
