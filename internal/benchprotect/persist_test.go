package main

import (
	"math"
	"slices"
	"testing"
	"time"
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
// timed) against the others, within one run.
func TestWindowExcess(t *testing.T) {
	ms := func(first, every int, f func(s int) int, n int) []time.Duration {
		var ds []time.Duration
		for s := first; s < first+n; s++ {
			ds = append(ds, time.Duration(f(s))*time.Millisecond)
		}
		return ds
	}
	for _, tc := range []struct {
		name         string
		first, every int
		steps        []time.Duration
		excess       float64
		share        float64
	}{
		// Steps 2 to 21, bases 10 and 20: 11-13 in a window (20's is cut off).
		{"slow after bases", 2, 10, ms(2, 10, func(s int) int {
			if s >= 11 && s <= 13 {
				return 200
			}
			return 100
		}, 20), 2, 3.0 / 17},
		{"flat", 2, 10, ms(2, 10, func(int) int { return 100 }, 20), 1, 3.0 / 17},
		// The window of base 20 (21-23) whole: steps 2 to 23.
		{"two windows", 2, 10, ms(2, 10, func(s int) int {
			if s == 21 {
				return 400
			}
			return 100
		}, 22), 1.5, 6.0 / 20}, // steps 2 and 3 (base 0's window, cut off) in neither
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, share := windowExcess(tc.steps, tc.first, tc.every)
			if math.Abs(e-tc.excess) > 1e-9 || math.Abs(share-tc.share) > 1e-9 {
				t.Fatalf("windowExcess = %v, %v; want %v, %v", e, share, tc.excess, tc.share)
			}
		})
	}
	if m := medianF([]float64{3, 1, 2, 10}); m != 2.5 {
		t.Fatalf("medianF = %v, want 2.5", m)
	}
}
