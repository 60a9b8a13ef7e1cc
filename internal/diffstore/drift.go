package diffstore

import (
	"math"
	"slices"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// Drift is how far a lossy log (a codec that drops or rounds gradient
// bits, such as int8 or topk) had carried the store's replay away from the
// owner's true state, measured when a base refresh (the owner's exact
// state at Step) replaced it: the store's own restore of Step (the base
// it replaced and the differentials up to Step) against the refresh, over
// the master weights W. A restore served from the lossy log between two
// refreshes is off by about this much.
type Drift struct {
	Step int64 // the refresh's step
	// Steps is how many optimizer steps the replaced path had replayed
	// since the last exact state it started from.
	Steps     int64
	MaxAbs    float64 // max |Δw| over the finite elements
	RMS       float64 // root mean square of Δw over the finite elements
	RelRMS    float64 // RMS(Δw) / RMS(w), w the true weights (0 if they are all zero)
	NonFinite int64   // elements whose replayed or true weight is NaN or infinite
}

// driftCheck is a Drift to measure: the state a refresh replaced, kept
// until the next fold measures it (foldMu write-held: nothing else reads
// or reuses old then).
type driftCheck struct {
	step int64
	nb   *base    // the refresh's base
	old  []byte   // the replaced base's optimizer region (not in retired: only the check holds it)
	es   []*entry // the differentials after old's step, up to step
	from int64    // the step of the last exact state old derives from
}

// noteDriftLocked, called by installLocked before it replaces the base
// with nb, keeps what the refresh replaces when that was not exact (the
// base or a differential up to nb's step lossy), for the next fold to
// measure (measureDrift). i differentials of the log lead to nb's step.
// mu is held.
func (s *Store) noteDriftLocked(nb *base, i int) {
	old := s.base
	exact := old.exact
	for _, e := range s.log[:i] {
		exact = exact && !e.lossy()
	}
	if exact {
		return
	}
	s.drift = &driftCheck{step: nb.step, nb: nb, old: old.data[s.optIdx], es: slices.Clone(s.log[:i]), from: old.exactAt}
}

// driftFoldedLocked tells the drift waiting to be measured, if it keeps
// the optimizer buffer of base b, that an in-place Fold (which the
// refresh superseded while it replayed) moved that buffer on to step
// last: the measurement replays only the differentials after last, and
// none is made if the fold passed the refresh's step. mu is held.
func (s *Store) driftFoldedLocked(b *base, last int64) {
	d := s.drift
	if d == nil || len(d.old) == 0 || unsafe.SliceData(d.old) != unsafe.SliceData(b.data[s.optIdx]) {
		return
	}
	if last > d.step {
		s.drift = nil // its buffer goes to the garbage collector
		return
	}
	d.es = slices.DeleteFunc(d.es, func(e *entry) bool { return e.step <= last })
}

// measureDrift measures the drift a refresh found (noteDriftLocked), if
// one is waiting and the base is still that refresh's, unchanged: it
// replays the replaced path onto the replaced base's own buffer (which
// nothing else reads), compares it with the refresh's W, records the
// result in Stats.Drift, and keeps the buffer for reuse. foldMu is
// write-held: the base's bytes do not change meanwhile.
func (s *Store) measureDrift(opt replay.ReplayOptions) {
	s.mu.Lock()
	d, cur := s.drift, s.base
	s.drift = nil
	stable := d != nil && cur == d.nb && cur.step == d.step
	s.mu.Unlock()
	if !stable {
		return
	}
	st, ok := s.state(d.old)
	if !ok || len(d.es) > 0 && replayLog(st, d.es, opt) != nil {
		return // an unaligned buffer, or a replay refused: not measured
	}
	truth, _ := s.state(cur.data[s.optIdx])
	dr := compareW(st.W, truth.W)
	dr.Step, dr.Steps = d.step, d.step-d.from
	s.mu.Lock()
	s.stats.Drift = &dr
	s.stats.DriftsMeasured++
	s.giveLocked(s.optIdx, d.old)
	s.mu.Unlock()
}

// compareW returns got's deviation from want (same length).
func compareW(got, want []float32) Drift {
	var d Drift
	var sq, wsq float64
	var n int64
	for i, g := range got {
		w := float64(want[i])
		diff := float64(g) - w
		if math.IsNaN(diff) || math.IsInf(diff, 0) {
			d.NonFinite++
			continue
		}
		d.MaxAbs = max(d.MaxAbs, math.Abs(diff))
		sq += diff * diff
		wsq += w * w
		n++
	}
	if n > 0 {
		d.RMS = math.Sqrt(sq / float64(n))
		if wsq > 0 {
			d.RelRMS = math.Sqrt(sq / wsq)
		}
	}
	return d
}
