package launcher

import (
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// TestWriteDiffTable: diff mode's -v figures per rank, each per step
// replicated, "-" where not known; one word per column.
func TestWriteDiffTable(t *testing.T) {
	var b strings.Builder
	writeDiffTable(&b, []diffFigures{
		// Today's reports: steps and bytes only.
		{Rank: 0, Steps: 10, Bytes: 10 * 1_500_000, Source: "network"},
		// With bases and differentials apart.
		{Rank: 1, Steps: 100, Bytes: 100 * 2_100_000, Split: true, BaseBytes: 100 * 100_000, DiffBytes: 100 * 2_000_000, Source: "local peer"},
		// Nothing replicated yet.
		{Rank: 2},
	})
	want := `differential protection, per rank:
    rank    sent/step   bases/step   diffs/step      source
       0        1.5MB            -            -     network
       1        2.1MB        100kB          2MB  local-peer
       2            -            -            -           -
`
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestFormatBytes: three significant digits in decimal units.
func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0B"}, {999, "999B"}, {1000, "1kB"}, {1500, "1.5kB"}, {999_499, "999kB"}, {999_500, "1MB"},
		{268_435_456, "268MB"}, {1 << 40, "1.1TB"}, {1<<63 - 1, "9.22EB"},
	} {
		if got := formatBytes(tc.n); got != tc.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// TestProgressTableMode: -v's table names the protect mode; in diff mode
// it gives its settings and the differential figures of every rank, below
// the table's rows (whose form the bench and the end-to-end tests parse).
func TestProgressTableMode(t *testing.T) {
	p := newProgress([][]int{{0}, {1}}, []int{0, 1}, func(*wire.GlobalStep) {})
	for h, r := range []wire.RankProgress{
		{Rank: 0, Committed: 4, Replicated: 4, Stages: 5, ReplSteps: 4, ReplNS: 4e6, ReplBytes: 4 * 3_000_000,
			ReplBaseBytes: 4 * 2_000_000, ReplDiffBytes: 4 * 1_000_000},
		{Rank: 1, Committed: 4, Replicated: 3, Stages: 5},
	} {
		u := &wire.UpProgress{Host: h, Ranks: []wire.RankProgress{r}}
		if h == 1 { // host 1 holds rank 0's replicas and folded them
			u.Fold = &wire.HostFold{Steps: 32, NS: 32 * 1_234_567}
		}
		if err := p.handle(u); err != nil {
			t.Fatal(err)
		}
	}
	rows := `    rank  committed replicated   stages    rule wait    repl/step  repl MB/s
       0          4          4        5           0s          1ms       3000
       1          4          3        5           0s            -          -`
	for _, tc := range []struct {
		name string
		mode ProtectMode
		diff DiffOptions
		want string
	}{
		{"zero is full", "", DiffOptions{}, "state protection: G = 3 (the step every rank can resume from), mode full\n" + rows},
		{"full", ModeFull, DiffOptions{}, "state protection: G = 3 (the step every rank can resume from), mode full\n" + rows},
		{"diff", ModeDiff, DiffOptions{Fold: 16, BaseEvery: 100, Codec: "raw"},
			"state protection: G = 3 (the step every rank can resume from), mode diff (fold 16, base every 100 steps, codec raw)\n" + rows + `
differential protection, per rank:
    rank    sent/step   bases/step   diffs/step      source
       0          3MB          2MB          1MB     network
       1            -            -            -     network
holders' replay per folded step: host 1 1.235ms (32 steps);`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.table(tc.mode, tc.diff); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestDiffFiguresOf: a rank's report gives its -v figures: bases and
// differentials apart, and the gradient's source from the differentials
// sent by reference (a local peer) and with the gradient (network).
func TestDiffFiguresOf(t *testing.T) {
	for _, tc := range []struct {
		local, net       int64
		nowLocal, nowNet int
		want             string
	}{
		{0, 0, 0, 0, "network"}, {0, 30, 0, 0, "network"}, {30, 0, 0, 0, "local peer"}, {29, 1, 0, 0, "local 96%"}, {1, 3, 0, 0, "local 25%"},
		// The holders' current sources, when reported, name it.
		{28, 2, 1, 0, "local peer"}, {28, 2, 0, 1, "network"}, {28, 2, 1, 1, "mixed"},
	} {
		r := wire.RankProgress{Rank: 3, ReplSteps: 30, ReplBytes: 700, ReplBaseBytes: 400, ReplDiffBytes: 300, DiffLocal: tc.local, DiffNet: tc.net,
			SourceLocal: tc.nowLocal, SourceNet: tc.nowNet}
		f := diffFiguresOf(r)
		if f.Source != tc.want || !f.Split || f.BaseBytes != 400 || f.DiffBytes != 300 || f.Steps != 30 || f.Bytes != 700 {
			t.Errorf("%+v: %+v, want source %q and the bytes split", tc, f, tc.want)
		}
	}
}

// TestProgressTableDrift: with a lossy codec, -v's table ends with each
// rank's drift at each holder host that measured one, ranks in order;
// without a drift nothing is added.
func TestProgressTableDrift(t *testing.T) {
	p := newProgress([][]int{{0}, {1}}, []int{0, 1}, func(*wire.GlobalStep) {})
	for h := range 2 {
		u := &wire.UpProgress{Host: h, Ranks: []wire.RankProgress{{Rank: h, Committed: 9, Replicated: 9}}}
		u.Fold = &wire.HostFold{Steps: 8, NS: 8e6, Drift: []wire.FoldDrift{{Rank: 1 - h, Step: 8, Steps: 8 - int64(h), MaxAbs: 0.00125 * float64(h+1), RelRMS: 3.5e-4, NonFinite: int64(h)}}}
		if err := p.handle(u); err != nil {
			t.Fatal(err)
		}
	}
	got := p.table(ModeDiff, DiffOptions{Fold: 8, BaseEvery: 8, Codec: "int8:256"})
	want := `holders' replay per folded step: host 0 1ms (8 steps); host 1 1ms (8 steps);
lossy differentials (--diff-codec): replay drift from the true weights at the last base refresh, never bitwise:
    rank holder     step    steps     max |dw|   rms dw/rms w non-finite
       0      1        8        7       0.0025        0.00035          1
       1      0        8        8      0.00125        0.00035          0`
	if !strings.HasSuffix(got, want) {
		t.Errorf("got\n%s\nwant it to end with\n%s", got, want)
	}
}
