package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/launcher"
)

// secretTimeout bounds how long an agent waits for its credentials on stdin.
const secretTimeout = 30 * time.Second

// agentMain runs `gorun agent`, which only the launcher starts. The host's
// credentials (jobkey.HostCredentials: its control-plane key, the data-plane
// and replica-link keys, and the pin of the control plane's TLS
// certificate) arrive as the first line on stdin, never in argv; the rest
// of stdin stays open while the launcher lives. Under srun (--slurm) the
// host is this Slurm node, and its credentials arrive sealed to a key it
// prints on stdout (slurmCredentials).
func agentMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gorun agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg agent.Config
	verbose := fs.Bool("v", false, "verbose logging")
	slurm := fs.Bool("slurm", false, "started by srun: this Slurm node's credentials come sealed on stdin")
	fs.StringVar(&cfg.Job, "job", "", "job id")
	fs.IntVar(&cfg.Host, "host-index", -1, "index of this host in the job")
	fs.StringVar(&cfg.Name, "host-name", "", "name of this host in the job")
	fs.StringVar(&cfg.ControlURL, "control", "", "control-plane URL")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *slurm {
		cfg.Name = os.Getenv("SLURMD_NODENAME")
	}
	if cfg.Job == "" || !*slurm && cfg.Host < 0 || cfg.Name == "" || cfg.ControlURL == "" || fs.NArg() != 0 {
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
	var creds jobkey.HostCredentials
	var err error
	if *slurm {
		stdout = undying(stdout)
		creds, err = slurmCredentials(r, stdout, cfg.Job, cfg.Name, os.Getenv)
		dropSlurmTaskEnv() // the step's task is this agent, not its ranks
	} else {
		creds, err = hostCredentials(r, cfg.Host)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gorun agent: %v\n", err)
		return exitUsage
	}
	cfg.Creds, cfg.Host = creds, creds.Host
	cfg.Launcher = r

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	code := exitOK
	if err := agent.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "gorun agent %s: %v\n", cfg.Name, err)
		code = exitError
	}
	if *slurm {
		// srun tells no task's end apart: this line tells the launcher.
		fmt.Fprintf(stdout, "%s %d\n", launcher.SlurmDoneLine, code)
	}
	return code
}

// readLine reads one line from r within secretTimeout.
func readLine(r *bufio.Reader) (string, error) {
	line := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		s, err := r.ReadString('\n')
		if err != nil && s == "" {
			errc <- err
			return
		}
		line <- s
	}()
	select {
	case s := <-line:
		return s, nil
	case err := <-errc:
		return "", err
	case <-time.After(secretTimeout):
		return "", errors.New("no credentials on stdin")
	}
}

// hostCredentials reads host's credentials, the first line of r.
func hostCredentials(r *bufio.Reader, host int) (jobkey.HostCredentials, error) {
	s, err := readLine(r)
	if err != nil {
		return jobkey.HostCredentials{}, fmt.Errorf("reading the host's credentials from stdin: %w", err)
	}
	creds, err := jobkey.ParseHostCredentials(s)
	if err == nil && creds.Host != host {
		err = fmt.Errorf("credentials of host %d, this is host %d", creds.Host, host)
	}
	if err != nil {
		return creds, fmt.Errorf("reading the host's credentials from stdin: %w", err)
	}
	return creds, nil
}

// slurmCredentials gets the credentials of Slurm node node: it prints a
// fresh public key on stdout (launcher.SlurmKeyLine, with the step from
// getenv) and opens the one line of r, shared by every node's agent,
// sealed to it; the line's index is the host's in the job. Other nodes'
// lines do not open with its key and are skipped.
func slurmCredentials(r *bufio.Reader, stdout io.Writer, job, node string, getenv func(string) string) (jobkey.HostCredentials, error) {
	key, err := jobkey.NewSealKey()
	if err != nil {
		return jobkey.HostCredentials{}, err
	}
	step := getenv("SLURM_JOB_ID") + "." + getenv("SLURM_STEP_ID")
	if _, err := fmt.Fprintf(stdout, "%s %s %s %s\n", launcher.SlurmKeyLine, node, base64.StdEncoding.EncodeToString(key.PublicKey().Bytes()), step); err != nil {
		return jobkey.HostCredentials{}, fmt.Errorf("showing the launcher this node's key: %w", err)
	}
	deadline := time.Now().Add(secretTimeout)
	for time.Now().Before(deadline) {
		s, err := readLine(r)
		if err != nil {
			return jobkey.HostCredentials{}, fmt.Errorf("reading node %s's credentials from stdin: %w", node, err)
		}
		idx, sealed, ok := strings.Cut(strings.TrimSpace(s), " ")
		host, err := strconv.Atoi(idx)
		if !ok || err != nil || host < 0 {
			continue
		}
		if creds, err := jobkey.OpenHostCredentials(sealed, job, host, key); err == nil {
			return creds, nil
		}
	}
	return jobkey.HostCredentials{}, fmt.Errorf("no credentials for node %s on stdin", node)
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
