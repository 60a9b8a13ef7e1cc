package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/gorun/gorun/durable"
)

const ckptUsage = `Usage: gorun ckpt ls|show|verify DIR

Inspects a --ckpt-dir, the durable tier of a job:
  ls      one line per version: step, ranks that hold it, committed or
          not, bytes; then the directory's footprint on disk
  show    the job's manifest, the commit record, and every rank's base
          files, pointer, markers and differential batches
  verify  reads every file and checks every CRC32C; exits 1 listing each
          bad file and its first bad byte range, 0 if all is well
`

// ckptMain runs `gorun ckpt`.
func ckptMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, ckptUsage)
		return exitOK
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "gorun ckpt: "+format+"\n%s", append(a, ckptUsage)...)
		return exitUsage
	}
	if len(args) != 2 {
		return usage("want a command and a directory, got %d arguments", len(args))
	}
	cmd, dir := args[0], args[1]
	switch fi, err := os.Stat(dir); {
	case errors.Is(err, os.ErrNotExist):
		return usage("%s does not exist", dir)
	case err != nil:
		return usage("%v", err)
	case !fi.IsDir():
		return usage("%s is not a directory", dir)
	}
	switch cmd {
	case "ls":
		return ckptLs(dir, stdout, stderr)
	case "show":
		return ckptShow(dir, stdout, stderr)
	case "verify":
		return ckptVerify(dir, stdout, stderr)
	}
	return usage("unknown command %q", cmd)
}

// versionRow is one step's versions across ranks, for ls.
type versionRow struct {
	step      int64
	ranks     int   // ranks holding a complete version of it
	bytes     int64 // their region bytes
	committed bool
}

