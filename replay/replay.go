package replay

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// ErrMismatch reports a replay whose state, differentials and
// hyper-parameters do not fit together.
var ErrMismatch = errors.New("replay: state, differentials and steps do not match")

// State is one tensor's optimizer state: its fp32 master weights and both
// Adam moments, of equal lengths.
type State struct{ W, M, V []float32 }

// ReplayOptions tune a replay; the zero value is good.
type ReplayOptions struct {
	// Workers is how many goroutines replay, each on its own ranges of
	// elements; 0 means GOMAXPROCS.
	Workers int
	// Block is the number of elements the fused replay expands from each
	// differential at a time (its scratch is Block × steps floats per
	// worker, meant to stay in cache); 0 means 2048.
	Block int
}

const defaultBlock = 2048

// maxBatch is the most steps one fused pass applies; longer replays take
// several passes.
const maxBatch = 64

func (o ReplayOptions) workers() int {
	if o.Workers > 0 {
		return o.Workers
	}
	return runtime.GOMAXPROCS(0)
}

func (o ReplayOptions) block() int {
	if o.Block > 0 {
		return (o.Block + 15) &^ 15
	}
	return defaultBlock
}

// check validates a replay's arguments and returns each step's constants.
func check(st State, diffs []*Tensor, hypers []Hyper) ([]Consts, error) {
	return checkAt(st, -1, diffs, hypers)
}

// checkAt is check for a replay of elements [lo, lo+len(st.W)) of the
// differentials (lo < 0: of all of them, which must be as long as st).
func checkAt(st State, lo int, diffs []*Tensor, hypers []Hyper) ([]Consts, error) {
	n := len(st.W)
	if len(st.M) != n || len(st.V) != n {
		return nil, fmt.Errorf("%w: %d weights, %d first and %d second moments", ErrMismatch, n, len(st.M), len(st.V))
	}
	if len(diffs) != len(hypers) {
		return nil, fmt.Errorf("%w: %d differentials for %d steps", ErrMismatch, len(diffs), len(hypers))
	}
	cs := make([]Consts, len(hypers))
	for s, h := range hypers {
		if err := h.Validate(); err != nil {
			return nil, fmt.Errorf("step %d of the replay: %w", s, err)
		}
		if s > 0 && h.T != hypers[s-1].T+1 {
			return nil, fmt.Errorf("%w: step %d of the replay is optimizer step %d, after step %d", ErrMismatch, s, h.T, hypers[s-1].T)
		}
		l := -1
		if diffs[s] != nil {
			l = diffs[s].Len
		}
		if lo < 0 && l != n {
			return nil, fmt.Errorf("%w: differential %d has %d elements, the state %d", ErrMismatch, s, l, n)
		}
		if lo >= 0 && lo > l-n {
			return nil, fmt.Errorf("%w: differential %d has %d elements, the state is its elements [%d, %d)", ErrMismatch, s, l, lo, lo+n)
		}
		cs[s] = h.Consts()
	}
	return cs, nil
}

// denseView returns t's values in place when it stores them dense and
// lossless (Raw), or nil.
func (t *Tensor) denseView() []float32 {
	if t.Codec == Raw && len(t.raw) == t.Len {
		return t.raw
	}
	return nil
}

// parallel runs f on the ranges [lo, hi) that split [0, n) into at most
// workers parts, each a multiple of align elements but the last.
func parallel(n, workers, align int, f func(lo, hi int)) {
	per := (n + workers - 1) / workers
	per = (per + align - 1) / align * align
	if per == 0 || workers == 1 || n <= per {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Go(func() { f(lo, hi) })
	}
	wg.Wait()
}

