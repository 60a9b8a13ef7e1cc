package keeper

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// BenchmarkTier2Restore measures a restore from another host (Tier 2):
// the fetch of an owner's replicated regions at a step from its holder,
// over a loopback link, each region checked against the owner's CRC32Cs
// on both ends, as a replacement rank's restore does. Full mode's holder
// sends a buffer it holds; diff mode's streams the state as it replays
// the differentials since its base (here 1 and 16 steps of replay.Step,
// none folded, with this build's kernels: GOEXPERIMENT=simd for the
// AVX-512 ones). Every
// figure is printed beside full mode's, measured in the same run.
//
// The owner trains 17 steps (0 to 16) of real Adam on its state: its
// holder in diff mode takes the base at step 0 and 16 differentials.
// GORUN_BENCH_STATE_MIB sets the optimizer state (default 64 MiB; the
// issue's figure is at 256).
func BenchmarkTier2Restore(b *testing.B) {
	mib := gortest.EnvMiB(b, "GORUN_BENCH_STATE_MIB", 64)
	n := int64(mib) << 20 / 12 // W, M and V
	const last = 16
	regions := []protect.Region{{Name: "optimizer", Size: 12 * n}, {Name: "meta", Size: 64}}
	opt := &protect.Optimizer{Region: "optimizer", N: n, W: 0, M: 4 * n, V: 8 * n}
	ctx := context.Background()

	// train runs steps 0..last on rank 0 of a cluster in protect mode
	// mod, holder rank 1 on host 1, and returns the cluster.
	train := func(mod func(*Config)) *cluster {
		c := newClusterWith(b, [][]int{{0}, {1}}, [][]int{{1}, nil}, func(int) []int { return []int{0, 1} }, mod)
		cl, err := protect.Connect(ctx, regions, protect.Options{Socket: c.sockets[0], Optimizer: opt})
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		rng := rand.New(rand.NewPCG(7, 8))
		w, m, v := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range w {
			w[i] = rng.Float32()*2 - 1
		}
		meta := make([]byte, 64)
		for s := int64(0); s <= last; s++ {
			g := make([]float32, n)
			if cl.Mode() == protect.ModeDiff {
				g = cl.GradientBuffer(s)[:n]
			}
			for i := range g {
				g[i] = float32(rng.NormFloat64())
			}
			h := replay.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, T: int(s) + 1}
			replay.Step(w, m, v, g, h.Consts())
			if cl.Mode() == protect.ModeDiff {
				if err := cl.Gradient(ctx, s, g, h); err != nil {
					b.Fatal(err)
				}
			}
			meta[0] = byte(s)
			err := cl.Stage(ctx, s, map[string][][]byte{"optimizer": {protect.Float32Bytes(w), protect.Float32Bytes(m), protect.Float32Bytes(v)}, "meta": {meta}})
			if err == nil {
				err = cl.Wait(ctx)
			}
			if err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(time.Minute)
			for c.progress(0).Replicated < s {
				if time.Now().After(deadline) {
					b.Fatalf("step %d not replicated in a minute: %+v", s, c.progress(0))
				}
				select {
				case <-c.changed:
				case <-time.After(time.Millisecond):
				}
			}
			for _, h := range c.hosts {
				h.SetG(0, s)
			}
		}
		return c
	}
	// Neither a fold nor a base refresh in 17 steps: the holder replays
	// all the differentials since step 0.
	full, diff := train(nil), train(diffMod(1000, 1000))
	// The restorer's buffers are allocated once: what is timed is the
	// holder's work and the transfer, not this process's page faults.
	opt0, meta0 := make([]byte, 12*n), make([]byte, 64)
	fetch := func(c *cluster, step int64) time.Duration {
		dst := map[string][]byte{"optimizer": opt0, "meta": meta0}
		start := time.Now()
		err := c.hosts[0].links.fetch(ctx, 1, linkHdr{kind: kindGet, owner: 0, holder: 1, step: step},
			[]tableEntry{{name: "optimizer"}, {name: "meta"}}, dst)
		if err != nil {
			b.Fatalf("fetch of step %d: %v", step, err)
		}
		return time.Since(start)
	}
	var tFull, tDiff1, tDiff16 time.Duration
	var runs int
	// Each fetch starts from a collected heap (runtime.GC, not timed), so
	// that no fetch pays for the garbage of the one before it (a restore
	// of the other kind).
	kinds := []struct {
		c    *cluster
		step int64
		t    *time.Duration
	}{{full, last, &tFull}, {diff, 1, &tDiff1}, {diff, last, &tDiff16}}
	for b.Loop() {
		for _, k := range kinds {
			b.StopTimer()
			runtime.GC()
			b.StartTimer()
			*k.t += fetch(k.c, k.step)
		}
		runs++
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(runs) / 1e6 }
	b.ReportMetric(ms(tFull), "full-ms")
	b.ReportMetric(ms(tDiff1), "diff1-ms")
	b.ReportMetric(ms(tDiff16), "diff16-ms")
	b.ReportMetric(float64(tDiff1)/float64(tFull), "diff1/full")
	b.ReportMetric(float64(tDiff16)/float64(tFull), "diff16/full")
	b.Logf("%d MiB of optimizer state: Tier-2 restore %.1f ms in full mode; in diff mode %.1f ms replaying 1 step (%.2fx), %.1f ms replaying 16 (%.2fx); vector kernels: %v",
		mib, ms(tFull), ms(tDiff1), float64(tDiff1)/float64(tFull), ms(tDiff16), float64(tDiff16)/float64(tFull), replay.Vectorized())
}
