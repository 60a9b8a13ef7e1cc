package main

import (
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// TestParseRedundancyFlag: -redundancy takes gorun --redundancy values,
// comma-separated, the first the baseline; it refuses malformed and
// repeated ones and replicas:0.
func TestParseRedundancyFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []topology.Redundancy
		err  string
	}{
		{nil, []topology.Redundancy{{Replicas: 1}}, ""},
		{[]string{"-redundancy", "replicas:1,ec:2+2"}, []topology.Redundancy{{Replicas: 1}, {ECK: 2, ECM: 2}}, ""},
		{[]string{"-redundancy", "ec:4+2,replicas:2"}, []topology.Redundancy{{ECK: 4, ECM: 2}, {Replicas: 2}}, ""},
		{[]string{"-redundancy", "ec:2"}, nil, `-redundancy "ec:2"`},
		{[]string{"-redundancy", "replicas:1,replicas:1"}, nil, "replicas:1 twice"},
		{[]string{"-redundancy", "replicas:0"}, nil, "protects nothing"},
		{[]string{"-redundancy", ""}, nil, "want replicas:K or ec:K+M"},
		{[]string{"-codec-reps", "0"}, nil, "-codec-reps must be at least 1"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseFlags(tc.args, &stderr)
			if tc.err != "" {
				if err == nil || !strings.Contains(stderr.String(), tc.err) {
					t.Fatalf("err %v, stderr %q; want an error saying %q", err, stderr.String(), tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.redundancies, tc.want) {
				t.Errorf("redundancies %v, want %v", cfg.redundancies, tc.want)
			}
		})
	}
}

// TestMeasureCodec: the codec measurement runs and gives positive rates.
func TestMeasureCodec(t *testing.T) {
	r, err := measureCodec(2, 2, 9<<20, 1) // two full chunks and a partial one per shard
	if err != nil {
		t.Fatal(err)
	}
	if r.k != 2 || r.m != 2 || r.oneCore <= 0 || r.all <= 0 || r.raw <= 0 {
		t.Errorf("rate %+v", r)
	}
	if _, err := measureCodec(0, 2, 1<<20, 1); err == nil {
		t.Error("a 0+2 code measured")
	}
}

// TestECReport: the erasure-coding targets compare the ec run's
// protection time with the baseline's, and say whether it is met, beside
// the ratio of their bytes on the wire (the bound where TCP bounds
// them); the pipeline's target names the figure it is judged on and
// prints the per-rank rate end to end against raw Encode and the shares'
// rate, and the rate TCP allows it.
func TestECReport(t *testing.T) {
	run := func(repl time.Duration, step time.Duration, wire float64) *runResult {
		return &runResult{
			steps: []time.Duration{step, step, step, step},
			wire:  wire,
			table: &protTable{g: 9, rows: []rankRow{{rank: 0, replicated: 9, stages: 10, replPerStep: repl}, {rank: 1, replicated: 9, stages: 10, replPerStep: repl}}},
		}
	}
	rep1 := topology.Redundancy{Replicas: 1}
	ec22 := topology.Redundancy{ECK: 2, ECM: 2}
	const state = 256 << 20
	for _, tc := range []struct {
		name    string
		ecRepl  time.Duration
		oneCore float64
		want    []string
	}{
		{"met", 120 * time.Millisecond, 2000, []string{
			"target: ec:2+2 protection time per step <= 1.3 x replicas:1's at device-ms 500 (the ranks' services, mean commit to protected): met (1.200: 120.0 ms against 100.0 ms)",
			"bound: ec:2+2 moves 2.00 x replicas:1's bytes on the wire per step (2048.0 MiB against 1024.0 MiB",
			"target: ec:2+2 pipeline >= 80% of the raw codec (reedsolomon Encode of the stripe, 4000 MB/s on one core): judged on\n  BenchmarkECPipeline's encode1core/raw",
			"end to end at device-ms 500: 2237 MB/s per rank (state / protection time), 56% of raw Encode, 112% of the shares' rate",
			// 256 MiB of state over 1 GiB per rank at 1000 MB/s.
			"bound by TCP to 250 MB/s per rank\n    (its 1024.0 MiB of the 2048.0 MiB on the wire per step at 1000 MB/s",
		}},
		{"missed", 200 * time.Millisecond, 2000, []string{
			"replicas:1's at device-ms 500 (the ranks' services, mean commit to protected): NOT met (2.000: 200.0 ms against 100.0 ms)",
			"1342 MB/s per rank (state / protection time), 34% of raw Encode, 67% of the shares' rate",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &variant{name: "device-ms 500", prot: []*modeRun{
				{mode: "full", red: rep1, r: run(100*time.Millisecond, time.Second, 1<<30)},
				{mode: "full", red: ec22, r: run(tc.ecRepl, time.Second, 2<<30)},
			}}
			var out bytes.Buffer
			ecReport(&out, v, rep1, []codecRate{{k: 2, m: 2, oneCore: tc.oneCore, all: 2 * tc.oneCore, raw: 2 * tc.oneCore}}, state, 2, 1000)
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("report does not say %q:\n%s", w, out.String())
				}
			}
		})
	}
	// Without an erasure-coded run there is nothing to say.
	v := &variant{name: "x", prot: []*modeRun{{mode: "full", red: rep1, r: run(time.Millisecond, time.Second, 1<<30)}}}
	var out bytes.Buffer
	ecReport(io.Writer(&out), v, rep1, nil, state, 2, 1000)
	if out.Len() != 0 {
		t.Errorf("report of a replicas-only variant: %q", out.String())
	}
}
