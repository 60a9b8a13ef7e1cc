package replay

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkEncodeRecord measures a diff-mode owner's per-step encoding of
// its gradient, the old way (CompressInto into a reused tensor, then
// AppendBinary into a fresh buffer: rank's encodeGradient before
// AppendRecord) against AppendRecord into a reused buffer, for the raw
// and TopK codecs, on 1M elements and on 22M (89 MB, the gradient of a
// rank of 256 MiB of Adam state). Each sub-benchmark reports ns/op, MB/s
// of gradient, B/op and allocs/op; "new" also reports new/old-time, its
// time per record over the old path's, measured just before it in the
// same run.
//
// The old path's fresh buffer is recycled by this process's heap between
// iterations (its pages stay faulted in): under the agent's soft memory
// limit the runtime returns them to the OS and every step faults them in
// again, which this benchmark does not show.
func BenchmarkEncodeRecord(b *testing.B) {
	for _, sz := range []struct {
		name string
		n    int
	}{{"1M", 1 << 20}, {"89MB", 89_000_000 / 4}} {
		for _, c := range []struct {
			name string
			opt  Options
		}{
			{"raw", Options{Lossless: true}},
			{"topk", Options{Threshold: 1}},
		} {
			b.Run(fmt.Sprintf("%s/%s", c.name, sz.name), func(b *testing.B) {
				x := benchGrad(sz.n)
				var oldNS float64 // the old path's time per record, for new's ratio
				b.Run("old", func(b *testing.B) {
					var tn Tensor
					if err := CompressInto(&tn, 1, x, c.opt); err != nil { // grows its buffers
						b.Fatal(err)
					}
					b.SetBytes(int64(4 * sz.n))
					b.ReportAllocs()
					start := time.Now()
					var n int
					for b.Loop() {
						if err := CompressInto(&tn, 1, x, c.opt); err != nil {
							b.Fatal(err)
						}
						r := Record{Step: uint64(n), Tensors: []*Tensor{&tn}}
						if _, err := r.AppendBinary(nil); err != nil {
							b.Fatal(err)
						}
						n++
					}
					oldNS = float64(time.Since(start).Nanoseconds()) / float64(n)
				})
				b.Run("new", func(b *testing.B) {
					var e Encoder
					buf, err := e.AppendRecord(nil, 0, 1, x, c.opt) // grows the buffer and the scratch
					if err != nil {
						b.Fatal(err)
					}
					b.SetBytes(int64(4 * sz.n))
					b.ReportAllocs()
					start := time.Now()
					var n int
					for b.Loop() {
						if buf, err = e.AppendRecord(buf[:0], uint64(n), 1, x, c.opt); err != nil {
							b.Fatal(err)
						}
						n++
					}
					newNS := float64(time.Since(start).Nanoseconds()) / float64(n)
					if oldNS > 0 {
						b.ReportMetric(newNS/oldNS, "new/old-time")
					}
				})
			})
		}
	}
}
