package durable

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
)

// BenchmarkPersist saves one checkpoint of GORUN_BENCH_PERSIST_MIB
// (default 1024) MiB to GORUN_BENCH_DIR (default a temporary directory
// under /tmp, removed after) and, in each iteration, writes as many
// bytes there with dd if=/dev/zero bs=4M conv=fsync: the same disk, in
// the same run, alternating so that both see the same load. It reports
// the save's MB/s, dd's, and the save's throughput as a percentage of
// dd's (target ≥ 90), for several writer counts and chunk sizes (make
// bench-persist). It also reports how long the save took to read its
// source (until copied: a rank's slot is held that long, package internal/keeper),
// as a percentage of the save's time ("held-%"), and the CPU time the
// process spent per save ("cpu-ms/save", user and system: the copies,
// CRCs and system calls, not the kernel's writeback threads), with the
// chunks written with O_DIRECT (the default where the file system takes
// it) and through the page cache ("buffered").
func BenchmarkPersist(b *testing.B) {
	mib := int64(1024)
	if v := os.Getenv("GORUN_BENCH_PERSIST_MIB"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 4 || n%4 != 0 {
			b.Fatalf("GORUN_BENCH_PERSIST_MIB=%q: want a multiple of 4", v)
		}
		mib = n
	}
	if _, err := exec.LookPath("dd"); err != nil {
		b.Skip("no dd")
	}
	root := os.Getenv("GORUN_BENCH_DIR")
	if root == "" {
		d, err := os.MkdirTemp("/tmp", "gorun-bench-persist-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(d)
		root = d
	}
	size := mib << 20
	regions := []Region{{Name: "optimizer", Size: size / 4 * 3}, {Name: "params", Size: size / 4}}
	src := make([][]byte, len(regions))
	sums := make([]uint32, len(regions))
	r := rand.New(rand.NewPCG(1, 1))
	for i, reg := range regions {
		src[i] = make([]byte, reg.Size)
		for j := 0; j < len(src[i]); j += 8 {
			le.PutUint64(src[i][j:], r.Uint64())
		}
		sums[i] = crc32c.Checksum(src[i])
	}
	for _, cfg := range []struct {
		writers, chunkMiB int
		buffered          bool
	}{
		{4, 4, false}, // the defaults
		{4, 4, true},
		{1, 4, false}, {2, 4, false}, {8, 4, false},
		{4, 1, false}, {4, 16, false},
	} {
		name := fmt.Sprintf("writers=%d/chunk=%dMiB", cfg.writers, cfg.chunkMiB)
		if cfg.buffered {
			name += "/buffered"
		}
		b.Run(name, func(b *testing.B) {
			dir, err := os.MkdirTemp(root, "persist-")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(dir)
			if err := CreateManifest(dir, &Manifest{Job: "bench", World: 1, Regions: [][]Region{regions}, Every: 1, Command: "bench"}); err != nil {
				b.Fatal(err)
			}
			s, err := Open(dir, 0, regions, Options{Concurrency: 1, Writers: cfg.writers, ChunkSize: cfg.chunkMiB << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.buffered.Store(cfg.buffered)
			var saveT, ddT, heldT, cpuT []time.Duration
			var step int64
			b.SetBytes(size)
			for b.Loop() {
				b.StopTimer()
				t0 := time.Now()
				dd := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(dir, "x"), "bs=4M", fmt.Sprintf("count=%d", mib/4), "conv=fsync")
				if out, err := dd.CombinedOutput(); err != nil {
					b.Fatalf("dd: %v\n%s", err, out)
				}
				ddT = append(ddT, time.Since(t0))
				if err := os.Remove(filepath.Join(dir, "x")); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				step++
				t0 = time.Now()
				copied := func() { heldT = append(heldT, time.Since(t0)) }
				cpu0 := cpuTime(b)
				if err := s.Save(context.Background(), step, src, sums, copied); err != nil {
					b.Fatal(err)
				}
				saveT = append(saveT, time.Since(t0))
				cpuT = append(cpuT, cpuTime(b)-cpu0)
				b.StopTimer()
				if _, err := s.Reclaim(step); err != nil { // the other file free again
					b.Fatal(err)
				}
				b.StartTimer()
			}
			mbps := func(ts []time.Duration) float64 {
				var sum time.Duration
				for _, t := range ts {
					sum += t
				}
				return float64(size) * float64(len(ts)) / sum.Seconds() / 1e6
			}
			b.ReportMetric(mbps(ddT), "dd-MB/s")
			b.ReportMetric(100*mbps(saveT)/mbps(ddT), "%-of-dd")
			b.ReportMetric(100*mbps(saveT)/mbps(heldT), "held-%")
			b.ReportMetric(float64(median(cpuT))/1e6, "cpu-ms/save")
			b.Logf("%d MiB: save %v, dd %v, source read after %v, CPU %v (per iteration; medians %v, %v, %v and %v)",
				mib, saveT, ddT, heldT, cpuT, median(saveT), median(ddT), median(heldT), median(cpuT))
		})
	}
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(ts []time.Duration) time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[len(s)/2]
}
