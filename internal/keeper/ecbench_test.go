package keeper

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// BenchmarkECPipeline measures the owner's erasure-coding pipeline
// (ecSend: shares, CRC32Cs and the sends to M parity hosts over loopback
// links, each host checking and XORing its share into its row) of one
// rank of a 2+2 group against the code alone over the same bytes in the
// same run:
//
//   - raw-MiB/s: reedsolomon's Encode of a whole stripe (ckpt.Codec.Encode
//     of K shards as long as the rank's: its bytes and K-1 copies of them
//     in memory of their own, 4 MiB at a time, on this goroutine), in
//     bytes of data (K shards) per second: the reference. The
//     copies cost K-1 times the rank's state in memory (64 MiB by
//     default, 256 MiB under make bench-ec, for K = 2);
//   - share-MiB/s, share/raw: ckpt.Codec.Share of the rank's shard alone
//     (4 MiB at a time into M buffers, on this goroutine), the owner's
//     part of the code. Each member's Share writes M bytes per byte of
//     its shard where a stripe's Encode writes M/K: K = 2 bounds
//     share/raw near 0.5;
//   - encode1core-MiB/s, encode1core/raw: the pipeline's encoder
//     (ecEncodeChunk: the checked copy, the shares and their CRC32Cs)
//     alone over the rank's shard on this goroutine, as raw and share
//     are: the "pipeline at 80% of raw Encode" is judged on it
//     (make bench-ec). These were encode-MiB/s and encode/raw, of the
//     encoder's time inside ecSend against a raw that read one shard
//     from memory: renamed so that figures of the two are not compared
//     by name;
//   - pipeline-MiB/s, pipeline/raw: ecSend end to end;
//   - encode-inpipe-MiB/s: the encoder's throughput in wall time while
//     it runs inside ecSend, beside the senders and the parity hosts'
//     receivers, which share the machine's cores with it: it is not a
//     figure of one core, and is not compared with raw.
//
// Over loopback TCP on a few shared cores the links, not the pipeline,
// bound pipeline/raw. GORUN_BENCH_STATE_MIB sets the rank's state
// (default 64 MiB).
func BenchmarkECPipeline(b *testing.B) {
	mib := gortest.EnvMiB(b, "GORUN_BENCH_STATE_MIB", 64)
	const k, m = 2, 2
	hosts := make([]topology.Host, k+m)
	var assign []topology.Assignment
	ranks := make([][]int, k+m)
	for h := range hosts {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: 1}
		assign = append(assign, topology.Assignment{Rank: h, Host: h})
		ranks[h] = []int{h}
	}
	groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: k, M: m})
	if err != nil {
		b.Fatal(err)
	}
	// Rank 0 runs on a data host (PlanEC's first data host is host 0 for
	// one rank per host): no clear copy, only the parity rows.
	owner := groups[0].DataGroups[0][0]
	c := newClusterWith(b, ranks, nil, nil, func(cfg *Config) { cfg.EC = groups })
	h := c.hosts[c.hostOf[owner]]
	sess := h.Session(owner)
	size := int64(mib) << 20
	hello := fmt.Sprintf(`{"v":1,"regions":[{"name":"optimizer","size":%d},{"name":"meta","size":64}]}`, size)
	ctx := context.Background()
	if _, ans, err := sess.Handle(ctx, protect.TypeProtectHello, []byte(hello)); err != nil || ans.(*protect.ProtectWelcome).Err != "" {
		b.Fatalf("ProtectHello: %+v, %v", ans, err)
	}
	if _, ans, err := sess.Handle(ctx, protect.TypeStage, []byte(`{"step":0}`)); err != nil || ans.(*protect.Staged).Err != "" {
		b.Fatalf("Stage: %+v, %v", ans, err)
	}
	s := h.svc(owner)
	s.mu.Lock()
	views := s.views[0]
	s.mu.Unlock()
	for i, v := range views {
		for j := range v {
			v[j] = byte(j*7 + i + j>>13)
		}
	}
	if _, ans, err := sess.Handle(ctx, protect.TypeCommit, []byte(`{"step":0}`)); err != nil || ans.(*protect.Committed).Err != "" {
		b.Fatalf("Commit: %+v, %v", ans, err)
	}
	c.waitFor("the owner's step 0 at its parity rows", func() bool { return c.progress(owner).Replicated == 0 })
	s.mu.Lock()
	var t []tableEntry
	var data [][]byte
	for _, i := range s.repl {
		t = append(t, tableEntry{name: s.regions[i].Name, size: s.regions[i].Size, sum: s.sums[0][i]})
		data = append(data, s.views[0][i])
	}
	s.mu.Unlock()
	to := h.place().ecTargets(owner)
	known := make([]bool, len(to))
	for i := range known {
		known[i] = true
	}
	codec := h.place().ec.codec
	x := h.place().ec.pos[owner].x
	// The stripe's other K-1 data shards: copies of the rank's bytes in
	// memory of their own, so that raw Encode reads K shards' bytes from
	// memory as a real stripe's does (with the rank's own bytes as every
	// shard, the kernel read one shard from memory and the others from
	// the cache lines just read, and was credited with K).
	others := make([][][]byte, k-1)
	for xi := range others {
		for _, d := range data {
			others[xi] = append(others[xi], slices.Clone(d))
		}
	}
	shares := make([][]byte, m)
	for j := range shares {
		shares[j] = make([]byte, ecChunkSize)
	}
	stripe := make([][]byte, k+m)
	for j := range m {
		stripe[k+j] = make([]byte, ecChunkSize)
	}
	blk, sub, crcs := make([]byte, ecBlock), make([][]byte, m), make([]uint32, m)
	var raw, share, alone, pipe time.Duration
	var encNS, encoded int64
	b.SetBytes(int64(tableBytes(t)))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		for ri, d := range data {
			for o := 0; o < len(d); o += ecChunkSize {
				n := min(ecChunkSize, len(d)-o)
				stripe[0] = d[o : o+n]
				for xi := 1; xi < k; xi++ {
					stripe[xi] = others[xi-1][ri][o : o+n]
				}
				for j := range m {
					stripe[k+j] = stripe[k+j][:n]
				}
				if err := codec.Encode(stripe); err != nil {
					b.Fatal(err)
				}
			}
		}
		raw += time.Since(start)
		start = time.Now()
		for _, d := range data {
			for o := 0; o < len(d); o += ecChunkSize {
				n := min(ecChunkSize, len(d)-o)
				sub := [][]byte{shares[0][:n], shares[1][:n]}
				if err := codec.Share(d[o:o+n], x, sub); err != nil {
					b.Fatal(err)
				}
			}
		}
		share += time.Since(start)
		// The pipeline's encoder alone, on this goroutine as raw and
		// share are, over the same bytes: what it costs a core.
		start = time.Now()
		for ri, d := range data {
			var sum uint32
			for o := 0; o < len(d); o += ecChunkSize {
				clear(crcs)
				sum = ecEncodeChunk(codec, x, blk, d[o:min(o+ecChunkSize, len(d))], shares, sub, crcs, sum, nil)
			}
			if sum != t[ri].sum {
				b.Fatalf("region %q: the encoder read CRC32C %08x, committed %08x", t[ri].name, sum, t[ri].sum)
			}
		}
		alone += time.Since(start)
		ns0, n0 := s.rep.ec.encodeNS.Load(), s.rep.ec.encoded.Load()
		start = time.Now()
		// A new label each time: every parity host empties its row and
		// XORs the share in.
		if _, err, _ := s.rep.ecSend(ctx, 0, 0, h.Gen(), uint64(i+1), t, data, to, known); err != nil {
			b.Fatal(err)
		}
		pipe += time.Since(start)
		encNS += s.rep.ec.encodeNS.Load() - ns0
		encoded += s.rep.ec.encoded.Load() - n0
	}
	bytes := float64(tableBytes(t)) * float64(b.N)
	mibps := func(d time.Duration) float64 { return bytes / d.Seconds() / (1 << 20) }
	rawRate := k * mibps(raw) // the stripe's K shards per raw
	b.ReportMetric(rawRate, "raw-MiB/s")
	b.ReportMetric(mibps(share), "share-MiB/s")
	b.ReportMetric(mibps(share)/rawRate, "share/raw")
	b.ReportMetric(mibps(alone), "encode1core-MiB/s")
	b.ReportMetric(mibps(alone)/rawRate, "encode1core/raw")
	b.ReportMetric(mibps(pipe), "pipeline-MiB/s")
	b.ReportMetric(mibps(pipe)/rawRate, "pipeline/raw")
	if encoded != int64(bytes) {
		b.Fatalf("the encoder counted %d bytes of %.0f", encoded, bytes)
	}
	b.ReportMetric(mibps(time.Duration(encNS)), "encode-inpipe-MiB/s")
}
