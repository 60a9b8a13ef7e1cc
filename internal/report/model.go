// Package report turns a job's events file (package events) into one
// self-contained HTML page: a summary, a per-host timeline (steps,
// failures, recovery phases, spares taking over) and the step-time series
// beside the protection's wait, as inline SVG and CSS with one small
// inline script and no external resources at all.
package report

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/gorun/gorun/internal/events"
)

// MaxPoints bounds every series drawn: longer ones are averaged down
// into this many buckets.
const MaxPoints = 2000

// MaxHostPoints bounds each host's step line: half a point per pixel of
// the plot (plotW), as more cannot be seen and a thousand hosts' lines
// are most of a page's bytes.
const MaxHostPoints = plotW / 2

// ErrNoLaunch is a record without a launch record: nothing says what the
// hosts are.
var ErrNoLaunch = errors.New("report: the events file has no launch record (written by gorun before the events schema, or not an events file)")

// Colours the page uses, named for the legend; FailureColour is the
// failure marker's, used for nothing else (a test finds it on a
// screenshot).
const (
	FailureColour  = "#e6007e"
	TakeoverColour = "#00a651"
	StepColour     = "#1f5fbf"
	WaitColour     = "#f08c00"
)

// PhaseColours are the recovery phases' colours, by the stage that ends
// the phase (events.Stages[1:]); SkipColour is a phase's that goes from
// a stage over one not reached (classified → published in a restart in
// place, which replaces no host).
var PhaseColours = []string{"#7b2cbf", "#c9a227", "#2a9d8f", "#577590", "#90be6d"}

// SkipColour: see PhaseColours.
const SkipColour = "#9e9e9e"

// HostTakeoverColour marks a splice onto a host that was not a spare (one
// with free slots); TakeoverColour a spare's.
const HostTakeoverColour = "#0b7285"

// Read reads an events file and builds its page's model. A file whose
// last line is cut short (being written, or a full disk) gives the page
// of the records before it, with a warning in Model.Warnings; a file of a
// schema this gorun does not read (events.CheckSchema) is an error.
func Read(r io.Reader) (*Model, error) {
	recs, err := events.ReadAll(r)
	var warn []string
	if errors.Is(err, events.ErrTruncated) {
		warn = append(warn, err.Error()+"; the page shows the records before it")
		err = nil
	}
	if err != nil {
		return nil, err
	}
	if err := events.CheckSchema(recs); err != nil {
		if errors.Is(err, events.ErrSchema) && slices.IndexFunc(recs, func(r events.Record) bool { _, ok := r.Event.(events.Launch); return ok }) < 0 {
			return nil, ErrNoLaunch
		}
		return nil, err
	}
	m, err := Build(recs)
	if err != nil {
		return nil, err
	}
	m.Warnings = warn
	return m, nil
}

// Model is what the page shows, built from the records (Build).
type Model struct {
	Launch   events.Launch
	Duration float64 // seconds: the exit's, or the last record's time
	Exit     *events.Exit
	Hosts    []HostRow
	Failures []Failure
	Recovery []Recovery
	Series   []Point // step time and protection wait, at most MaxPoints
	MaxStep  int64
	Samples  int
	// Warnings are about the file (a cut-short last line), for the user.
	Warnings []string
}

// CollapseAbove is how many hosts a job may have before the hosts that
// nothing happened to (ran ranks from start to end: no failure, no
// takeover, not a spare) share one row (HostRow.Group).
const CollapseAbove = 24

// HostRow is one host's row of the timeline.
type HostRow struct {
	Name  string
	Role  string
	Ranks []int
	// Group is, for the row of untouched hosts (CollapseAbove), how many
	// hosts it stands for (its Steps are their least step); 0 for a
	// host's own row.
	Group int
	// Active are the intervals (seconds) during which the host ran
	// ranks; Idle those it waited as a spare.
	Active, Idle []Span
	// Steps is its least committed step over time, at most MaxPoints.
	Steps []StepPoint
	// Takeover is when the host took over a lost host's ranks (a spare
	// spliced in), with what it took; nil if never.
	Takeover *Takeover
}

// Span is an interval in seconds since the start.
type Span struct{ From, To float64 }

