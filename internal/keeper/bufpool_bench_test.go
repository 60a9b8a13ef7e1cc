package keeper

import (
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// BenchmarkEncodeGradient measures the commit's encoding of a rank's
// gradient of 89 MB (256 MiB of Adam state), raw codec, per step: "old"
// is the encoding before the record pool (CompressInto into a reused
// tensor, AppendBinary into a fresh buffer), "new" is encodeGradient
// into a pooled buffer, then the differential's last release giving the
// buffer back (the steady state: the previous step's record was
// acknowledged). "new" reports new/old-time against "old" measured just
// before it.
func BenchmarkEncodeGradient(b *testing.B) {
	const n = 89_000_000 / 4
	half := make([]byte, 4*n)
	x := unsafe.Slice((*float32)(unsafe.Pointer(&half[0])), n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 1e-3)
	}
	var oldNS float64
	b.Run("old", func(b *testing.B) {
		var tn replay.Tensor
		b.SetBytes(4 * n)
		b.ReportAllocs()
		start, steps := time.Now(), 0
		for b.Loop() {
			if err := replay.CompressInto(&tn, 0, x, replay.Options{Lossless: true}); err != nil {
				b.Fatal(err)
			}
			r := replay.Record{Step: uint64(steps), Tensors: []*replay.Tensor{&tn}}
			if _, err := r.AppendBinary(nil); err != nil {
				b.Fatal(err)
			}
			steps++
		}
		oldNS = float64(time.Since(start).Nanoseconds()) / float64(steps)
	})
	b.Run("new", func(b *testing.B) {
		s := &service{h: &Keeper{}}
		s.recs.max = 2
		s.grad[0], s.grad[1] = half, half
		encode := func(step int64) {
			rec, err := s.encodeGradient(gradRec{step: step, n: n})
			if err != nil {
				b.Fatal(err)
			}
			var od ownerDiff
			od.rec.own(&s.recs, rec)
			od.rec.release()
		}
		encode(0) // the pool's first buffer
		b.SetBytes(4 * n)
		b.ReportAllocs()
		start, steps := time.Now(), int64(0)
		for b.Loop() {
			encode(steps)
			steps++
		}
		if oldNS > 0 {
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(steps)/oldNS, "new/old-time")
		}
	})
}
