package wire

import "math"

// MaxStep bounds protected step numbers (exact in a float64, as in JSON).
const MaxStep = 1<<53 - 1

// RankProgress is one rank's state-protection progress (see package
// rank): the newest step committed on its host, and the newest committed
// there and at every replica holder; -1 for none.
type RankProgress struct {
	Rank       int   `json:"r"`
	Committed  int64 `json:"c"`
	Replicated int64 `json:"p"`
	Stages     int64 `json:"n,omitempty"`
	WaitNS     int64 `json:"w,omitempty"`
	// Replication: steps sent to all holders, time and bytes.
	ReplSteps int64 `json:"rs,omitempty"`
	ReplNS    int64 `json:"rt,omitempty"`
	ReplBytes int64 `json:"rb,omitempty"`
	// Of ReplBytes in diff mode: whole states (bases) and
	// differentials.
	ReplBaseBytes int64 `json:"rbb,omitempty"`
	ReplDiffBytes int64 `json:"rdb,omitempty"`
	// Diff mode: differentials whose gradient the holder took from a
	// data-parallel peer on its host (sent by reference), and those sent
	// with it over the network.
	DiffLocal int64 `json:"dl,omitempty"`
	DiffNet   int64 `json:"dn,omitempty"`
	// The rank's holders whose newest differential came from a local
	// peer, and over the network: the source each uses now.
	SourceLocal int `json:"sl,omitempty"`
	SourceNet   int `json:"sn,omitempty"`
	// Restores counts the Restore requests served to the rank in this
	// generation: a rank restored in a recovery epoch has more than when
	// the epoch was published.
	Restores int64 `json:"rr,omitempty"`
	// Base is, in diff mode under erasure coding, the rank's newest coded
	// base (rank.Progress.Base): the newest base step b <= Replicated
	// whose every parity row has the rank's share of b and whose clear
	// bytes at b are kept on the rank's data host; -1 for none. The
	// launcher's H is the minimum over the ranks. 0 otherwise (omitted).
	Base int64 `json:"b,omitempty"`
	// D is the rank's durable tier (gorun --ckpt-dir), nil without one.
	D *RankDurable `json:"dur,omitempty"`
}

// UpProgress is an agent's report of its ranks' progress, sent when it
// changes (coalesced): one message per host, whatever its ranks.
type UpProgress struct {
	Host int    `json:"h"`
	Gen  uint64 `json:"gen"`
	// Epoch is the newest epoch whose placement (replica holders) the
	// host's state protection had applied before it took the report:
	// Replicated counts that placement's holders, or a later one's.
	Epoch uint64         `json:"epoch,omitempty"`
	Ranks []RankProgress `json:"ranks"`
	// Fold is the host's figures as a replica holder in diff mode: the
	// steps its folds replayed into the bases it holds, and the time
	// that took (nil: none yet).
	Fold *HostFold `json:"fold,omitempty"`
}

// HostFold is a holder host's fold figures (diff mode).
type HostFold struct {
	Steps int64 `json:"s"`
	NS    int64 `json:"t"`
	// Drift is, with a lossy --diff-codec, the last drift measured of
	// each owner the host holds: how far its replay of the owner's
	// weights was from the true ones when a base refresh arrived.
	Drift []FoldDrift `json:"d,omitempty"`
}

// FoldDrift is one owner's drift (rank.FoldStats.Drifts).
type FoldDrift struct {
	Rank      int     `json:"r"`
	Step      int64   `json:"s"`  // the refresh's step
	Steps     int64   `json:"n"`  // steps replayed since an exact state
	MaxAbs    float64 `json:"m"`  // max |Δw|
	RelRMS    float64 `json:"q"`  // RMS(Δw) / RMS(w)
	NonFinite int64   `json:"nf"` // elements replayed to NaN or ±Inf
}

