package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/testcluster"
)

// helperAllreduce is a Go rank: comm.Init, an Allreduce of known values
// that it checks, a Send/Recv ring and an Allgather; it prints one line.
func helperAllreduce() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := comm.Init(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	defer c.Close()
	n, r := c.Size(), c.Rank()
	x := make([]float64, 1000)
	for i := range x {
		x[i] = float64(r*1000 + i)
	}
	if err := c.AllreduceFloat64(ctx, x); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		return 1
	}
	for i, v := range x {
		want := float64(1000*n*(n-1)/2 + n*i)
		if v != want {
			fmt.Fprintf(os.Stderr, "allreduce[%d] = %v, want %v\n", i, v, want)
			return 1
		}
	}
	if n > 1 { // a token around the ring (a rank cannot send to itself)
		next, prev := (r+1)%n, (r+n-1)%n
		errc := make(chan error, 1)
		go func() { errc <- c.Send(ctx, next, []byte("from "+strconv.Itoa(r))) }()
		got, err := c.Recv(ctx, prev)
		if err == nil {
			err = <-errc
		}
		if err != nil || string(got) != "from "+strconv.Itoa(prev) {
			fmt.Fprintf(os.Stderr, "ring: %q %v\n", got, err)
			return 1
		}
	}
	all, err := c.Allgather(ctx, []byte(strconv.Itoa(r*r)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "allgather:", err)
		return 1
	}
	var parts []string
	for _, b := range all {
		parts = append(parts, string(b))
	}
	if err := c.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "barrier:", err)
		return 1
	}
	fmt.Printf("ok rank=%d size=%d epoch=%d gather=%s sum0=%v\n", r, n, c.Epoch(), strings.Join(parts, ","), x[0])
	return 0
}

func wantAllreduce(t *testing.T, res result, np int) {
	t.Helper()
	if res.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	var sq []string
	for r := range np {
		sq = append(sq, strconv.Itoa(r*r))
	}
	re := regexp.MustCompile(`(?m)^\[(\d+)\] ok rank=(\d+) size=(\d+) epoch=0 gather=(\S+) sum0=`)
	got := re.FindAllStringSubmatch(res.stdout, -1)
	if len(got) != np {
		t.Fatalf("%d ranks finished, want %d\n%s\n%s", len(got), np, res.stdout, res.stderr)
	}
	for _, m := range got {
		if m[1] != m[2] || m[3] != strconv.Itoa(np) || m[4] != strings.Join(sq, ",") {
			t.Errorf("rank %s: %v", m[1], m)
		}
	}
}

func TestCommUnderGorun(t *testing.T) {
	for _, np := range []int{1, 2, 5} {
		res := runJob(t, "allreduce", nil, "-np", strconv.Itoa(np), "--oversubscribe", os.Args[0])
		wantAllreduce(t, res, np)
	}
}

func TestMultiHostComm(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 4)
	res := multiHostJob(t, hosts, 2, "allreduce").wait(90 * time.Second)
	wantAllreduce(t, res, 8)
}
