package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/gordump"
	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/launcher"
	"golang.org/x/sys/unix"
)

// Version is gorun's version; release builds set it with -ldflags -X.
var Version = "0.1.0-dev"

// Exit codes of the command line itself.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// debugGoroutinesEnv names the file gorun run writes its goroutines'
// dump to at its exit (see the package doc).
const debugGoroutinesEnv = "GORUN_DEBUG_GOROUTINES"

// usageError is an error in how gorun was called: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// Main runs gorun with args (without the program name) and returns its exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "agent":
			return agentMain(args[1:], stdin, stdout, stderr)
		case "ckpt":
			return ckptMain(args[1:], stdout, stderr)
		case "report":
			return reportMain(args[1:], stdout, stderr)
		case "plan":
			return planMain(args[1:], stdout, stderr)
		case "status":
			return statusMain(args[1:], stdout, stderr)
		case "clean":
			return cleanMain(args[1:], stdout, stderr)
		case "run":
			args = args[1:]
		}
	}
	return runMain(args, stdout, stderr)
}

func runMain(args []string, stdout, stderr io.Writer) int {
	if path := os.Getenv(debugGoroutinesEnv); path != "" {
		// Deferred first, so run last: after the job and what runMain
		// closes (see the package doc).
		defer func() {
			if err := gordump.Write(path, time.Second); err != nil {
				fmt.Fprintf(stderr, "gorun: %s: %v\n", debugGoroutinesEnv, err)
			}
		}()
	}
	opts, err := parseRun(args, stderr)
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, runUsage())
		return exitOK
	}
	if errors.Is(err, errVersion) {
		fmt.Fprintf(stdout, "gorun %s\n", Version)
		return exitOK
	}
	if err != nil {
		return reportError(stderr, err)
	}
	cfg, err := opts.config(stdout, stderr)
	if err != nil {
		return reportError(stderr, err)
	}
	cfg.Stdout, cfg.Stderr = undying(stdout), undying(stderr)
	// gorun status finds the job in any of these (jobstatus.ListAll).
	if dirs := jobstatus.Dirs(); len(dirs) > 0 {
		cfg.Registry, cfg.RegistryFallback = dirs[0], dirs[1:]
	}
	// A terminal is read only by a foreground gorun: reading it from the
	// background would stop gorun with SIGTTIN. When gorun does read one,
	// SIGTTIN is ignored, so that a job moved to the background later reads
	// EIO instead of stopping. (Only then: an ignored signal stays ignored
	// in the ranks gorun starts.)
	if cfg.Stdin != nil {
		switch bg, tty := terminalState(os.Stdin); {
		case bg:
			cfg.Stdin = nil
		case tty:
			signal.Ignore(syscall.SIGTTIN)
		}
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	cfg.Signals = sigs
	if cfg.Metrics != "" {
		// Before the events file: a port in use leaves nothing behind.
		l, err := launcher.ListenMetrics(cfg.Metrics)
		if err != nil {
			return reportError(stderr, err)
		}
		defer l.Close() // (the job's, unless it never started)
		cfg.MetricsListener = l
	}
	var events *os.File
	created := false // the events file is gorun's to remove
	if opts.events != "" {
		// Opened last: every check that can be made before the job starts
		// has been made, so bad input leaves no file behind.
		_, serr := os.Lstat(opts.events)
		created = errors.Is(serr, fs.ErrNotExist)
		if events, err = os.OpenFile(opts.events, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644); err != nil {
			return reportError(stderr, usagef("--events: %v", err))
		}
		cfg.Events = events
	}
	code, err := launcher.Run(context.Background(), cfg)
	if events != nil {
		if cerr := events.Close(); cerr != nil {
			fmt.Fprintf(stderr, "gorun: --events %s: %v\n", opts.events, cerr)
		}
		if errors.Is(err, launcher.ErrConfig) && created {
			// The job never started: its record is empty, and the file
			// was not there before.
			_ = os.Remove(opts.events)
		}
	}
	if err != nil {
		return reportError(stderr, err)
	}
	return code
}

// undying returns w, or for os.Stdout and os.Stderr a duplicate of their
// descriptor: Go kills a program whose write to descriptor 1 or 2 meets a
// closed pipe (gorun ... | head), while any other descriptor gets EPIPE,
// on which the launcher stops the job in order.
func undying(w io.Writer) io.Writer {
	f, ok := w.(*os.File)
	if !ok || (f != os.Stdout && f != os.Stderr) {
		return w
	}
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return w
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), f.Name())
}

// terminalState reports whether f is a terminal, and whether gorun is in
// the background on it (its foreground process group is not gorun's).
func terminalState(f *os.File) (background, terminal bool) {
	pgrp, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCGPGRP)
	if err != nil {
		return false, false // not a terminal
	}
	return pgrp != unix.Getpgrp(), true
}

func reportError(stderr io.Writer, err error) int {
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, launcher.ErrConfig) {
		fmt.Fprintf(stderr, "gorun: %v\nRun 'gorun --help' for usage.\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "gorun: %v\n", err)
	return exitError
}
