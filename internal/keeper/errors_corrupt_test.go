package keeper

import (
	"errors"
	"fmt"
	"testing"
)

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
