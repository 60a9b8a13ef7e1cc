package launcher

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// The -v report of state protection: progress.table, and diff mode's
// figures per rank and per holder.

// table describes every rank's protection, for -v: G, then per rank its
// steps, its wait at the overwrite rule and its replication; in diff mode
// (diff says how it is configured) also each rank's differential figures
// (writeDiffTable).
func (p *progress) table(mode ProtectMode, diff DiffOptions) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "state protection: G = %d (the step every rank can resume from)", p.g)
	if p.diffEC {
		fmt.Fprintf(&b, ", H = %d (the newest coded base every rank has: a decode restores it and replays to G)", p.hp)
	}
	fmt.Fprintf(&b, ", mode %s", modeOrFull(mode))
	if mode == ModeDiff {
		fmt.Fprintf(&b, " (fold %d, base every %d steps, codec %s)", diff.Fold, diff.BaseEvery, diff.Codec)
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "  %6s %10s %10s %8s %12s %12s %10s", "rank", "committed", "replicated", "stages", "rule wait", "repl/step", "repl MB/s")
	if p.diffEC {
		fmt.Fprintf(&b, " %10s", "coded base")
	}
	b.WriteByte('\n')
	for _, r := range p.ranks {
		per, rate := "-", "-"
		if r.ReplSteps > 0 && r.ReplNS > 0 {
			per = (time.Duration(r.ReplNS) / time.Duration(r.ReplSteps)).Round(time.Microsecond).String()
			rate = fmt.Sprintf("%.0f", float64(r.ReplBytes)/1e6/(float64(r.ReplNS)/1e9))
		}
		fmt.Fprintf(&b, "  %6d %10d %10d %8d %12v %12s %10s", r.Rank, r.Committed, r.Replicated, r.Stages, time.Duration(r.WaitNS).Round(time.Microsecond), per, rate)
		if p.diffEC {
			fmt.Fprintf(&b, " %10d", r.Base)
		}
		b.WriteByte('\n')
	}
	if mode == ModeDiff {
		rows := make([]diffFigures, len(p.ranks))
		for i, r := range p.ranks {
			rows[i] = diffFiguresOf(r)
		}
		writeDiffTable(&b, rows)
		writeFolds(&b, p.folds)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func modeOrFull(m ProtectMode) ProtectMode {
	if m == "" {
		return ModeFull
	}
	return m
}

// diffFigures are one rank's differential-protection figures (diff mode),
// for -v.
type diffFigures struct {
	Rank int
	// Steps is how many steps were sent to every holder, and Bytes the
	// bytes that took, bases and differentials together, summed over
	// holders.
	Steps, Bytes int64
	// Split says that BaseBytes and DiffBytes divide Bytes into bases
	// and differentials.
	Split                bool
	BaseBytes, DiffBytes int64
	// Source is where the holders take the rank's gradient from:
	// "network" (the rank's service sends it) or "local peer" (a
	// data-parallel peer on the holder's host).
	Source string
}

// The gradient sources of diff mode's holders.
const (
	sourceNetwork = "network"
	sourceLocal   = "local peer"
)

// diffFiguresOf is rank r's differential-protection figures from its
// report: the bytes of bases and differentials apart, and the source of
// the gradient its holders use now (their newest differential's): "local
// peer", "network", or "mixed" when some holders use each (a report
// without it: from the counts of differentials, "local" with the share
// from a local peer when both sources were used).
func diffFiguresOf(r wire.RankProgress) diffFigures {
	f := diffFigures{Rank: r.Rank, Steps: r.ReplSteps, Bytes: r.ReplBytes, Source: diffSource(r.DiffLocal, r.DiffNet),
		BaseBytes: r.ReplBaseBytes, DiffBytes: r.ReplDiffBytes, Split: r.ReplBaseBytes+r.ReplDiffBytes > 0}
	switch {
	case r.SourceLocal > 0 && r.SourceNet > 0:
		f.Source = "mixed"
	case r.SourceLocal > 0:
		f.Source = sourceLocal
	case r.SourceNet > 0:
		f.Source = sourceNetwork
	}
	return f
}

// diffSource names the source of a rank's differentials: local of them
// taken from a local peer, net sent with the gradient.
func diffSource(local, net int64) string {
	switch {
	case local == 0:
		return sourceNetwork
	case net == 0:
		return sourceLocal
	}
	return fmt.Sprintf("local %d%%", local*100/(local+net))
}

// writeDiffTable writes diff mode's figures, a row per rank: the bytes
// sent per step replicated (all, bases, differentials; bases are sent
// every --base-every steps, and counted here over every step) and the
// gradient's source. A figure not known is "-".
func writeDiffTable(w io.Writer, rows []diffFigures) {
	fmt.Fprintf(w, "differential protection, per rank:\n")
	fmt.Fprintf(w, "  %6s %12s %12s %12s %11s\n", "rank", "sent/step", "bases/step", "diffs/step", "source")
	for _, r := range rows {
		sent, bases, diffs := "-", "-", "-"
		if r.Steps > 0 {
			sent = formatBytes(r.Bytes / r.Steps)
			if r.Split {
				bases, diffs = formatBytes(r.BaseBytes/r.Steps), formatBytes(r.DiffBytes/r.Steps)
			}
		}
		source := r.Source
		if source == "" {
			source = "-"
		}
		// One word per column: "local peer" is written local-peer.
		fmt.Fprintf(w, "  %6d %12s %12s %12s %11s\n", r.Rank, sent, bases, diffs, strings.ReplaceAll(source, " ", "-"))
	}
}

// writeFolds writes each holder host's replay time per folded step (its
// folds of the differential logs it holds into their bases), hosts in
// order; nothing when no host folded yet.
func writeFolds(w io.Writer, folds map[int]wire.HostFold) {
	hosts := slices.Sorted(maps.Keys(folds))
	if len(hosts) == 0 {
		return
	}
	fmt.Fprintf(w, "holders' replay per folded step:")
	for _, h := range hosts {
		f := folds[h]
		fmt.Fprintf(w, " host %d %v (%d steps);", h, (time.Duration(f.NS) / time.Duration(max(f.Steps, 1))).Round(time.Microsecond), f.Steps)
	}
	fmt.Fprintln(w)
	writeDrifts(w, folds, hosts)
}

// writeDrifts writes, with a lossy --diff-codec, how far each rank's
// replay at its holders had drifted from its true weights when its last
// base refresh arrived (what a restore from the differentials is off by,
// at most, about): a row per rank and holder host, ranks in order.
// Nothing when no drift was measured.
func writeDrifts(w io.Writer, folds map[int]wire.HostFold, hosts []int) {
	type row struct {
		host int
		d    wire.FoldDrift
	}
	var rows []row
	for _, h := range hosts {
		for _, d := range folds[h].Drift {
			rows = append(rows, row{h, d})
		}
	}
	if len(rows) == 0 {
		return
	}
	slices.SortStableFunc(rows, func(a, b row) int { return cmp.Compare(a.d.Rank, b.d.Rank) })
	fmt.Fprintf(w, "lossy differentials (--diff-codec): replay drift from the true weights at the last base refresh, never bitwise:\n")
	fmt.Fprintf(w, "  %6s %6s %8s %8s %12s %14s %10s\n", "rank", "holder", "step", "steps", "max |dw|", "rms dw/rms w", "non-finite")
	for _, r := range rows {
		fmt.Fprintf(w, "  %6d %6d %8d %8d %12.3g %14.3g %10d\n", r.d.Rank, r.host, r.d.Step, r.d.Steps, r.d.MaxAbs, r.d.RelRMS, r.d.NonFinite)
	}
}

// formatBytes writes n bytes in decimal units, to three significant
// digits: 512B, 1.5kB, 268MB.
func formatBytes(n int64) string {
	const units = "kMGTPE"
	if n < 1000 && n > -1000 {
		return fmt.Sprintf("%dB", n)
	}
	f, u := float64(n), -1
	for (f >= 999.5 || f <= -999.5) && u < len(units)-1 {
		f /= 1000
		u++
	}
	return strconv.FormatFloat(f, 'g', 3, 64) + string(units[u]) + "B"
}
