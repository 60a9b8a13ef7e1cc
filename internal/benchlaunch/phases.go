package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/gorun/gorun/internal/phasetrace"
)

// phaseRow is one phase's offsets from the start of gorun's process, over
// the runs: its first and its last mark (they differ for the phases
// marked once per rank or per host).
type phaseRow struct {
	name        string
	first, last []time.Duration
	n           int // marks per run (the last run's)
}

// phases runs gorun -np n b.cfg.rounds times with GORUN_DEBUG_PHASES
// (internal/phasetrace) and prints the median offset of every phase from
// the moment before the fork, and of the exit as the benchmark saw it.
func (b *bench) phases(n int) error {
	dir, err := os.MkdirTemp("", "benchlaunch-phases-")
	if err != nil {
		return fmt.Errorf("benchlaunch: %w", err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "phases")
	var rows []*phaseRow
	byName := map[string]*phaseRow{}
	var waited []time.Duration
	args := launchers(b.cfg.gorun, true, b.cfg.prog, "")[0].argv(n)
	for i := range b.cfg.rounds + 1 { // the first, a warm-up, untimed
		cmd := exec.Command(b.cfg.gorun, args...)
		cmd.Env = append(os.Environ(), phasetrace.Env+"="+file)
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("benchlaunch: gorun -np %d: %w", n, err)
		}
		wall := time.Since(start)
		ps, err := phasetrace.Read(file)
		if err != nil {
			return err
		}
		if i == 0 {
			continue
		}
		waited = append(waited, wall)
		t0 := start.UnixNano()
		for _, p := range ps {
			r := byName[p.Name]
			if r == nil {
				r = &phaseRow{name: p.Name}
				byName[p.Name] = r
				rows = append(rows, r)
			}
			r.first = append(r.first, time.Duration(p.First-t0))
			r.last = append(r.last, time.Duration(p.Last-t0))
			r.n = p.N
		}
	}
	slices.SortStableFunc(rows, func(a, b *phaseRow) int { return int(median(a.first) - median(b.first)) })
	fmt.Fprintf(b.out, "\ngorun -np %d: phases, median of %d runs, from fork (ms)\n", n, b.cfg.rounds)
	fmt.Fprintf(b.out, "%-18s %8s %8s %6s\n", "phase", "first", "last", "marks")
	for _, r := range rows {
		last := ""
		if r.n > 1 {
			last = msec(median(r.last))
		}
		fmt.Fprintf(b.out, "%-18s %8s %8s %6s\n", r.name, msec(median(r.first)), last, strconv.Itoa(r.n))
	}
	fmt.Fprintf(b.out, "%-18s %8s\n", "waited", msec(median(waited)))
	return nil
}

func msec(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }
