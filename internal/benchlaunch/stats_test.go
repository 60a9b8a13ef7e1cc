package main

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(xs ...float64) []time.Duration {
		var ds []time.Duration
		for _, x := range xs {
			ds = append(ds, time.Duration(x*float64(time.Millisecond)))
		}
		return ds
	}
	tests := []struct {
		name string
		xs   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 50, ms(7)[0]},
		{"odd median", ms(5, 1, 3), 50, ms(3)[0]},
		{"even median interpolates", ms(4, 1, 3, 2), 50, ms(2.5)[0]},
		{"p0 is min", ms(9, 2, 5), 0, ms(2)[0]},
		{"p100 is max", ms(9, 2, 5), 100, ms(9)[0]},
		{"p10 of 11", ms(10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9), 10, ms(1)[0]},
		{"p90 of 11", ms(10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9), 90, ms(9)[0]},
		{"p90 of 5 interpolates", ms(10, 20, 30, 40, 50), 90, ms(46)[0]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.xs)
			if got := percentile(tt.xs, tt.p); got != tt.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tt.xs, tt.p, got, tt.want)
			}
			if !slices.Equal(in, tt.xs) {
				t.Errorf("percentile modified its input: %v, was %v", tt.xs, in)
			}
		})
	}
	if got, want := median(ms(3, 1, 2)), ms(2)[0]; got != want {
		t.Errorf("median = %v, want %v", got, want)
	}
}

func TestRoundOrder(t *testing.T) {
	if got, want := roundOrder(1, 3), []int{1, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("roundOrder(1, 3) = %v, want %v", got, want)
	}
	for k := 1; k <= 4; k++ {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			// Over any k consecutive rounds, each launcher runs once per
			// round and once in each position.
			for start := range 2 * k {
				seen := make([][]int, k) // seen[launcher][position]
				for i := range seen {
					seen[i] = make([]int, k)
				}
				for r := start; r < start+k; r++ {
					order := roundOrder(r, k)
					if got := slices.Sorted(slices.Values(order)); !slices.Equal(got, roundOrder(0, k)) {
						t.Fatalf("round %d runs %v, want each of 0..%d once", r, order, k-1)
					}
					for pos, l := range order {
						seen[l][pos]++
					}
				}
				for l, counts := range seen {
					for pos, c := range counts {
						if c != 1 {
							t.Errorf("rounds %d..%d: launcher %d ran %d times at position %d, want 1", start, start+k-1, l, c, pos)
						}
					}
				}
			}
		})
	}
}

func TestSample(t *testing.T) {
	var s sample
	for _, r := range []result{{outcome: ok, elapsed: time.Millisecond}, {outcome: hung}, {outcome: failed}, {outcome: ok, elapsed: 3 * time.Millisecond}} {
		s.add(r)
	}
	if !slices.Equal(s.times, []time.Duration{time.Millisecond, 3 * time.Millisecond}) || s.hangs != 1 || s.fails != 1 {
		t.Errorf("sample = %+v, want 2 times, 1 hang, 1 fail", s)
	}
}