// StepPoint is a host's least committed step at a time.
type StepPoint struct {
	T    float64
	Step int64
}

// Takeover is a splice onto a host.
type Takeover struct {
	T     float64
	Lost  string
	Ranks []int
	Spare bool // the host was a spare (else a host with free slots)
}

// Failure is a failure record on a host's row. Its Epoch is, for a
// failure that waited for a replacement (decision wait), the epoch of the
// splice that replaced its host (0 if none did), not the record's.
type Failure struct {
	// T is when it was detected (the record's "detected", gorun
	// status's DETECTED; the record's t in a file without it).
	T    float64
	Host int // row index, -1 if the host is not in the launch record
	events.Failure
	// Recovery is its recovery epoch's outcome in words: the time from
	// detection to resume, or why there is none.
	Recovery string
}

// Recovery is a recovery epoch's timeline.
type Recovery struct {
	events.Timeline
	Phases []Phase
	// Took is detected to resumed in seconds, or -1 if it did not resume.
	Took float64
	// Cells are, for each phase (PhaseColoursNames), its length in
	// words, "-" for a phase not gone through.
	Cells []string
}

// Phase is one phase of a recovery: from one stage to the next reached.
type Phase struct {
	Name   string // the stage that ends it
	Colour string
	Span
}

// Point is one point of the step-time series.
type Point struct {
	T        float64
	StepTime float64 // seconds per step per rank
	Wait     float64 // seconds per step per rank waited at the overwrite rule
}

// Build builds the page's model from an events file's records.
func Build(recs []events.Record) (*Model, error) {
	m := &Model{}
	li := slices.IndexFunc(recs, func(r events.Record) bool { _, ok := r.Event.(events.Launch); return ok })
	if li < 0 {
		return nil, ErrNoLaunch
	}
	m.Launch = recs[li].Event.(events.Launch)
	index := map[string]int{}
	for i, h := range m.Launch.Hosts {
		index[h.Name] = i
		m.Hosts = append(m.Hosts, HostRow{Name: h.Name, Role: h.Role, Ranks: h.Ranks})
	}
	row := func(name string) int {
		if i, ok := index[name]; ok {
			return i
		}
		return -1
	}
	for _, r := range recs {
		m.Duration = max(m.Duration, r.T)
	}
	// When each host started and stopped running ranks.
	activeFrom := make([]float64, len(m.Hosts))
	for i, h := range m.Launch.Hosts {
		activeFrom[i] = -1
		if h.Role != events.RoleSpare {
			activeFrom[i] = 0
		}
	}
	idleFrom := make([]float64, len(m.Hosts))
	for i := range idleFrom {
		idleFrom[i] = -1
		if activeFrom[i] < 0 {
			idleFrom[i] = 0
		}
	}
	var prev *events.Sample
	var prevT float64
	var series []Point
	steps := make([][]StepPoint, len(m.Hosts))
	for _, r := range recs {
		switch e := r.Event.(type) {
		case events.Exit:
			x := e
			m.Exit = &x
			m.Duration = max(m.Duration, e.Duration)
		case events.Failure:
			at := r.T
			if e.Detected != nil {
				at = *e.Detected
			}
			m.Failures = append(m.Failures, Failure{T: at, Host: row(e.Host), Failure: e})
		case events.Fence:
			if h := row(e.Host); h >= 0 && activeFrom[h] >= 0 {
				m.Hosts[h].Active = append(m.Hosts[h].Active, Span{activeFrom[h], r.T})
				activeFrom[h] = -1
			} else if h >= 0 && idleFrom[h] >= 0 {
				m.Hosts[h].Idle = append(m.Hosts[h].Idle, Span{idleFrom[h], r.T})
				idleFrom[h] = -1
			}
		case events.Splice:
			m.linkWait(e)
			if h := row(e.With); h >= 0 {
				if idleFrom[h] >= 0 {
					m.Hosts[h].Idle = append(m.Hosts[h].Idle, Span{idleFrom[h], r.T})
					idleFrom[h] = -1
				}
				if activeFrom[h] < 0 {
					activeFrom[h] = r.T
				}
				if m.Hosts[h].Takeover == nil {
					m.Hosts[h].Takeover = &Takeover{T: r.T, Lost: e.Lost, Ranks: e.Ranks, Spare: e.Spare}
				}
			}
		case events.Timeline:
			m.Recovery = append(m.Recovery, recovery(e))
		case events.Sample:
			m.Samples++
			for h := range min(len(e.Min), len(steps)) {
				if e.Min[h] >= 0 {
					steps[h] = append(steps[h], StepPoint{r.T, e.Min[h]})
					m.MaxStep = max(m.MaxStep, e.Min[h])
				}
			}
			if prev != nil && r.T > prevT && e.Gen == prev.Gen {
				if p, ok := point(prev, &e, r.T-prevT, m.Launch.NP); ok {
					p.T = r.T
					series = append(series, p)
				}
			}
			x := e
			prev, prevT = &x, r.T
		}
	}
	for h := range m.Hosts {
		if activeFrom[h] >= 0 {
			m.Hosts[h].Active = append(m.Hosts[h].Active, Span{activeFrom[h], m.Duration})
		}
		if idleFrom[h] >= 0 {
			m.Hosts[h].Idle = append(m.Hosts[h].Idle, Span{idleFrom[h], m.Duration})
		}
	}
	steps = m.collapse(steps)
	for h := range m.Hosts {
		m.Hosts[h].Steps = downsampleSteps(steps[h], MaxHostPoints)
	}
	m.Series = downsample(series, MaxPoints)
	for i := range m.Failures {
		m.Failures[i].Recovery = m.failureRecovery(m.Failures[i].Failure)
	}
	return m, nil
}

