package keeper

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/gortest"
)

// BenchmarkECDecode measures the decode of one lost member's state from
// in-memory sources (the network left out: what is measured is the
// decoder's reads into its buffers, the rebuild and the CRC32C check),
// against the restore-by-replica baseline of the same bytes in the same
// run: a copy checked against the committed CRC32Cs in one pass
// (crc32c.CopyUpdate, what a replica restore does to the bytes it
// receives). It reports both times and their ratio (decode/copy).
// GORUN_BENCH_STATE_MIB sets each member's state (default 256 MiB).
func BenchmarkECDecode(b *testing.B) {
	mib := gortest.EnvMiB(b, "GORUN_BENCH_STATE_MIB", 256)
	for _, c := range []struct{ k, m int }{{2, 2}, {4, 2}} {
		b.Run(fmt.Sprintf("%d+%d", c.k, c.m), func(b *testing.B) {
			st := newECStripe(b, c.k, c.m, func(int) []int64 { return []int64{int64(mib) << 20, 64} })
			// Member 0 is lost; the decode reads the first K of the rest
			// (the other data members, then parity).
			srcs, _ := st.sources([]int{0}, nil, nil)
			views := st.views(0)
			copyTo := st.views(0)
			ctx := context.Background()
			var tCopy, tDecode time.Duration
			runs := 0
			for b.Loop() {
				b.StopTimer()
				runtime.GC()
				b.StartTimer()
				start := time.Now()
				for _, e := range st.tables[0] {
					if got := crc32c.CopyUpdate(0, copyTo[e.name], st.regions[0][e.name]); got != e.sum {
						b.Fatalf("copy of region %q: CRC32C %08x, committed %08x", e.name, got, e.sum)
					}
				}
				tCopy += time.Since(start)

				b.StopTimer()
				runtime.GC()
				b.StartTimer()
				start = time.Now()
				err := decodeMember(ctx, ecDecode{codec: st.codec, lost: 0, shard: st.L, sources: srcs, table: st.tables[0], views: views})
				tDecode += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				runs++
			}
			b.StopTimer()
			if err := st.same(0, views); err != nil {
				b.Fatal(err)
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(runs) / 1e6 }
			b.SetBytes(st.L)
			b.ReportMetric(ms(tCopy), "copy-ms")
			b.ReportMetric(ms(tDecode), "decode-ms")
			b.ReportMetric(float64(tDecode)/float64(tCopy), "decode/copy")
			b.Logf("%d MiB member, %d+%d: decode %.1f ms, checked copy %.1f ms (%.2fx), GOMAXPROCS %d",
				mib, c.k, c.m, ms(tDecode), ms(tCopy), float64(tDecode)/float64(tCopy), runtime.GOMAXPROCS(0))
		})
	}
}
