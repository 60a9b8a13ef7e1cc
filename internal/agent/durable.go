package agent

import (
	"fmt"

	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
)

// The durable tier (gorun --ckpt-dir): the job spec's settings become
// keeper.Config.Persist, each rank's keeper.DurableProgress goes to the
// launcher in its progress report, and the launcher's watermark and
// resolved step come back on G (protection.onG → keeper.Keeper.SetDurable).

// parsePersist adds the durable tier's settings of spec s to ps (whose
// protect mode is parsed): the decoder bounded them; here --diff-batch
// is refused outside diff mode.
func parsePersist(s *wire.JobSpec, ps protectSettings) (protectSettings, error) {
	if s.CkptDir == "" {
		return ps, nil
	}
	if s.DiffBatch != 0 && ps.mode != protect.ModeDiff {
		return protectSettings{}, fmt.Errorf("%w: a differential batch of %d steps with protect mode %s", ErrJobSpec, s.DiffBatch, ps.mode)
	}
	ps.persist = keeper.PersistConfig{Dir: s.CkptDir, Every: s.CkptEvery, Concurrency: s.CkptConcurrency, Overhead: s.CkptOverhead}
	ps.diffBatch, ps.resume = s.DiffBatch, s.Resume
	return ps, nil
}

// diffLog is the differential log on disk of a diff-mode job with a
// durable tier (keeper.Config.DiffLog), or nil.
func (ps protectSettings) diffLog() *keeper.DiffLogConfig {
	if ps.mode != protect.ModeDiff || ps.persist.Dir == "" {
		return nil
	}
	return &keeper.DiffLogConfig{Dir: ps.persist.Dir, Batch: max(ps.diffBatch, 1)}
}

// durableReport is a rank's durable progress as the launcher gets it
// (nil: none).
func durableReport(d *keeper.DurableProgress) *wire.RankDurable {
	if d == nil {
		return nil
	}
	w := &wire.RankDurable{Markers: d.Markers, Resolved: d.Resolved, Saves: d.Saves, Skipped: d.Skipped, Failed: d.Failed,
		WriteNS: d.WriteNS, Bytes: d.Bytes, HoldNS: d.HoldNS, N: d.N, Off: truncateMsg(d.Off)}
	if l := d.Log; l != nil {
		w.Log = &wire.DiffLogStats{Steps: l.Steps, Dropped: l.Dropped, Failed: l.Failed}
		if l.LastErr != nil {
			w.Log.LastErr = truncateMsg(l.LastErr.Error())
		}
	}
	for _, r := range d.Regions {
		w.Regions = append(w.Regions, wire.DurableRegion{Name: r.Name, Size: r.Size})
	}
	return w
}
