package diffstore

import (
	"strconv"
	"testing"

	"github.com/gorun/gorun/replay"
)

// BenchmarkRestore measures, on a shard of 16 MiB of optimizer state
// (W, M and V of 1.4 M elements) and lossless differentials: a plain copy
// of the state's bytes (the full-replication restore), Restore of 1 and of
// 16 unfolded steps, and Fold per folded step (16 at a time). Each reports
// x-copy, its time as a multiple of the plain copy measured in the same
// run (the copy sub-benchmark must run first: run them together).
func BenchmarkRestore(b *testing.B) {
	const steps = 16
	o := newOwner(40, (16<<20)/12, lossless)
	diffs := make([]Diff, steps+1)
	for i := 1; i <= steps; i++ {
		diffs[i] = o.next(b)
	}
	regions, _ := o.layout()
	var bytes int64
	dst := map[string][]byte{}
	for _, r := range regions {
		dst[r.Name] = alloc(r.Size)
		bytes += r.Size
	}
	base := o.states[0]
	baseSums := sums(base)
	// fill returns a store with the base at step 0 and the differentials.
	fill := func(b *testing.B) *Store {
		s := o.newStore(b)
		w, err := s.BeginBase(0)
		if err != nil {
			b.Fatal(err)
		}
		for name, data := range base {
			if err := w.Write(name, 0, data); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Commit(0, baseSums); err != nil {
			b.Fatal(err)
		}
		for _, d := range diffs[1:] {
			if err := s.Append(d); err != nil {
				b.Fatal(err)
			}
		}
		return s
	}
	s := fill(b)
	for name, data := range base { // fault dst's pages in before anything is timed
		copy(dst[name], data)
	}

	var copyNs float64
	perOp := func(b *testing.B, n int) float64 {
		return float64(b.Elapsed().Nanoseconds()) / float64(b.N) / float64(n)
	}
	report := func(b *testing.B, ns float64) {
		if copyNs > 0 {
			b.ReportMetric(ns/copyNs, "x-copy")
		}
	}
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(bytes)
		for b.Loop() {
			for name, data := range base {
				copy(dst[name], data)
			}
		}
		copyNs = perOp(b, 1)
	})
	for _, k := range []int64{1, steps} {
		b.Run("restore-"+strconv.FormatInt(k, 10), func(b *testing.B) {
			b.SetBytes(bytes)
			for b.Loop() {
				if err := s.Restore(k, dst, replay.ReplayOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			report(b, perOp(b, 1))
		})
	}
	b.Run("fold-per-step", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			s := fill(b)
			b.StartTimer()
			if err := s.Fold(steps, replay.ReplayOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		ns := perOp(b, steps)
		b.ReportMetric(ns, "ns/folded-step")
		report(b, ns)
	})
}
