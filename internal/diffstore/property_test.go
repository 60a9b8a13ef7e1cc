package diffstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/gorun/gorun/replay"
)

// The property of the store: at every moment, Restore(s) of every step s
// in Range is the owner's true state at s, bit for bit (all regions),
// whatever the folds and base refreshes before.
//
// TestPropertyRestoreBitwise drives that with random schedules. For each
// seed (in the subtest's name) and fold depth D (1, 7, 16), an owner
// simulated in the test (a shard of a few thousand elements, Adam via
// replay.Step, random gradients, a changing learning rate, weight decay
// on most steps) runs 60 steps; the store gets a base at step 0 and a
// lossless differential every step. Every B steps (B random) the owner
// starts a base refresh of its state, whose chunks, in random sizes and
// order, are written a few per step between the differentials, then
// committed; some refreshes are aborted midway, others cut short by a new
// BeginBase (the owner crashed and began again). The holder keeps a lag
// of L steps (L random, as G lags the newest step) and folds D steps at a
// time once it holds D+L, with random replay options; the folds (lossless)
// pass refreshes in progress, which are then verified and dropped when
// they commit, or installed if no fold passed them. After every step the
// test restores every step in Range and compares it with the owner's.
//
// GORUN_PROPERTY_ITERS sets the number of seeds (default 4, 2 with
// -short), GORUN_PROPERTY_SEED the first seed.
func TestPropertyRestoreBitwise(t *testing.T) {
	iters, first := 4, uint64(1)
	if testing.Short() {
		iters = 2
	}
	if v := os.Getenv("GORUN_PROPERTY_ITERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		iters = n
	}
	if v := os.Getenv("GORUN_PROPERTY_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		first = n
	}
	for seed := first; seed < first+uint64(iters); seed++ {
		for _, depth := range []int64{1, 7, 16} {
			t.Run(fmt.Sprintf("seed=%d/depth=%d", seed, depth), func(t *testing.T) {
				t.Parallel()
				runProperty(t, seed, depth)
			})
		}
	}
}

// refresh is a base refresh the simulated owner is sending.
type refresh struct {
	w     *BaseWriter
	state map[string][]byte
	todo  []chunk
	fate  int // 0 commits, 1 aborts, 2 the owner crashes and begins a new one
	cut   int // chunks left when an interrupted refresh is interrupted
}

func runProperty(t *testing.T, seed uint64, depth int64) {
	const steps = 60
	rng := rand.New(rand.NewPCG(seed, uint64(depth)))
	o := newOwner(seed, 2000+rng.IntN(2000), lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	every := depth + int64(3+rng.IntN(8)) // a base every B steps leaves room for a fold of D
	lag := int64(rng.IntN(6))
	opt := replay.ReplayOptions{Workers: 1 + rng.IntN(2), Block: 16 * (1 + rng.IntN(64))}
	t.Logf("%d elements, base every %d steps, lag %d, %+v", o.n, every, lag, opt)

	first := int64(0) // the base's step, as the test expects it
	var ref *refresh
	begun := 0
	begin := func(step int64) {
		w, err := s.BeginBase(step)
		if err != nil {
			t.Fatalf("BeginBase(%d): %v", step, err)
		}
		st := o.states[step]
		ref = &refresh{w: w, state: st, todo: chunks(rng, st), fate: rng.IntN(4) % 3}
		if begun++; begun == 1 {
			ref.fate = 0 // every run commits at least one refresh
		}
		ref.cut = rng.IntN(len(ref.todo) + 1)
	}
	var commits, installed, aborts int
	for step := int64(1); step <= steps; step++ {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatalf("Append(%d): %v", step, err)
		}
		if ref != nil {
			for k := 1 + rng.IntN(3); k > 0 && len(ref.todo) > 0; k-- {
				c := ref.todo[0]
				ref.todo = ref.todo[1:]
				if err := ref.w.Write(c.region, c.off, c.b); err != nil {
					t.Fatalf("step %d: Write: %v", step, err)
				}
			}
			switch {
			case ref.fate == 1 && len(ref.todo) <= ref.cut:
				ref.w.Abort()
				if err := ref.w.Write(optName, 0, []byte{1}); !errors.Is(err, ErrStale) {
					t.Fatalf("Write after Abort: %v, want ErrStale", err)
				}
				ref, aborts = nil, aborts+1
			case ref.fate == 2 && len(ref.todo) <= ref.cut:
				old := ref.w
				begin(max(first, ref.w.Step()+int64(rng.IntN(int(step-ref.w.Step())+1))))
				if err := old.Commit(old.Step(), sums(ref.state)); !errors.Is(err, ErrStale) {
					t.Fatalf("Commit of a superseded refresh: %v, want ErrStale", err)
				}
				aborts++
			case len(ref.todo) == 0:
				if err := ref.w.Commit(ref.w.Step(), sums(ref.state)); err != nil {
					t.Fatalf("step %d: Commit of the refresh at %d: %v", step, ref.w.Step(), err)
				}
				if f, _, _ := s.Range(); f == ref.w.Step() {
					installed++
				}
				first = max(first, ref.w.Step())
				ref, commits = nil, commits+1
			}
		}
		if ref == nil && step%every == 0 {
			begin(step)
		}
		if step-first >= depth+lag {
			if err := s.Fold(first+depth, opt); err != nil {
				t.Fatalf("Fold(%d): %v", first+depth, err)
			}
			// A lossless fold passes a refresh in progress: the refresh,
			// when it commits, is verified and dropped.
			first += depth
		}
		checkRange(t, s, o, first, step, opt)
		if st := s.Stats(); st.LogLen != int(step-first) {
			t.Fatalf("step %d: Stats.LogLen = %d, want %d", step, st.LogLen, step-first)
		}
	}
	for _, step := range []int64{first - 1, steps + 1} {
		if _, err := restore(s, step, opt); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("restore of step %d outside [%d, %d]: %v, want ErrNotHeld", step, first, steps, err)
		}
	}
	st := s.Stats()
	t.Logf("%d refreshes committed, %d installed (%d dropped, the base being past them), %d interrupted; %d folds of %d steps", commits, installed, st.RefreshesSuperseded, aborts, st.Folds, st.FoldedSteps)
	if int64(installed) != st.Refreshes-1 || int64(installed)+st.RefreshesSuperseded != int64(commits) {
		t.Fatalf("%d refreshes committed, %d installed (Stats: %d installed, %d dropped)", commits, installed, st.Refreshes-1, st.RefreshesSuperseded)
	}
	if st.FoldedSteps == 0 {
		t.Fatal("no step was folded")
	}
}
