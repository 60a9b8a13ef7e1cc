package comm

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// baselineBytes is the size of the baselines' transfers.
const baselineBytes = 256 << 20

// tcpThroughput measures loopback TCP with streams concurrent streams: for
// each, one goroutine writes bytes to a loopback connection (tuned as the
// data plane's links are) and another reads them. It returns the
// throughput of one stream, in bytes/s, best of three runs. One stream is
// the single-stream baseline; n streams is what n ranks' ring links get
// when they share the machine's cores.
func tcpThroughput(b *testing.B, streams, bytes int) float64 {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	src := touched(bytes)
	dst := make([][]byte, streams)
	for i := range dst {
		dst[i] = touched(bytes)
	}
	best := 0.0
	for range 3 {
		w, r := make([]net.Conn, streams), make([]net.Conn, streams)
		for i := range streams {
			var err error
			if w[i], err = net.Dial("tcp", l.Addr().String()); err != nil {
				b.Fatal(err)
			}
			if r[i], err = l.Accept(); err != nil {
				b.Fatal(err)
			}
			tune(w[i])
			tune(r[i])
		}
		errs := make(chan error, 2*streams)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range streams {
			wg.Go(func() {
				_, err := w[i].Write(src)
				errs <- err
			})
			wg.Go(func() {
				_, err := io.ReadFull(r[i], dst[i])
				errs <- err
			})
		}
		wg.Wait()
		d := time.Since(start)
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		for i := range streams {
			w[i].Close()
			r[i].Close()
		}
		best = max(best, float64(bytes)/d.Seconds())
	}
	return best
}

// memcpyBandwidth is the best of three copies of baselineBytes, in bytes/s.
func memcpyBandwidth() float64 {
	src, dst := touched(baselineBytes), touched(baselineBytes)
	best := 0.0
	for range 3 {
		start := time.Now()
		copy(dst, src)
		best = max(best, baselineBytes/time.Since(start).Seconds())
	}
	return best
}

// touched returns n bytes whose pages are mapped already.
func touched(n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		b[i] = 1
	}
	return b
}

// BenchmarkAllreduce measures ring Allreduce (float32 sum) between local
// ranks, linked by loopback TCP (link=tcp, as ranks on different hosts
// are) or by Unix sockets (link=unix, as comm.Init links ranks of one
// host), as bus bandwidth: busbw = 2(n-1)/n × bytes /
// time, the rate at which each rank's ring link carries data. Beside it,
// measured in the same run: the limits, single-stream loopback TCP
// throughput (tcp) and memcpy bandwidth, and the ratio busbw/tcp (the
// target at 256 MiB is ≥ 0.7); also the per-stream throughput of n
// concurrent loopback streams (tcp-Nstreams), which is what n ranks' links
// can get at best when they share the machine's cores.
//
//	go test -run '^$' -bench BenchmarkAllreduce -benchtime 5x ./comm/
func BenchmarkAllreduce(b *testing.B) {
	tcp := tcpThroughput(b, 1, baselineBytes)
	mem := memcpyBandwidth()
	streams := map[int]float64{}
	for _, n := range []int{2, 4} {
		streams[n] = tcpThroughput(b, n, baselineBytes/2)
	}
	baseline := func(name string, v float64) {
		b.Run("baseline="+name, func(b *testing.B) {
			for b.Loop() {
			}
			b.ReportMetric(v/1e9, "GB/s")
		})
	}
	baseline("tcp", tcp)
	baseline("memcpy", mem)
	for _, n := range []int{2, 4} {
		baseline(fmt.Sprintf("tcp-%dstreams", n), streams[n])
	}
	for _, link := range []string{"tcp", "unix"} {
		for _, n := range []int{2, 4} {
			for _, size := range []int{1 << 20, 16 << 20, 256 << 20} {
				b.Run(fmt.Sprintf("link=%s/ranks=%d/size=%dMiB", link, n, size>>20), func(b *testing.B) {
					busbw := benchmarkAllreduce(b, n, size, link == "unix")
					b.ReportMetric(busbw/1e9, "busbw-GB/s")
					b.ReportMetric(tcp/1e9, "tcp-GB/s")
					b.ReportMetric(mem/1e9, "memcpy-GB/s")
					b.ReportMetric(busbw/tcp, "busbw/tcp")
					b.ReportMetric(busbw/streams[n], "busbw/tcp-nstreams")
				})
			}
		}
	}
}

// benchmarkAllreduce runs Allreduce of size bytes on n ranks and returns
// the bus bandwidth in bytes/s.
func benchmarkAllreduce(b *testing.B, n, size int, unix bool) float64 {
	comms := newWorld(b, n, worldOpts{log: io.Discard, unix: unix})
	x := make([][]float32, n)
	for r := range x {
		x[r] = make([]float32, size/4)
		for i := range x[r] {
			x[r][i] = float32(i % 7)
		}
	}
	ctx := context.Background()
	b.SetBytes(int64(size))
	for b.Loop() {
		mustAll(b, onAll(comms, func(c *Comm) error { return c.AllreduceFloat32(ctx, x[c.Rank()]) }))
	}
	perOp := b.Elapsed().Seconds() / float64(b.N)
	return 2 * float64(n-1) / float64(n) * float64(size) / perOp
}
