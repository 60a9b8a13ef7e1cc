package report

import (
	"embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"sync"
)

//go:embed page.html.tmpl
var pageFS embed.FS

// pageTmpl is parsed on first use, not at package init: gorun links this
// package, and every launch would otherwise pay for parsing a page it does
// not make (about 0.4 ms of gorun -np 1 true).
var pageTmpl = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("page.html.tmpl").Funcs(template.FuncMap{
		"seconds": seconds, "ints": joinInts,
	}).ParseFS(pageFS, "page.html.tmpl"))
})

// Geometry of the timeline and of the series chart, in CSS pixels.
const (
	width  = 1200
	labelW = 190 // host names
	plotW  = 960
	rowH   = 34
	topPad = 30 // the time axis's labels above the rows
	axisH  = 44
	// maxLabel is the most characters of a host name shown: longer ones
	// end in an ellipsis (the whole name is the label's tooltip).
	maxLabel  = 26
	seriesH   = 240
	seriesTop = 20
)

// Render writes m's page to w.
func Render(w io.Writer, m *Model) error {
	if err := pageTmpl().Execute(w, newPage(m)); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// page is the model laid out: every shape with its coordinates.
type page struct {
	*Model
	Program        string
	Running, Spare int
	RanksText      string
	Colours        map[string]string
	Phases         []Phase // one of each, for the legend
	TL             svg
	Series         svg
	HasSeries      bool
}

type svg struct {
	W, H  int
	Rects []rect
	Lines []line
	Polys []poly
	Texts []text
}

type rect struct {
	X, Y, W, H float64
	Fill       string
	Class      string
	Marker     string // data-marker (failure, takeover), or ""
	Title      string
}

type line struct {
	X1, Y1, X2, Y2 float64
	Class          string
}

type poly struct {
	Points string
	Stroke string
	Class  string
}

type text struct {
	X, Y   float64
	Anchor string
	Class  string
	Text   string
	Title  string // a tooltip, or ""
}

// shorten cuts s to n characters with an ellipsis in the middle (hosts'
// names often differ only at their end: node-0005.cluster) and says
// whether it did.
func shorten(s string, n int) (string, bool) {
	r := []rune(s)
	if len(r) <= n {
		return s, false
	}
	head := (n - 1) * 2 / 5
	tail := n - 1 - head
	return string(r[:head]) + "…" + string(r[len(r)-tail:]), true
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func newPage(m *Model) *page {
	p := &page{Model: m, Program: strings.Join(m.Launch.Program, " "),
		Colours: map[string]string{"failure": FailureColour, "takeover": TakeoverColour, "hosttakeover": HostTakeoverColour,
			"step": StepColour, "wait": WaitColour, "skip": SkipColour}}
	for i, s := range PhaseColoursNames() {
		p.Phases = append(p.Phases, Phase{Name: s, Colour: PhaseColours[i]})
	}
	for _, h := range m.Launch.Hosts {
		if h.Role == "spare" {
			p.Spare++
		} else {
			p.Running++
		}
	}
	p.RanksText = plural(m.Launch.NP, "rank", "ranks") + " on " + plural(p.Running, "host", "hosts") + ", " + plural(p.Spare, "spare", "spares")
	dur := m.Duration
	if dur <= 0 {
		dur = 1
	}
	x := func(t float64) float64 { return labelW + t/dur*plotW }
	p.timeline(x, dur)
	p.series(x, dur)
	return p
}

// PhaseColoursNames are the names of the phases PhaseColours colour:
// each phase is named for the stage that ends it.
func PhaseColoursNames() []string {
	return []string{"detected → classified", "classified → replaced", "replaced → published", "published → restored", "restored → resumed"}
}

func (p *page) timeline(x func(float64) float64, dur float64) {
	m := p.Model
	rows := len(m.Hosts) + 1 // the hosts, then the recovery row
	s := &p.TL
	s.W, s.H = width, topPad+rows*rowH+axisH
	top := func(r int) float64 { return float64(topPad + r*rowH) }
	bottom := float64(topPad + rows*rowH)
	// Each host's row box, first (under everything, no pointer events):
	// the page's script reports them (data-marker row-I), so that a test
	// can check which row a marker is on.
	for i := range m.Hosts {
		s.Rects = append(s.Rects, rect{X: labelW, Y: top(i), W: plotW, H: rowH, Class: "rowbox", Marker: fmt.Sprintf("row-%d", i)})
	}
	// Recovery bands behind every row.
	for _, r := range m.Recovery {
		if len(r.Phases) == 0 {
			continue
		}
		from, to := r.Phases[0].From, r.Phases[len(r.Phases)-1].To
		s.Rects = append(s.Rects, rect{X: x(from), Y: top(0), W: max(x(to)-x(from), 4), H: bottom - top(0), Class: "band",
			Title: fmt.Sprintf("recovery epoch %d: %s", r.Epoch, r.Cause)})
	}
	for i, h := range m.Hosts {
		y := top(i)
		suffix := ""
		if h.Role == "spare" {
			suffix = " (spare)"
		}
		label, cut := shorten(h.Name, maxLabel-len(suffix))
		label += suffix
		title := ""
		if cut {
			title = h.Name
		}
		if h.Group > 0 {
			title = fmt.Sprintf("%d hosts that ran their ranks from start to end without a failure; the line is their least committed step", h.Group)
		}
		s.Texts = append(s.Texts, text{X: labelW - 8, Y: y + rowH/2 + 4, Anchor: "end", Class: "host", Text: label, Title: title})
		s.Lines = append(s.Lines, line{X1: labelW, Y1: y + rowH, X2: labelW + plotW, Y2: y + rowH, Class: "rowsep"})
		for _, sp := range h.Idle {
			s.Rects = append(s.Rects, rect{X: x(sp.From), Y: y + 12, W: max(x(sp.To)-x(sp.From), 1), H: rowH - 24, Class: "idle",
				Title: fmt.Sprintf("%s idle (spare) %s – %s", h.Name, seconds(sp.From), seconds(sp.To))})
		}
		for _, sp := range h.Active {
			s.Rects = append(s.Rects, rect{X: x(sp.From), Y: y + 5, W: max(x(sp.To)-x(sp.From), 1), H: rowH - 10, Class: "active",
				Title: fmt.Sprintf("%s runs ranks %s – %s", h.Name, seconds(sp.From), seconds(sp.To))})
		}
		if len(h.Steps) > 0 && m.MaxStep > 0 {
			var b strings.Builder
			for _, pt := range h.Steps {
				fmt.Fprintf(&b, "%.1f,%.1f ", x(pt.T), y+rowH-6-float64(pt.Step)/float64(m.MaxStep)*(rowH-12))
			}
			s.Polys = append(s.Polys, poly{Points: strings.TrimSpace(b.String()), Stroke: StepColour, Class: "steps"})
		}
		if t := h.Takeover; t != nil {
			fill, what := TakeoverColour, "spare"
			if !t.Spare {
				fill, what = HostTakeoverColour, "host with free slots"
			}
			s.Rects = append(s.Rects, rect{X: x(t.T) - 4, Y: y + 2, W: 8, H: rowH - 4, Fill: fill, Marker: "takeover",
				Title: fmt.Sprintf("%s (%s) takes over ranks %s of %s at %s", h.Name, what, joinInts(t.Ranks), t.Lost, seconds(t.T))})
		}
	}
	// The recovery row: each epoch's phases.
	ry := top(len(m.Hosts))
	s.Texts = append(s.Texts, text{X: labelW - 8, Y: ry + rowH/2 + 4, Anchor: "end", Class: "host", Text: "recovery"})
	for _, r := range m.Recovery {
		for _, ph := range r.Phases {
			s.Rects = append(s.Rects, rect{X: x(ph.From), Y: ry + 6, W: max(x(ph.To)-x(ph.From), 3), H: rowH - 12, Fill: ph.Colour,
				Title: fmt.Sprintf("epoch %d, %s: %s – %s (%s)", r.Epoch, ph.Name, seconds(ph.From), seconds(ph.To), seconds(ph.To-ph.From))})
		}
	}
	// Failures on top of everything.
	for _, f := range m.Failures {
		r := f.Host
		if r < 0 {
			r = len(m.Hosts) // not a host of the launch: the recovery row
		}
		what := f.What
		if f.Rank >= 0 {
			what = fmt.Sprintf("rank %d %s", f.Rank, f.What)
		}
		if f.Exit != nil {
			what += fmt.Sprintf(" (exit %d)", *f.Exit)
		}
		if f.Signal != "" {
			what += " (" + f.Signal + ")"
		}
		s.Rects = append(s.Rects, rect{X: x(f.T) - 4, Y: top(r) + 2, W: 8, H: rowH - 4, Fill: FailureColour, Marker: "failure",
			Title: fmt.Sprintf("failure at %s on %s: %s %s", seconds(f.T), f.Failure.Host, what, f.Msg)})
	}
	// The time axis, below the rows and above them (a long page's rows
	// go far down).
	s.Lines = append(s.Lines, line{X1: labelW, Y1: bottom, X2: labelW + plotW, Y2: bottom, Class: "axis"},
		line{X1: labelW, Y1: top(0), X2: labelW + plotW, Y2: top(0), Class: "axis"})
	for _, t := range ticks(dur) {
		s.Lines = append(s.Lines, line{X1: x(t), Y1: bottom, X2: x(t), Y2: bottom + 5, Class: "axis"},
			line{X1: x(t), Y1: top(0) - 5, X2: x(t), Y2: top(0), Class: "axis"})
		s.Texts = append(s.Texts, text{X: x(t), Y: bottom + 18, Anchor: "middle", Class: "tick", Text: tickLabel(t)},
			text{X: x(t), Y: top(0) - 9, Anchor: "middle", Class: "tick", Text: tickLabel(t)})
	}
	s.Texts = append(s.Texts, text{X: labelW + plotW/2, Y: bottom + 38, Anchor: "middle", Class: "label", Text: "seconds since the job started"})
}

func (p *page) series(x func(float64) float64, dur float64) {
	m := p.Model
	s := &p.Series
	s.W, s.H = width, seriesTop+seriesH+axisH
	bottom := float64(seriesTop + seriesH)
	if len(m.Series) == 0 {
		return
	}
	p.HasSeries = true
	hi := 0.0
	for _, pt := range m.Series {
		hi = max(hi, pt.StepTime*1000, pt.Wait*1000)
	}
	if hi <= 0 {
		hi = 1
	}
	yt := ticks(hi)
	hi = max(hi, yt[len(yt)-1])
	y := func(ms float64) float64 { return bottom - ms/hi*seriesH }
	for _, v := range yt {
		s.Lines = append(s.Lines, line{X1: labelW, Y1: y(v), X2: labelW + plotW, Y2: y(v), Class: "grid"})
		s.Texts = append(s.Texts, text{X: labelW - 6, Y: y(v) + 4, Anchor: "end", Class: "tick", Text: tickLabel(v)})
	}
	s.Texts = append(s.Texts, text{X: 24, Y: bottom - seriesH/2, Anchor: "middle", Class: "label ylabel", Text: "ms per step (per rank)"})
	var st, wt strings.Builder
	for _, pt := range m.Series {
		fmt.Fprintf(&st, "%.1f,%.1f ", x(pt.T), y(pt.StepTime*1000))
		fmt.Fprintf(&wt, "%.1f,%.1f ", x(pt.T), y(pt.Wait*1000))
	}
	s.Polys = append(s.Polys, poly{Points: strings.TrimSpace(st.String()), Stroke: StepColour, Class: "series"},
		poly{Points: strings.TrimSpace(wt.String()), Stroke: WaitColour, Class: "series"})
	for _, f := range m.Failures {
		s.Lines = append(s.Lines, line{X1: x(f.T), Y1: float64(seriesTop), X2: x(f.T), Y2: bottom, Class: "failline"})
	}
	s.Lines = append(s.Lines, line{X1: labelW, Y1: bottom, X2: labelW + plotW, Y2: bottom, Class: "axis"})
	for _, t := range ticks(dur) {
		s.Lines = append(s.Lines, line{X1: x(t), Y1: bottom, X2: x(t), Y2: bottom + 5, Class: "axis"})
		s.Texts = append(s.Texts, text{X: x(t), Y: bottom + 18, Anchor: "middle", Class: "tick", Text: tickLabel(t)})
	}
	s.Texts = append(s.Texts, text{X: labelW + plotW/2, Y: bottom + 38, Anchor: "middle", Class: "label", Text: "seconds since the job started"})
}

// ticks are round values from 0 to about hi, some 5 to 10 of them.
func ticks(hi float64) []float64 {
	if hi <= 0 || math.IsNaN(hi) || math.IsInf(hi, 0) {
		return []float64{0}
	}
	step := math.Pow(10, math.Floor(math.Log10(hi/8)))
	for _, f := range []float64{1, 2, 5, 10} {
		if hi/(step*f) <= 10 {
			step *= f
			break
		}
	}
	var out []float64
	for v := 0.0; v <= hi+step/2 && len(out) < 12; v += step {
		out = append(out, v)
	}
	return out
}

func tickLabel(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}
