package wire_test

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// The tests in this file pin down bugs found while writing the tests of
// this package. Each is skipped until the bug is fixed; remove the Skip
// together with the fix.

// Expand sums the counts of s with "total += r.Count; total > world", which
// overflows when world > math.MaxInt/2: the sum wraps negative and Expand
// panics in make ("makeslice: cap out of range"); with four such ranges the
// sum wraps to 0 and Expand appends 2^64 ranks. Decoders never pass such a
// world (it is at most MaxWorld), but Expand is exported.
func TestKnownBugExpandCountOverflow(t *testing.T) {
	const half = math.MaxInt/2 + 1
	for _, s := range []wire.RankSet{
		{rr(0, half, 1), rr(0, half, 1)},
		{rr(0, half, 1), rr(0, half, 1), rr(0, half, 1)},
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("Expand(MaxInt) of %v panicked: %v", s, p)
				}
			}()
			if _, err := s.Expand(math.MaxInt); !errors.Is(err, wire.ErrBadRankSet) {
				t.Errorf("Expand(MaxInt) of %v = %v, want ErrBadRankSet", s, err)
			}
		}()
	}
}

// DecodeOutputFrame compares ranks with uint64(world): a negative world
// becomes huge, so every rank is accepted and ranks >= 1<<63 are delivered
// as negative ints.
func TestKnownBugOutputFrameNegativeWorld(t *testing.T) {
	f := wire.NewOutputFrame(0)
	f.Add(-5, wire.Stdout, []byte("x"))
	err := wire.DecodeOutputFrame(f.Bytes(), -1, func(_ int, r wire.OutputRecord) {
		t.Errorf("delivered rank %d with world -1", r.Rank)
	})
	if !errors.Is(err, wire.ErrMalformed) {
		t.Errorf("DecodeOutputFrame(world -1) = %v, want ErrMalformed", err)
	}
}

// EpochTable.Encode writes any uint64 epoch, and Validate accepts any, but
// DecodeEpochTable rejects epochs above 1<<63.
func TestKnownBugEpochTableLargeEpoch(t *testing.T) {
	tab := table(1, []int{0})
	tab.Epoch = math.MaxUint64
	if err := tab.Validate(); err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeEpochTable(tab.Encode())
	if err != nil || !reflect.DeepEqual(got, tab) {
		t.Errorf("round trip of epoch %d: %+v, %v", tab.Epoch, got, err)
	}
}

// Validate checks the length of host names and addresses but not of
// MasterAddr, so it accepts a table that DecodeEpochTable rejects after
// Encode.
func TestKnownBugEpochTableLongMasterAddr(t *testing.T) {
	tab := table(1, []int{0})
	tab.MasterAddr = tooLong
	err := tab.Validate()
	_, derr := wire.DecodeEpochTable(tab.Encode())
	if (err == nil) != (derr == nil) {
		t.Errorf("Validate() = %v but DecodeEpochTable(Encode()) = %v", err, derr)
	}
}
