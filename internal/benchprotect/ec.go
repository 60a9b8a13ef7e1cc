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
// encoded (K shards): as the agents encode it (shares XORed into the
// rows) on one core and on all, and the code's own Encode of the whole
// stripe held in one place on one core (raw: the reference).
type codecRate struct {
	k, m         int
	oneCore, all float64
	raw          float64
}

// measureCodec measures ckpt.Codec's encoding of one stripe of k shards
// of shard bytes into m parity rows, as the agents encode it, on one core
// and on every core (GOMAXPROCS goroutines, the chunks dealt among them),
// and the code's Encode of the same stripe on one core (4 MiB of each
// shard at a time into m buffers): the best of reps rounds of each,
// alternating.
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
	stripe := make([][]byte, k+m)
	for j := range m {
		stripe[k+j] = make([]byte, chunk)
	}
	raw := func() (time.Duration, error) {
		start := time.Now()
		for off := 0; off < int(shard); off += chunk {
			n := min(chunk, int(shard)-off)
			for x := range k {
				stripe[x] = data[x][off : off+n]
			}
			for j := range m {
				stripe[k+j] = stripe[k+j][:n]
			}
			if err := c.Encode(stripe); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	best := [3]time.Duration{}
	procs := [2]int{1, runtime.GOMAXPROCS(0)}
	for range reps {
		for i := range best {
			var d time.Duration
			var err error
			if i < len(procs) {
				d, err = round(procs[i])
			} else {
				d, err = raw()
			}
			if err != nil {
				return codecRate{}, err
			}
			if best[i] == 0 || d < best[i] {
				best[i] = d
			}
		}
	}
	bytes := float64(k) * float64(shard)
	rate := func(d time.Duration) float64 { return bytes / d.Seconds() / 1e6 }
	return codecRate{k: k, m: m, oneCore: rate(best[0]), all: rate(best[1]), raw: rate(best[2])}, nil
}

// ecReport prints the erasure-coding targets of one variant: each
// full-mode run with an erasure code against the variant's run with the
// baseline redundancy (the first of -redundancy) and against the codec's
// rate for its K and M, beside what bounds them here. stateBytes is one
// rank's protected state, ranks the job's ranks, hostMBps the
// single-stream TCP rate between two hosts.
func ecReport(w io.Writer, v *variant, baseline topology.Redundancy, rates []codecRate, stateBytes float64, ranks int, hostMBps float64) {
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
			if base.r.wire > 0 && m.r.wire > 0 {
				fmt.Fprintf(w, "  bound: %s moves %.2f x %s's bytes on the wire per step (%s against %s: each rank sends M shares of its\n"+
					"    state, and clear copies). Where protection is bound by the hosts' TCP, as here (namespaces on %d CPUs: every byte\n"+
					"    costs CPU at both ends, and the ranks replicate at once), its time cannot fall below about that multiple of\n"+
					"    %s's; the %.1f x target (ECHECK: 1.6 x) needs hosts whose NICs move the bytes\n",
					m.red, m.r.wire/base.r.wire, baseline, mib(m.r.wire), mib(base.r.wire), runtime.NumCPU(), baseline, ecTimeTarget)
			}
		}
		for _, r := range rates {
			if r.k != m.red.ECK || r.m != m.red.ECM || repl <= 0 {
				continue
			}
			// Each rank encodes its own shard on its host: its pipeline's
			// rate end to end is its state over its protection time.
			rate := stateBytes / repl.Seconds() / 1e6
			ref := r.raw
			if ref <= 0 { // not measured: the shares' rate
				ref = r.oneCore
			}
			q := rate / ref
			fmt.Fprintf(w, "target: %s pipeline >= %.0f%% of the raw codec (reedsolomon Encode of the stripe, %.0f MB/s on one core): judged on\n"+
				"  BenchmarkECPipeline's encode1core/raw (make bench-ec): the pipeline's own work, without the links\n",
				m.red, 100*ecPipelineTarget, ref)
			fmt.Fprintf(w, "  end to end at %s: %.0f MB/s per rank (state / protection time), %.0f%% of raw Encode, %.0f%% of the shares' rate\n"+
				"    on one core (%.0f MB/s): not the pipeline's figure: it measures the links",
				v.name, rate, 100*q, 100*rate/r.oneCore, r.oneCore)
			if ranks > 0 && m.r.wire > 0 && hostMBps > 0 {
				// The rank's part of the step's bytes on the wire at the
				// single-stream rate: the end-to-end rate the links allow.
				tcp := stateBytes / (m.r.wire / float64(ranks) / (hostMBps * 1e6)) / 1e6
				fmt.Fprintf(w, ", bound by TCP to %.0f MB/s per rank\n"+
					"    (its %s of the %s on the wire per step at %.0f MB/s, one stream between hosts)", tcp,
					mib(m.r.wire/float64(ranks)), mib(m.r.wire), hostMBps)
			}
			fmt.Fprintln(w)
		}
	}
}
