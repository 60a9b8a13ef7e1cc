package plan

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits of a trace file, so that a wrong file fails fast instead of
// filling memory.
const (
	MaxTraceLine     = 1024      // bytes per line
	MaxTraceFailures = 1_000_000 // failures per file
)

// Failure is one host failure of a trace.
type Failure struct {
	At   time.Duration // since the job started
	Host string        // "" when the trace does not say
}

// ParseTrace reads a failure trace: one failure per line,
//
//	TIME[,HOST[,...]]
//
// TIME is the time since the job started, in seconds ("12600",
// "12600.5") or as a duration ("3h30m", "2d"); or an RFC 3339 timestamp
// ("2026-01-05T10:00:00Z"), counted from start, or from the earliest
// timestamp of the file when start is zero (then the first failure is at
// 0). A file gives either times since the start or timestamps, not both.
// HOST, when given, names the host that failed (no spaces); the models
// do not use it (failures are taken as independent of the host). Further
// comma-separated columns (an error code, a message) are ignored. Blank
// lines and lines starting with '#' are skipped, and so is the first
// other line when its TIME is a column name: letters, digits and '_'
// starting with a letter ("time,host"). Times must not be negative
// (timestamps not before start). The failures are returned in time
// order. file names the trace in errors, which are *[TraceError] values
// (wrapping [ErrTrace]) naming the line.
func ParseTrace(r io.Reader, file string, start time.Time) ([]Failure, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), MaxTraceLine) // the larger of the two is the limit
	type rec struct {
		line int
		f    Failure
		abs  time.Time // zero: f.At is relative
	}
	var recs []rec
	line, data := 0, 0
	earliest := time.Time{}
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if data++; data == 1 && isColumnName(strings.TrimSpace(strings.SplitN(text, ",", 2)[0])) {
			continue // a header
		}
		f, abs, err := parseTraceLine(text, line)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(recs) > 0 && abs.IsZero() != recs[0].abs.IsZero() {
			return nil, fmt.Errorf("%s: %w", file, &TraceError{Line: line, Msg: fmt.Sprintf("the trace mixes timestamps and times since the start (line %d has the other kind)", recs[0].line)})
		}
		if len(recs) == MaxTraceFailures {
			return nil, fmt.Errorf("%s: %w", file, &TraceError{Line: line, Msg: fmt.Sprintf("more than %d failures", MaxTraceFailures)})
		}
		if !abs.IsZero() && (earliest.IsZero() || abs.Before(earliest)) {
			earliest = abs
		}
		recs = append(recs, rec{line, f, abs})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, &TraceError{Line: line + 1, Msg: fmt.Sprintf("unreadable (lines are at most %d bytes)", MaxTraceLine), Err: err})
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%s: %w: no failures in it", file, ErrTrace)
	}
	origin := start
	if origin.IsZero() {
		origin = earliest
	}
	out := make([]Failure, len(recs))
	for i, r := range recs {
		if !r.abs.IsZero() {
			if r.abs.Before(origin) {
				return nil, fmt.Errorf("%s: %w", file, &TraceError{Line: r.line, Msg: fmt.Sprintf("%s is before the trace's start %s", r.abs.Format(time.RFC3339), origin.Format(time.RFC3339))})
			}
			d := r.abs.Sub(origin)
			if d >= time.Duration(1<<62) {
				return nil, fmt.Errorf("%s: %w", file, &TraceError{Line: r.line, Msg: "too long after the trace's start"})
			}
			r.f.At = d
		}
		out[i] = r.f
	}
	slices.SortStableFunc(out, func(a, b Failure) int { return b2i(a.At > b.At) - b2i(a.At < b.At) })
	return out, nil
}

// isColumnName reports whether s is a header's column name: a letter,
// then letters, digits or '_' ("time", "timestamp", "t_fail").
func isColumnName(s string) bool {
	if s == "" || !isLetter(s[0]) {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !isLetter(c) && c != '_' && (c < '0' || c > '9') {
			return false
		}
	}
	_, err := parseTraceTime(s) // and not a time

	return err != nil
}

func isLetter(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

// parseTraceLine parses one line; abs is its timestamp, zero when TIME
// is a time since the start (then in f.At).
func parseTraceLine(text string, line int) (f Failure, abs time.Time, err error) {
	fields := strings.Split(text, ",")
	ts := strings.TrimSpace(fields[0])
	if len(fields) > 1 {
		host := strings.TrimSpace(fields[1])
		switch {
		case host == "":
			return Failure{}, time.Time{}, &TraceError{Line: line, Msg: "empty host after the comma"}
		case strings.ContainsAny(host, " \t"):
			return Failure{}, time.Time{}, &TraceError{Line: line, Msg: fmt.Sprintf("host %q: want TIME[,HOST[,...]] with no spaces in HOST", shorten(host))}
		}
		f.Host = host
	}
	if t, terr := time.Parse(time.RFC3339Nano, ts); terr == nil {
		return f, t, nil
	}
	at, err := parseTraceTime(ts)
	if err != nil {
		return Failure{}, time.Time{}, &TraceError{Line: line, Msg: fmt.Sprintf("time %q", shorten(ts)), Err: err}
	}
	f.At = at
	return f, time.Time{}, nil
}

// parseTraceTime reads seconds ("12600.5") or a duration ("3h30m", "2d").
func parseTraceTime(s string) (time.Duration, error) {
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("negative")
	}
	var d time.Duration
	if digitsDot(s) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v*float64(time.Second) >= float64(1<<62) {
			return 0, fmt.Errorf("want seconds, a duration such as 3h30m or an RFC 3339 timestamp")
		}
		d = time.Duration(v * float64(time.Second))
	} else {
		var err error
		if d, err = ParseDuration(s); err != nil {
			return 0, fmt.Errorf("want seconds, a duration such as 3h30m or an RFC 3339 timestamp")
		}
	}
	if d < 0 {
		return 0, fmt.Errorf("negative")
	}
	return d, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
