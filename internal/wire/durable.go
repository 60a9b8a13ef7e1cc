package wire

import "strings"

// The durable tier's messages (gorun --ckpt-dir; package durable): the
// job spec's settings, each rank's durable progress, and the watermark
// on GlobalStep.

// Bounds of the durable tier's settings and reports.
const (
	// MaxCkptDir bounds JobSpec.CkptDir (PATH_MAX).
	MaxCkptDir = 4096
	// MaxCkptEvery bounds JobSpec.CkptEvery.
	MaxCkptEvery = 1 << 31
	// MaxCkptConcurrency bounds JobSpec.CkptConcurrency and
	// RankDurable.N: durable.MaxConcurrency (a test keeps them equal).
	MaxCkptConcurrency = 8
	// MaxDiffBatch bounds JobSpec.DiffBatch.
	MaxDiffBatch = 4096
	// MaxDurableMarkers bounds RankDurable.Markers: a rank holds at most
	// MaxCkptConcurrency+1 base files, so at most that many markers not
	// reclaimed; the bound leaves room for files a store keeps beyond
	// them.
	MaxDurableMarkers = 64
	// MaxDurableRegions bounds RankDurable.Regions (durable.MaxRegions).
	MaxDurableRegions = 16
	// MaxRegionName bounds a region's name (package ckpt's names).
	MaxRegionName = 32
	// MaxRegionSize bounds a region's size (durable.MaxRegionSize).
	MaxRegionSize = 1 << 40
)

// checkDurableSpec bounds a job spec's durable settings: none without a
// directory; with one, an absolute path without NUL, a base period, a
// concurrency, an overhead and a batch size in range. The agent checks
// what needs the protect mode (DiffBatch only in diff mode).
func checkDurableSpec(s *JobSpec) error {
	if s.CkptDir == "" {
		if s.CkptEvery != 0 || s.CkptConcurrency != 0 || s.CkptOverhead != 0 || s.DiffBatch != 0 || s.Resume {
			return malformed("register reply: durable settings without a checkpoint directory")
		}
		return nil
	}
	switch {
	case len(s.CkptDir) > MaxCkptDir || !strings.HasPrefix(s.CkptDir, "/") || strings.IndexByte(s.CkptDir, 0) >= 0:
		return malformed("register reply: checkpoint directory %q is not an absolute path", Truncate(s.CkptDir))
	case s.CkptEvery < 1 || int64(s.CkptEvery) > MaxCkptEvery:
		return malformed("register reply: ckpt-every %d out of range", s.CkptEvery)
	case s.CkptConcurrency < 0 || s.CkptConcurrency > MaxCkptConcurrency:
		return malformed("register reply: ckpt-concurrency %d out of range", s.CkptConcurrency)
	case !(s.CkptOverhead > 0 && s.CkptOverhead < 1):
		return malformed("register reply: ckpt-overhead %v out of range", s.CkptOverhead)
	case s.DiffBatch < 0 || s.DiffBatch > MaxDiffBatch:
		return malformed("register reply: diff-batch %d out of range", s.DiffBatch)
	}
	return nil
}

