package diffstore

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/gorun/gorun/replay"
)

// TestDriftMeasured: when a base refresh replaces a lossy path (a lossy
// base or lossy differentials up to its step), the next fold measures how
// far the store's replay of that step was from the refresh (the owner's
// true state): Stats.Drift holds the same figures as a comparison of a
// Restore taken just before the refresh with the true W; a lossless log
// never reports a drift, and a refresh replaced before any fold measured
// it is not measured.
func TestDriftMeasured(t *testing.T) {
	for _, tc := range []struct {
		name       string
		codec      replay.Options
		foldBefore int64 // fold up to this step before the refresh (0: none)
		refreshes  []int64
		wantSteps  int64 // Drift.Steps; -1: no drift
	}{
		{"int8, log only", replay.Options{Threshold: 1 << 20}, 0, []int64{6}, 6},
		{"int8, folded base", replay.Options{Threshold: 1 << 20}, 3, []int64{6}, 6},
		{"topk, folded base", replay.Options{Threshold: 1, K: 0.1}, 4, []int64{6}, 6},
		{"int8, second refresh before a fold", replay.Options{Threshold: 1 << 20}, 0, []int64{4, 6}, 2},
		{"lossless", lossless, 3, []int64{6}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwner(61, 300, tc.codec)
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			var want Drift
			for step := int64(1); step <= 8; step++ {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
				if step == tc.foldBefore {
					if err := s.Fold(step, defaults); err != nil {
						t.Fatal(err)
					}
				}
				for _, r := range tc.refreshes {
					if r != step {
						continue
					}
					got, err := restore(s, step, defaults)
					if err != nil {
						t.Fatal(err)
					}
					want = driftOf(o, got[optName], o.states[step][optName])
					sendBase(t, s, o, step)
				}
			}
			if err := s.Fold(8, defaults); err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			if tc.wantSteps < 0 {
				if st.Drift != nil || st.DriftsMeasured != 0 {
					t.Fatalf("a lossless log reported drift %+v (%d measured)", st.Drift, st.DriftsMeasured)
				}
				return
			}
			last := tc.refreshes[len(tc.refreshes)-1]
			d := st.Drift
			switch {
			case d == nil || st.DriftsMeasured != 1:
				t.Fatalf("Drift %+v, %d measured; want one, at step %d", d, st.DriftsMeasured, last)
			case d.Step != last || d.Steps != tc.wantSteps:
				t.Fatalf("drift at step %d over %d steps, want step %d over %d", d.Step, d.Steps, last, tc.wantSteps)
			case d.MaxAbs != want.MaxAbs || d.NonFinite != want.NonFinite || !near(d.RMS, want.RMS) || !near(d.RelRMS, want.RelRMS):
				t.Fatalf("drift %+v, want %+v", *d, want)
			case d.MaxAbs == 0:
				t.Fatalf("a lossy log replayed the owner's weights exactly: %+v", *d)
			}
			// Measured once: a later fold does not count it again.
			if err := s.Append(o.next(t)); err != nil {
				t.Fatal(err)
			}
			if err := s.Fold(9, defaults); err != nil {
				t.Fatal(err)
			}
			if n := s.Stats().DriftsMeasured; n != 1 {
				t.Fatalf("%d drifts measured after another fold, want 1", n)
			}
		})
	}
}

// driftOf is the test's own comparison of the W of two optimizer regions.
func driftOf(o *owner, got, want []byte) Drift {
	var d Drift
	var sq, wsq float64
	off := o.off(0)
	for i := range o.n {
		g := float64(math.Float32frombits(binary.LittleEndian.Uint32(got[off+4*i:])))
		w := float64(math.Float32frombits(binary.LittleEndian.Uint32(want[off+4*i:])))
		if math.IsNaN(g-w) || math.IsInf(g-w, 0) {
			d.NonFinite++
			continue
		}
		d.MaxAbs = math.Max(d.MaxAbs, math.Abs(g-w))
		sq += (g - w) * (g - w)
		wsq += w * w
	}
	d.RMS = math.Sqrt(sq / float64(o.n-int(d.NonFinite)))
	d.RelRMS = math.Sqrt(sq / wsq)
	return d
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

// TestCompareW: non-finite elements are counted apart, and all-zero true
// weights give no relative figure.
func TestCompareW(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name      string
		got, want []float32
		d         Drift
	}{
		{"equal", []float32{1, 2}, []float32{1, 2}, Drift{}},
		{"one off", []float32{1, 2.5}, []float32{1, 2}, Drift{MaxAbs: 0.5, RMS: math.Sqrt(0.125), RelRMS: math.Sqrt(0.25 / 5)}},
		{"zero truth", []float32{0.5}, []float32{0}, Drift{MaxAbs: 0.5, RMS: 0.5}},
		{"non-finite", []float32{nan, inf, 1}, []float32{1, 1, 1}, Drift{NonFinite: 2}},
		{"empty", nil, nil, Drift{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := compareW(tc.got, tc.want); d != tc.d {
				t.Fatalf("compareW = %+v, want %+v", d, tc.d)
			}
		})
	}
}

// TestDriftRefreshDuringFold: a refresh that commits while a lossy Fold
// replays in place (into the base the refresh replaces, which the drift
// measurement keeps) leaves a drift measured from where that fold left
// the buffer: each step replayed once, the same figures as a restore of
// the refresh's step taken before it. (The measurement used to replay
// the steps that fold had applied a second time.)
func TestDriftRefreshDuringFold(t *testing.T) {
	o := newOwner(61, 300, replay.Options{Threshold: 1 << 20})
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 6 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := restore(s, 4, defaults)
	if err != nil {
		t.Fatal(err)
	}
	want := driftOf(o, got[optName], o.states[4][optName])
	w, err := s.BeginBase(4)
	if err != nil {
		t.Fatal(err)
	}
	st := o.states[4]
	writeChunks(t, w, st, 1)
	s.testFoldHook = func() { // the Fold has planned steps 1 to 4 (a lossy fold stops at the refresh)
		s.testFoldHook = nil
		if err := w.Commit(4, sums(st)); err != nil {
			t.Error(err)
		}
		if sp := s.Stats().SpareBytes; sp < int64(o.optSize()) {
			t.Errorf("the replaced base kept for the drift measurement is not counted: %d spare bytes", sp)
		}
	}
	if err := s.Fold(6, defaults); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(o.next(t)); err != nil {
		t.Fatal(err)
	}
	if err := s.Fold(7, defaults); err != nil {
		t.Fatal(err)
	}
	switch d := s.Stats().Drift; {
	case d == nil:
		t.Fatal("no drift measured")
	case d.Step != 4 || d.MaxAbs != want.MaxAbs || !near(d.RMS, want.RMS) || !near(d.RelRMS, want.RelRMS):
		t.Fatalf("drift %+v, want %+v at step 4", *d, want)
	}
}
