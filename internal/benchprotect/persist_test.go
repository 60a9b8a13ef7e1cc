package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

func TestParseCkpt(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"auto,1,2,4", []string{"auto", "1", "2", "4"}},
		{"8", []string{"8"}},
		{"0", nil},
		{"9", nil},
		{"auto,auto", nil},
		{"1,,2", nil},
		{"fast", nil},
	} {
		got, err := parseCkpt(tc.in)
		if (err != nil) != (tc.want == nil) || !slices.Equal(got, tc.want) {
			t.Errorf("parseCkpt(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestParseDurable reads gorun -v's durable tier report as gorun prints
// it (the last one of the log).
func TestParseDurable(t *testing.T) {
	log := `gorun: state protection: G = 19 (the step every rank can resume from), mode full
    rank  committed replicated   stages    rule wait    repl/step  repl MB/s
       0         19         19       20     19.113ms            -          -
gorun: durable tier: /tmp/d2ck, a base every 4 steps, committed version step 16
    rank  saves  skipped  failed   write/save       MB/s   stage wait    N
       0      5        0       0     52.939ms         11           0s    1
       1      4        1       2     50ms             13       10ms    2
       2      -
durable footprint: 12.3MB in /tmp/d2ck (by rank: 3.08MB 3.08MB 3.08MB 3.08MB)
`
	d := parseDurable(log)
	if d == nil {
		t.Fatal("no report parsed")
	}
	if d.committed != 16 || d.saves != 9 || d.skipped != 1 || d.failed != 2 || !slices.Equal(d.n, []int{1, 2}) || d.footprint != "12.3MB" ||
		d.writePerSave != (52939*time.Microsecond+50*time.Millisecond)/2 || d.mbps != 12 || d.holdTotal != 5*time.Millisecond {
		t.Fatalf("parsed %+v", d)
	}
	if d := parseDurable("gorun: durable tier: /x, a base every 10 steps, no version committed\n    rank  saves\n"); d == nil || d.committed != -1 {
		t.Fatalf("a report without a commit: %+v", d)
	}
	if parseDurable("nothing") != nil {
		t.Fatal("a report parsed from nothing")
	}
}

func TestRatios(t *testing.T) {
	run := func(ms ...int) *runResult {
		r := &runResult{}
		for _, m := range ms {
			r.steps = append(r.steps, time.Duration(m)*time.Millisecond)
		}
		return r
	}
	qs, q := ratios([]*runResult{run(110, 110), run(90, 110)}, []*runResult{run(100, 100), run(100, 100)})
	if !slices.Equal(qs, []float64{1.1, 1.0}) || q != 1.05 {
		t.Fatalf("ratios %v, mean %v; want [1.1 1] and 1.05", qs, q)
	}
}

// TestWindowExcess: the steps after each base step (its whole window
// timed) against the others, within one run; a run with no whole window
// or no other step cannot be judged.
func TestWindowExcess(t *testing.T) {
	ms := func(first int, f func(s int) int, n int) []time.Duration {
		var ds []time.Duration
		for s := first; s < first+n; s++ {
			ds = append(ds, time.Duration(f(s))*time.Millisecond)
		}
		return ds
	}
	flat := func(int) int { return 100 }
	for _, tc := range []struct {
		name                string
		first, every, after int
		steps               []time.Duration
		ratio, share        float64
		ok                  bool
	}{
		// Steps 2 to 21, bases 10 and 20: 11-13 in a window (20's is cut off).
		{"slow after bases", 2, 10, 3, ms(2, func(s int) int {
			if s >= 11 && s <= 13 {
				return 200
			}
			return 100
		}, 20), 2, 3.0 / 17, true},
		{"flat", 2, 10, 3, ms(2, flat, 20), 1, 3.0 / 17, true},
		// The window of base 20 (21-23) whole: steps 2 to 23.
		{"two windows", 2, 10, 3, ms(2, func(s int) int {
			if s == 21 {
				return 400
			}
			return 100
		}, 22), 1.5, 6.0 / 20, true}, // steps 2 and 3 (base 0's window, cut off) in neither
		// -ckpt-every 3 with a window of 2: steps 4-5, 7-8 in, 6 and 9 out.
		{"every 3", 4, 3, 2, ms(4, func(s int) int {
			if s%3 != 0 {
				return 150
			}
			return 100
		}, 6), 1.5, 4.0 / 6, true},
		// -ckpt-every 1: no step outside a window (baseWindow gives 0).
		{"every 1", 2, 1, 0, ms(2, flat, 10), 0, 0, false},
		// 10 steps at -ckpt-every 10: no whole window.
		{"no whole window", 2, 10, 3, ms(2, flat, 10), 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ratio, share, ok := windowExcess(tc.steps, tc.first, tc.every, tc.after)
			if ok != tc.ok || math.Abs(ratio-tc.ratio) > 1e-9 || math.Abs(share-tc.share) > 1e-9 {
				t.Fatalf("windowExcess = %v, %v, %v; want %v, %v, %v", ratio, share, ok, tc.ratio, tc.share, tc.ok)
			}
		})
	}
	if m := medianF([]float64{3, 1, 2, 10}); m != 2.5 {
		t.Fatalf("medianF = %v, want 2.5", m)
	}
}

func TestBaseWindow(t *testing.T) {
	for _, tc := range []struct {
		write, step time.Duration
		every       int
		after       int
		cut         bool
	}{
		{0, 100 * time.Millisecond, 10, 1, false},
		{50 * time.Millisecond, 100 * time.Millisecond, 10, 2, false},
		{100 * time.Millisecond, 100 * time.Millisecond, 10, 2, false},
		{550 * time.Millisecond, 100 * time.Millisecond, 10, 7, false},
		{800 * time.Millisecond, 100 * time.Millisecond, 10, 9, false},
		{2 * time.Second, 100 * time.Millisecond, 10, 9, true},
		{50 * time.Millisecond, 100 * time.Millisecond, 3, 2, false},
		{50 * time.Millisecond, 100 * time.Millisecond, 1, 0, true},
	} {
		if after, cut := baseWindow(tc.write, tc.step, tc.every); after != tc.after || cut != tc.cut {
			t.Errorf("baseWindow(%v, %v, %d) = %d, %v; want %d, %v", tc.write, tc.step, tc.every, after, cut, tc.after, tc.cut)
		}
	}
}

// TestAttributedLongSave: each save slows the 6 steps after its base by
// half (a write time of 5.5 steps): B's window follows the write time and
// finds the whole run's overhead (figure A, +30%), which a window of 3
// steps put at a fifth of it (the slow steps past it counted as the
// baseline). A run too short for a whole window cannot be judged.
func TestAttributedLongSave(t *testing.T) {
	b := &bench{cfg: config{warmup: 1, ckptEvery: 10}}
	run := func(n int, slow func(s int) bool, write time.Duration) *runResult {
		r := &runResult{durable: &durableTable{writePerSave: write}}
		for s := 1; s <= n; s++ {
			d := 100 * time.Millisecond
			if slow(s) {
				d = 150 * time.Millisecond
			}
			r.steps = append(r.steps, d)
		}
		return r
	}
	slow := func(s int) bool { k := (s-1)%10 + 1; return k <= 6 } // s+1..s+6 after each base s
	const n = 100                                                 // steps 1 to 100: bases 0 to 90 with whole windows
	with := run(n, slow, 550*time.Millisecond)
	base := run(n, func(int) bool { return false }, 0)
	qs, _ := ratios([]*runResult{with}, []*runResult{base})
	a := qs[0] - 1
	got := b.attributed(with, base)
	if !got.ok || got.cut || math.Abs(got.q-a) > 0.01 {
		t.Fatalf("B = %+v, want %.3f (A) within 0.01", got, a)
	}
	// Steps 2 to 11 (-warmup 2): base 0's window starts before them,
	// base 10's ends after them.
	b.cfg.warmup = 2
	short := run(10, slow, 550*time.Millisecond)
	if got := b.attributed(short, run(10, func(int) bool { return false }, 0)); got.ok {
		t.Fatalf("B of 10 steps at -ckpt-every 10 = %+v, want not ok", got)
	}
}

// TestPersistReportCannotJudge: runs too short for a whole window after a
// base (10 steps at -ckpt-every 10) have B printed as "cannot judge", not
// as +0.0% met; C is the wait over the run's span.
func TestPersistReportCannotJudge(t *testing.T) {
	var out strings.Builder
	b := &bench{out: &out, cfg: config{ranks: 1, warmup: 2, steps: 10, ckptEvery: 10, ckptRounds: 1, ckpt: []string{"1"},
		redundancies: []topology.Redundancy{{}}}}
	run := func(hold time.Duration) *runResult {
		r := &runResult{span: time.Second, durable: &durableTable{holdTotal: hold, writePerSave: 50 * time.Millisecond, n: []int{1}}}
		for range 10 {
			r.steps = append(r.steps, 100*time.Millisecond)
		}
		return r
	}
	b.persistReport(&variant{name: "v"}, nil, []*runResult{run(0)}, [][]*runResult{{run(10 * time.Millisecond)}})
	got := out.String()
	for _, want := range []string{"B (within runs, median) cannot judge", "cannot judge\n", "n/a %", "+1.0 %"} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
}
