package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/report"
)

const reportUsageHead = `Usage: gorun report EVENTS [-o FILE]

Turns a job's events file (gorun --events EVENTS) into one self-contained
HTML page: a summary, a per-host timeline of steps, failures, recovery
phases and spares taking over, and the step time beside the protection's
wait. The page loads nothing from the network; open it in any browser.

`

const reportUsageTail = `
Exit status: 0 done (an EVENTS whose last line is cut short, as while the
job writes it, gives the page of the lines before it, with a warning); 1
EVENTS cannot be read or FILE written; 2 a usage error or an EVENTS that
is not a valid events file (the error names the line) or of a newer
schema than this gorun reads.
`

// reportUsage is `gorun report -h`, its flags from reportFlags.
func reportUsage() string {
	return flagUsage(reportUsageHead, reportFlags(new(string)), []flagGroup{{}}, 12, "", reportUsageTail)
}

// reportFlags describes gorun report's flags: -o into out.
func reportFlags(out *string) []flagSpec {
	return []flagSpec{
		{names: []string{"-o"}, arg: "FILE", define: strFlag(out, "-"),
			help: `write the page to FILE (default, and "-": standard output)`},
	}
}

// reportMain runs `gorun report`.
func reportMain(args []string, stdout, stderr io.Writer) int {
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "gorun report: "+format+"\n%s", append(a, reportUsage())...)
		return exitUsage
	}
	fs := flag.NewFlagSet("gorun report", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := new(string)
	defineFlags(fs, reportFlags(out))
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, reportUsage())
				return exitOK
			}
			return usage("%v", err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(pos) != 1 {
		return usage("want one events file, got %d arguments", len(pos))
	}
	if *out == "" {
		return usage("-o: want a file name, or - for standard output")
	}
	in := pos[0]
	f, err := os.Open(in)
	if err != nil {
		fmt.Fprintf(stderr, "gorun report: %v\n", err)
		return exitError
	}
	m, err := report.Read(f) // streamed: a long job's file is large
	f.Close()
	if err != nil {
		if le, ok := errors.AsType[*events.LineError](err); ok {
			fmt.Fprintf(stderr, "gorun report: %s: line %d: %s\n", in, le.Line, lineErrorText(le))
			return exitUsage
		}
		if errors.Is(err, report.ErrNoLaunch) || errors.Is(err, events.ErrSchema) {
			fmt.Fprintf(stderr, "gorun report: %s: %v\n", in, err)
			return exitUsage
		}
		fmt.Fprintf(stderr, "gorun report: %s: %v\n", in, err)
		return exitError
	}
	for _, w := range m.Warnings {
		fmt.Fprintf(stderr, "gorun report: %s: warning: %s\n", in, w)
	}
	var page bytes.Buffer
	if err := report.Render(&page, m); err != nil {
		fmt.Fprintf(stderr, "gorun report: %v\n", err)
		return exitError
	}
	if *out == "-" {
		if _, err := stdout.Write(page.Bytes()); err != nil {
			fmt.Fprintf(stderr, "gorun report: writing the page: %v\n", err)
			return exitError
		}
		return exitOK
	}
	if err := writeFileAtomic(*out, page.Bytes()); err != nil {
		fmt.Fprintf(stderr, "gorun report: %v\n", err)
		return exitError
	}
	return exitOK
}

func lineErrorText(le *events.LineError) string {
	if le.Err != nil {
		return fmt.Sprintf("%s: %v", le.Msg, le.Err)
	}
	return le.Msg
}

// writeFileAtomic writes b to name. A regular file (or none yet) is
// written through a temporary file in its directory renamed over it, so
// that a failure leaves no half-written page; a symbolic link is followed
// (the file it names is written so, the link stays); anything else (a
// device such as /dev/null or /dev/stdout, a FIFO) is opened and written,
// never replaced.
func writeFileAtomic(name string, b []byte) error {
	target := name
	if fi, err := os.Lstat(name); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		r, err := filepath.EvalSymlinks(name)
		if err != nil {
			// A dangling link: writing through it creates what it names.
			return writeFileDirect(name, b)
		}
		target = r
	}
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist) || err == nil && fi.Mode().IsRegular():
	case err != nil:
		return fmt.Errorf("writing %s: %w", name, err)
	default:
		return writeFileDirect(target, b)
	}
	f, err := os.CreateTemp(filepath.Dir(target), ".gorun-report-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), target)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// writeFileDirect opens name (creating it if need be) and writes b.
func writeFileDirect(name string, b []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}
