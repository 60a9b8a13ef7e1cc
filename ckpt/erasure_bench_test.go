package ckpt

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/gortest"
)

// BenchmarkCodecEncode: the erasure code's throughput over one stripe of
// K data shards of GORUN_BENCH_STATE_MIB MiB each (default 64; make
// bench-ec uses 256, one rank's state per shard), in bytes of data
// encoded per second (SetBytes: K shards):
//
//   - share: each member's Share of its shard, chunk by chunk (4 MiB, as
//     the agents' pipeline), XORed into the M parity rows (Accumulate):
//     the work of the whole group, on one core;
//   - share-all-cores: the same with the chunks dealt to GOMAXPROCS
//     goroutines, each with its own share buffers;
//   - accumulate: the parity hosts' part alone, K×M Accumulates of a
//     chunk.
//
// The parity of share equals the code's (TestCodecSubsets).
//
//	GORUN_BENCH_STATE_MIB=256 go test -run '^$' -bench BenchmarkCodecEncode -benchtime 3x ./ckpt/
func BenchmarkCodecEncode(b *testing.B) {
	mib := gortest.EnvMiB(b, "GORUN_BENCH_STATE_MIB", 64)
	const chunk = 4 << 20
	shard := mib << 20
	for _, km := range [][2]int{{2, 2}, {4, 2}} {
		k, m := km[0], km[1]
		c, err := NewCodec(k, m)
		if err != nil {
			b.Fatal(err)
		}
		data := make([][]byte, k)
		for x := range data {
			data[x] = make([]byte, shard)
			fill(uint64(x+1), x, data[x])
		}
		parity := make([][]byte, m)
		for j := range parity {
			parity[j] = make([]byte, shard)
		}
		// encode encodes chunks lo, lo+step, ... of every member into
		// parity with its own share buffers.
		encode := func(lo, step int, shares [][]byte) error {
			for x, d := range data {
				for off := lo * chunk; off < len(d); off += step * chunk {
					n := min(chunk, len(d)-off)
					sh := make([][]byte, m)
					for j := range sh {
						sh[j] = shares[j][:n]
					}
					if err := c.Share(d[off:off+n], x, sh); err != nil {
						return err
					}
					for j := range sh {
						Accumulate(parity[j][off:off+n], sh[j])
					}
				}
			}
			return nil
		}
		newShares := func() [][]byte {
			s := make([][]byte, m)
			for j := range s {
				s[j] = make([]byte, chunk)
			}
			return s
		}
		b.Run(fmt.Sprintf("%d+%d/share", k, m), func(b *testing.B) {
			shares := newShares()
			b.SetBytes(int64(k * shard))
			for b.Loop() {
				for _, p := range parity {
					clear(p)
				}
				if err := encode(0, 1, shares); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%d+%d/share-all-cores", k, m), func(b *testing.B) {
			procs := runtime.GOMAXPROCS(0)
			shares := make([][][]byte, procs)
			for i := range shares {
				shares[i] = newShares()
			}
			b.SetBytes(int64(k * shard))
			for b.Loop() {
				for _, p := range parity {
					clear(p)
				}
				var wg sync.WaitGroup
				errs := make([]error, procs)
				for i := range procs {
					wg.Go(func() { errs[i] = encode(i, procs, shares[i]) })
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("%d+%d/accumulate", k, m), func(b *testing.B) {
			src := make([]byte, chunk)
			fill(9, 0, src)
			b.SetBytes(int64(k * shard))
			for b.Loop() {
				for range k {
					for _, p := range parity {
						for off := 0; off < len(p); off += chunk {
							Accumulate(p[off:min(off+chunk, len(p))], src[:min(chunk, len(p)-off)])
						}
					}
				}
			}
		})
	}
}

// BenchmarkShareChecked: an owner's work on its shard (GORUN_BENCH_STATE_MIB
// MiB, default 64), 128 KiB at a time into share buffers of 4 MiB as the
// agents' encoder takes it (keeper's ecBlock and ecChunkSize), done
// by ShareChecked (fused where the processor allows) against the same
// work in passes (crc32c.CopyUpdate into the block buffer, Share of the
// copy, each share's crc32c.Update: the encoder before ShareChecked),
// both in each iteration over the same bytes on this goroutine, the one
// that goes first alternating (a method that always ran first or second
// would always find the caches as the other left them). Each method
// runs once over the buffers before the timing, so that neither pays the
// first touch of their pages. It reports each method's rate,
// fused-MiB/s and passes-MiB/s (of the shard's bytes, over that method's
// time alone), and fused/passes, the median of the iterations' ratios,
// which the machine's other load shifts less than either rate. It sets no
// bytes per op: an op is both methods, two passes over the shard, and
// ns/op is their sum.
func BenchmarkShareChecked(b *testing.B) {
	mib := gortest.EnvMiB(b, "GORUN_BENCH_STATE_MIB", 64)
	const block, chunk = 128 << 10, 4 << 20
	for _, km := range [][2]int{{2, 2}, {4, 2}} {
		k, m := km[0], km[1]
		b.Run(fmt.Sprintf("%d+%d", k, m), func(b *testing.B) {
			c, err := NewCodec(k, m)
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, mib<<20)
			fill(3, 0, data)
			cp := make([]byte, block)
			shares := make([][]byte, m)
			sub := make([][]byte, m)
			for j := range shares {
				shares[j] = make([]byte, chunk)
			}
			crcs := make([]uint32, m)
			fusedRun := func() (uint32, time.Duration) {
				start := time.Now()
				var sum uint32
				for a := 0; a < len(data); a += block {
					for j := range sub {
						sub[j] = shares[j][a%chunk : a%chunk+block]
					}
					var err error
					if sum, err = c.ShareChecked(data[a:a+block], 0, sub, cp, sum, crcs); err != nil {
						b.Fatal(err)
					}
				}
				return sum, time.Since(start)
			}
			passesRun := func() (uint32, time.Duration) {
				start := time.Now()
				var sum uint32
				for a := 0; a < len(data); a += block {
					sum = crc32c.CopyUpdate(sum, cp, data[a:a+block])
					for j := range sub {
						sub[j] = shares[j][a%chunk : a%chunk+block]
					}
					if err := c.Share(cp, 0, sub); err != nil {
						b.Fatal(err)
					}
					for j := range sub {
						crcs[j] = crc32c.Update(crcs[j], sub[j])
					}
				}
				return sum, time.Since(start)
			}
			// The first touch of cp and the share buffers, and the
			// codec's power of x for the block's length, before timing.
			fusedRun()
			passesRun()
			var fused, passes time.Duration
			var ratios []float64
			for b.Loop() {
				var s1, s2 uint32
				var f, p time.Duration
				if len(ratios)%2 == 0 {
					s1, f = fusedRun()
					s2, p = passesRun()
				} else {
					s2, p = passesRun()
					s1, f = fusedRun()
				}
				if s1 != s2 {
					b.Fatalf("sums %08x and %08x of the same bytes", s1, s2)
				}
				fused, passes = fused+f, passes+p
				ratios = append(ratios, p.Seconds()/f.Seconds())
			}
			mibps := func(d time.Duration) float64 {
				return float64(len(data)) * float64(len(ratios)) / d.Seconds() / (1 << 20)
			}
			slices.Sort(ratios)
			b.ReportMetric(mibps(fused), "fused-MiB/s")
			b.ReportMetric(mibps(passes), "passes-MiB/s")
			b.ReportMetric(ratios[len(ratios)/2], "fused/passes")
		})
	}
}
