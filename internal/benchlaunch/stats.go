package main

import (
	"slices"
	"time"
)

// percentile returns the p-th percentile (0 <= p <= 100) of xs, interpolating
// linearly between the two closest ranks. It returns 0 for an empty xs and
// does not modify xs.
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	pos := p / 100 * float64(len(s)-1)
	lo := int(pos)
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	if lo < 0 {
		return s[0]
	}
	return s[lo] + time.Duration((pos-float64(lo))*float64(s[lo+1]-s[lo]))
}

func median(xs []time.Duration) time.Duration { return percentile(xs, 50) }

// roundOrder returns the order in which round r runs k launchers: 0..k-1
// rotated left by r. Over any k consecutive rounds every launcher runs once
// in every position, so warm caches and load drift favour none of them.
func roundOrder(r, k int) []int {
	order := make([]int, k)
	for i := range order {
		order[i] = (r + i) % k
	}
	return order
}

// sample collects the runs of one launcher at one N.
type sample struct {
	times []time.Duration // wall times of runs that exited 0
	hangs int             // runs killed at the timeout
	fails int             // runs that exited non-zero
}

func (s *sample) add(r result) {
	switch r.outcome {
	case ok:
		s.times = append(s.times, r.elapsed)
	case hung:
		s.hangs++
	case failed:
		s.fails++
	}
}
