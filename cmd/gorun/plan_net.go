package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/comm"
)

// The network between two hosts of --hostfile is measured by a 2-rank job
// gorun itself runs there, one rank per host, over gorun's data plane:
// each rank joins the job's world with comm.Init (its links authenticated
// with the job's data-plane key by comm's HMAC challenge-response, as
// every data-plane connection is), rank 1 sends --measure-size bytes to
// rank 0 in messages of at most 4 MiB, rank 0 acknowledges them all with
// one byte, and rank 1 prints how long that took:
//
//	gorun-plan-net bytes=N seconds=S
//
// then says goodbye, so that rank 0 does not close the link under the
// acknowledgement. Ranks run `gorun plan net-probe BYTES`, this same
// binary.

// netProbeLine starts the line rank 1 prints.
const netProbeLine = "gorun-plan-net "

// netProbeTimeout bounds the probe's connection and transfer.
const netProbeTimeout = 2 * time.Minute

// netProbeChunk is the largest message the probe sends.
const netProbeChunk = 4 << 20

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
	ctx, cancel := context.WithTimeout(context.Background(), netProbeTimeout)
	defer cancel()
	c, err := comm.Init(ctx)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	el, err := probe(ctx, c, size)
	if err != nil {
		return fail(err)
	}
	if c.Rank() == 1 {
		fmt.Fprintf(stdout, "%sbytes=%d seconds=%.9f\n", netProbeLine, size, el.Seconds())
	}
	return exitOK
}

// probe is one rank's part of the measurement on c, a world of 2 ranks:
// rank 1 sends size bytes and returns how long they took to be
// acknowledged; rank 0 receives them and acknowledges.
func probe(ctx context.Context, c *comm.Comm, size int64) (time.Duration, error) {
	if c.Size() != 2 {
		return 0, fmt.Errorf("a world of %d ranks: the probe runs as ranks 0 and 1", c.Size())
	}
	if c.Rank() == 0 {
		for got := int64(0); got < size; {
			b, err := c.Recv(ctx, 1)
			if err != nil {
				return 0, fmt.Errorf("receiving: %w", err)
			}
			if got += int64(len(b)); got > size {
				return 0, fmt.Errorf("receiving: %d bytes, more than the %d expected", got, size)
			}
		}
		if err := c.Send(ctx, 1, []byte{1}); err != nil {
			return 0, fmt.Errorf("acknowledging: %w", err)
		}
		if _, err := c.Recv(ctx, 1); err != nil { // goodbye
			return 0, fmt.Errorf("waiting for rank 1 to finish: %w", err)
		}
		return 0, nil
	}
	buf := make([]byte, min(size, netProbeChunk))
	for i := range buf {
		buf[i] = byte(i * 131)
	}
	start := time.Now()
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		if err := c.Send(ctx, 0, buf[:n]); err != nil {
			return 0, fmt.Errorf("sending: %w", err)
		}
		left -= n
	}
	if _, err := c.Recv(ctx, 0); err != nil {
		return 0, fmt.Errorf("waiting for the acknowledgement: %w", err)
	}
	el := time.Since(start)
	if err := c.Send(ctx, 0, []byte{0}); err != nil {
		return 0, fmt.Errorf("saying goodbye: %w", err)
	}
	return el, nil
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
