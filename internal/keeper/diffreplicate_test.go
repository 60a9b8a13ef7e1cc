package keeper

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// BenchmarkReplicateStep measures one protected step of 64 MiB of
// optimizer state on a loopback pair of hosts, full mode against diff
// mode (lossless): the time from Stage to every holder's acknowledgement,
// and the bytes on the replication link per step, bases included.
//
// The diff side's trainer steps its optimizer (replay's Adam) as the
// gradients it hands say: a holder's fold (every 16 steps) checks its
// replay against the commits, and an optimizer left as it was would fail
// the rank at step 16, and stop its replication.
func BenchmarkReplicateStep(b *testing.B) {
	full, diff, s := replicateSteps(b, (64<<20)/12, b.Loop) // W, M and V: 64 MiB
	pf, pd := full.c.progress(0), diff.c.progress(0)
	steps := float64(s)
	b.ReportMetric(float64(pf.ReplBytes)/steps, "full-B/step")
	b.ReportMetric(float64(pd.ReplBytes)/steps, "diff-B/step")
	b.ReportMetric(float64(pd.ReplBytes)/float64(pf.ReplBytes), "diff/full-bytes")
	b.ReportMetric(float64(full.ns.Nanoseconds())/steps, "full-ns/step")
	b.ReportMetric(float64(diff.ns.Nanoseconds())/steps, "diff-ns/step")
	b.ReportMetric(float64(diff.ns)/float64(full.ns), "diff/full-time")
}

// TestReplicateStepsPastFold: BenchmarkReplicateStep's harness, small,
// past the diff side's first fold (step 16): every step is replicated,
// the rank never failed (its trainer's optimizer is replay's).
func TestReplicateStepsPastFold(t *testing.T) {
	left := 20
	_, diff, s := replicateSteps(t, 4096, func() bool { left--; return left >= 0 })
	if p := diff.c.progress(0); s != 20 || p.Replicated != s-1 {
		t.Errorf("diff side: %d steps, replicated to %d, want 20, 19", s, p.Replicated)
	}
}

// replicateSide is one host pair of replicateSteps: its cluster, the
// rank's session, regions and gradient views, the time its steps took,
// and (diff mode) its trainer's optimizer state.
type replicateSide struct {
	c        *cluster
	sess     *Session
	v        [2][][]byte
	g        [2][]byte
	ns       time.Duration
	w, m, vv []float32
}

// replicateSteps runs protected steps of n-element W, M and V while more
// says so on a full-mode pair and a diff-mode pair side by side (each
// step waiting for its replication), and returns both and the number of
// steps. It fails tb if a rank fails.
func replicateSteps(b testing.TB, n int64, more func() bool) (full, diff *replicateSide, s int64) {
	regions := []protect.Region{{Name: "optimizer", Size: 12 * n}, {Name: "meta", Size: 64}}
	o := protect.Optimizer{Region: "optimizer", N: n, W: 0, M: 4 * n, V: 8 * n}
	hello, _ := json.Marshal(&protect.ProtectHello{Version: protect.Version, Regions: regions, Gradient: n, Optimizer: &o})
	type side = replicateSide
	mk := func(mod func(*Config)) *side {
		c := newClusterWith(b, [][]int{{0}, {1}}, [][]int{{1}, nil}, func(int) []int { return []int{0, 1} }, mod)
		sd := &side{c: c, sess: c.hosts[0].Session(0)}
		_, ans, err := sd.sess.Handle(context.Background(), protect.TypeProtectHello, hello)
		if err != nil || ans.(*protect.ProtectWelcome).Err != "" {
			b.Fatal(ans, err)
		}
		w := ans.(*protect.ProtectWelcome)
		views, unmap, err := mapRegionFiles(w.Regions)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(unmap)
		gv, gunmap, err := ckpt.MapData(ckpt.RegionFile{Name: protect.GradientRegion, Size: w.Gradient.Size, Stride: w.Gradient.Stride, Path: w.Gradient.Path})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { gunmap() })
		sd.v, sd.g = views, gv
		sd.w, sd.m, sd.vv = make([]float32, n), make([]float32, n), make([]float32, n)
		return sd
	}
	rng := rand.New(rand.NewPCG(1, 2))
	grad := make([]float32, n)
	for i := range grad {
		grad[i] = float32(rng.NormFloat64())
	}
	step := func(sd *side, s int64, withGrad bool) {
		ctx := context.Background()
		hy := replay.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: int(s) + 1}
		if withGrad {
			replay.Step(sd.w, sd.m, sd.vv, grad, hy.Consts()) // the trainer's, not measured
		}
		start := time.Now()
		var untimed time.Duration
		if withGrad {
			copy(sd.g[s%2], protect.Float32Bytes(grad))
			req, _ := json.Marshal(&protect.StepReq{Step: s, N: n, Hyper: &protect.Hyper{LR: hy.LR, Beta1: hy.Beta1, Beta2: hy.Beta2, Eps: hy.Eps, T: hy.T}})
			if _, ans, err := sd.sess.Handle(ctx, protect.TypeGradient, req); err != nil || ans.(*protect.GradientDone).Err != "" {
				b.Fatal(ans, err)
			}
		}
		sreq := fmt.Appendf(nil, `{"step":%d}`, s)
		_, ans, err := sd.sess.Handle(ctx, protect.TypeStage, sreq)
		if err != nil || ans.(*protect.Staged).Err != "" {
			b.Fatal(ans, err)
		}
		slot := sd.v[ans.(*protect.Staged).Slot]
		slot[1][0] = byte(s) // meta changes
		if withGrad {
			// The optimizer's bytes are the trainer's cost, not measured.
			t0 := time.Now()
			copy(slot[0], protect.Float32Bytes(sd.w))
			copy(slot[0][4*n:], protect.Float32Bytes(sd.m))
			copy(slot[0][8*n:], protect.Float32Bytes(sd.vv))
			untimed = time.Since(t0)
		}
		if _, ans, err := sd.sess.Handle(ctx, protect.TypeCommit, sreq); err != nil || ans.(*protect.Committed).Err != "" {
			b.Fatal(ans, err)
		}
		for sd.c.progress(0).Replicated < s {
			if err := sd.c.hosts[0].svc(0).failure(); err != nil {
				b.Fatalf("step %d: the rank failed: %v", s, err)
			}
			select {
			case <-sd.c.changed:
			case <-time.After(time.Millisecond):
			}
		}
		sd.ns += time.Since(start) - untimed
		for _, h := range sd.c.hosts {
			h.SetG(0, s)
		}
	}
	full, diff = mk(nil), mk(diffMod(16, 100))
	for more() {
		step(full, s, false)
		step(diff, s, true)
		s++
	}
	return full, diff, s
}
