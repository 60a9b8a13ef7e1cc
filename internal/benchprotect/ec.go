package main

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/topology"
)

// Erasure coding (make bench-ec): -redundancy names several gorun
// --redundancy values; each protect mode runs once with each, and the
// first is the baseline of the others. Beside them, in the same run, the
// codec's own throughput over the same bytes: one stripe of K shards of
// one rank's state each, encoded as the agents do (ckpt.Codec.Share of
// each member, 4 MiB at a time, XORed into the M parity rows) on one core
// and on all of them.

// The targets for an erasure-coded run against the raw codec and
// against the baseline (replicas:1).
const (
	ecPipelineTarget = 0.8 // protection throughput per rank >= 80% of the codec's on one core
	ecTimeTarget     = 1.3 // protection time per step <= 1.3 x the baseline's
)

// parseRedundancies parses -redundancy: gorun --redundancy values,
// comma-separated, each once, in canonical form.
func parseRedundancies(s string) ([]topology.Redundancy, error) {
	var rs []topology.Redundancy
	for f := range strings.SplitSeq(s, ",") {
		r, err := topology.ParseRedundancy(f)
		if err != nil {
			return nil, fmt.Errorf("benchprotect: -redundancy %q: %w", s, err)
		}
		for _, x := range rs {
			if x == r {
				return nil, fmt.Errorf("benchprotect: -redundancy %q: %s twice", s, r)
			}
		}
		if !r.EC() && r.Replicas < 1 {
			return nil, fmt.Errorf("benchprotect: -redundancy %q: %s protects nothing beyond each rank's host", s, r)
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// codecRate is the codec's throughput over one stripe, in MB/s of data
// encoded (K shards).
type codecRate struct {
	k, m         int
	oneCore, all float64
}

// measureCodec measures ckpt.Codec's encoding of one stripe of k shards
// of shard bytes into m parity rows, as the agents encode it, on one core
// and on every core (GOMAXPROCS goroutines, the chunks dealt among them):
// the best of reps rounds of each, alternating.
func measureCodec(k, m int, shard int64, reps int) (codecRate, error) {
	c, err := ckpt.NewCodec(k, m)
	if err != nil {
		return codecRate{}, err
	}
	const chunk = 4 << 20
	data := make([][]byte, k)
	for x := range data {
		data[x] = make([]byte, shard)
		for i := range data[x] {
			data[x][i] = byte(i*131 + x*7 + i>>12)
		}
	}
	parity := make([][]byte, m)
	for j := range parity {
		parity[j] = make([]byte, shard)
	}
	encode := func(lo, step int) error {
		shares := make([][]byte, m)
		for j := range shares {
			shares[j] = make([]byte, chunk)
		}
		sh := make([][]byte, m)
		for x, d := range data {
			for off := lo * chunk; off < len(d); off += step * chunk {
				n := min(chunk, len(d)-off)
				for j := range sh {
					sh[j] = shares[j][:n]
				}
				if err := c.Share(d[off:off+n], x, sh); err != nil {
					return err
				}
				for j := range sh {
					ckpt.Accumulate(parity[j][off:off+n], sh[j])
				}
			}
		}
		return nil
	}
	round := func(procs int) (time.Duration, error) {
		for _, p := range parity {
			clear(p)
		}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, procs)
		for i := range procs {
			wg.Go(func() { errs[i] = encode(i, procs) })
		}
		wg.Wait()
		d := time.Since(start)
		for _, err := range errs {
			if err != nil {
				return 0, err
			}
		}
		return d, nil
	}
	best := [2]time.Duration{}
	procs := [2]int{1, runtime.GOMAXPROCS(0)}
	for range reps {
		for i, p := range procs {
			d, err := round(p)
			if err != nil {
				return codecRate{}, err
			}
			if best[i] == 0 || d < best[i] {
				best[i] = d
			}
		}
	}
	bytes := float64(k) * float64(shard)
	return codecRate{k: k, m: m, oneCore: bytes / best[0].Seconds() / 1e6, all: bytes / best[1].Seconds() / 1e6}, nil
}

// ecReport prints the erasure-coding targets of one variant: each
// full-mode run with an erasure code against the variant's run with the
// baseline redundancy (the first of -redundancy) and against the codec's
// rate for its K and M. stateBytes is one rank's protected state.
func ecReport(w io.Writer, v *variant, baseline topology.Redundancy, rates []codecRate, stateBytes float64) {
	var base *modeRun
	for _, m := range v.prot {
		if m.mode == "full" && m.red == baseline {
			base = m
			break
		}
	}
	for _, m := range v.prot {
		if m.mode != "full" || !m.red.EC() || m.r.table == nil {
			continue
		}
		_, repl, _, _ := m.r.table.services()
		if base != nil && base.r.table != nil {
			_, baseRepl, _, _ := base.r.table.services()
			if baseRepl > 0 {
				q := float64(repl) / float64(baseRepl)
				fmt.Fprintf(w, "target: %s protection time per step <= %.1f x %s's at %s (the ranks' services, mean commit to protected): %s (%.3f: %s against %s)\n",
					m.red, ecTimeTarget, baseline, v.name, verdict(q <= ecTimeTarget), q, msf(repl), msf(baseRepl))
			}
			fmt.Fprintf(w, "  step, %s / %s, last half, ratio of means: %s\n", m.red, baseline,
				ratioStr(mean(lastHalf(m.r.steps)), mean(lastHalf(base.r.steps))))
		}
		for _, r := range rates {
			if r.k != m.red.ECK || r.m != m.red.ECM || repl <= 0 {
				continue
			}
			// Each rank encodes its own shard on its host: its pipeline's
			// rate is its state over its protection time, against the
			// codec's rate on one core.
			rate := stateBytes / repl.Seconds() / 1e6
			q := rate / r.oneCore
			fmt.Fprintf(w, "target: %s pipeline >= %.0f%% of the codec's throughput on one core (%.0f MB/s; %.0f MB/s on %d cores) at %s: %s (%.0f MB/s per rank, %.0f%%)\n",
				m.red, 100*ecPipelineTarget, r.oneCore, r.all, runtime.GOMAXPROCS(0), v.name, verdict(q >= ecPipelineTarget), rate, 100*q)
		}
	}
}
