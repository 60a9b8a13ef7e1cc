package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// testConfig is a small job: 1000 parameters (not a multiple of 3 or 8, so
// the last shard has a remainder) and a batch of 24, which 1, 2, 3, 4, 6 and
// 8 ranks divide.
func testConfig(t testing.TB, extra ...string) Config {
	t.Helper()
	args := append([]string{"--params", "1000", "--steps", "30", "--batch", "24", "--compute", "3", "--log-every", "5"}, extra...)
	cfg, err := parseFlags(args, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestSameHashesForEveryWorldSize(t *testing.T) {
	cfg := testConfig(t)
	want := mustRunWorld(t, 1, cfg, runOptions{})
	for _, size := range []int{2, 3, 4, 6, 8} {
		t.Run(fmt.Sprintf("np%d", size), func(t *testing.T) {
			got := mustRunWorld(t, size, cfg, runOptions{})
			if got.ParamsHash != want.ParamsHash || got.OptimizerHash != want.OptimizerHash {
				t.Errorf("hashes %x %x, want %x %x (world of 1)", got.ParamsHash, got.OptimizerHash, want.ParamsHash, want.OptimizerHash)
			}
			if fmt.Sprint(got.Losses) != fmt.Sprint(want.Losses) {
				t.Errorf("losses %v, want %v (world of 1)", got.Losses, want.Losses)
			}
		})
	}
}

func TestSeedChangesHashes(t *testing.T) {
	a := mustRunWorld(t, 2, testConfig(t, "--seed", "1"), runOptions{})
	b := mustRunWorld(t, 2, testConfig(t, "--seed", "2"), runOptions{})
	if a.ParamsHash == b.ParamsHash || a.OptimizerHash == b.OptimizerHash {
		t.Errorf("seeds 1 and 2 gave the same hashes %x %x", a.ParamsHash, a.OptimizerHash)
	}
}

func TestRepeatable(t *testing.T) {
	cfg := testConfig(t, "--seed", "7")
	a := mustRunWorld(t, 4, cfg, runOptions{})
	b := mustRunWorld(t, 4, cfg, runOptions{})
	if a.ParamsHash != b.ParamsHash || a.OptimizerHash != b.OptimizerHash {
		t.Errorf("two runs gave %x %x and %x %x", a.ParamsHash, a.OptimizerHash, b.ParamsHash, b.OptimizerHash)
	}
}

// TestGoldenHashes pins the result of one small job, so that a change to
// the data stream, the model, the optimizer or the hashing (or a platform
// that computes differently, say with fused multiply-adds) is noticed. A
// deliberate change of the model updates these values.
func TestGoldenHashes(t *testing.T) {
	res := mustRunWorld(t, 2, testConfig(t, "--seed", "1"), runOptions{})
	const (
		params    = "30e5833dc41eb6562ca21bd8f492ec08d77776079996bc6a42d4c3f8e29bac38"
		optimizer = "6fd4c0fe850b6dc98707cfa76a501639f3a902bb43744223a8717a77f11dec9a"
	)
	if got := fmt.Sprintf("%x", res.ParamsHash); got != params {
		t.Errorf("params hash %s, want %s", got, params)
	}
	if got := fmt.Sprintf("%x", res.OptimizerHash); got != optimizer {
		t.Errorf("optimizer hash %s, want %s", got, optimizer)
	}
}

// TestLossDecreases trains towards the noise floor. The printed loss is a
// minibatch loss, noisy from step to step, so the test compares averages
// over consecutive stretches of training.
func TestLossDecreases(t *testing.T) {
	cfg := testConfig(t, "--steps", "200", "--log-every", "10")
	res := mustRunWorld(t, 4, cfg, runOptions{})
	l := res.Losses
	if len(l) != 21 || l[0].Step != 0 || l[len(l)-1].Step != 199 {
		t.Fatalf("losses at steps %v, want 0, 10, …, 190, 199", l)
	}
	var means []float64
	for q := range 4 {
		var sum float64
		for _, p := range l[q*5 : q*5+5] {
			sum += p.Loss
		}
		means = append(means, sum/5)
	}
	for q := 1; q < len(means); q++ {
		if !(means[q] < means[q-1]) {
			t.Errorf("mean loss over steps %d-%d is %g, over the previous 50 steps %g", q*50, q*50+49, means[q], means[q-1])
		}
	}
	if first, last := l[0].Loss, l[len(l)-1].Loss; !(last < first/3) {
		t.Errorf("loss fell only from %g to %g", first, last)
	}
}

// TestShardsAndChunksDoNotMatter moves the shard boundaries (including an
// empty shard) and the chunking of the collectives.
func TestShardsAndChunksDoNotMatter(t *testing.T) {
	cfg := testConfig(t)
	want := mustRunWorld(t, 4, cfg, runOptions{})
	for _, tc := range []struct {
		name   string
		bounds []int
		chunk  int
	}{
		{"uneven", []int{0, 1, 2, 999, 1000}, 0},
		{"empty", []int{0, 400, 400, 401, 1000}, 0},
		{"all-on-one", []int{0, 0, 1000, 1000, 1000}, 0},
		{"chunk7", nil, 7},
		{"chunk1", nil, 1},
		{"uneven-chunk64", []int{0, 10, 500, 600, 1000}, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mustRunWorld(t, 4, cfg, runOptions{bounds: tc.bounds, chunk: tc.chunk})
			if got.ParamsHash != want.ParamsHash || got.OptimizerHash != want.OptimizerHash {
				t.Errorf("hashes %x %x, want %x %x", got.ParamsHash, got.OptimizerHash, want.ParamsHash, want.OptimizerHash)
			}
		})
	}
}

func TestOutput(t *testing.T) {
	var out bytes.Buffer
	res := mustRunWorld(t, 2, testConfig(t), runOptions{out: &out})
	s := out.String()
	for _, want := range []string{
		"dptrain: 2 ranks, 1000 parameters (500 per rank, last 500), batch 24 (12 per rank), compute 3, 30 steps, seed 1\n",
		fmt.Sprintf("params sha256 %x\n", res.ParamsHash),
		fmt.Sprintf("optimizer sha256 %x\n", res.OptimizerHash),
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	steps := regexp.MustCompile(`(?m)^step (\d+) loss \S+$`).FindAllStringSubmatch(s, -1)
	var got []string
	for _, m := range steps {
		got = append(got, m[1])
	}
	if want := "0 5 10 15 20 25 29"; strings.Join(got, " ") != want {
		t.Errorf("loss printed at steps %v, want %s:\n%s", got, want, s)
	}
}

func TestWorldMustDivideBatch(t *testing.T) {
	_, errs := runWorld(t, 5, testConfig(t), runOptions{})
	for r, err := range errs {
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "world size 5 does not divide --batch 24") {
			t.Errorf("rank %d: %v, want a usage error", r, err)
		}
	}
}

func TestFailRankMustExist(t *testing.T) {
	_, errs := runWorld(t, 2, testConfig(t, "--fail-at-step", "3", "--fail-rank", "2"), runOptions{})
	for r, err := range errs {
		if !errors.Is(err, errUsage) {
			t.Errorf("rank %d: %v, want a usage error", r, err)
		}
	}
}

func TestFlagsMustAgree(t *testing.T) {
	w := newFakeWorld(2)
	errs := make(chan error, 2)
	for r, seed := range []string{"1", "2"} {
		go func() {
			_, err := train(t.Context(), &fakeComm{w, r}, testConfig(t, "--seed", seed), runOptions{})
			if err != nil {
				w.abort(err)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil && !errors.Is(err, errUsage) {
			t.Errorf("got %v, want a usage error", err)
		}
	}
}

func TestFailAtStep(t *testing.T) {
	cfg := testConfig(t, "--fail-at-step", "4", "--fail-rank", "1")
	var crashed []int
	o := runOptions{crash: func(step int) error {
		crashed = append(crashed, step)
		return errCrashed
	}}
	_, errs := runWorld(t, 3, cfg, o)
	if fmt.Sprint(crashed) != "[4]" {
		t.Errorf("crash hook called at steps %v, want [4] once", crashed)
	}
	if !errors.Is(errs[1], errCrashed) {
		t.Errorf("rank 1: %v, want errCrashed", errs[1])
	}
	for _, r := range []int{0, 2} {
		if errs[r] == nil {
			t.Errorf("rank %d finished without its peer", r)
		}
	}
}

func TestZeroSteps(t *testing.T) {
	a := mustRunWorld(t, 1, testConfig(t, "--steps", "0"), runOptions{})
	b := mustRunWorld(t, 4, testConfig(t, "--steps", "0"), runOptions{})
	if a.ParamsHash != b.ParamsHash || a.OptimizerHash != b.OptimizerHash || len(a.Losses) != 0 {
		t.Errorf("zero steps: %+v and %+v", a, b)
	}
}

func TestDeviceTimeIsSpent(t *testing.T) {
	cfg := testConfig(t, "--steps", "5", "--device-ms", "20", "--params", "10")
	start := time.Now()
	a := mustRunWorld(t, 2, cfg, runOptions{})
	if d := time.Since(start); d < 5*20*time.Millisecond {
		t.Errorf("5 steps of 20 ms device time took %v", d)
	}
	b := mustRunWorld(t, 2, testConfig(t, "--steps", "5", "--params", "10"), runOptions{})
	if a.ParamsHash != b.ParamsHash {
		t.Error("--device-ms changed the result")
	}
}

func TestStepDoesNotAllocate(t *testing.T) {
	cfg := testConfig(t, "--steps", "1000")
	tr, err := newTrainer(&fakeComm{newFakeWorld(1), 0}, cfg, runOptions{chunk: 300})
	if err != nil {
		t.Fatal(err)
	}
	// The fake's collectives allocate; count the trainer's own work.
	allocs := testing.AllocsPerRun(10, func() {
		sampleCoefficients(tr.coef, cfg.Seed, 3, tr.first, len(tr.sampleLoss), cfg.Compute)
		gradChunk(tr.sums, tr.sampleLoss, tr.params[:len(tr.sums)], 0, tr.coef, tr.scratch, tr.basisKey)
		gradChunk(tr.sums, nil, tr.params[:len(tr.sums)], 0, tr.coef, tr.scratch, tr.basisKey)
		adamUpdate(tr.master, tr.m, tr.v, tr.g, cfg.Adam.consts(3))
		getFloat32s(tr.params[:10], putFloat32s(tr.buf, tr.master[:10]))
	})
	if allocs != 0 {
		t.Errorf("%v allocations per step", allocs)
	}
}

func BenchmarkGradChunk(b *testing.B) {
	for _, k := range []int{1, 4} {
		for _, nloc := range []int{1, 16} {
			b.Run(fmt.Sprintf("compute%d/samples%d", k, nloc), func(b *testing.B) {
				const n = 1 << 16
				w := make([]float32, n)
				initParams(w, 1)
				coef := make([]float32, nloc*k)
				sampleCoefficients(coef, 1, 0, 0, nloc, k)
				s := newKernelScratch(k)
				out := make([]int64, n)
				b.SetBytes(4 * n)
				b.ReportAllocs()
				for b.Loop() {
					gradChunk(out, nil, w, 0, coef, s, streamKey(1, domainBasis))
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n*nloc), "ns/param-sample")
			})
		}
	}
}

// TestDeviceGrad: with the accelerator's gradients, the hashes are the same
// for every world size too, differ from the CPU computation's, and the
// optimizer moved the parameters.
func TestDeviceGrad(t *testing.T) {
	cfg := testConfig(t, "--device-grad")
	want := mustRunWorld(t, 1, cfg, runOptions{})
	for _, size := range []int{2, 3, 8} {
		got := mustRunWorld(t, size, cfg, runOptions{})
		if got.ParamsHash != want.ParamsHash || got.OptimizerHash != want.OptimizerHash {
			t.Errorf("np %d: hashes %x %x, want %x %x (world of 1)", size, got.ParamsHash, got.OptimizerHash, want.ParamsHash, want.OptimizerHash)
		}
	}
	cpu := mustRunWorld(t, 1, testConfig(t), runOptions{})
	if cpu.ParamsHash == want.ParamsHash {
		t.Error("--device-grad gave the CPU computation's parameters")
	}
	zero := mustRunWorld(t, 1, testConfig(t, "--device-grad", "--steps", "0"), runOptions{})
	if zero.ParamsHash == want.ParamsHash {
		t.Error("30 steps of --device-grad left the parameters where they started")
	}
}

// TestNoticesChangeNothing gives every rank of a world of 3 a SIGUSR1
// before its first step: each notes it once on its errOut, naming its
// rank and step 0, and the result is that of a run without it.
func TestNoticesChangeNothing(t *testing.T) {
	cfg := testConfig(t)
	want := mustRunWorld(t, 3, cfg, runOptions{})
	const size = 3
	w := newFakeWorld(size)
	res := make([]*result, size)
	errs := make([]error, size)
	notes := make([]bytes.Buffer, size)
	var wg sync.WaitGroup
	for r := range size {
		notices := make(chan os.Signal, 1)
		notices <- syscall.SIGUSR1
		wg.Go(func() {
			res[r], errs[r] = train(t.Context(), &fakeComm{w, r}, cfg, runOptions{errOut: &notes[r], notices: notices})
			if errs[r] != nil {
				w.abort(fmt.Errorf("fake: rank %d failed: %w", r, errs[r]))
			}
		})
	}
	wg.Wait()
	for r := range size {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if res[r].ParamsHash != want.ParamsHash || res[r].OptimizerHash != want.OptimizerHash {
			t.Errorf("rank %d: hashes %x %x, want %x %x (no notice)", r, res[r].ParamsHash, res[r].OptimizerHash, want.ParamsHash, want.OptimizerHash)
		}
		line := fmt.Sprintf("dptrain: rank %d: got SIGUSR1 at step 0 (a preemption notice); going on\n", r)
		if got := notes[r].String(); got != line {
			t.Errorf("rank %d noted %q, want %q", r, got, line)
		}
	}
}
