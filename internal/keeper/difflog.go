package keeper

import (
	"context"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/diffstore"
)

// The differential log on disk (gorun --protect-mode diff with
// --ckpt-dir, issue 17): every step a local rank commits, the
// differential its service builds for the replica holders (ownerDiff:
// the encoded gradient, the hyper-parameters, the other replicated
// regions, sealed, with every replicated region's committed CRC32C) also
// goes to the job's durable directory, through a difflog.Writer per rank:
// batches of DiffLogConfig.Batch consecutive steps appended by the
// writer's goroutine, never by the commit, which only queues the step (a
// reference to its record buffer; the writer copies it into a record off
// the training path and releases it). A full queue or a failed write
// drops steps: the log on disk stops being contiguous there, which a
// resume from disk sees (internal/cascade.Reach), and training goes on.
// A restart to G (Keeper.Restart, and a rank's restore) discards the steps
// after G that were queued and removes those on disk (difflog.Writer.Reset,
// difflog.TrimBatches) before the rank trains them again.

// DiffLogConfig configures the differential log on disk
// (Config.DiffLog; used in diff mode only).
type DiffLogConfig struct {
	// Dir is the job's durable directory (--ckpt-dir).
	Dir string
	// Batch is the number of consecutive steps per batch (--diff-batch,
	// at least 1).
	Batch int
	// Queue bounds the steps of a rank waiting to be written (0: 2×Batch).
	Queue int
	// Append and Trim, if set, replace durable.AppendBatch(Dir, ...) and
	// difflog.TrimBatches(Dir, ...) (tests).
	Append func(rank int, first, last int64, records [][]byte) error
	Trim   func(rank int, after int64) error
}

// queue returns the bound of the steps queued (Queue, or 2×Batch).
func (c *DiffLogConfig) queue() int {
	if c.Queue > 0 {
		return c.Queue
	}
	return 2 * max(c.Batch, 1)
}

// diffLogFlush bounds how long a service's close waits for its writer to
// append what it queued and collected.
const diffLogFlush = 10 * time.Second

// newDiffLog returns the differential log writer of local rank r, or nil
// when the job keeps none (not diff mode, or no DiffLog configured).
func (h *Keeper) newDiffLog(r int) *difflog.Writer {
	c := h.cfg.DiffLog
	if c == nil || !h.diffMode() {
		return nil
	}
	app := func(first, last int64, recs [][]byte) error { return durable.AppendBatch(c.Dir, r, first, last, recs) }
	if c.Append != nil {
		app = func(first, last int64, recs [][]byte) error { return c.Append(r, first, last, recs) }
	}
	trim := func(after int64) error { return difflog.TrimBatches(c.Dir, r, after) }
	if c.Trim != nil {
		trim = func(after int64) error { return c.Trim(r, after) }
	}
	w, err := difflog.NewWriter(difflog.WriterConfig{Batch: c.Batch, Queue: c.queue(), Append: app, Trim: trim,
		Log: h.log.With("rank", r, "log", "differentials on disk")})
	if err != nil {
		h.log.Error("no differential log on disk", "rank", r, "err", err)
		return nil
	}
	return w
}

// logDiff hands od, the differential of a step just committed, to the
// rank's writer. It takes a reference to od's record for the writer
// (released once the writer copied it, or dropped it). s.mu is held, and
// the caller holds a reference to od: so a restart, which takes s.mu
// before it resets the writer, comes after the step is queued (and
// discards it) or before the commit (which then does not get here).
func (s *service) logDiff(od *ownerDiff) {
	if s.dlog == nil || od == nil || s.opt == nil {
		return
	}
	od.rec.retain()
	rec := &difflog.Record{Diff: od.d,
		Optimizer: diffstore.Optimizer{Region: s.opt.Region, N: s.opt.N, WOff: s.opt.W, MOff: s.opt.M, VOff: s.opt.V},
		Regions:   make([]difflog.Region, len(od.table))}
	for i, e := range od.table {
		rec.Regions[i] = difflog.Region{Name: e.name, Size: e.size, Sum: e.sum}
	}
	s.dlog.Add(difflog.Item{Step: od.step, Release: od.rec.release,
		Encode: func(dst []byte) ([]byte, error) { return difflog.Encode(dst, rec) }})
}

// resetDiffLog discards the steps after g from the rank's log, queued or
// on disk (a restart resumes from g), waiting for a write in progress.
func (s *service) resetDiffLog(g int64) {
	if s.dlog != nil {
		s.dlog.Reset(g)
	}
}

// closeDiffLog appends what the rank's writer holds (for diffLogFlush at
// most) and stops it.
func (s *service) closeDiffLog() {
	if s.dlog == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), diffLogFlush)
	defer cancel()
	s.dlog.Close(ctx)
}

// DiffLogStats returns, per local rank, the counters of its differential
// log on disk (none without one).
func (h *Keeper) DiffLogStats() map[int]difflog.WriterStats {
	out := map[int]difflog.WriterStats{}
	for r, s := range h.place().svcs {
		if s.dlog != nil {
			out[r] = s.dlog.Stats()
		}
	}
	return out
}
