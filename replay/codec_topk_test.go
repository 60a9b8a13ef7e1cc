package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestTopKSpecials: non-finite values are the largest magnitudes and are
// kept as themselves; values beyond fp16's range become ±Inf; zeros are
// never kept, even when K asks for more entries than are non-zero.
func TestTopKSpecials(t *testing.T) {
	inf := float32(math.Inf(1))
	x := make([]float32, 1000)
	x[10], x[20], x[30], x[40], x[50] = inf, -inf, float32(math.NaN()), 1e6, -7
	tn := mustCompress(t, 1, x, Options{Threshold: 1, K: 0.004})
	got := decompressed(t, tn)
	if tn.Kept() != 4 || !math.IsInf(float64(got[10]), 1) || !math.IsInf(float64(got[20]), -1) || got[30] == got[30] || !math.IsInf(float64(got[40]), 1) || got[50] != 0 {
		t.Errorf("kept %d: %v %v %v %v %v", tn.Kept(), got[10], got[20], got[30], got[40], got[50])
	}
	tn = mustCompress(t, 1, x, Options{Threshold: 1, K: 0.5})
	if tn.Kept() != 5 {
		t.Errorf("K=0.5 of 5 non-zero entries kept %d", tn.Kept())
	}
	tn = mustCompress(t, 1, make([]float32, 1000), Options{Threshold: 1})
	if tn.Kept() != 0 {
		t.Errorf("all-zero tensor kept %d", tn.Kept())
	}
}

// TestTopKKeptCount: the sampled threshold keeps ceil(K·Len) ± 10%
// entries on normal, heavy-tailed (Cauchy), all-equal and structured
// (periodic spikes) data, for K = 0.01 and 0.001, from exact selection
// (100K at K = 0.01) to sampling 1/64 of the tensor (16M at K = 0.01).
func TestTopKKeptCount(t *testing.T) {
	lens := []int{100_000, 1_000_000, 16_000_000}
	if testing.Short() {
		lens = lens[:2]
	}
	worst := 0.0
	for _, n := range lens {
		for _, d := range []dist{normalDist, cauchyDist, equalDist, spikesDist} {
			x := genData(d, n, 99)
			for _, k := range []float64{0.01, 0.001} {
				tn := mustCompress(t, 1, x, Options{K: k, Seed: uint64(n)})
				target := topkTarget(n, k)
				rel := float64(tn.Kept()-target) / float64(target)
				worst = max(worst, math.Abs(rel))
				t.Logf("len %8d K %-5v %-9s: kept %6d of %6d (%+.2f%%), sample %d", n, k, d.name, tn.Kept(), target, 100*rel, sampleSize(n, k))
				if math.Abs(rel) > 0.1 {
					t.Errorf("len %d K %v %s: kept %d, want %d ± 10%%", n, k, d.name, tn.Kept(), target)
				}
			}
		}
	}
	t.Logf("worst deviation %.2f%%", 100*worst)
}

// TestTopKSampleSpread justifies the sample size: over many seeds, in the
// sampled regime (1M elements at K = 0.01: strata of 4, 250 000 samples), the kept
// count's relative deviation has the standard deviation the binomial
// model predicts, sqrt((1-K)/(K·m)·(1-m/n)) ≈ 2%, and stays far inside
// ±10%. (The 65 536-entry sample one might pick instead would give 3.9%,
// and miss ±10% about once in a hundred tensors.)
func TestTopKSampleSpread(t *testing.T) {
	const n, k = 1_000_000, 0.01
	seeds := 64
	if testing.Short() {
		seeds = 8
	}
	x := genData(normalDist, n, 5)
	target := topkTarget(n, k)
	m := sampleSize(n, k)
	if m == n {
		t.Fatalf("1M elements at K=0.01 should be sampled")
	}
	var sum, sum2, worst float64
	var tn Tensor
	for s := range seeds {
		if err := CompressInto(&tn, 1, x, Options{K: k, Seed: uint64(s)}); err != nil {
			t.Fatal(err)
		}
		rel := float64(tn.Kept()-target) / float64(target)
		sum, sum2, worst = sum+rel, sum2+rel*rel, max(worst, math.Abs(rel))
	}
	mean := sum / float64(seeds)
	sd := math.Sqrt(sum2/float64(seeds) - mean*mean)
	model := math.Sqrt((1 - k) / (k * float64(m)) * (1 - float64(m)/n))
	t.Logf("%d seeds: kept count relative deviation mean %+.2f%%, sd %.2f%% (model %.2f%%), worst %.2f%%", seeds, 100*mean, 100*sd, 100*model, 100*worst)
	if worst > 0.1 || math.Abs(mean) > 0.02 || (seeds >= 64 && sd > 1.5*model) {
		t.Errorf("kept count spread: mean %v sd %v worst %v", mean, sd, worst)
	}
}