func ckptLs(dir string, stdout, stderr io.Writer) int {
	ls, err := durable.List(dir)
	if err != nil {
		fmt.Fprintf(stderr, "gorun ckpt: %v\n", err)
		return exitError
	}
	world := len(ls.Ranks)
	if ls.Manifest != nil {
		world = ls.Manifest.World
	}
	fmt.Fprintln(stdout, header(ls))
	rows := map[int64]*versionRow{}
	for _, rl := range ls.Ranks {
		seen := map[int64]bool{} // a rank counts once per step
		for _, b := range rl.Bases {
			if b.State != durable.StateComplete && b.State != durable.StateCommitted || seen[b.Step] {
				continue
			}
			seen[b.Step] = true
			r := rows[b.Step]
			if r == nil {
				r = &versionRow{step: b.Step}
				rows[b.Step] = r
			}
			r.ranks++
			r.bytes += b.Bytes
			r.committed = r.committed || b.State == durable.StateCommitted
		}
	}
	steps := make([]int64, 0, len(rows))
	for s := range rows {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	if len(steps) == 0 {
		fmt.Fprintln(stdout, "no complete version")
	} else {
		fmt.Fprintf(stdout, "%10s  %11s  %-9s  %s\n", "STEP", "RANKS", "STATE", "BYTES")
	}
	for _, s := range steps {
		r := rows[s]
		state := "partial"
		switch {
		case r.committed:
			state = "committed"
		case r.ranks == world:
			state = "complete"
		}
		fmt.Fprintf(stdout, "%10d  %11s  %-9s  %s\n", s, fmt.Sprintf("%d/%d", r.ranks, world), state, fmtBytes(r.bytes))
	}
	fmt.Fprintln(stdout, footprint(ls.Usage))
	return exitOK
}

// header is the first line of ls and show: the job and its commit record.
func header(ls *durable.Listing) string {
	var b strings.Builder
	if m := ls.Manifest; m != nil {
		fmt.Fprintf(&b, "job %s, world size %d, a base every %d steps", m.Job, m.World, m.Every)
	} else {
		fmt.Fprintf(&b, "no manifest (%v)", ls.ManifestErr)
	}
	switch {
	case ls.CommitErr != nil:
		fmt.Fprintf(&b, "; bad commit record: %v", ls.CommitErr)
	case ls.HasCommit:
		fmt.Fprintf(&b, "; committed step %d", ls.Committed)
	default:
		b.WriteString("; nothing committed")
	}
	return b.String()
}

// footprint says what the directory takes on disk.
func footprint(u durable.Usage) string {
	s := fmt.Sprintf("footprint: %s on disk", fmtBytes(u.Total))
	if len(u.Ranks) > 0 {
		s += fmt.Sprintf(", %s per rank at most", fmtBytes(slices.Max(u.Ranks)))
	}
	return s
}

func ckptShow(dir string, stdout, stderr io.Writer) int {
	ls, err := durable.List(dir)
	if err != nil {
		fmt.Fprintf(stderr, "gorun ckpt: %v\n", err)
		return exitError
	}
	fmt.Fprintln(stdout, header(ls))
	if m := ls.Manifest; m != nil {
		fmt.Fprintf(stdout, "protect mode %q, diff codec %q, command %q\n", m.Protect, m.Codec, m.Command)
		// Ranks with the same regions share a line.
		for r := 0; r < len(m.Regions); {
			end := r + 1
			for end < len(m.Regions) && slices.Equal(m.Regions[end], m.Regions[r]) {
				end++
			}
			var regs []string
			for _, reg := range m.Regions[r] {
				regs = append(regs, fmt.Sprintf("%s %s", reg.Name, fmtBytes(reg.Size)))
			}
			who := fmt.Sprintf("rank %d", r)
			if end-r > 1 {
				who = fmt.Sprintf("ranks %d-%d", r, end-1)
			}
			fmt.Fprintf(stdout, "%s: %s\n", who, strings.Join(regs, ", "))
			r = end
		}
	}
	for _, rl := range ls.Ranks {
		fmt.Fprintf(stdout, "\nrank %d: %s on disk\n", rl.Rank, fmtBytes(rl.Disk))
		if rl.Latest != nil {
			fmt.Fprintf(stdout, "  pointer: step %d, version %d, %s\n", rl.Latest.Step, rl.Latest.Version, rl.Latest.File)
		} else {
			fmt.Fprintln(stdout, "  pointer: none")
		}
		for _, b := range rl.Bases {
			switch b.State {
			case durable.StateComplete, durable.StateCommitted:
				fmt.Fprintf(stdout, "  base.%d: %s step %d, version %d, %s\n", b.Index, b.State, b.Step, b.Version, fmtBytes(b.Bytes))
			case durable.StateCorrupt:
				fmt.Fprintf(stdout, "  base.%d: corrupt: %v\n", b.Index, b.Err)
			default:
				fmt.Fprintf(stdout, "  base.%d: %s\n", b.Index, b.State)
			}
		}
		fmt.Fprintf(stdout, "  markers: %s\n", steps(rl.Markers))
		if len(rl.Batches) == 0 {
			fmt.Fprintln(stdout, "  differentials: none")
		} else {
			var bytes int64
			for _, b := range rl.Batches {
				bytes += b.Disk
			}
			fmt.Fprintf(stdout, "  differentials: %d batches, steps %d to %d, %s\n",
				len(rl.Batches), rl.Batches[0].First, rl.Batches[len(rl.Batches)-1].Last, fmtBytes(bytes))
		}
	}
	fmt.Fprintln(stdout, footprint(ls.Usage))
	return exitOK
}

// steps lists steps, or says there are none.
func steps(s []int64) string {
	if len(s) == 0 {
		return "none"
	}
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, " ")
}

func ckptVerify(dir string, stdout, stderr io.Writer) int {
	probs, err := durable.Verify(context.Background(), dir)
	if err != nil {
		fmt.Fprintf(stderr, "gorun ckpt: %v\n", err)
		return exitError
	}
	for _, p := range probs {
		if _, ok := errors.AsType[*durable.CorruptError](p.Err); ok {
			fmt.Fprintln(stdout, p.Err) // names the file and the byte range
		} else {
			fmt.Fprintf(stdout, "%s: %v\n", p.Path, p.Err)
		}
	}
	if len(probs) > 0 {
		fmt.Fprintf(stderr, "gorun ckpt: %s: %d problems\n", dir, len(probs))
		return exitError
	}
	fmt.Fprintf(stdout, "%s: every file verifies\n", dir)
	return exitOK
}

// fmtBytes formats a byte count in binary units.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n), 0
	for v >= unit && u < 5 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[u-1])
}
