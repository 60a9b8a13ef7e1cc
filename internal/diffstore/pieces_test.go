package diffstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/replay"
)

// TestPropertyRestorePiecesIsRestore: RestorePieces gives Restore's bytes,
// bit for bit, every byte of every region exactly once, the regions one
// after another, whatever the optimizer region's layout (W, M and V in any
// order, with or without bytes between them), the codec, the folds and
// base refreshes before, and the piece size (4 bytes, sizes that divide
// neither N nor the region, larger than the region, the default). For
// each seed an owner of a random size and layout runs 30 steps; the store
// gets a base at step 0, one at a random later step, and folds now and
// then; after every step, steps of its range (first, last, one at random)
// are restored in pieces and compared with Restore (and, lossless, with
// the owner's true state).
func TestPropertyRestorePiecesIsRestore(t *testing.T) {
	codecs := []struct {
		name string
		opt  replay.Options
	}{
		{"raw", lossless},
		{"int8", replay.Options{}},
		{"topk", replay.Options{Threshold: 1, K: 0.05}},
	}
	perms := [][3]int{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}, {2, 1, 0}, {0, 2, 1}, {1, 0, 2}}
	for seed := uint64(1); seed <= 9; seed++ {
		c := codecs[seed%3]
		t.Run(fmt.Sprintf("seed=%d/%s", seed, c.name), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 77))
			o := newOwner(seed, 1+rng.IntN(3000), c.opt)
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
					first, _, _ := s.Range() // a refresh before the base is stale
					sendBase(t, s, o, max(first, step-int64(rng.IntN(3))))
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
							if !bytes.Equal(want[name], b) {
								t.Fatalf("Restore(%d): region %q is not the owner's", at, name)
							}
						}
					}
					for _, chunk := range []int{7 + rng.IntN(64), 4 * (1 + rng.IntN(o.n)), 1 + rng.IntN(regionBytes), regionBytes + 8, 0} {
						checkPieces(t, s, at, chunk, opt, want)
					}
				}
			}
		})
	}
}

// checkPieces checks that RestorePieces(step) in pieces of chunk bytes
// gives want, every region, each byte exactly once, the regions one after
// another in the store's order, no piece empty or longer than chunk
// rounded down to a multiple of 4 (DefaultChunk for 0).
func checkPieces(t testing.TB, s *Store, step int64, chunk int, opt replay.ReplayOptions, want map[string][]byte) {
	t.Helper()
	limit := max(4, chunk&^3)
	if chunk <= 0 {
		limit = DefaultChunk
	}
	got := make([][]byte, len(s.regions))
	seen := make([][]bool, len(s.regions))
	left := make([]int64, len(s.regions))
	for i, r := range s.regions {
		got[i], seen[i], left[i] = make([]byte, r.Size), make([]bool, r.Size), r.Size
	}
	cur := 0
	err := s.RestorePieces(step, chunk, opt, func(region int, off int64, b []byte) error {
		if region < 0 || region >= len(s.regions) {
			t.Fatalf("RestorePieces(%d): region %d of %d", step, region, len(s.regions))
		}
		for ; cur < region; cur++ {
			if left[cur] != 0 {
				t.Fatalf("RestorePieces(%d): a piece of region %d before region %d's last %d bytes", step, region, cur, left[cur])
			}
		}
		if region < cur {
			t.Fatalf("RestorePieces(%d): a piece of region %d after region %d's", step, region, cur)
		}
		if len(b) == 0 || len(b) > limit {
			t.Fatalf("RestorePieces(%d, chunk %d): a piece of %d bytes", step, chunk, len(b))
		}
		if off < 0 || off > s.regions[region].Size-int64(len(b)) {
			t.Fatalf("RestorePieces(%d): %d bytes at %d of region %q of %d", step, len(b), off, s.regions[region].Name, s.regions[region].Size)
		}
		for i := range b {
			if seen[region][off+int64(i)] {
				t.Fatalf("RestorePieces(%d): byte %d of region %q twice", step, off+int64(i), s.regions[region].Name)
			}
			seen[region][off+int64(i)] = true
		}
		copy(got[region][off:], b)
		left[region] -= int64(len(b))
		return nil
	})
	if err != nil {
		t.Fatalf("RestorePieces(%d, chunk %d): %v", step, chunk, err)
	}
	for i, r := range s.regions {
		if left[i] != 0 {
			t.Fatalf("RestorePieces(%d, chunk %d): %d bytes of region %q missing", step, chunk, left[i], r.Name)
		}
		if !bytes.Equal(got[i], want[r.Name]) {
			t.Fatalf("RestorePieces(%d, chunk %d): region %q differs from Restore's (first at byte %d)", step, chunk, r.Name, firstDiff(got[i], want[r.Name]))
		}
	}
}

// TestRestorePiecesNotHeld: a step outside the range (or any, before the
// first base) fails with ErrNotHeld before any piece.
func TestRestorePiecesNotHeld(t *testing.T) {
	o := newOwner(1, 100, lossless)
	s := o.newStore(t)
	emit := func(int, int64, []byte) error { t.Fatal("a piece of a step not held"); return nil }
	if err := s.RestorePieces(0, 0, replay.ReplayOptions{}, emit); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("RestorePieces without a base: %v, want ErrNotHeld", err)
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
		if err := s.RestorePieces(step, 0, replay.ReplayOptions{}, emit); !errors.Is(err, ErrNotHeld) {
			t.Errorf("RestorePieces(%d) of [1, 3]: %v, want ErrNotHeld", step, err)
		}
	}
}

// TestRestorePiecesStopsAtEmitError: emit's error ends the stream at any
// piece (the outside bytes, a window's W, M or V) and is returned as it is;
// the replayer is done when RestorePieces returns (a Fold, which waits for
// it, goes on), and the store is unchanged.
func TestRestorePiecesStopsAtEmitError(t *testing.T) {
	o := newOwner(2, 1000, lossless)
	o.gap = 8
	o.states[0] = o.regions()
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 2 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	stop := errors.New("the link failed")
	for _, at := range []int{1, 2, 3, 5, 9, 14} {
		calls := 0
		err := s.RestorePieces(2, 256, replay.ReplayOptions{}, func(int, int64, []byte) error {
			if calls++; calls == at {
				return stop
			}
			return nil
		})
		if err != stop || calls != at {
			t.Fatalf("RestorePieces: %v after %d pieces, want %v after %d", err, calls, stop, at)
		}
	}
	checkRestore(t, s, o, 2, replay.ReplayOptions{})
	if err := s.Fold(1, replay.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	checkRestore(t, s, o, 2, replay.ReplayOptions{})
}
