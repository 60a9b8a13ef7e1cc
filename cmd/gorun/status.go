package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gorun/gorun/internal/jobstatus"
	"golang.org/x/sys/unix"
)

const statusUsageHead = `Usage: gorun status [JOB] [--json] [--ranks] [--watch [--interval D]]

Shows a running job of yours: its hosts (state, ranks, per tier the
newest step of the host's ranks, min..max), epoch and generation, G (the
step every rank can resume from), D (the durable watermark), the spares
left and the recent failures (class, what gorun decided, recovery time:
the words of the events file and the metrics). JOB is a job id
or a unique prefix of one; without it, the one running job (with several,
one line per job, or a JSON list of them with --json, and exit 1).

`

const statusUsageTail = `
Exit codes: 0 shown, 1 no such job, several and none named, or no answer,
2 usage error.
`

// statusUsage is `gorun status -h`, its flags from statusFlags.
func statusUsage() string {
	return flagUsage(statusUsageHead, statusFlags(&statusOpts{}), []flagGroup{{}}, 19, "", statusUsageTail)
}

// statusFlags describes gorun status's flags, bound to o.
func statusFlags(o *statusOpts) []flagSpec {
	return []flagSpec{
		{names: []string{"--json"}, define: boolFlag(&o.json, false),
			help: "the snapshot as JSON (every rank's row included)"},
		{names: []string{"--ranks"}, define: boolFlag(&o.ranks, false),
			help: "every rank's row in the table too"},
		{names: []string{"--watch"}, define: boolFlag(&o.watch, false),
			help: `redraw every --interval until interrupted or the job
ends ("job ended", exit 0)`},
		{names: []string{"--interval"}, arg: "D", define: durationFlag(&o.interval, 2*time.Second),
			help: "the redraw interval of --watch (default 2s)"},
		{names: []string{"--timeout"}, arg: "D", define: durationFlag(&o.timeout, 10*time.Second),
			help: "how long to wait for the job's answer (default 10s)"},
	}
}

type statusOpts struct {
	job      string
	json     bool
	ranks    bool
	watch    bool
	interval time.Duration
	timeout  time.Duration
}

// parseStatus parses gorun status's arguments (flags and JOB in any order).
func parseStatus(args []string) (*statusOpts, error) {
	o := &statusOpts{}
	fs := flag.NewFlagSet("gorun status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	defineFlags(fs, statusFlags(o))
	intervalSet := false
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if o.job != "" {
			return nil, usagef("more than one job given (%q and %q)", o.job, args[0])
		}
		if args[0] == "" {
			return nil, usagef("empty job id")
		}
		o.job, args = args[0], args[1:]
	}
	fs.Visit(func(f *flag.Flag) { intervalSet = intervalSet || f.Name == "interval" })
	switch {
	case intervalSet && !o.watch:
		return nil, usagef("--interval is for --watch")
	case o.interval <= 0:
		return nil, usagef("--interval %v: want a positive duration", o.interval)
	case o.timeout <= 0:
		return nil, usagef("--timeout %v: want a positive duration", o.timeout)
	}
	return o, nil
}

// statusMain runs `gorun status`.
func statusMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseStatus(args)
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, statusUsage())
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "gorun status: %v\nRun 'gorun status -h' for usage.\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return runStatus(ctx, o, jobstatus.Dirs(), stdout, stderr)
}

