package chaos

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/gorun/gorun/internal/events"
)

// What a job ended with, read from its output and events file, and
// whether that is gorun refusing its configuration.

// refusal reports whether a run that exited code, hung says why the
// harness stopped it ("" if it did not), with stderr, is gorun refusing
// its configuration: exit 2 (README: usage and configuration errors)
// with gorun's usage error ("gorun: REASON" then "Run 'gorun --help'
// for usage.", cmd/gorun's reportError: a rank that exited 2 gives gorun
// status 2 too, without it), and neither a hang the harness ended
// (SIGQUIT: a Go program exits 2) nor a panic (a rank's, whose status
// gorun returns, or gorun's own).
func refusal(code int, hung, stderr string) bool {
	if code != 2 || hung != "" || strings.Contains(stderr, "\ngoroutine ") || strings.Contains(stderr, "panic: ") || strings.Contains(stderr, "SIGQUIT") {
		return false
	}
	return usageRE.MatchString(stderr)
}

// usageRE is cmd/gorun's usage error: its reason, then where help is.
var usageRE = regexp.MustCompile(`(?m)^gorun: .+\nRun 'gorun --help' for usage\.$`)

// sameReason reports whether gorun's refusal (stderr) gives the reason
// the precheck's error (predicted) gives: the error's last part (after
// its last ": "; gorun prefixes its own flag, the libraries' prefixes
// differ) is in it.
func sameReason(predicted, stderr string) bool {
	last := predicted
	if i := strings.LastIndex(predicted, ": "); i >= 0 {
		last = predicted[i+2:]
	}
	return strings.Contains(stderr, last)
}

var (
	dptrainHashRE = regexp.MustCompile(`(?m)^\[0\] (params|optimizer) sha256 ([0-9a-f]{64})$`)
	pytrainHashRE = regexp.MustCompile(`(?m)^\[0\] final hash ([0-9a-f]{64})$`)
	mpiHashRE     = regexp.MustCompile(`(?m)^\[0\] final hash ([0-9a-f]{16})$`)
	stepRE        = regexp.MustCompile(`(?m)^\[0\] step (\d+)\b`)
	// corruptRE is what gorun says of a slot that failed its CRC32C:
	// ckpt.ErrCorrupt's text (the agent's "restoring from other hosts"
	// line names it under -v), or keeper.CorruptError's.
	// For a base file on disk: durable.CorruptError's "durable: PATH:
	// bytes [A, B): ...".
	corruptRE = regexp.MustCompile(`ckpt: corrupt slot|corrupted in memory|durable: \S+: bytes \[`)
)

// outcome fills r with what job j ended with.
func (s *Suite) outcome(r *Run, j *Job) {
	out, errOut := j.stdout.String(), j.stderr.String()
	r.Code, r.Seconds, r.Hung = j.code, j.elapsed.Seconds(), j.hung
	if j.hung != "" {
		r.Dump = errOut
	}
	switch j.Config.Workload {
	case Pytrain:
		if m := pytrainHashRE.FindAllStringSubmatch(out, -1); m != nil {
			r.Hash = m[len(m)-1][1]
		}
	case MPICH:
		if m := mpiHashRE.FindAllStringSubmatch(out, -1); m != nil {
			r.Hash = m[len(m)-1][1]
		}
	default:
		var p, o string
		for _, m := range dptrainHashRE.FindAllStringSubmatch(out, -1) {
			if m[1] == "params" {
				p = m[2]
			} else {
				o = m[2]
			}
		}
		if p != "" || o != "" {
			r.Hash = "params " + p + " optimizer " + o
		}
	}
	// Rank 0's step lines: every step of dptrain (--log-every 1) and
	// of the MPICH program, every tenth and the last of pytrain's.
	seen := map[int]bool{}
	for _, m := range stepRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		seen[n] = true
	}
	if r.Hash != "" {
		for i := range j.Config.Steps {
			logged := j.Config.Workload != Pytrain || i%10 == 9 || i == j.Config.Steps-1
			if logged && !seen[i] {
				r.MissingSteps = append(r.MissingSteps, i)
			}
		}
	}
	// In order: a job no fault restarted prints each step once, rising.
	prev := -1
	for _, m := range stepRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		if n <= prev && r.Reordered == "" {
			r.Reordered = fmt.Sprintf("rank 0's line of step %d after that of step %d", n, prev)
		}
		prev = n
	}
	r.StderrTail, r.Stderr = tail(errOut, 12), errOut
	recs := j.records()
	evText, _ := os.ReadFile(j.Events)
	r.Detected = corruptRE.MatchString(errOut) || corruptRE.Match(evText)
	r.Reported = reportOf(recs)
	var timelines []events.Timeline
	r.RestoredSteps = nil
	for _, rec := range recs {
		switch e := rec.Event.(type) {
		case events.Timeline:
			timelines = append(timelines, e)
		case events.Publish:
			// Every epoch's, not only those after r.At: the harness's
			// clock and the events file's start apart, and the epochs
			// before a SlotFlip restore nothing (G -1).
			r.RestoredSteps = append(r.RestoredSteps, e.G)
		}
	}
	if len(timelines) > 0 && r.At > 0 {
		first, last := timelines[0], timelines[len(timelines)-1]
		if first.Detected != nil {
			r.FaultToDetect = max(0, *first.Detected-r.At)
			if last.Resumed != nil {
				r.DetectToResume = *last.Resumed - *first.Detected
			}
		}
	}
}

// reportOf is the report of a job that failed: its events file's exit
// record's reason, "" without one (standard error's last line is no
// report: under -v it always has one, a panic's trace too).
func reportOf(recs []events.Record) string {
	for _, rec := range recs {
		if e, ok := rec.Event.(events.Exit); ok && e.Code != 0 {
			return e.Reason
		}
	}
	return ""
}

// tail returns the last n non-empty lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	var out []string
	for i := len(lines) - 1; i >= 0 && len(out) < n; i-- {
		if strings.TrimSpace(lines[i]) != "" {
			out = append([]string{lines[i]}, out...)
		}
	}
	return strings.Join(out, "\n")
}
