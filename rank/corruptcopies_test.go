package rank

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestRestoreReportsCorruptCopies: a restore that fails because its only
// copy failed its CRC32C (Host.FlipReplicas) leaves the holder and step
// for the agent to report with the rank's exit (Host.TakeCorruptCopies),
// once; a restore that took a good copy after a flipped one leaves
// nothing (the launcher must not count a copy lost that a restore did
// not need).
func TestRestoreReportsCorruptCopies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holders [][]int // host 1's rank 1 first: the flipped copy is tried first
		want    []int   // the holders reported; nil: none
	}{
		{"one copy, flipped", [][]int{{1}, {2}, {0}}, []int{1}},
		{"two copies, one flipped", [][]int{{1, 2}, {2, 0}, {0, 1}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peers := func(int) []int { return []int{0, 1, 2} }
			c := newCluster(t, [][]int{{0}, {1}, {2}}, tc.holders, peers)
			rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
			protectReplicated(c, rs, 2) // G = 1
			protectFrom(c, rs, 2, 3)    // G = 2
			if _, err := c.hosts[1].FlipReplicas(); err != nil {
				t.Fatal(err)
			}
			replaceHost(t, c, 0, []int{0}, peers, 1, 2)
			r0 := newSessRank(t, c.hosts[0], 0)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res := r0.restore(ctx)
			if (res.Err != "") != (tc.want != nil) {
				t.Fatalf("restore: %+v", res)
			}
			step, hs, ok := c.hosts[0].TakeCorruptCopies(0)
			if ok != (tc.want != nil) || ok && (step != 2 || !slices.Equal(hs, tc.want)) {
				t.Fatalf("TakeCorruptCopies(0) = %d %v %t, want step 2 holders %v", step, hs, ok, tc.want)
			}
			if _, _, ok := c.hosts[0].TakeCorruptCopies(0); ok {
				t.Error("TakeCorruptCopies(0) reported the same restore twice")
			}
		})
	}
}

// TestCopiesCorruptErrorMatches: the error matches ErrCopiesCorrupt and
// what the restore's error matches (ErrCopyCRC), and names the holders.
func TestCopiesCorruptErrorMatches(t *testing.T) {
	inner := fmt.Errorf("holder rank 3: %w", fmt.Errorf("region %q: %w", "opt", ErrCopyCRC))
	var err error = &CopiesCorruptError{Rank: 1, Step: 16, Holders: []int{3}, Err: inner}
	err = fmt.Errorf("restore: %w", err)
	for _, target := range []error{ErrCopiesCorrupt, ErrCopyCRC} {
		if !errors.Is(err, target) {
			t.Errorf("%v does not match %v", err, target)
		}
	}
	if errors.Is(err, ErrUnrecoverable) {
		t.Errorf("%v matches ErrUnrecoverable", err)
	}
}
