package diffstore

import (
	"fmt"
	"hash/crc32"
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

// BenchmarkHolderStep measures a holder's per-step work on one owner's
// store in steady state, per fold period of fold steps (one op): each
// differential's record is received (copied, as from the link, into a
// buffer), appended, and every fold steps the log is folded after a check
// of the fold's end state against the owner's CRC32Cs. "fresh" is the
// holder as it was: a new buffer per record, the check a Restore into a
// scratch buffer and then a Fold that replays the same steps again.
// "recycled" is the holder now: record buffers come back through
// SetRecycle to a free list and are received into again, and the fold is
// FoldChecked (each step replayed once, into the spare). allocs/op and
// B/op are the allocations of the whole period.
func BenchmarkHolderStep(b *testing.B) {
	const fold = 8
	const n = (12 << 20) / 12
	b.Run("fresh", func(b *testing.B) { benchHolder(b, n, fold, false) })
	b.Run("recycled", func(b *testing.B) { benchHolder(b, n, fold, true) })
}

// benchHolder runs BenchmarkHolderStep's loop; recycled says whether the
// holder reuses record buffers and folds with FoldChecked.
func benchHolder(b *testing.B, n, fold int, recycled bool) {
	o := newOwner(41, n, lossless)
	s := o.newStore(b)
	sendBase(b, s, o, 0)
	regions, _ := o.layout()
	scratch := map[string][]byte{}
	for _, r := range regions {
		scratch[r.Name] = alloc(r.Size)
	}
	var free [][]byte
	if recycled {
		s.SetRecycle(func(rec []byte) {
			if len(free) < fold+2 {
				free = append(free, rec)
			}
		})
	}
	check := func(step int64, got [][]byte) error {
		want := sums(o.states[step])
		for i, r := range regions {
			if crc32.Checksum(got[i], castagnoli) != want[r.Name] {
				return fmt.Errorf("step %d: region %q differs", step, r.Name)
			}
		}
		return nil
	}
	diffs := make([]Diff, fold)
	// period runs one fold period; the owner's steps are made with the
	// timer stopped.
	period := func() {
		b.StopTimer()
		for i := range diffs {
			diffs[i] = o.next(b)
		}
		last := diffs[fold-1].Step
		want := sums(o.states[last])
		for st := range o.states {
			if st < last-1 {
				delete(o.states, st)
			}
		}
		b.StartTimer()
		for _, d := range diffs {
			var rec []byte
			if k := len(free); k > 0 && len(free[k-1]) == len(d.Record) {
				rec, free = free[k-1], free[:k-1]
			} else {
				rec = make([]byte, len(d.Record))
			}
			copy(rec, d.Record)
			d.Record = rec
			if err := s.Append(d); err != nil {
				b.Fatal(err)
			}
		}
		if recycled {
			if err := s.FoldChecked(last, replay.ReplayOptions{}, check); err != nil {
				b.Fatal(err)
			}
			return
		}
		if err := s.Restore(last, scratch, replay.ReplayOptions{}); err != nil {
			b.Fatal(err)
		}
		for name, sum := range want {
			if crc32.Checksum(scratch[name], castagnoli) != sum {
				b.Fatalf("step %d: region %q differs", last, name)
			}
		}
		if err := s.Fold(last, replay.ReplayOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	period() // steady state: the free list and the spare are filled
	b.ResetTimer()
	for range b.N {
		period()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*fold), "ns/step")
}
