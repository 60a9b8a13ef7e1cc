package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/jobkey"
)

// realWorld builds a world of size ranks with the real communicator, the
// ranks being goroutines on loopback.
func realWorld(t *testing.T, size int) []*comm.Comm {
	t.Helper()
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	lns := make([]net.Listener, size)
	addrs := make([]string, size)
	for r := range lns {
		if lns[r], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		addrs[r] = lns[r].Addr().String()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	comms := make([]*comm.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			comms[r], errs[r] = comm.NewComm(ctx, comm.CommConfig{
				Rank: r, Size: size, Epoch: 1, Job: "dptrain-test", Key: secret.DataKey(),
				Listener: lns[r], Addrs: addrs,
				Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
			})
		})
	}
	wg.Wait()
	for r, c := range comms {
		if c != nil {
			t.Cleanup(func() { c.Close() })
		}
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
	return comms
}

// runReal trains cfg on a real world; the first rank to fail cancels the
// others' context, as gorun would stop the job.
func runReal(t *testing.T, comms []*comm.Comm, cfg Config, o func(r int) runOptions) ([]*result, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	res := make([]*result, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			res[r], errs[r] = train(ctx, c, cfg, o(r))
		})
	}
	wg.Wait()
	return res, errs
}

// TestOverRealComm runs the trainer over comm.Comm (loopback TCP) with 1, 2
// and 4 ranks and checks it gets the hashes of the in-process fake.
func TestOverRealComm(t *testing.T) {
	if testing.Short() {
		t.Skip("opens TCP connections; skipped with -short")
	}
	cfg := testConfig(t)
	want := mustRunWorld(t, 1, cfg, runOptions{})
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("np%d", size), func(t *testing.T) {
			// Small chunks: many collectives per step, some larger than
			// the data plane's segment.
			res, errs := runReal(t, realWorld(t, size), cfg, func(int) runOptions { return runOptions{chunk: 300} })
			for r := range size {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				if res[r].ParamsHash != want.ParamsHash || res[r].OptimizerHash != want.OptimizerHash {
					t.Errorf("rank %d: hashes %x %x, want %x %x", r, res[r].ParamsHash, res[r].OptimizerHash, want.ParamsHash, want.OptimizerHash)
				}
			}
		})
	}
}

// TestRankCrashOverRealComm has rank 1 die at step 3 (its communicator
// closes, as a killed process's sockets do): every other rank must fail
// promptly with a lost peer, not hang.
func TestRankCrashOverRealComm(t *testing.T) {
	if testing.Short() {
		t.Skip("opens TCP connections; skipped with -short")
	}
	cfg := testConfig(t, "--fail-at-step", "3", "--fail-rank", "1")
	comms := realWorld(t, 3)
	start := time.Now()
	_, errs := runReal(t, comms, cfg, func(r int) runOptions {
		return runOptions{crash: func(int) error {
			comms[r].Close()
			return errCrashed
		}}
	})
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the survivors took %v to notice", d)
	}
	if !errors.Is(errs[1], errCrashed) {
		t.Errorf("rank 1: %v, want errCrashed", errs[1])
	}
	for _, r := range []int{0, 2} {
		if !errors.Is(errs[r], comm.ErrPeerLost) {
			t.Errorf("rank %d: %v, want comm.ErrPeerLost", r, errs[r])
		}
	}
}