// runStatus shows the job o names among those registered in any of dirs
// (jobstatus.ListAll: the job may have started in another environment).
func runStatus(ctx context.Context, o *statusOpts, dirs []string, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "gorun status: "+format+"\n", a...)
		return exitError
	}
	es, err := jobstatus.ListAll(dirs)
	if err != nil {
		return fail("%v", err)
	}
	if len(es) == 0 {
		return fail("no running gorun job of yours (registries %s)", strings.Join(dirs, ", "))
	}
	e, err := jobstatus.Find(es, o.job)
	if errors.Is(err, jobstatus.ErrAmbiguous) && o.job == "" {
		// No job shown: exit 1, with or without --watch.
		if o.json {
			if err := listJobsJSON(stdout, es); err != nil {
				return fail("%v", err)
			}
		} else {
			listJobs(stdout, es)
		}
		fmt.Fprintf(stderr, "gorun status: %d running jobs; name one: gorun status JOB\n", len(es))
		return exitError
	}
	if errors.Is(err, jobstatus.ErrNoJob) {
		// Other jobs run, none of them this one: said as when none runs.
		return fail("no running gorun job of yours with id %q (registries %s)", o.job, strings.Join(dirs, ", "))
	}
	if err != nil {
		return fail("%v", err)
	}
	clear := o.watch && isTerminal(stdout)
	warned := false // about the snapshot's version, once
	for n := 0; ; n++ {
		qctx, cancel := context.WithTimeout(ctx, o.timeout)
		s, err := jobstatus.Query(qctx, e, o.ranks || o.json)
		cancel()
		if ctx.Err() != nil {
			return exitOK // interrupted (--watch)
		}
		if err != nil {
			if o.watch && n > 0 {
				// The job may be ending (its launcher no longer answers
				// while its agents exit): give its entry time to go.
				gone(ctx, dirs, e.Job, o.timeout)
			}
			if jobstatus.Refused(ctx, e) {
				// Its launcher runs (or ran: List's checks) but nothing
				// listens: it is ending, or its server is gone. The
				// entry is stale.
				jobstatus.Remove(e.Dir, e)
			}
			if !alive(dirs, e.Job) {
				if o.watch && n > 0 {
					fmt.Fprintf(stdout, "job %s ended\n", e.Job)
					return exitOK
				}
				return fail("job %s ended", e.Job)
			}
			return fail("job %s does not answer: %v", e.Job, err)
		}
		if err := jobstatus.CheckVersion(s); err != nil && !warned {
			// Shown all the same: most fields likely mean what they did.
			fmt.Fprintf(stderr, "gorun status: warning: job %s: %v\n", e.Job, err)
			warned = true
		}
		if clear {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J")
		} else if n > 0 {
			fmt.Fprintln(stdout)
		}
		if o.json {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(s)
		} else {
			err = jobstatus.Render(stdout, s, o.ranks)
		}
		if err != nil {
			return fail("%v", err)
		}
		if !o.watch {
			return exitOK
		}
		t := time.NewTimer(o.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return exitOK
		case <-t.C:
		}
	}
}

// alive reports whether job is still in the registry (its launcher runs).
func alive(dirs []string, job string) bool {
	es, err := jobstatus.ListAll(dirs)
	if err != nil {
		return false
	}
	_, err = jobstatus.Find(es, job)
	return err == nil
}

// gone waits, up to limit, until job leaves the registry.
func gone(ctx context.Context, dirs []string, job string, limit time.Duration) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(limit)
	for alive(dirs, job) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func listJobs(w io.Writer, es []*jobstatus.Entry) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tPID\tSTARTED\tPROGRAM")
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Job, e.PID, e.Start.Format(time.RFC3339), strings.TrimSpace(e.Prog))
	}
	_ = tw.Flush()
}

// listedJob is a job in --json's list of the running jobs (without its
// status credential).
type listedJob struct {
	Job        string    `json:"job"`
	PID        int       `json:"pid"`
	Start      time.Time `json:"start"`
	Prog       string    `json:"prog"`
	MetricsURL string    `json:"metrics_url,omitempty"`
}

func listJobsJSON(w io.Writer, es []*jobstatus.Entry) error {
	jobs := make([]listedJob, len(es))
	for i, e := range es {
		jobs[i] = listedJob{Job: e.Job, PID: e.PID, Start: e.Start, Prog: e.Prog, MetricsURL: e.MetricsURL}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(jobs)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
