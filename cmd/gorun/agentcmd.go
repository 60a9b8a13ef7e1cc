package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/agent"
)

// secretTimeout bounds how long an agent waits for its credentials on stdin.
const secretTimeout = 30 * time.Second

// agentMain runs `gorun agent`, which only the launcher starts. The host's
// credentials (comm.HostCredentials: its control-plane key, the data-plane
// and replica-link keys, and the pin of the control plane's TLS
// certificate) arrive as the first line on stdin, never in argv; the rest
// of stdin stays open while the launcher lives.
func agentMain(args []string, stdin io.Reader, stderr io.Writer) int {
	fs := flag.NewFlagSet("gorun agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg agent.Config
	verbose := fs.Bool("v", false, "verbose logging")
	fs.StringVar(&cfg.Job, "job", "", "job id")
	fs.IntVar(&cfg.Host, "host-index", -1, "index of this host in the job")
	fs.StringVar(&cfg.Name, "host-name", "", "name of this host in the job")
	fs.StringVar(&cfg.ControlURL, "control", "", "control-plane URL")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cfg.Job == "" || cfg.Host < 0 || cfg.Name == "" || cfg.ControlURL == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "gorun agent: started by gorun itself, not by hand (needs --job, --host-index, --host-name, --control and its credentials on stdin)")
		return exitUsage
	}
	setMemoryLimit()
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	// Once the launcher is gone, so is the reader of this stderr: a log line
	// must then fail (EPIPE), not kill the agent with SIGPIPE before it has
	// stopped its ranks and removed the job's files.
	stderr = undying(stderr)
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	r := bufio.NewReader(stdin)
	line := make(chan string, 1)
	go func() {
		s, _ := r.ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		creds, err := comm.ParseHostCredentials(s)
		if err == nil && creds.Host != cfg.Host {
			err = fmt.Errorf("credentials of host %d, this is host %d", creds.Host, cfg.Host)
		}
		if err != nil {
			fmt.Fprintf(stderr, "gorun agent: reading the host's credentials from stdin: %v\n", err)
			return exitUsage
		}
		cfg.Creds = creds
	case <-time.After(secretTimeout):
		fmt.Fprintln(stderr, "gorun agent: no credentials on stdin")
		return exitUsage
	}
	cfg.Launcher = r

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	if err := agent.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "gorun agent %s: %v\n", cfg.Name, err)
		return exitError
	}
	return exitOK
}

// setMemoryLimit gives the agent's Go runtime a soft memory limit of 60%
// of the host's memory, unless GOMEMLIMIT sets one. The agent keeps other
// hosts' replicas (rank caps them at half the host's memory) and, in diff
// mode, drops a gradient record of a third of a rank's optimizer state
// every step: with GOGC's default headroom alone its heap could reach
// twice what it holds before a collection, more than the host has. Near
// the limit the collector runs more often instead.
//
// It also collects when the heap has grown by 25% over what the last
// collection left (GOGC=25, unless GOGC sets it): what the agent holds is
// mostly long-lived buffers it reuses (replicas, bases, logs, their
// spares), so a collection has little to mark and little to free, and
// GOGC's default 100% would let a host's agents and ranks ask for twice
// that memory before any of it came back (two namespace hosts' agents on
// one 24 GiB machine, at 256 MiB of state per rank, were killed by the
// OOM killer).
func setMemoryLimit() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(agentGOGC)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil || si.Totalram == 0 {
		return
	}
	debug.SetMemoryLimit(int64(uint64(si.Totalram) * uint64(si.Unit) / 10 * 6))
}

// agentGOGC is the agent's GOGC unless the environment sets one.
const agentGOGC = 25
