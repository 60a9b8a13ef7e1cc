package keeper

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// BenchmarkECRestore measures the recovery of two lost hosts' state
// under ec:2+2 against one replica restore, in the same run, and prints
// their ratio (the target: ≤ 2×).
//
// Four hosts of one rank each form one 2+2 group; every rank commits a
// step of GORUN_BENCH_STATE_MIB MiB of optimizer state (default 64; make
// bench-ec: 256) and 64 bytes of meta, encoded and sent to the parity
// hosts and the clear copies as in a job. Both data hosts are then lost:
// their two ranks have no clear copy left, and each is rebuilt on its own
// spare from its stripe (decodeRemote: the two parity rows read over
// loopback links, chunk by chunk, reconstructed into the spare's views,
// every region's CRC32C checked), the two decodes in parallel as a hot
// swap runs them. The baseline is one rank's replica restore: the fetch
// of a clear copy of the same size from its holder over a loopback link,
// checked against the CRC32Cs on both ends (BenchmarkTier2Restore's full
// mode). Both write into buffers allocated once; each starts from a
// collected heap. Beside the wall times it reports the process's CPU
// time (user + system, getrusage) during each: on a shared machine the
// CPU a restore takes varies less than its wall time, and every host of
// the benchmark runs in this process, so it is all of the restore's work.
func BenchmarkECRestore(b *testing.B) {
	mib := gortest.EnvMiB(b, "GORUN_BENCH_STATE_MIB", 64)
	const k, m, work = 2, 2, 4
	size := int64(mib) << 20
	hosts := make([]topology.Host, work)
	var assign []topology.Assignment
	ranks := make([][]int, work+2) // two spares
	hostOf := make([]int, work)
	for h := range work {
		hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: 1}
		assign = append(assign, topology.Assignment{Rank: h, Host: h})
		ranks[h], hostOf[h] = []int{h}, h
	}
	groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: k, M: m})
	if err != nil {
		b.Fatal(err)
	}
	holders := ecClearHolders(groups, hostOf)
	c := newClusterWith(b, ranks, holders, nil, func(cfg *Config) { cfg.EC = groups })
	ctx := context.Background()
	hello := func(h *Keeper, r int) (*service, *Session) {
		req := fmt.Sprintf(`{"v":1,"regions":[{"name":"optimizer","size":%d},{"name":"meta","size":64}]}`, size)
		sess := h.Session(r)
		if _, ans, err := sess.Handle(ctx, protect.TypeProtectHello, []byte(req)); err != nil || ans.(*protect.ProtectWelcome).Err != "" {
			b.Fatalf("rank %d: ProtectHello: %+v, %v", r, ans, err)
		}
		return h.svc(r), sess
	}
	for r := range work {
		h := c.hosts[r]
		s, sess := hello(h, r)
		if _, ans, err := sess.Handle(ctx, protect.TypeStage, []byte(`{"step":0}`)); err != nil || ans.(*protect.Staged).Err != "" {
			b.Fatalf("rank %d: Stage: %+v, %v", r, ans, err)
		}
		s.mu.Lock()
		views := s.views[0]
		s.mu.Unlock()
		for i, v := range views {
			for j := range v {
				v[j] = byte(j*7 + i + r*13 + j>>13)
			}
		}
		if _, ans, err := sess.Handle(ctx, protect.TypeCommit, []byte(`{"step":0}`)); err != nil || ans.(*protect.Committed).Err != "" {
			b.Fatalf("rank %d: Commit: %+v, %v", r, ans, err)
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	for r := range work {
		for c.progress(r).Replicated < 0 {
			if time.Now().After(deadline) {
				b.Fatalf("step 0 of rank %d not replicated: %+v", r, c.progress(r))
			}
			select {
			case <-c.changed:
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	if g := c.publishG(); g != 0 {
		b.Fatalf("G = %d", g)
	}

	// Both data hosts lost, each replaced by a spare that sees neither.
	lost, spares := groups[0].Data, []int{work, work + 1}
	sw := swapHosts(groups, hostOf, holders, lost, spares, func(int) int { return 0 })
	addrs := make([]string, len(c.hosts))
	for h, x := range c.hosts {
		addrs[h] = x.cfg.Listener.Addr().String()
	}
	for _, h := range lost {
		addrs[h] = ""
	}
	type dec struct {
		s     *service
		pl    *placement
		views map[string][]byte
	}
	var decs []dec
	for _, sp := range spares {
		h := c.hosts[sp]
		h.SetAddrs(addrs)
		if err := h.SetPlacement(sw.placement(sp, 1, 0)); err != nil {
			b.Fatal(err)
		}
		for _, r := range h.place().ranks {
			if !sw.sources[r].Decode {
				b.Fatalf("rank %d restores from a copy, not by decode", r)
			}
			s, _ := hello(h, r)
			decs = append(decs, dec{s: s, pl: h.place(), views: map[string][]byte{"optimizer": make([]byte, size), "meta": make([]byte, 64)}})
		}
	}
	if len(decs) != 2 {
		b.Fatalf("%d ranks to decode, want 2", len(decs))
	}
	// The baseline: a rank with a clear copy (on a data host), fetched
	// by a parity host.
	owner := -1
	for r, hs := range holders {
		if len(hs) > 0 {
			owner = r
			break
		}
	}
	if owner < 0 {
		b.Fatal("no rank has a clear copy")
	}
	holder := holders[owner][0]
	from := c.hosts[groups[0].Parity[0]]
	dstOpt, dstMeta := make([]byte, size), make([]byte, 64)

	var tRepl, tEC, cRepl, cEC time.Duration
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	runs := 0
	b.SetBytes(2 * size)
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		b.StartTimer()
		start, c0 := time.Now(), cpu()
		err := from.links.fetch(ctx, hostOf[holder], linkHdr{kind: kindGet, owner: owner, holder: holder, step: 0},
			[]tableEntry{{name: "optimizer"}, {name: "meta"}}, map[string][]byte{"optimizer": dstOpt, "meta": dstMeta})
		if err != nil {
			b.Fatalf("replica restore of rank %d: %v", owner, err)
		}
		tRepl += time.Since(start)
		cRepl += cpu() - c0

		b.StopTimer()
		runtime.GC()
		b.StartTimer()
		start, c0 = time.Now(), cpu()
		errs := make([]error, len(decs))
		var wg sync.WaitGroup
		for i, d := range decs {
			wg.Go(func() { errs[i] = d.s.decodeRemote(ctx, 0, d.pl, d.views) })
		}
		wg.Wait()
		tEC += time.Since(start)
		cEC += cpu() - c0
		for i, err := range errs {
			if err != nil {
				b.Fatalf("decode of rank %d: %v", decs[i].s.rank, err)
			}
		}
		runs++
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(runs) / 1e6 }
	b.ReportMetric(ms(tRepl), "replica-ms")
	b.ReportMetric(ms(tEC), "ec2-ms")
	b.ReportMetric(float64(tEC)/float64(tRepl), "ec2/replica")
	b.ReportMetric(ms(cRepl), "replica-cpu-ms")
	b.ReportMetric(ms(cEC), "ec2-cpu-ms")
	b.Logf("%d MiB per rank: two lost hosts' ranks decoded in parallel (ec:2+2) in %.1f ms, one replica restore in %.1f ms: %.2fx (target <= 2x)",
		mib, ms(tEC), ms(tRepl), float64(tEC)/float64(tRepl))
}
