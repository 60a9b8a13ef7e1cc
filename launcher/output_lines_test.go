package launcher

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gorun/gorun/internal/gortest"

	"github.com/gorun/gorun/internal/wire"
)

// lineChecker records everything written to it, from both streams, as a
// terminal does.
type lineChecker = gortest.SyncBuffer

// checkWholeLines checks every line of out against re.
func checkWholeLines(t *testing.T, out string, re *regexp.Regexp) map[string]int {
	t.Helper()
	kinds := map[string]int{}
	if out != "" && !strings.HasSuffix(out, "\n") {
		t.Errorf("output does not end in a newline: …%q", out[max(0, len(out)-80):])
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			if len(l) > 200 {
				l = l[:100] + "…" + l[len(l)-100:]
			}
			t.Fatalf("line not whole: %q", l)
		}
		kinds[m[1]]++
	}
	return kinds
}

// Reports and agent lines written while agents' frames arrive on other
// goroutines never land inside a rank's line, with stdout and stderr on
// the same terminal.
func TestOutputConcurrentWritersKeepLinesWhole(t *testing.T) {
	term := &lineChecker{}
	const agents, frames, world = 6, 100, 24
	m := newOutputMux(term, term, world, true, false, "")
	var wg sync.WaitGroup
	for a := range agents {
		wg.Go(func() {
			for i := range frames {
				var recs []rec
				for k := range 4 {
					r := a*4 + k
					var sb strings.Builder
					for l := range 1 + (i+k)%7 {
						fmt.Fprintf(&sb, "r%d-f%d-l%d-%s\n", r, i, l, strings.Repeat("x", (i*31+l*17)%500))
					}
					s := wire.Stdout
					if (i+k)%3 == 0 {
						s = wire.Stderr
					}
					recs = append(recs, rec{r, s, sb.String()})
				}
				if err := m.frame(a, frameOf(a, recs...)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for g := range 3 {
		wg.Go(func() {
			for i := range frames {
				m.report("report %d from %d with %s", i, g, strings.Repeat("y", i%50))
			}
		})
		wg.Go(func() {
			for i := range frames {
				m.agentLine(fmt.Sprintf("host%d", g), []byte(fmt.Sprintf("agent says %d %s\n", i, strings.Repeat("z", i%70))))
			}
		})
	}
	wg.Wait()
	m.close()
	re := regexp.MustCompile(`^(?:\[(\d+)\] r(\d+)-f\d+-l\d+-x*|gorun: (report) \d+ from \d with y*|gorun agent host\d: (agent) says \d+ z*)$`)
	total := 0
	for _, l := range strings.Split(strings.TrimSuffix(term.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line not whole: %.200q", l)
		}
		if m[1] != "" && m[1] != m[2] {
			t.Fatalf("line of rank %s tagged %s: %.200q", m[2], m[1], l)
		}
		total++
	}
	want := 3 * frames * 2 // reports and agent lines
	for i := range frames {
		for k := range 4 {
			want += agents * (1 + (i+k)%7)
		}
	}
	if total != want {
		t.Errorf("%d lines, want %d", total, want)
	}
}

// Each stream has its own 64 KiB buffer; a frame with more than that for
// stdout and then for stderr must not make either writer flush part of a
// line, or, with both streams on one terminal (the usual case), stderr
// lands inside a stdout line. Agents send frames of 256 KiB and more.
func TestLargeFrameKeepsLinesWhole(t *testing.T) {
	term := &lineChecker{}
	m := newOutputMux(term, term, 2, true, false, "")
	var out, errs strings.Builder
	for i := range 100 {
		fmt.Fprintf(&out, "out-%d-%s\n", i, strings.Repeat("o", 1000))
		fmt.Fprintf(&errs, "err-%d-%s\n", i, strings.Repeat("e", 1000))
	}
	mustFrame(t, m, frameOf(0, rec{0, wire.Stdout, out.String()}, rec{1, wire.Stderr, errs.String()}))
	m.close()
	checkWholeLines(t, term.String(), regexp.MustCompile(`^\[\d\] ((out)-\d+-o+|(err)-\d+-e+)$`))
}

// wholeWrites fails the test when a write does not end a line: the unit a
// terminal shared by stdout and stderr can interleave.
type wholeWrites struct {
	t      *testing.T
	mu     sync.Mutex // the two streams' lanes write at once
	writes int
}

func (w *wholeWrites) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	if len(p) > 0 && p[len(p)-1] != '\n' {
		w.t.Errorf("write %d of %d bytes ends mid-line: …%q", w.writes, len(p), p[max(0, len(p)-40):])
	}
	return len(p), nil
}

// A line longer than a stream's whole buffer goes out in one write, and
// no write ends mid-line.
func TestLineLongerThanBufferStaysWhole(t *testing.T) {
	w := &wholeWrites{t: t}
	m := newOutputMux(w, w, 2, true, false, "")
	long := "long-" + strings.Repeat("l", 200<<10) + "\n"
	var many strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&many, "out-%d-%s\n", i, strings.Repeat("o", i%300))
	}
	mustFrame(t, m, frameOf(0, rec{1, wire.Stderr, "err-1-e\n"}, rec{0, wire.Stdout, long}, rec{0, wire.Stdout, many.String()}, rec{1, wire.Stderr, "err-2-e\n"}))
	m.close()
	if w.writes < 3 {
		t.Fatalf("only %d writes", w.writes)
	}
}
