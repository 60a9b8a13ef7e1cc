package ckpt

import (
	"math"
	"os"
	"testing"
	"time"
)

// BenchmarkStage: staging and committing a 256 MiB region (Stage, copy
// into the slot, Commit's CRC32C) beside a plain copy() of the same bytes
// between two heap buffers, both measured in the same run, alternating,
// the best of each counting (the machine is shared; a slow spell should
// not decide the ratio). The target is staging within 2× of the copy:
// ×copy ≤ 2, copy/stage ≥ 0.5. The slots are in a fresh directory under
// /dev/shm (tmpfs, where they live in production), removed afterwards.
//
//	go test -run '^$' -bench BenchmarkStage -benchtime 3x ./ckpt/
func BenchmarkStage(b *testing.B) {
	const size = 256 << 20
	dir, err := os.MkdirTemp(DefaultDir, "gorun-ckpt-bench-")
	if err != nil {
		b.Logf("no %s (%v): using a temporary directory", DefaultDir, err)
		dir = b.TempDir()
	} else {
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	s, err := Create("bench", 0, []Region{{Name: "params", Size: size}}, Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	src := make([]byte, size)
	fill(1, 0, src)
	dst := make([]byte, size)
	copy(dst, src) // fault the heap pages in
	step := uint64(0)
	stage := func() (copyT, commitT time.Duration) {
		step++
		start := time.Now()
		st, err := s.Stage(step)
		if err != nil {
			b.Fatal(err)
		}
		copy(st.Region("params"), src)
		mid := time.Now()
		if err := st.Commit(); err != nil {
			b.Fatal(err)
		}
		return mid.Sub(start), time.Since(mid)
	}
	stage() // one step into each slot, so that neither is touched first
	stage() // in the measured loop
	best := func(d *time.Duration, v time.Duration) { *d = min(*d, v) }
	inf := time.Duration(math.MaxInt64)
	plain, staged, intoSlot, commit := inf, inf, inf, inf
	for b.Loop() {
		start := time.Now()
		copy(dst, src)
		best(&plain, time.Since(start))
		c, k := stage()
		best(&staged, c+k)
		best(&intoSlot, c)
		best(&commit, k)
	}
	gbps := func(d time.Duration) float64 { return size / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(plain), "copy-GB/s")
	b.ReportMetric(gbps(staged), "stage-GB/s")
	b.ReportMetric(plain.Seconds()/staged.Seconds(), "copy/stage")
	b.ReportMetric(staged.Seconds()/plain.Seconds(), "×copy")
	b.ReportMetric(gbps(intoSlot), "into-slot-GB/s")
	b.ReportMetric(gbps(commit), "commit-GB/s")
	if sn, err := s.Newest(); err != nil || sn.Step != step {
		b.Fatalf("Newest after the benchmark: %+v, %v", sn, err)
	}
}
