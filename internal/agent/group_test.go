package agent

import (
	"slices"
	"testing"
	"time"
)

// TestGroupWait: wait returns nothing once the group's goroutines (its
// subgroups' too) have ended, and otherwise what is left: at its bound,
// or at once when only goroutines it is told not to wait for are left.
func TestGroupWait(t *testing.T) {
	for _, tt := range []struct {
		name        string
		blocked     []string // goroutines left blocked until the test ends
		unstoppable []string
		bound       time.Duration
		want        []string
	}{
		{"all end", nil, nil, time.Minute, nil},
		{"one blocked", []string{"stuck"}, nil, 10 * time.Millisecond, []string{"stuck"}},
		{"two of a name", []string{"stuck", "stuck"}, nil, 10 * time.Millisecond, []string{"stuck ×2"}},
		// Returned at once (a wait for it would show as a minute more).
		{"unstoppable", []string{"stream"}, []string{"stream"}, time.Minute, []string{"stream"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var g group
			release := make(chan struct{})
			defer close(release)
			for _, name := range tt.blocked {
				g.Go(name, func() { <-release })
			}
			quick := make(chan struct{})
			g.Go("quick", func() { <-quick })
			sub := newSubgroup(&g, "sub")
			sub.Go(func() { <-quick })
			close(quick)
			sub.Wait()
			if got := g.wait(tt.bound, tt.unstoppable...); !slices.Equal(got, tt.want) {
				t.Errorf("wait: %q, want %q", got, tt.want)
			}
		})
	}
}