// DecodeUpProgress decodes and validates an UpProgress.
func DecodeUpProgress(b []byte) (*UpProgress, error) {
	var u UpProgress
	if err := decode(b, &u, "progress"); err != nil {
		return nil, err
	}
	if u.Host < 0 || u.Host >= MaxHosts {
		return nil, malformed("progress: host %d out of range", u.Host)
	}
	if len(u.Ranks) > MaxWorld {
		return nil, malformed("progress: %d ranks", len(u.Ranks))
	}
	for _, r := range u.Ranks {
		switch {
		case r.Rank < 0 || r.Rank >= MaxWorld:
			return nil, malformed("progress: rank %d out of range", r.Rank)
		case r.Committed < -1 || r.Committed > MaxStep || r.Replicated < -1 || r.Replicated > r.Committed:
			return nil, malformed("progress: rank %d steps %d/%d", r.Rank, r.Committed, r.Replicated)
		case r.Base < -1 || r.Base > max(r.Replicated, 0):
			// A coded base is a replicated step (0, the value outside
			// diff mode under EC, goes with any): the launcher's H, the
			// minimum of the bases, is then never above its G.
			return nil, malformed("progress: rank %d coded base %d, replicated %d", r.Rank, r.Base, r.Replicated)
		case r.Stages < 0 || r.WaitNS < 0 || r.ReplSteps < 0 || r.ReplNS < 0 || r.ReplBytes < 0 || r.Restores < 0,
			r.ReplBaseBytes < 0 || r.ReplDiffBytes < 0 || r.ReplBaseBytes > r.ReplBytes || r.ReplDiffBytes > r.ReplBytes-r.ReplBaseBytes:
			return nil, malformed("progress: rank %d counters", r.Rank)
		}
		if err := r.D.check(r.Rank, r.Committed); err != nil {
			return nil, err
		}
	}
	if f := u.Fold; f != nil {
		if len(f.Drift) == 0 {
			f.Drift = nil // omitted when encoded: it decodes as it re-encodes
		}
		if f.Steps < 0 || f.NS < 0 || len(f.Drift) > MaxWorld {
			return nil, malformed("progress: fold counters %d/%d, %d drifts", f.Steps, f.NS, len(f.Drift))
		}
		for _, d := range f.Drift {
			if d.Rank < 0 || d.Rank >= MaxWorld || d.Step < 0 || d.Step > MaxStep || d.Steps < 0 || d.NonFinite < 0 ||
				!(d.MaxAbs >= 0 && d.MaxAbs <= math.MaxFloat64) || !(d.RelRMS >= 0 && d.RelRMS <= math.MaxFloat64) {
				return nil, malformed("progress: drift %+v", d)
			}
		}
	}
	return &u, nil
}

// GlobalStep is G, the globally recoverable step, that the launcher
// publishes when it advances: every rank has step G committed locally and
// at all its replica holders.
type GlobalStep struct {
	Gen uint64 `json:"gen"`
	G   int64  `json:"g"`
	// H is, in diff mode under erasure coding, the newest step every rank
	// has a coded base of (the minimum of RankProgress.Base; H <= G):
	// recovery decodes a lost rank's state at H and replays its
	// differentials (H, G]. The launcher publishes when G or H advances.
	// 0 otherwise (omitted).
	H int64 `json:"h,omitempty"`
	// D is the durable tier's watermark (gorun --ckpt-dir): the step of
	// the job's commit record, which every rank has durably (nil: none
	// yet, or no durable tier). The launcher commits only steps at or
	// below G, so D <= G.
	D *int64 `json:"d,omitempty"`
	// X is the durable tier's resolved step (package durable, "Committing
	// and abandoning"; nil: none yet, or no durable tier): every base
	// step at or before it is decided, D committed and every other one
	// abandoned for good, and the ranks free their versions of those.
	// D <= X <= G, and X only moves forward.
	X *int64 `json:"x,omitempty"`
}

// DecodeGlobalStep decodes and validates a GlobalStep.
func DecodeGlobalStep(b []byte) (*GlobalStep, error) {
	var g GlobalStep
	if err := decode(b, &g, "global step"); err != nil {
		return nil, err
	}
	if g.G < -1 || g.G > MaxStep {
		return nil, malformed("global step %d out of range", g.G)
	}
	if g.H < -1 || g.H > max(g.G, 0) {
		// H <= G, and 0 (outside diff mode under EC) goes with any G.
		return nil, malformed("global step %d: coded base step %d", g.G, g.H)
	}
	if g.D != nil && (*g.D < 0 || *g.D > g.G) {
		return nil, malformed("global step %d: durable commit %d", g.G, *g.D)
	}
	if g.X != nil && (*g.X < 0 || *g.X > g.G || g.D != nil && *g.D > *g.X) {
		return nil, malformed("global step %d: durable resolved step %d", g.G, *g.X)
	}
	return &g, nil
}
