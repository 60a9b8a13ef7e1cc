package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What is read from a gorun run of dptrain: rank 0's step lines (timed as
// they arrive), its own summary lines, and gorun -v's protection table.

// clientStats are rank 0's per-step protection figures, from the line
// "dptrain: protection per step: copy …, commit …, overwrite-rule wait …,
// trainer wait …".
type clientStats struct {
	copy, commit, ruleWait, wait time.Duration
}

// rankRow is one row of gorun -v's "state protection" table.
type rankRow struct {
	rank                          int
	committed, replicated, stages int64
	ruleWait                      time.Duration // total over the run
	replPerStep                   time.Duration // 0: none measured
	replMBps                      float64       // 0: none measured
}

// protTable is gorun -v's "state protection" table.
type protTable struct {
	g    int64
	rows []rankRow
}

var (
	stepRe   = regexp.MustCompile(`^\[0\] step (\d+)( loss \S+)?$`)
	msStepRe = regexp.MustCompile(`^\[0\] dptrain: (\d+) steps in \S+, ([0-9.]+) ms/step$`)
	protRe   = regexp.MustCompile(`^\[0\] dptrain: protection per step: copy (\S+), commit (\S+), overwrite-rule wait (\S+), trainer wait (\S+)$`)
	tableRe  = regexp.MustCompile(`state protection: G = (-?\d+)`)
	jobRe    = regexp.MustCompile(`msg="control plane up".* job=([a-z0-9]+)`)
)

// stamp is when a line arrived and the bytes on the wire by then.
type stamp struct {
	at   time.Time
	wire uint64
}

// stdoutResult is what rank 0 printed.
type stdoutResult struct {
	stepAt   map[int]time.Time // arrival time of "step N loss" per step
	stepWire map[int]uint64    // bytes on the wire when that line arrived
	msStep   float64           // dptrain's own ms/step over all steps; 0 if missing
	client   *clientStats      // nil without --protect
	lines    []string          // the last few lines, for error reports
	badLine  error             // the first line that matched but did not parse
}

// readStdout reads gorun's standard output to its end, stamping each step
// line with now() as it arrives.
func readStdout(r io.Reader, now func() stamp) stdoutResult {
	res := stdoutResult{stepAt: map[int]time.Time{}, stepWire: map[int]uint64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		t := now()
		line := sc.Text()
		if len(res.lines) == 20 {
			res.lines = slices.Delete(res.lines, 0, 1)
		}
		res.lines = append(res.lines, line)
		if m := stepRe.FindStringSubmatch(line); m != nil {
			s, _ := strconv.Atoi(m[1])
			res.stepAt[s], res.stepWire[s] = t.at, t.wire
		} else if m := msStepRe.FindStringSubmatch(line); m != nil {
			res.msStep, _ = strconv.ParseFloat(m[2], 64)
		} else if m := protRe.FindStringSubmatch(line); m != nil {
			var c clientStats
			for i, d := range []*time.Duration{&c.copy, &c.commit, &c.ruleWait, &c.wait} {
				v, err := time.ParseDuration(m[i+1])
				if err != nil && res.badLine == nil {
					res.badLine = fmt.Errorf("parsing %q: %w", line, err)
				}
				*d = v
			}
			res.client = &c
		}
	}
	_, _ = io.Copy(io.Discard, r) // a line too long for the scanner: drain the pipe
	return res
}

// stepTimes returns the intervals between the arrivals of step lines
// first-1 and first, …, last-1 and last: the time of steps first..last.
func stepTimes(stepAt map[int]time.Time, first, last int) ([]time.Duration, error) {
	var ds []time.Duration
	for s := first; s <= last; s++ {
		a, okA := stepAt[s-1]
		b, okB := stepAt[s]
		if !okA || !okB {
			return nil, fmt.Errorf("rank 0 did not print steps %d and %d", s-1, s)
		}
		ds = append(ds, b.Sub(a))
	}
	return ds, nil
}

// wirePerStep returns the bytes on the wire per step from the arrival of
// step line first-1 to that of last.
func wirePerStep(stepWire map[int]uint64, first, last int) (float64, error) {
	a, okA := stepWire[first-1]
	b, okB := stepWire[last]
	if !okA || !okB || b < a || last < first {
		return 0, fmt.Errorf("no wire counters at steps %d and %d", first-1, last)
	}
	return float64(b-a) / float64(last-first+1), nil
}

// parseTable finds gorun -v's protection table in its standard error (the
// last one, if a restart printed more) and the job id.
func parseTable(stderr string) (*protTable, string) {
	var job string
	if m := jobRe.FindStringSubmatch(stderr); m != nil {
		job = m[1]
	}
	i := strings.LastIndex(stderr, "state protection: G = ")
	if i < 0 {
		return nil, job
	}
	lines := strings.Split(stderr[i:], "\n")
	m := tableRe.FindStringSubmatch(lines[0])
	if m == nil {
		return nil, job
	}
	t := &protTable{}
	t.g, _ = strconv.ParseInt(m[1], 10, 64)
	for _, line := range lines[2:] { // after the column heads
		row, ok := parseRow(line)
		if !ok {
			break
		}
		t.rows = append(t.rows, row)
	}
	return t, job
}

// parseRow parses "rank committed replicated stages rule-wait repl/step
// MB/s", and in diff mode under EC the coded base after them (not used
// here); repl/step and MB/s are "-" when nothing was replicated.
func parseRow(line string) (rankRow, bool) {
	f := strings.Fields(line)
	if len(f) == 8 {
		if _, err := strconv.ParseInt(f[7], 10, 64); err != nil {
			return rankRow{}, false
		}
		f = f[:7]
	}
	if len(f) != 7 {
		return rankRow{}, false
	}
	var r rankRow
	var err error
	var ints [4]int64
	for i := range ints {
		if ints[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return rankRow{}, false
		}
	}
	r.rank, r.committed, r.replicated, r.stages = int(ints[0]), ints[1], ints[2], ints[3]
	if r.ruleWait, err = time.ParseDuration(f[4]); err != nil {
		return rankRow{}, false
	}
	if f[5] != "-" {
		if r.replPerStep, err = time.ParseDuration(f[5]); err != nil {
			return rankRow{}, false
		}
	}
	if f[6] != "-" {
		if r.replMBps, err = strconv.ParseFloat(f[6], 64); err != nil {
			return rankRow{}, false
		}
	}
	return r, true
}

// parseDiffSources returns the gradient source of each rank's holders
// (rank order) in the last differential-protection table of gorun -v's
// stderr ("local-peer", "network", "mixed"), or nil if there is none.
func parseDiffSources(stderr string) []string {
	i := strings.LastIndex(stderr, "differential protection, per rank:")
	if i < 0 {
		return nil
	}
	lines := strings.Split(stderr[i:], "\n")
	if len(lines) < 2 {
		return nil
	}
	var out []string
	for _, l := range lines[2:] { // past the title and the header
		f := strings.Fields(l)
		if len(f) != 5 { // rank, sent/step, bases/step, diffs/step, source
			break
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			break
		}
		out = append(out, f[4])
	}
	return out
}
