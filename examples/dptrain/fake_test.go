package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// fakeWorld is an in-process world whose ranks are goroutines sharing
// memory. Every collective is a rendezvous of all ranks: each deposits a copy
// of its input, the last to arrive publishes the round, and every rank
// computes its result serially, in rank order (the reference semantics the
// real communicator must match). Ranks calling different collectives, or
// reducing different lengths, fail the round.
type fakeWorld struct {
	size int

	mu      sync.Mutex // guards the fields below
	cond    *sync.Cond // signalled when a round completes or the world aborts
	pending []fakeCall // this round's deposits, by rank
	arrived int
	round   uint64
	last    []fakeCall    // the last completed round's deposits
	err     error         // once set, every call fails with it
	done    chan struct{} // closed when err is set
}

// fakeCall is one rank's part in a round.
type fakeCall struct {
	op   string
	root int
	data []byte
	ints []int64
}

func newFakeWorld(size int) *fakeWorld {
	w := &fakeWorld{size: size, pending: make([]fakeCall, size), done: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// abort makes every pending and later call fail with err.
func (w *fakeWorld) abort(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		close(w.done)
	}
	w.cond.Broadcast()
}

// exchange deposits rank's call and returns every rank's, once all arrived.
func (w *fakeWorld) exchange(rank int, c fakeCall) ([]fakeCall, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return nil, w.err
	}
	w.pending[rank] = c
	w.arrived++
	if w.arrived == w.size {
		all := w.pending
		for r, c := range all {
			if c.op != all[0].op || c.root != all[0].root || len(c.ints) != len(all[0].ints) {
				w.err = fmt.Errorf("fake: rank %d called %s(root %d, %d ints), rank 0 %s(root %d, %d ints)",
					r, c.op, c.root, len(c.ints), all[0].op, all[0].root, len(all[0].ints))
				close(w.done)
				w.cond.Broadcast()
				return nil, w.err
			}
		}
		w.pending, w.arrived, w.last = make([]fakeCall, w.size), 0, all
		w.round++
		w.cond.Broadcast()
		return all, nil
	}
	// The next round cannot complete before this rank returns, so last
	// still holds this round when the wait ends.
	round := w.round
	for w.round == round && w.err == nil {
		w.cond.Wait()
	}
	if w.round == round {
		return nil, w.err
	}
	return w.last, nil
}

// fakeComm is one rank's view of a fakeWorld; it implements collectives.
type fakeComm struct {
	w    *fakeWorld
	rank int
}

var _ collectives = (*fakeComm)(nil)

func (c *fakeComm) Rank() int             { return c.rank }
func (c *fakeComm) Done() <-chan struct{} { return c.w.done }

func (c *fakeComm) Err() error {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	return c.w.err
}
func (c *fakeComm) Size() int { return c.w.size }

func (c *fakeComm) Barrier(ctx context.Context) error {
	_, err := c.w.exchange(c.rank, fakeCall{op: "Barrier"})
	return err
}

func (c *fakeComm) Broadcast(ctx context.Context, root int, b []byte) ([]byte, error) {
	call := fakeCall{op: "Broadcast", root: root}
	if c.rank == root {
		call.data = slices.Clone(b)
	}
	all, err := c.w.exchange(c.rank, call)
	if err != nil {
		return nil, err
	}
	return slices.Clone(all[root].data), nil
}

func (c *fakeComm) AllreduceInt64(ctx context.Context, x []int64) error {
	all, err := c.w.exchange(c.rank, fakeCall{op: "AllreduceInt64", ints: slices.Clone(x)})
	if err != nil {
		return err
	}
	for i := range x {
		var s int64
		for _, a := range all {
			s += a.ints[i]
		}
		x[i] = s
	}
	return nil
}

func (c *fakeComm) Allgather(ctx context.Context, mine []byte) ([][]byte, error) {
	all, err := c.w.exchange(c.rank, fakeCall{op: "Allgather", data: slices.Clone(mine)})
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(all))
	for r, a := range all {
		out[r] = slices.Clone(a.data)
	}
	return out, nil
}

// runWorld trains cfg on size goroutine ranks and returns every rank's
// result and error. The first rank to fail aborts the others.
func runWorld(t testing.TB, size int, cfg Config, o runOptions) ([]*result, []error) {
	t.Helper()
	w := newFakeWorld(size)
	res := make([]*result, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			o := o
			if r != 0 {
				o.out = nil
			}
			res[r], errs[r] = train(t.Context(), &fakeComm{w, r}, cfg, o)
			if errs[r] != nil {
				w.abort(fmt.Errorf("fake: rank %d failed: %w", r, errs[r]))
			}
		})
	}
	wg.Wait()
	return res, errs
}

// mustRunWorld is runWorld for runs that must succeed, with every rank
// agreeing on the result; it returns rank 0's.
func mustRunWorld(t testing.TB, size int, cfg Config, o runOptions) *result {
	t.Helper()
	res, errs := runWorld(t, size, cfg, o)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("world of %d, rank %d: %v", size, r, err)
		}
	}
	for r := 1; r < size; r++ {
		if res[r].ParamsHash != res[0].ParamsHash || res[r].OptimizerHash != res[0].OptimizerHash ||
			!slices.Equal(res[r].Losses, res[0].Losses) {
			t.Fatalf("world of %d: rank %d's result differs from rank 0's", size, r)
		}
	}
	return res[0]
}
