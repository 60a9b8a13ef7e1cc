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
//	TIME[,HOST]
//
// TIME is the time since the job started, in seconds ("12600", "12600.5")
// or as a duration ("3h30m", "2d"); HOST, when given, names the host that
// failed (no commas or spaces). Blank lines and lines starting with '#'
// are skipped. Times must not be negative, and at most one comma is
// allowed. The failures are returned in time order. file names the trace
// in errors, which are *[TraceError] values (wrapping [ErrTrace]) naming
// the line.
func ParseTrace(r io.Reader, file string) ([]Failure, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 256), MaxTraceLine) // the larger of the two is the limit
	var out []Failure
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f, err := parseTraceLine(text, line)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(out) == MaxTraceFailures {
			return nil, fmt.Errorf("%s: %w", file, &TraceError{Line: line, Msg: fmt.Sprintf("more than %d failures", MaxTraceFailures)})
		}
		out = append(out, f)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, &TraceError{Line: line + 1, Msg: fmt.Sprintf("unreadable (lines are at most %d bytes)", MaxTraceLine), Err: err})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w: no failures in it", file, ErrTrace)
	}
	slices.SortStableFunc(out, func(a, b Failure) int { return b2i(a.At > b.At) - b2i(a.At < b.At) })
	return out, nil
}

func parseTraceLine(text string, line int) (Failure, error) {
	ts, host, hasHost := strings.Cut(text, ",")
	ts, host = strings.TrimSpace(ts), strings.TrimSpace(host)
	if hasHost {
		switch {
		case host == "":
			return Failure{}, &TraceError{Line: line, Msg: "empty host after the comma"}
		case strings.ContainsAny(host, ", \t"):
			return Failure{}, &TraceError{Line: line, Msg: fmt.Sprintf("host %q: want TIME[,HOST] with no commas or spaces in HOST", shorten(host))}
		}
	}
	at, err := parseTraceTime(ts)
	if err != nil {
		return Failure{}, &TraceError{Line: line, Msg: fmt.Sprintf("time %q", shorten(ts)), Err: err}
	}
	return Failure{At: at, Host: host}, nil
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
			return 0, fmt.Errorf("want seconds or a duration such as 3h30m")
		}
		d = time.Duration(v * float64(time.Second))
	} else {
		var err error
		if d, err = ParseDuration(s); err != nil {
			return 0, fmt.Errorf("want seconds or a duration such as 3h30m")
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
