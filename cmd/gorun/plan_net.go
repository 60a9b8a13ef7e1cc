package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The network between two hosts of --hostfile is measured by a 2-rank job
// gorun itself runs there, one rank per host: rank 0 listens on
// MASTER_ADDR:MASTER_PORT (its agent released the port for the job), rank
// 1 connects and sends --measure-size bytes, rank 0 acknowledges them all
// with one byte, and rank 1 prints how long that took:
//
//	gorun-plan-net bytes=N seconds=S
//
// Ranks run `gorun plan net-probe BYTES`, this same binary. The transfer is
// one TCP stream between the two hosts, as a replica or a spare's restore
// is, not gorun's comm library itself.

// netProbeLine starts the line rank 1 prints.
const netProbeLine = "gorun-plan-net "

// netProbeTimeout bounds the probe's connection and transfer.
const netProbeTimeout = 2 * time.Minute

// runNetProbe is a rank of the measurement job.
func runNetProbe(args []string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "gorun plan net-probe: %v\n", err)
		return exitError
	}
	if len(args) != 1 {
		return fail(errors.New("want BYTES"))
	}
	size, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || size < 1 {
		return fail(fmt.Errorf("bytes %q: want a positive integer", args[0]))
	}
	addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	ctx, cancel := context.WithTimeout(context.Background(), netProbeTimeout)
	defer cancel()
	switch os.Getenv("RANK") {
	case "0":
		var lc net.ListenConfig
		l, lerr := lc.Listen(ctx, "tcp", addr)
		if lerr != nil {
			return fail(fmt.Errorf("listening on %s: %w", addr, lerr))
		}
		err = probeServe(ctx, l, size)
	case "1":
		var el time.Duration
		if el, err = probeSend(ctx, addr, size); err == nil {
			fmt.Fprintf(stdout, "%sbytes=%d seconds=%.9f\n", netProbeLine, size, el.Seconds())
		}
	default:
		err = fmt.Errorf("RANK %q: the probe runs as ranks 0 and 1", os.Getenv("RANK"))
	}
	if err != nil {
		return fail(err)
	}
	return exitOK
}

// probeServe accepts one connection on l (which it closes), reads size
// bytes and acknowledges them.
func probeServe(ctx context.Context, l net.Listener, size int64) error {
	defer l.Close()
	dl, _ := ctx.Deadline()
	if tl, ok := l.(*net.TCPListener); ok {
		tl.SetDeadline(dl)
	}
	c, err := l.Accept()
	if err != nil {
		return fmt.Errorf("accepting on %s: %w", l.Addr(), err)
	}
	defer c.Close()
	c.SetDeadline(dl)
	if _, err := io.CopyN(io.Discard, c, size); err != nil {
		return fmt.Errorf("receiving: %w", err)
	}
	if _, err := c.Write([]byte{1}); err != nil {
		return fmt.Errorf("acknowledging: %w", err)
	}
	// wait for the sender to close, so that the ack is not reset away
	_, _ = c.Read(make([]byte, 1))
	return nil
}

// probeSend connects to addr (retrying while rank 0 is not listening yet,
// until ctx ends), sends size bytes and waits for the acknowledgement.
func probeSend(ctx context.Context, addr string, size int64) (time.Duration, error) {
	var d net.Dialer
	var c net.Conn
	for {
		var err error
		if c, err = d.DialContext(ctx, "tcp", addr); err == nil {
			break
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			return 0, fmt.Errorf("connecting to %s: %w", addr, err)
		}
		select { // polling an external process to a deadline
		case <-ctx.Done():
			return 0, fmt.Errorf("connecting to %s: %w", addr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	buf := make([]byte, min(size, 4<<20))
	for i := range buf {
		buf[i] = byte(i * 131)
	}
	start := time.Now()
	for left := size; left > 0; {
		n, err := c.Write(buf[:min(left, int64(len(buf)))])
		if err != nil {
			return 0, fmt.Errorf("sending: %w", err)
		}
		left -= int64(n)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return 0, fmt.Errorf("waiting for the acknowledgement: %w", err)
	}
	return time.Since(start), nil
}

// netJob is how gorun plan runs the measurement job: the arguments of a
// gorun run, its standard output back. Tests replace it.
type netJob func(ctx context.Context, args []string) ([]byte, error)

// runGorun runs this binary with args.
func runGorun(ctx context.Context, args []string) ([]byte, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return runGroup(ctx, self, args...)
}

// runGroup runs path with args in a process group of its own and returns
// its standard output. When ctx ends first, the whole group (the
// launcher, its rsh children and what they started) gets SIGTERM, so that
// the launcher can stop its job; whatever of the group is left when the
// launcher has exited (or 10 s after the SIGTERM) gets SIGKILL.
func runGroup(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // ESRCH: none left
	}
	if err != nil {
		return out.Bytes(), fmt.Errorf("measurement job: %w: %s", err, strings.TrimSpace(lastLines(errb.String(), 5)))
	}
	return out.Bytes(), nil
}

// measureNet measures the network between hosts a and b through run.
func measureNet(ctx context.Context, run netJob, a, b string, size int64, rsh, bind string) (float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	args := []string{"-H", a + "," + b, "-np", "2", "--map-by", "node", "--tag-output=false", "--stdin", "none",
		"--timeout", strconv.Itoa(int(netProbeTimeout.Seconds()) + 30)}
	if rsh != "" {
		args = append(args, "--rsh", rsh)
	}
	if bind != "" {
		args = append(args, "--bind", bind)
	}
	args = append(args, "--", self, "plan", "net-probe", strconv.FormatInt(size, 10))
	out, err := run(ctx, args)
	if err != nil {
		return 0, err
	}
	return parseNetProbe(out)
}

// parseNetProbe finds rank 1's line in the job's output.
func parseNetProbe(out []byte) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), netProbeLine)
		if !ok {
			continue
		}
		var n int64
		var s float64
		if _, err := fmt.Sscanf(rest, "bytes=%d seconds=%g", &n, &s); err != nil || n < 1 || !(s > 0) {
			return 0, fmt.Errorf("measurement job: bad result line %q", sc.Text())
		}
		return float64(n) / s, nil
	}
	return 0, fmt.Errorf("measurement job: no result line in its output %q", lastLines(string(out), 5))
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
