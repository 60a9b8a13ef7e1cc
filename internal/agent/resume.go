package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/replay"
)

// The agent's part of gorun --resume (internal/wire/resume.go has the
// protocol): before it starts the ranks of the first epoch table, it
// reports each local rank's reach on disk (resumeReach), waits for the
// launcher's T (the first G it publishes), rebuilds each local rank's
// state at T into its slots (preloadRanks: cascade.Load into
// rank.Host.Preload's staged slot) and only then starts the ranks, which
// restore T from their own slots.

// resumeReach reads, for each of ranks, the newest step its state can be
// rebuilt at from the durable tier in dir: the commit record's step
// (every rank must hold a complete version of it) plus its contiguous
// differentials (cascade.Reach).
func resumeReach(host int, dir string, ranks []int) *wire.ResumeReach {
	out := &wire.ResumeReach{Host: host, Ranks: []wire.ResumeRank{}}
	fail := func(err error) *wire.ResumeReach {
		out.Err, out.Ranks = truncateMsg(err.Error()), []wire.ResumeRank{}
		return out
	}
	base, err := durable.ReadCommitted(dir)
	if err != nil {
		return fail(err)
	}
	out.Base = base
	m, err := durable.ReadManifest(dir)
	if err != nil {
		return fail(err)
	}
	ls, err := durable.List(dir)
	if err != nil {
		return fail(err)
	}
	for _, r := range ranks {
		k := wire.ResumeRank{Rank: r, To: -1}
		switch {
		case r >= len(m.Regions):
			k.Err = fmt.Sprintf("the checkpoint directory's job has %d ranks", len(m.Regions))
		case !hasVersion(ls, r, base):
			k.Err = fmt.Sprintf("no complete version of the committed step %d in %s", base, dir)
		default:
			sp, stop := cascade.Reach(dir, r, m.Regions[r], base)
			k.To = sp.To
			if stop != nil {
				k.Stop = truncateMsg(stop.Error())
			}
		}
		out.Ranks = append(out.Ranks, k)
	}
	return out
}

// hasVersion reports whether the listing has a complete version of step
// for rank (it does not read the data: Load does, and checks it).
func hasVersion(ls *durable.Listing, r int, step int64) bool {
	for _, rl := range ls.Ranks {
		if rl.Rank != r {
			continue
		}
		return slices.ContainsFunc(rl.Bases, func(b durable.BaseFile) bool {
			return b.Step == step && (b.State == durable.StateComplete || b.State == durable.StateCommitted)
		})
	}
	return false
}

// preloadRanks rebuilds each of ranks' state at step target from the
// durable tier in dir (base: the commit record's step) into its slots on
// h, as committed step target (rank.Host.Preload). It stops at the first
// rank that fails, whose error names it.
func preloadRanks(ctx context.Context, h *rank.Host, dir string, base, target int64, ranks []int, log *slog.Logger) error {
	m, err := durable.ReadManifest(dir)
	if err != nil {
		return err
	}
	for _, r := range ranks {
		if r >= len(m.Regions) {
			return fmt.Errorf("rank %d: the checkpoint directory's job has %d ranks", r, len(m.Regions))
		}
		regions := m.Regions[r]
		rr := make([]rank.Region, len(regions))
		for i, g := range regions {
			rr[i] = rank.Region{Name: g.Name, Size: g.Size}
		}
		start := time.Now()
		var got cascade.Loaded
		err := h.Preload(r, rr, target, func(views [][]byte) (int, error) {
			var err error
			got, err = cascade.Load(ctx, dir, r, regions, base, target, views, replay.ReplayOptions{})
			return got.AdamT, err
		})
		if err != nil {
			return fmt.Errorf("rank %d: resuming step %d: %w", r, target, err)
		}
		if !got.Exact {
			log.Warn("resumed a rank's state from lossy differentials: an approximation of the state it had, not bitwise", "rank", r, "step", target)
		}
		log.Info("resumed a rank's state from the checkpoint directory", "rank", r, "step", target, "base", base,
			"differentials replayed", got.Replayed, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}
