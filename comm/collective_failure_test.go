package comm

// Collectives that fail: a peer closing, an Abort or a context ending in
// the middle of one.

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// loopAllreduce runs allreduces on every rank of comms until one fails,
// counting completed calls in done, and returns each rank's error.
func loopAllreduce(ctx context.Context, comms []*Comm, l int, done *atomic.Int64) []error {
	return onAll(comms, func(c *Comm) error {
		x := make([]float32, l)
		for {
			if err := c.AllreduceFloat32(ctx, x); err != nil {
				return err
			}
			done.Add(1)
		}
	})
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPeerClosesMidAllreduce(t *testing.T) { forLinks(t, testPeerClosesMidAllreduce) }

func testPeerClosesMidAllreduce(t *testing.T, unix bool) {
	const n, victim = 4, 2
	comms := newWorld(t, n, worldOpts{segment: 16 << 10, log: io.Discard, unix: unix})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var done atomic.Int64
	result := make(chan []error, 1)
	go func() { result <- loopAllreduce(ctx, comms, 200_000, &done) }()
	waitFor(t, 10*time.Second, func() bool { return done.Load() >= 2*n })
	comms[victim].Close()
	closedAt := time.Now()
	var errs []error
	select {
	case errs = <-result:
	case <-time.After(5 * time.Second):
		t.Fatal("the others did not return within 5 s of a peer's Close")
	}
	t.Logf("every rank returned %v after the Close", time.Since(closedAt))
	for r, err := range errs {
		want := ErrPeerLost
		if r == victim {
			want = ErrClosed
		}
		if !errors.Is(err, want) {
			t.Errorf("rank %d: %v, want %v", r, err, want)
		}
		// The lost peer is one this rank exchanges with in the ring.
		if pl, ok := errors.AsType[*PeerLostError](err); r != victim && (!ok || (pl.Rank != (r+1)%n && pl.Rank != (r+n-1)%n) || pl.Op != "AllreduceFloat32") {
			t.Errorf("rank %d: %#v, want a PeerLostError naming a ring neighbour", r, pl)
		}
	}
	// The failure sticks: the next collective fails at once.
	if err := within(t, 5*time.Second, func() error { return comms[0].Barrier(ctx) }); !errors.Is(err, ErrPeerLost) {
		t.Errorf("Barrier after the loss: %v", err)
	}
}

func TestAbortMidCollective(t *testing.T) { forLinks(t, testAbortMidCollective) }

func testAbortMidCollective(t *testing.T, unix bool) {
	const n = 4
	secret := testKey(t)
	comms := newWorld(t, n, worldOpts{secret: secret, epoch: 5, segment: 16 << 10, log: io.Discard, unix: unix})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for r, c := range comms {
		if err := c.Err(); err != nil {
			t.Errorf("rank %d: Err before Abort: %v", r, err)
		}
		select {
		case <-c.Done():
			t.Errorf("rank %d: Done closed before Abort", r)
		default:
		}
	}
	var done atomic.Int64
	result := make(chan []error, 1)
	go func() { result <- loopAllreduce(ctx, comms, 200_000, &done) }()
	waitFor(t, 10*time.Second, func() bool { return done.Load() >= 2*n })
	// The epoch changes: every rank learns it, at slightly different times.
	for _, c := range comms {
		c.Abort(ErrEpochChanged)
	}
	for r, c := range comms {
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("rank %d: Done not closed after Abort", r)
		}
		if err := c.Err(); !errors.Is(err, ErrEpochChanged) {
			t.Errorf("rank %d: Err after Abort: %v, want ErrEpochChanged", r, err)
		}
	}
	var errs []error
	select {
	case errs = <-result:
	case <-time.After(5 * time.Second):
		t.Fatal("the ranks did not return within 5 s of Abort")
	}
	for r, err := range errs {
		if !errors.Is(err, ErrEpochChanged) {
			t.Errorf("rank %d: %v, want ErrEpochChanged", r, err)
		}
	}
	for _, c := range comms {
		if err := c.Send(ctx, (c.Rank()+1)%n, nil); !errors.Is(err, ErrEpochChanged) {
			t.Errorf("Send after Abort: %v", err)
		}
		c.Close()
		if err := c.Barrier(ctx); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrEpochChanged) {
			t.Errorf("Barrier after Abort and Close: %v", err)
		}
	}
	// Epoch 6 on fresh listeners.
	next := newWorld(t, n, worldOpts{secret: secret, epoch: 6, log: io.Discard, unix: unix})
	x := make([][]float64, n)
	for r := range x {
		x[r] = []float64{float64(r), 1}
	}
	mustAll(t, onAll(next, func(c *Comm) error { return c.AllreduceFloat64(ctx, x[c.Rank()]) }))
	if x[3][0] != 6 || x[3][1] != 4 {
		t.Fatalf("epoch 6 allreduce: %v", x[3])
	}
}

func TestContextCancel(t *testing.T) {
	const n = 3
	t.Run("alone in a barrier", func(t *testing.T) {
		comms := newWorld(t, n, worldOpts{log: io.Discard})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err := within(t, 5*time.Second, func() error { return comms[0].Barrier(ctx) })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Barrier: %v", err)
		}
		// The others learn that rank 0 gave up instead of waiting for it.
		// (Rank 0 did arrive, so a rank may complete this barrier; the next
		// one fails everywhere.)
		for i := range 2 {
			errs := within(t, 5*time.Second, func() []error {
				return onAll(comms[1:], func(c *Comm) error { return c.Barrier(context.Background()) })
			})
			for r, err := range errs {
				if !errors.Is(err, ErrPeerLost) && (i == 1 || err != nil) {
					t.Errorf("barrier %d, rank %d: %v, want ErrPeerLost", i, r+1, err)
				}
			}
		}
	})
	t.Run("mid allreduce", func(t *testing.T) { forLinks(t, testCancelMidAllreduce) })
	t.Run("already done", func(t *testing.T) {
		comms := newWorld(t, 1, worldOpts{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c := comms[0]
		for name, err := range map[string]error{
			"Barrier":   c.Barrier(ctx),
			"Allreduce": c.AllreduceFloat32(ctx, []float32{1}),
		} {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
}

// testCancelMidAllreduce: one rank's context ends in the middle of a loop
// of Allreduce; it returns the context's error, the others ErrPeerLost.
func testCancelMidAllreduce(t *testing.T, unix bool) {
	const n = 3
	comms := newWorld(t, n, worldOpts{segment: 16 << 10, log: io.Discard, unix: unix})
	ctx0, cancel0 := context.WithCancel(context.Background())
	var done atomic.Int64
	result := make(chan []error, 1)
	go func() {
		result <- onAll(comms, func(c *Comm) error {
			ctx := context.Background()
			if c.Rank() == 0 {
				ctx = ctx0
			}
			x := make([]float32, 200_000)
			for {
				if err := c.AllreduceFloat32(ctx, x); err != nil {
					return err
				}
				done.Add(1)
			}
		})
	}()
	waitFor(t, 10*time.Second, func() bool { return done.Load() >= 2*n })
	cancel0()
	var errs []error
	select {
	case errs = <-result:
	case <-time.After(5 * time.Second):
		t.Fatal("no return within 5 s of the cancellation")
	}
	if !errors.Is(errs[0], context.Canceled) {
		t.Errorf("rank 0: %v, want context.Canceled", errs[0])
	}
	for r := 1; r < n; r++ {
		if !errors.Is(errs[r], ErrPeerLost) {
			t.Errorf("rank %d: %v, want ErrPeerLost", r, errs[r])
		}
	}
}