// collapse puts the hosts nothing happened to in one row, after the
// others, when there are more than CollapseAbove hosts and at least two
// such: the rows of a large job are then the hosts worth looking at. It
// renumbers the failures' rows and returns the rows' steps.
func (m *Model) collapse(steps [][]StepPoint) [][]StepPoint {
	if len(m.Hosts) <= CollapseAbove {
		return steps
	}
	touched := make([]bool, len(m.Hosts))
	for _, f := range m.Failures {
		if f.Host >= 0 {
			touched[f.Host] = true
		}
	}
	n := 0
	for i, h := range m.Hosts {
		whole := len(h.Active) == 1 && h.Active[0].From == 0 && h.Active[0].To >= m.Duration
		if h.Role == events.RoleSpare || h.Takeover != nil || len(h.Idle) > 0 || !whole {
			touched[i] = true
		}
		if !touched[i] {
			n++
		}
	}
	if n < 2 {
		return steps
	}
	newRow := make([]int, len(m.Hosts))
	var rows []HostRow
	var rowSteps [][]StepPoint
	least := map[float64]int64{}
	for i, h := range m.Hosts {
		if touched[i] {
			newRow[i] = len(rows)
			rows = append(rows, h)
			rowSteps = append(rowSteps, steps[i])
			continue
		}
		newRow[i] = -1
		for _, p := range steps[i] {
			if s, ok := least[p.T]; !ok || p.Step < s {
				least[p.T] = p.Step
			}
		}
	}
	group := make([]StepPoint, 0, len(least))
	for t, s := range least {
		group = append(group, StepPoint{T: t, Step: s})
	}
	slices.SortFunc(group, func(a, b StepPoint) int { return cmp.Compare(a.T, b.T) })
	rows = append(rows, HostRow{Name: fmt.Sprintf("%d other hosts", n), Role: events.RoleRunning, Group: n,
		Active: []Span{{0, m.Duration}}})
	rowSteps = append(rowSteps, group)
	for i := range m.Failures {
		if h := m.Failures[i].Host; h >= 0 {
			m.Failures[i].Host = newRow[h]
		}
	}
	m.Hosts = rows
	return rowSteps
}

// linkWait gives the failure that waited for a replacement of the host
// splice s replaces (decision wait, no epoch yet: the newest such of
// s.Lost) the splice's epoch, as gorun status does (its statusState's
// spliced): its recovery is that epoch's.
func (m *Model) linkWait(s events.Splice) {
	for i := len(m.Failures) - 1; i >= 0; i-- {
		f := &m.Failures[i]
		if f.Failure.Host == s.Lost && f.Epoch == 0 && f.Decision == "wait" {
			f.Epoch = s.Epoch
			return
		}
	}
}