// Sequential replays the steps one after another onto st, as re-running
// the optimizer would: for step s, the gradient diffs[s] is expanded to a
// dense buffer and hypers[s]'s update runs over the whole tensor (each in
// parallel over ranges of elements). The hypers must be consecutive steps.
// With lossless (Raw) differentials the result is bitwise the states the
// optimizer produced.
func Sequential(st State, diffs []*Tensor, hypers []Hyper, opt ReplayOptions) error {
	cs, err := check(st, diffs, hypers)
	if err != nil {
		return err
	}
	n := len(st.W)
	var buf []float32
	for s, c := range cs {
		// A lossless gradient is read in place; others are expanded
		// into a dense buffer first.
		g := diffs[s].denseView()
		expand := g == nil
		if expand {
			if buf == nil {
				buf = make([]float32, n)
			}
			g = buf
		}
		parallel(n, opt.workers(), 16, func(lo, hi int) {
			if expand {
				diffs[s].ExpandRange(g[lo:hi], lo)
			}
			Step(st.W[lo:hi], st.M[lo:hi], st.V[lo:hi], g[lo:hi], c)
		})
	}
	return nil
}

// Fused replays the steps onto st in one pass over memory (TierCheck
// §3.3): each worker takes a range of elements and, block by block,
// expands every step's gradient for the block into a scratch buffer, then
// applies the steps to each element in temporal order, reading the
// weights and moments once and writing them once. Batches longer than 64
// steps take one pass per 64. The result is bitwise that of Sequential.
func Fused(st State, diffs []*Tensor, hypers []Hyper, opt ReplayOptions) error {
	cs, err := check(st, diffs, hypers)
	if err != nil {
		return err
	}
	fused(st, 0, diffs, cs, opt)
	return nil
}

// FusedAt is Fused on a window of the tensor: st holds elements [lo,
// lo+len(st.W)) of the state, to which it applies the same elements of
// the differentials (each at least lo+len(st.W) long). Adam is
// elementwise, so the result is bitwise those elements of Fused's on the
// whole state: a replay can be cut into windows, as a restore that
// streams its state does.
func FusedAt(st State, lo int, diffs []*Tensor, hypers []Hyper, opt ReplayOptions) error {
	if lo < 0 {
		return fmt.Errorf("%w: window at element %d", ErrMismatch, lo)
	}
	cs, err := checkAt(st, lo, diffs, hypers)
	if err != nil {
		return err
	}
	fused(st, lo, diffs, cs, opt)
	return nil
}

// fused is Fused's replay of elements [at, at+len(st.W)) of diffs onto
// st; the arguments are checked.
func fused(st State, at int, diffs []*Tensor, cs []Consts, opt ReplayOptions) {
	block := opt.block()
	for b0 := 0; b0 < len(cs); b0 += maxBatch {
		bd, bc := diffs[b0:min(b0+maxBatch, len(cs))], cs[b0:min(b0+maxBatch, len(cs))]
		parallel(len(st.W), opt.workers(), block, func(lo, hi int) {
			k := newFusedKernel(bc)
			var scratch []float32 // for the steps not read in place; made on first use
			gs := make([][]float32, len(bd))
			// A sparse (TopK) step's scratch stays zero but for the
			// entries it scattered, which are zeroed again after use:
			// cheaper than clearing the whole block every time.
			touched := make([][]int32, len(bd))
			for e0 := lo; e0 < hi; e0 += block {
				e1 := min(e0+block, hi)
				for s, d := range bd {
					if raw := d.denseView(); raw != nil {
						gs[s] = raw[at+e0 : at+e1] // lossless: read in place
						continue
					}
					if scratch == nil {
						scratch = make([]float32, len(bd)*block)
					}
					gs[s] = scratch[s*block : s*block+e1-e0]
					if d.Codec == TopK {
						touched[s] = d.scatterTopK(gs[s], at+e0, touched[s][:0], true)
					} else {
						d.ExpandRange(gs[s], at+e0)
					}
				}
				k.run(st.W[e0:e1], st.M[e0:e1], st.V[e0:e1], gs)
				for s, d := range bd {
					if d.Codec == TopK {
						for _, o := range touched[s] {
							gs[s][o] = 0
						}
					}
				}
			}
		})
	}
}