// RankDurable is one rank's durable tier, as its agent reports it in
// RankProgress.D.
type RankDurable struct {
	// Markers are the steps of the rank's completion markers that were
	// not reclaimed, ascending, each at most the rank's Committed: the
	// launcher commits the newest step every rank has a marker of.
	Markers []int64 `json:"m,omitempty"`
	// Resolved is the rank's resolved step (package durable, "Committing
	// and abandoning"), -1 to Committed: every save of the rank of a step
	// at or before it has ended, and Markers at or before it are final
	// (a step not listed there never is later). The launcher's X, beside
	// its watermark on GlobalStep, is the minimum over the ranks.
	Resolved int64 `json:"x"`
	// Saves, Skipped and Failed count the bases written, the bases
	// skipped because the durable tier had fallen behind (every save
	// allowed in flight was, or no base file was free), and the saves
	// that failed (an I/O error: ENOSPC, EIO...).
	Saves   int64 `json:"s,omitempty"`
	Skipped int64 `json:"k,omitempty"`
	Failed  int64 `json:"f,omitempty"`
	// WriteNS and Bytes are the time the saves written took, from their
	// start to their marker, and their bytes.
	WriteNS int64 `json:"t,omitempty"`
	Bytes   int64 `json:"b,omitempty"`
	// HoldNS is the rank's stages' total wait for a save to finish
	// reading the slot it was about to overwrite.
	HoldNS int64 `json:"h,omitempty"`
	// N is the number of saves the rank allows in flight now (automatic,
	// or --ckpt-concurrency): 0 before the rank's store is open.
	N int `json:"n,omitempty"`
	// Regions are the rank's regions, reported until the job's commit
	// record exists: the launcher writes the manifest from them.
	Regions []DurableRegion `json:"rg,omitempty"`
	// Off says why the rank has no store (it could not be opened), or is
	// empty.
	Off string `json:"off,omitempty"`
	// Log is the rank's differential log on disk (diff mode), or nil.
	Log *DiffLogStats `json:"dl,omitempty"`
}

// DiffLogStats are the counters of a rank's differential log on disk
// (difflog.WriterStats): the steps written, the steps lost (dropped: a
// full queue, a failed batch), the batches that failed, and the last
// error, empty once a batch was written again.
type DiffLogStats struct {
	Steps   int64  `json:"s,omitempty"`
	Dropped int64  `json:"d,omitempty"`
	Failed  int64  `json:"f,omitempty"`
	LastErr string `json:"e,omitempty"`
}

// DurableRegion is one of a rank's regions (durable.Region).
type DurableRegion struct {
	Name string `json:"n"`
	Size int64  `json:"s"`
}

// check validates d, the durable report of rank with committed step
// committed (nil is none), and makes its empty lists nil: they are
// omitted when encoded, and a report decodes as it re-encodes.
func (d *RankDurable) check(rank int, committed int64) error {
	if d == nil {
		return nil
	}
	if len(d.Markers) == 0 {
		d.Markers = nil
	}
	if len(d.Regions) == 0 {
		d.Regions = nil
	}
	if len(d.Markers) > MaxDurableMarkers {
		return malformed("progress: rank %d: %d durable markers", rank, len(d.Markers))
	}
	for i, m := range d.Markers {
		if m < 0 || m > committed || i > 0 && m <= d.Markers[i-1] {
			return malformed("progress: rank %d: durable markers %v, committed %d", rank, d.Markers, committed)
		}
	}
	if d.Resolved < -1 || d.Resolved > committed {
		return malformed("progress: rank %d: durable resolved step %d, committed %d", rank, d.Resolved, committed)
	}
	if d.Saves < 0 || d.Skipped < 0 || d.Failed < 0 || d.WriteNS < 0 || d.Bytes < 0 || d.HoldNS < 0 || d.N < 0 || d.N > MaxCkptConcurrency {
		return malformed("progress: rank %d: durable counters", rank)
	}
	if len(d.Regions) > MaxDurableRegions {
		return malformed("progress: rank %d: %d regions", rank, len(d.Regions))
	}
	for _, r := range d.Regions {
		if r.Name == "" || len(r.Name) > MaxRegionName || r.Size < 0 || r.Size > MaxRegionSize {
			return malformed("progress: rank %d: region %q of %d bytes", rank, Truncate(r.Name), r.Size)
		}
	}
	if err := checkString("progress: durable state", d.Off); err != nil {
		return err
	}
	if l := d.Log; l != nil {
		if l.Steps < 0 || l.Dropped < 0 || l.Failed < 0 {
			return malformed("progress: rank %d: differential log counters", rank)
		}
		if err := checkString("progress: differential log error", l.LastErr); err != nil {
			return err
		}
	}
	return nil
}
