package cascade_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/replay"
)

// BenchmarkResume is the third part of make bench-persist: the time to
// rebuild one rank's state from the durable tier (cascade.Load, what each
// agent does per rank in gorun --resume) with 0, 16 and 64 lossless
// differentials to replay after the base, each beside the time to load
// the base alone, alternating in the same run (ratio = resume / base).
// The rank's state is dptrain's layout: one optimizer region of W, M
// and V (GORUN_BENCH_STATE_MIB, default 256, in all) and a 64-byte meta
// region; its differentials go to GORUN_BENCH_DIR (default a temporary
// directory under /tmp, removed after) in batches of 16. The files were
// just written, so most reads come from the page cache: the figures are
// the CPU's part (CRC32C of every chunk and record, decode, fused
// replay), not a cold disk's. B/op (the base's load and the resume's) is
// about one batch: Load holds one batch of the log at a time, and reads
// none after the target.
func BenchmarkResume(b *testing.B) {
	mib := gortest.EnvMiB(b, "GORUN_BENCH_STATE_MIB", 256)
	root := os.Getenv("GORUN_BENCH_DIR")
	if root == "" {
		d, err := os.MkdirTemp("/tmp", "gorun-bench-resume-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(d)
		root = d
	}
	dir, err := os.MkdirTemp(root, "resume-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	const maxDiffs, batch, base = 64, 16, 100
	regions, reach := writeResumeLog(b, dir, int64(mib)<<20, base, maxDiffs, batch)
	dst := make([][]byte, len(regions))
	for i, g := range regions {
		dst[i] = make([]byte, g.Size)
	}
	ctx := context.Background()
	for _, k := range []int64{0, 16, 64} {
		b.Run(fmt.Sprintf("diffs=%d", k), func(b *testing.B) {
			if base+k > reach {
				b.Fatalf("the log reaches %d", reach)
			}
			var resume, baseOnly, read, replayed time.Duration
			b.ReportAllocs()
			for b.Loop() {
				t0 := time.Now()
				if err := durable.Load(ctx, dir, 0, base, dst); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				got, err := cascade.Load(ctx, dir, 0, regions, base, base+k, dst, replay.ReplayOptions{})
				if err != nil {
					b.Fatal(err)
				}
				resume += time.Since(t1)
				read += got.LogTime
				replayed += got.ReplayTime
				baseOnly += t1.Sub(t0)
				if got.Replayed != int(k) || !got.Exact {
					b.Fatalf("%+v", got)
				}
			}
			n := float64(b.N)
			b.ReportMetric(resume.Seconds()*1e3/n, "resume-ms")
			b.ReportMetric(baseOnly.Seconds()*1e3/n, "base-ms")
			b.ReportMetric(resume.Seconds()/baseOnly.Seconds(), "ratio")
			b.ReportMetric(0, "ns/op")
			per := func(d time.Duration) time.Duration { return (d / time.Duration(b.N)).Round(time.Millisecond) }
			b.Logf("%d MiB state, %d differentials: resume %v (reading the log %v, replay %v), base alone %v, ratio %.2f",
				mib, k, per(resume), per(read), per(replayed), per(baseOnly), resume.Seconds()/baseOnly.Seconds())
		})
	}
}

// writeResumeLog writes rank 0's base at step base (a state of size
// bytes: W, M and V) and the lossless differentials of the maxDiffs steps
// after it, in batches of batch, stepping the state with replay.Step to
// take each step's committed CRC32C. It returns the regions and the last
// step written.
func writeResumeLog(b *testing.B, dir string, size, base int64, maxDiffs, batch int) ([]durable.Region, int64) {
	n := size / 12
	opt := make([]byte, 12*n)
	f := unsafe.Slice((*float32)(unsafe.Pointer(&opt[0])), 3*n)
	w, m, v := f[:n:n], f[n:2*n:2*n], f[2*n:]
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range w {
		w[i] = float32(rng.Int32N(1<<20)) * 1e-7
		v[i] = float32(rng.Int32N(1<<20)) * 1e-12
	}
	meta := make([]byte, 64)
	regions := []durable.Region{{Name: "optimizer", Size: 12 * n}, {Name: "meta", Size: 64}}
	s, err := durable.Open(dir, 0, regions, durable.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Save(context.Background(), base, [][]byte{opt, meta}, []uint32{crc32c.Checksum(opt), crc32c.Checksum(meta)}, nil); err != nil {
		b.Fatal(err)
	}
	s.Close()
	g := make([]float32, n)
	var enc replay.Encoder
	var recs [][]byte
	first := base + 1
	for k := 1; k <= maxDiffs; k++ {
		step := base + int64(k)
		x := rng.Uint64() | 1
		for i := range g {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			g[i] = float32(int32(x>>32)) * 1e-11 // ±0.02
		}
		h := replay.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, T: int(step) + 1}
		grad, err := enc.AppendRecord(nil, uint64(step), 0, g, replay.Options{Lossless: true})
		if err != nil {
			b.Fatal(err)
		}
		replay.Step(w, m, v, g, h.Consts())
		meta[0] = byte(step)
		d := diffstore.Diff{Step: step, Hyper: h, Record: grad, Other: map[string][]byte{"meta": append([]byte(nil), meta...)}}
		d.Seal()
		rec, err := difflog.Encode(nil, &difflog.Record{Diff: d,
			Optimizer: diffstore.Optimizer{Region: "optimizer", N: n, WOff: 0, MOff: 4 * n, VOff: 8 * n},
			Regions:   []difflog.Region{{Name: "optimizer", Size: 12 * n, Sum: crc32c.Checksum(opt)}, {Name: "meta", Size: 64, Sum: crc32c.Checksum(meta)}}})
		if err != nil {
			b.Fatal(err)
		}
		recs = append(recs, rec)
		if len(recs) == batch || k == maxDiffs {
			if err := durable.AppendBatch(dir, 0, first, step, recs); err != nil {
				b.Fatal(err)
			}
			recs, first = nil, step+1
		}
	}
	return regions, base + int64(maxDiffs)
}