// failureRecovery says how f's recovery epoch went, by its epoch (the
// last timeline of that epoch).
func (m *Model) failureRecovery(f events.Failure) string {
	switch f.Decision {
	case "abort":
		return "none: the job stopped"
	case "none":
		return "none needed"
	}
	if f.Epoch == 0 {
		return "-"
	}
	for i := len(m.Recovery) - 1; i >= 0; i-- {
		r := m.Recovery[i]
		if r.Epoch != f.Epoch {
			continue
		}
		switch {
		case r.Took >= 0:
			return seconds(r.Took) + " to resume"
		case r.Unfinished:
			return "unfinished when the job ended"
		case r.Superseded:
			return "superseded by a later failure"
		}
		return "did not resume"
	}
	return "no timeline"
}

// point is the step time and the wait per step between two samples of
// one generation, dt seconds apart: the steps committed and the wait
// added over every rank.
func point(a, b *events.Sample, dt float64, np int) (Point, bool) {
	var steps int64
	var wait float64
	for h := range min(len(a.Stages), len(b.Stages)) {
		steps += max(b.Stages[h]-a.Stages[h], 0)
	}
	for h := range min(len(a.Wait), len(b.Wait)) {
		wait += max(b.Wait[h]-a.Wait[h], 0)
	}
	if steps <= 0 || np <= 0 {
		return Point{}, false
	}
	perRank := float64(steps) / float64(np)
	return Point{StepTime: dt / perRank, Wait: wait / float64(steps)}, true
}

func recovery(t events.Timeline) Recovery {
	r := Recovery{Timeline: t, Took: -1, Cells: []string{"-", "-", "-", "-", "-"}}
	at := []*float64{t.Detected, t.Classified, t.Replaced, t.Published, t.Restored, t.Resumed}
	last := -1
	for i, p := range at {
		if p == nil {
			continue
		}
		if last >= 0 && *p >= *at[last] {
			ph := Phase{Name: PhaseColoursNames()[i-1], Colour: PhaseColours[i-1], Span: Span{*at[last], *p}}
			cell := seconds(*p - *at[last])
			if last != i-1 {
				// A stage skipped (replaced, in a restart in place):
				// the phase is from the stage before, in its own colour.
				ph.Name = events.Stages[last] + " → " + events.Stages[i]
				ph.Colour = SkipColour
				cell += " (from " + events.Stages[last] + ")"
			}
			r.Phases = append(r.Phases, ph)
			r.Cells[i-1] = cell
		}
		last = i
	}
	if t.Detected != nil && t.Resumed != nil {
		r.Took = *t.Resumed - *t.Detected
	}
	return r
}

// downsample averages pts into at most n buckets of equal count.
func downsample(pts []Point, n int) []Point {
	if len(pts) <= n {
		return pts
	}
	out := make([]Point, 0, n)
	for b := range n {
		lo, hi := b*len(pts)/n, (b+1)*len(pts)/n
		var p Point
		for _, q := range pts[lo:hi] {
			p.T += q.T
			p.StepTime += q.StepTime
			p.Wait += q.Wait
		}
		k := float64(hi - lo)
		out = append(out, Point{T: p.T / k, StepTime: p.StepTime / k, Wait: p.Wait / k})
	}
	return out
}

// downsampleSteps keeps at most n of pts, evenly spaced, the last kept.
func downsampleSteps(pts []StepPoint, n int) []StepPoint {
	if len(pts) <= n {
		return pts
	}
	out := make([]StepPoint, 0, n)
	for b := range n - 1 {
		out = append(out, pts[b*len(pts)/(n-1)])
	}
	return append(out, pts[len(pts)-1])
}

// seconds formats a duration in seconds for people.
func seconds(s float64) string {
	switch {
	case s < 0 || math.IsNaN(s):
		return "-"
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 120:
		return fmt.Sprintf("%.2f s", s)
	case s < 7200:
		return fmt.Sprintf("%.1f min", s/60)
	}
	return fmt.Sprintf("%.1f h", s/3600)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
