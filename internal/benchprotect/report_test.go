package main

import (
	"testing"
	"time"
)

// TestAfterBaseExcess: the steps right after a base (s mod B = 1) are set
// against the median of the others, whatever step the timed ones start
// at; no such step, or B below 2, gives no figure.
func TestAfterBaseExcess(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		var ds []time.Duration
		for _, x := range xs {
			ds = append(ds, time.Duration(x)*time.Millisecond)
		}
		return ds
	}
	for _, tc := range []struct {
		name         string
		steps        []time.Duration
		first, every int
		want         time.Duration
		n            int
		ok           bool
	}{
		// Steps 3..10, B 4: steps 5 and 9 come after bases 4 and 8.
		{name: "from 3", steps: ms(10, 12, 80, 10, 11, 10, 60, 12), first: 3, every: 4, want: 59500 * time.Microsecond, n: 2, ok: true},
		// Steps 1..4, B 2: steps 1 and 3.
		{name: "from 1", steps: ms(30, 10, 50, 12), first: 1, every: 2, want: 29 * time.Millisecond, n: 2, ok: true},
		{name: "no step after a base", steps: ms(10, 10), first: 2, every: 8},
		{name: "B 1", steps: ms(10, 10), first: 2, every: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n, ok := afterBaseExcess(tc.steps, tc.first, tc.every)
			if got != tc.want || n != tc.n || ok != tc.ok {
				t.Errorf("afterBaseExcess = %v, %d, %v; want %v, %d, %v", got, n, ok, tc.want, tc.n, tc.ok)
			}
		})
	}
}
