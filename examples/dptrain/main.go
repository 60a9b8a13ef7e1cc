package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/comm"
)

var _ collectives = (*comm.Comm)(nil)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// SIGUSR1 is Slurm's preemption notice, which gorun forwards: the
	// Go runtime would ignore it unnotified; each rank notes it and goes on.
	notices := make(chan os.Signal, 1)
	signal.Notify(notices, syscall.SIGUSR1)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, notices)
	signal.Stop(notices)
	stop()
	os.Exit(code)
}

// run is the program; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, notices <-chan os.Signal) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "dptrain: %v\n", err)
		return 2
	}
	if n := os.Getenv("GORUN_RESTART_COUNT"); n != "" && n != "0" {
		// gorun restarted the ranks after the crash: do not crash again.
		cfg.FailAtStep = -1
	}
	if n := os.Getenv("GORUN_EPOCH"); n != "" && n != "0" {
		// gorun started this rank in a later epoch, to replace a lost
		// one in place: it does not crash again either.
		cfg.FailAtStep = -1
	}
	c, err := comm.Init(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "dptrain: joining the job (run me under gorun): %v\n", err)
		return 1
	}
	defer func() { c.Close() }() // the communicator of the last epoch joined
	o := runOptions{out: stdout, errOut: stderr, notices: notices, crash: func(step int) error {
		fmt.Fprintf(stderr, "dptrain: rank %d crashing at step %d (--fail-at-step)\n", c.Rank(), step)
		if cfg.FailWipeState {
			if err := wipeState(c.Rank()); err != nil {
				fmt.Fprintf(stderr, "dptrain: --fail-wipe-state: %v\n", err)
			} else {
				fmt.Fprintf(stderr, "dptrain: rank %d overwrote its protected optimizer state on this host\n", c.Rank())
			}
		}
		crash(cfg.FailSignal)
		return errCrashed // not reached
	}}
	o.rebuild = func(ctx context.Context) (collectives, error) {
		nc, err := c.Rebuild(ctx)
		if err != nil {
			return nil, err
		}
		c = nc
		return nc, nil
	}
	if _, err := train(ctx, c, cfg, o); err != nil {
		fmt.Fprintf(stderr, "dptrain: rank %d: %v\n", c.Rank(), err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

// wipeState overwrites both slots of this rank's protected optimizer
// state on its host (gorun's file /dev/shm/gorun-<job>.r<rank>.optimizer)
// with a pattern, as a fault in that memory would: restoring must then
// come from another host.
func wipeState(rank int) error {
	path := ckpt.RegionPath(os.Getenv("GORUN_JOB_ID"), rank, "optimizer", ckpt.Options{})
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = 0xA5
	}
	for off := int64(0); off < st.Size(); off += int64(len(buf)) {
		if _, err := f.WriteAt(buf[:min(int64(len(buf)), st.Size()-off)], off); err != nil {
			return err
		}
	}
	return nil
}

// crash ends the process at once: with exit code 1, or killed by sig, which
// it sends itself. The Go runtime turns SIGABRT into a stack dump and exit
// code 2 unless the traceback level is "crash", which makes it re-raise the
// signal so that the process does die of it.
func crash(sig syscall.Signal) {
	if sig != 0 {
		signal.Reset(sig)
		debug.SetTraceback("crash")
		if p, err := os.FindProcess(os.Getpid()); err == nil && p.Signal(sig) == nil {
			time.Sleep(time.Minute) // the signal ends the process meanwhile
		}
	}
	os.Exit(1)
}
