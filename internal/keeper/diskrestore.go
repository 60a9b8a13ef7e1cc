package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/replay"
)

// The retrieval cascade's last tier for a lost rank (issue 17): when a
// host and every holder of one of its ranks are lost, no memory tier has
// the rank's state at G, and the restore on the new host
// (restoreRemote) falls back to the durable tier: the job's committed
// version and the rank's differentials after it on disk, replayed to G
// (internal/cascade.Load, which checks every byte and, lossless, that the
// state rebuilt is the one the rank committed at G). Only G itself will
// do: the other ranks resume from G. When the disk does not reach G (its
// log lags, or the rank has a region the differentials do not carry),
// the restore fails as it did without a durable tier; rolling every rank
// back to a step the disk reaches is not done.

// restoreFromDisk rebuilds the rank's regions at step g from the job's
// durable directory into views (every region, params too), or says why
// it cannot.
func (s *service) restoreFromDisk(ctx context.Context, g int64, views [][]byte) error {
	dir := s.h.cfg.Persist.Dir
	if dir == "" && s.h.cfg.DiffLog != nil {
		dir = s.h.cfg.DiffLog.Dir
	}
	if dir == "" {
		return errors.New("the job has none (--ckpt-dir)")
	}
	base, err := durable.ReadCommitted(dir)
	if err != nil {
		return err
	}
	if base > g {
		return fmt.Errorf("its committed version is of step %d, after %d", base, g)
	}
	s.mu.Lock()
	regions := make([]durable.Region, len(s.regions))
	for i, r := range s.regions {
		regions[i] = durable.Region{Name: r.Name, Size: r.Size}
	}
	s.mu.Unlock()
	// Whether the log reaches g, before anything is written into views
	// (a restore that fails publishes no half-built state): read up to
	// g, no further (what the log holds after g does not matter).
	sp, stop := cascade.ReachTo(dir, s.rank, regions, base, g)
	if g > sp.To {
		if stop == nil {
			stop = errors.New("the log ends there")
		}
		return fmt.Errorf("from its committed version of step %d the rank's state can be rebuilt up to step %d, not %d: %w", base, sp.To, g, stop)
	}
	start := time.Now()
	got, err := cascade.Load(ctx, dir, s.rank, regions, base, g, views, replay.ReplayOptions{})
	if err != nil {
		return err
	}
	if !got.Exact {
		s.h.log.Warn("restored a rank from lossy differentials on disk: an approximation of its state", "rank", s.rank, "step", g)
	}
	s.h.log.Info("restored a rank from the durable tier (no memory tier had it)", "rank", s.rank, "step", g, "base", base,
		"differentials replayed", got.Replayed, "took", time.Since(start).Round(time.Millisecond))
	return nil
}
