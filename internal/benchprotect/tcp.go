package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// TCP throughput, the yardstick of the replication's: one stream sends
// n bytes from a 1 MiB buffer and waits for the receiver's 8-byte
// acknowledgement, sent once it has read them all; the time runs from the
// connection's establishment to the acknowledgement. Between namespace
// hosts the two ends are this program again, started with -tcp-sink and
// -tcp-source inside the namespaces (a socket belongs to the network
// namespace of the process that opens it).

const tcpChunk = 1 << 20

// sink accepts one connection on l, reads it to its end, answers with the
// byte count and closes.
func sink(l net.Listener) error {
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	n, err := io.CopyBuffer(io.Discard, c, make([]byte, tcpChunk))
	if err != nil {
		return err
	}
	var ack [8]byte
	binary.LittleEndian.PutUint64(ack[:], uint64(n))
	_, err = c.Write(ack[:])
	return err
}

// source sends n bytes to addr and returns the time until the receiver
// acknowledged them.
func source(addr string, n int64) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, tcpChunk)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	start := time.Now()
	for left := n; left > 0; {
		k, err := c.Write(buf[:min(left, int64(len(buf)))])
		if err != nil {
			return 0, err
		}
		left -= int64(k)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return 0, fmt.Errorf("reading the acknowledgement: %w", err)
	}
	d := time.Since(start)
	if got := int64(binary.LittleEndian.Uint64(ack[:])); got != n {
		return 0, fmt.Errorf("receiver got %d bytes, sent %d", got, n)
	}
	return d, nil
}

// loopbackOnce measures one stream over 127.0.0.1 in this process.
func loopbackOnce(n int64) (time.Duration, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() { errc <- sink(l) }()
	d, err := source(l.Addr().String(), n)
	return d, errors.Join(err, <-errc)
}

// sinkMain is -tcp-sink ADDR: listen on ADDR, print the address listened
// on, serve one stream.
func sinkMain(addr string, stdout io.Writer) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(stdout, "listening %s\n", l.Addr())
	return sink(l)
}

// sourceMain is -tcp-source ADDR: send n bytes, print the nanoseconds.
func sourceMain(addr string, n int64, stdout io.Writer) error {
	d, err := source(addr, n)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ns %d\n", d.Nanoseconds())
	return nil
}

// hostsOnce measures one stream from host from to host to, both ends in
// their namespaces.
func (b *bench) hostsOnce(ctx context.Context, from, to int, n int64) (time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	sk := exec.CommandContext(ctx, "ip", "netns", "exec", b.hosts.Names[to], exe, "-tcp-sink", net.JoinHostPort(b.hosts.Addrs[to], "0"))
	out, err := sk.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var skErr strings.Builder
	sk.Stderr = &skErr
	if err := sk.Start(); err != nil {
		return 0, err
	}
	defer sk.Wait()
	defer cancel() // kills the sink if it is still there
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		return 0, fmt.Errorf("TCP sink in %s did not start: %q %v %s", b.hosts.Names[to], line, err, skErr.String())
	}
	src, err := exec.CommandContext(ctx, "ip", "netns", "exec", b.hosts.Names[from], exe,
		"-tcp-source", addr, "-tcp-bytes", strconv.FormatInt(n, 10)).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("TCP source in %s: %v: %s", b.hosts.Names[from], err, src)
	}
	s, ok := strings.CutPrefix(strings.TrimSpace(string(src)), "ns ")
	ns, err := strconv.ParseInt(s, 10, 64)
	if !ok || err != nil {
		return 0, fmt.Errorf("TCP source in %s said %q", b.hosts.Names[from], src)
	}
	if err := sk.Wait(); err != nil {
		return 0, fmt.Errorf("TCP sink in %s: %v: %s", b.hosts.Names[to], err, skErr.String())
	}
	return time.Duration(ns), nil
}

// tcpRates measures single-stream TCP throughput over 127.0.0.1 and from
// host 0 to host 1 (the path rank 0's replication takes), reps times each,
// interleaved, and returns the median rates in MB/s.
func (b *bench) tcpRates(ctx context.Context) (loopback, hosts float64, err error) {
	n := b.cfg.tcpBytes
	var lo, ho []time.Duration
	for range b.cfg.tcpReps {
		d, err := loopbackOnce(n)
		if err != nil {
			return 0, 0, fmt.Errorf("TCP over 127.0.0.1: %w", err)
		}
		lo = append(lo, d)
		if d, err = b.hostsOnce(ctx, 0, 1, n); err != nil {
			return 0, 0, err
		}
		ho = append(ho, d)
	}
	rate := func(d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }
	return rate(median(lo)), rate(median(ho)), nil
}
