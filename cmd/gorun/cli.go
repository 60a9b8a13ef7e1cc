package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gorun/gorun/launcher"
)

// Version is gorun's version; release builds set it with -ldflags -X.
var Version = "0.1.0-dev"

// Exit codes of the command line itself.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

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
			return agentMain(args[1:], stdin, stderr)
		case "run":
			args = args[1:]
		}
	}
	return runMain(args, stdout, stderr)
}

func runMain(args []string, stdout, stderr io.Writer) int {
	opts, err := parseRun(args, stderr)
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, usageText)
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
	sigs := make(chan os.Signal, 8)
	// SIGPIPE too: a closed stdout (gorun ... | head) then stops the job
	// in order instead of killing gorun under its ranks.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	defer signal.Stop(sigs)
	cfg.Signals = sigs
	code, err := launcher.Run(context.Background(), cfg)
	if err != nil {
		return reportError(stderr, err)
	}
	return code
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