// TestTopKSelect compares topkSelect with sorting, on keys (sign bits
// included, which it must ignore) where the sub-sampled bound holds, where
// it fails (every 32nd key large, the others small: the sub-sample sees
// only large keys), and with ties.
func TestTopKSelect(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	gens := map[string]func(i int) uint32{
		"random":   func(int) uint32 { return rng.Uint32() },
		"narrow":   func(int) uint32 { return 0x3f800000 + rng.Uint32()%4096 | rng.Uint32()&0x80000000 },
		"equal":    func(int) uint32 { return 0xbe800000 },
		"few":      func(int) uint32 { return uint32(rng.IntN(3)) << 29 },
		"every32":  func(i int) uint32 { return map[bool]uint32{true: 0x7f000000 + uint32(i), false: uint32(i)}[i%32 == 0] },
		"zeros":    func(int) uint32 { return 0 },
		"non-fin.": func(int) uint32 { return 0x7f800000 + rng.Uint32()%0x800000 },
	}
	var cand []uint32
	var hist [2048]uint32
	for name, gen := range gens {
		for _, m := range []int{1, 31, 8191, 8192, 100_000} {
			keys := make([]uint32, m)
			for i := range keys {
				keys[i] = gen(i)
			}
			sorted := make([]uint32, m)
			for i, k := range keys {
				sorted[i] = k & 0x7fffffff
			}
			slices.Sort(sorted)
			slices.Reverse(sorted)
			for _, r := range []int{1, 2, 3, m / 100, m / 32, m / 2, m} {
				if r < 1 || r > m {
					continue
				}
				orig := slices.Clone(keys)
				var key uint32
				var above int
				key, above, cand = topkSelect(keys, r, cand, &hist)
				wantAbove := 0
				for _, k := range sorted {
					if k > sorted[r-1] {
						wantAbove++
					}
				}
				if key != sorted[r-1] || above != wantAbove {
					t.Fatalf("%s, %d keys, r=%d: key %#x above %d, want %#x above %d", name, m, r, key, above, sorted[r-1], wantAbove)
				}
				if !slices.Equal(keys, orig) {
					t.Fatalf("%s: topkSelect modified its keys", name)
				}
			}
		}
	}
}

// TestTopKDeterministic: same input and seed, same bytes; another seed
// draws another sample.
func TestTopKDeterministic(t *testing.T) {
	x := genData(normalDist, 1_000_000, 3)
	enc := func(seed uint64) string {
		b, err := (&Record{Tensors: []*Tensor{mustCompress(t, 1, x, Options{Seed: seed})}}).AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if enc(1) != enc(1) {
		t.Error("same input and seed gave different encodings")
	}
	if enc(1) == enc(2) {
		t.Error("different seeds gave the same encoding (the sample should differ)")
	}
}

// TestTopKChunks: with chunks of 1000 elements, the chunk bases are the
// multiples of 1000, indices are rebased to them, the tie budget spans
// chunks, and everything round-trips.
func TestTopKChunks(t *testing.T) {
	withMaxChunk(t, 1000)
	for _, tc := range []struct {
		n int
		d dist
		k float64
	}{
		{10_500, normalDist, 0.1},
		{10_000, normalDist, 0.01},
		{999, normalDist, 0.1},
		{1000, normalDist, 0.1},
		{1001, normalDist, 0.1},
		{5000, equalDist, 0.3}, // ties across chunks: the first 1500 entries
		{500_000, cauchyDist, 0.01},
	} {
		t.Run(fmt.Sprintf("%s/%d/k%v", tc.d.name, tc.n, tc.k), func(t *testing.T) {
			x := genData(tc.d, tc.n, 8)
			opt := Options{Threshold: 1, K: tc.k}
			tn := mustCompress(t, 1, x, opt)
			if want := ceilDiv(tc.n, 1000); len(tn.chunks) != want {
				t.Fatalf("%d chunks, want %d", len(tn.chunks), want)
			}
			for i, c := range tn.chunks {
				if c.base != 1000*i {
					t.Fatalf("chunk %d base %d", i, c.base)
				}
				for _, j := range tn.idx[c.start : c.start+c.count] {
					if j < 0 || j >= 1000 {
						t.Fatalf("chunk %d index %d not rebased", i, j)
					}
				}
			}
			if tc.d.name == "all-equal" {
				got := decompressed(t, tn)
				for i, v := range got {
					if (v != 0) != (i < 1500) {
						t.Fatalf("all-equal: element %d = %v", i, v)
					}
				}
			}
			checkTensor(t, x, tn, opt)
		})
	}
}
