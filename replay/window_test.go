package replay

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestFusedAtIsFused: replaying a tensor window by window (random cuts,
// windows not aligned to vectors or blocks) gives bitwise the state of
// Fused on the whole tensor, with every codec (TopK and Int8 expand a
// window from its own offset).
func TestFusedAtIsFused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		steps int
		opt   Options
	}{
		{"raw", 5_003, 16, Options{Lossless: true}},
		{"raw, more than a batch", 1_001, maxBatch + 3, Options{Lossless: true}},
		{"int8", 5_003, 4, Options{}},
		{"topk", 40_009, 4, Options{Threshold: 1, K: 0.05}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := randomState(3, tc.n)
			_, grads, hypers := trajectory(base, 5, 1, tc.steps)
			diffs := compressAll(t, grads, tc.opt)
			want := base.clone()
			if err := Fused(want, diffs, hypers, ReplayOptions{}); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(tc.n), 1))
			for trial := range 5 {
				got := base.clone()
				opt := ReplayOptions{Workers: 1 + trial%3, Block: 16 * (1 + rng.IntN(200))}
				for lo := 0; lo < tc.n; {
					hi := min(tc.n, lo+1+rng.IntN(tc.n/3))
					win := State{W: got.W[lo:hi], M: got.M[lo:hi], V: got.V[lo:hi]}
					if err := FusedAt(win, lo, diffs, hypers, opt); err != nil {
						t.Fatal(err)
					}
					lo = hi
				}
				checkSameState(t, "windows vs whole", got, want)
			}
		})
	}
}

// TestFusedAtMismatch: a window outside the differentials is refused
// with ErrMismatch.
func TestFusedAtMismatch(t *testing.T) {
	base := randomState(1, 100)
	_, grads, hypers := trajectory(base, 1, 1, 2)
	diffs := compressAll(t, grads, Options{Lossless: true})
	win := func(n int) State { return State{W: make([]float32, n), M: make([]float32, n), V: make([]float32, n)} }
	for _, tc := range []struct {
		name string
		st   State
		lo   int
	}{
		{"negative offset", win(10), -1},
		{"past the end", win(10), 91},
		{"longer than the tensor", win(101), 0},
	} {
		if err := FusedAt(tc.st, tc.lo, diffs, hypers, ReplayOptions{}); !errors.Is(err, ErrMismatch) {
			t.Errorf("%s: %v, want ErrMismatch", tc.name, err)
		}
	}
	if err := FusedAt(win(10), 90, diffs, hypers, ReplayOptions{}); err != nil {
		t.Errorf("the last 10 elements: %v", err)
	}
}
