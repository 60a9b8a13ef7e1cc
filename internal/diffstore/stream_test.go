package diffstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/replay"
)

// TestPropertyRestoreToIsRestore: RestoreTo gives Restore's bytes, bit for
// bit, whatever the optimizer region's layout (W, M and V in any order,
// with or without bytes between them), the codec (lossless or not), the
// folds and base refreshes before, and the piece size (4 bytes, sizes that
// divide neither N nor the region, larger than the region, the default).
// For each seed an owner of a random size and layout runs 30 steps; the
// store gets a base at step 0, one at a random later step, and folds a
// random number of steps now and then; after every step, the steps in
// Range (its first, its last and one at random) are streamed with random
// piece sizes and compared with Restore (and, lossless, with the owner's
// true state).
func TestPropertyRestoreToIsRestore(t *testing.T) {
	codecs := []struct {
		name string
		opt  replay.Options
	}{
		{"raw", lossless},
		{"int8", replay.Options{}},
		{"topk", replay.Options{Threshold: 1, K: 0.05}},
	}
	perms := [][3]int{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}, {2, 1, 0}}
	for seed := uint64(1); seed <= 8; seed++ {
		c := codecs[seed%3]
		t.Run(fmt.Sprintf("seed=%d/%s", seed, c.name), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 99))
			o := newOwner(seed, 500+rng.IntN(2500), c.opt)
			o.pos = perms[rng.IntN(len(perms))]
			o.gap = 4 * rng.IntN(4)
			o.states[0] = o.regions() // the initial state in this layout
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			opt := replay.ReplayOptions{Workers: 1 + rng.IntN(2), Block: 16 * (1 + rng.IntN(64))}
			refreshAt := int64(5 + rng.IntN(20))
			t.Logf("%d elements, W M V in slots %v, gaps of %d bytes, refresh at %d, %+v", o.n, o.pos, o.gap, refreshAt, opt)
			regionBytes := o.optSize()
			for step := int64(1); step <= 30; step++ {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatalf("Append(%d): %v", step, err)
				}
				if step == refreshAt {
					sendBase(t, s, o, step-int64(rng.IntN(3)))
				}
				if rng.IntN(4) == 0 {
					first, _, _ := s.Range()
					if err := s.Fold(first+int64(1+rng.IntN(8)), opt); err != nil {
						t.Fatal(err)
					}
				}
				first, last, ok := s.Range()
				if !ok {
					t.Fatal("no range")
				}
				for _, at := range []int64{first, last, first + rng.Int64N(last-first+1)} {
					want, err := restore(s, at, opt)
					if err != nil {
						t.Fatalf("Restore(%d): %v", at, err)
					}
					if c.opt.Lossless {
						for name, b := range o.states[at] {
							if !equalBytes(want[name], b) {
								t.Fatalf("Restore(%d): region %q is not the owner's", at, name)
							}
						}
					}
					chunks := []int{7 + rng.IntN(64), 4 * (1 + rng.IntN(o.n)), 1 + rng.IntN(regionBytes), regionBytes + 8, 0}
					if step == 30 {
						chunks = append(chunks, 4) // one element at a time: slow
					}
					for _, chunk := range chunks {
						checkStream(t, s, at, chunk, opt, want)
					}
				}
			}
		})
	}
}

func equalBytes(a, b []byte) bool { return string(a) == string(b) }

// TestRestoreToNotHeld: a step outside the range (or any, before the first
// base) fails with ErrNotHeld before any piece.
func TestRestoreToNotHeld(t *testing.T) {
	o := newOwner(1, 100, lossless)
	s := o.newStore(t)
	emit := func(int, []byte) error { t.Fatal("a piece of a step not held"); return nil }
	if err := s.RestoreTo(0, 0, replay.ReplayOptions{}, emit); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("RestoreTo without a base: %v, want ErrNotHeld", err)
	}
	sendBase(t, s, o, 0)
	for range 3 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Fold(1, replay.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []int64{0, 4, -1} {
		if err := s.RestoreTo(step, 0, replay.ReplayOptions{}, emit); !errors.Is(err, ErrNotHeld) {
			t.Errorf("RestoreTo(%d) of [1, 3]: %v, want ErrNotHeld", step, err)
		}
	}
}

// TestRestoreToStopsAtEmitError: emit's error ends the stream and is
// returned as it is; the store is unchanged (a later restore is exact).
func TestRestoreToStopsAtEmitError(t *testing.T) {
	o := newOwner(2, 1000, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 2 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	stop := errors.New("the link failed")
	calls := 0
	err := s.RestoreTo(2, 256, replay.ReplayOptions{}, func(int, []byte) error {
		if calls++; calls == 5 {
			return stop
		}
		return nil
	})
	if err != stop || calls != 5 {
		t.Fatalf("RestoreTo: %v after %d pieces, want %v after 5", err, calls, stop)
	}
	checkRestore(t, s, o, 2, replay.ReplayOptions{})
	checkRestore(t, s, o, 0, replay.ReplayOptions{})
}
