package diffstore

import (
	"errors"
	"maps"
	"testing"
)

// TestAppendRefusesUnsealed: a differential changed after the owner
// sealed it — its step, a hyper-parameter, another region's bytes or
// name — or never sealed, is refused with ErrCorrupt and changes nothing.
func TestAppendRefusesUnsealed(t *testing.T) {
	for _, tc := range []struct {
		name string
		bend func(d *Diff)
	}{
		{"not sealed", func(d *Diff) { d.Sum++ }},
		{"learning rate", func(d *Diff) { d.Hyper.LR *= 2 }},
		{"weight decay", func(d *Diff) { d.Hyper.WeightDecay += 0.01 }},
		{"beta2", func(d *Diff) { d.Hyper.Beta2 = 0.99 }},
		{"optimizer step", func(d *Diff) { d.Hyper.T++ }},
		{"step", func(d *Diff) { d.Step++ }},
		{"meta byte", func(d *Diff) {
			m := append([]byte(nil), d.Other[metaName]...)
			m[20] ^= 1
			d.Other = map[string][]byte{metaName: m}
		}},
		{"meta renamed", func(d *Diff) { d.Other = map[string][]byte{"Meta": d.Other[metaName]} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwner(50, 200, lossless)
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			for range 2 {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
			}
			d := o.next(t)
			good := d
			good.Other = maps.Clone(d.Other)
			before := observe(s)
			tc.bend(&d)
			if err := s.Append(d); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Append: %v, want ErrCorrupt", err)
			}
			if after := observe(s); after != before {
				t.Fatalf("the store changed: %+v, was %+v", after, before)
			}
			if err := s.Append(good); err != nil {
				t.Fatal(err)
			}
			checkRange(t, s, o, 0, 3, defaults)
		})
	}
}

// TestCommitChecksStep: a Commit whose step is not the refresh's (the
// BeginBase or the commit damaged on the way) is refused with ErrCorrupt
// and changes nothing; the right one then commits.
func TestCommitChecksStep(t *testing.T) {
	o := newOwner(51, 200, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 4 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	w, err := s.BeginBase(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks(o.rng, o.states[3]) {
		if err := w.Write(c.region, c.off, c.b); err != nil {
			t.Fatal(err)
		}
	}
	before := observe(s)
	for _, step := range []int64{2, 4, -1} {
		if err := w.Commit(step, sums(o.states[3])); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Commit(%d) of the refresh at 3: %v, want ErrCorrupt", step, err)
		}
	}
	if after := observe(s); after != before {
		t.Fatalf("the store changed: %+v, was %+v", after, before)
	}
	if err := w.Commit(3, sums(o.states[3])); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 3, 4, defaults)
}

// TestOptimizerStepChecked: Adam's step count T must follow the previous
// differential's, and the base's when the log is empty: after a Fold of
// the whole log, after a refresh that the log reached.
func TestOptimizerStepChecked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		empty func(t *testing.T, s *Store, o *owner)
	}{
		{"fold", func(t *testing.T, s *Store, o *owner) {
			if err := s.Fold(3, defaults); err != nil {
				t.Fatal(err)
			}
		}},
		{"refresh", func(t *testing.T, s *Store, o *owner) { sendBase(t, s, o, 3) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwner(52, 200, lossless)
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			for range 3 {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
			}
			tc.empty(t, s, o)
			if st := s.Stats(); st.LogLen != 0 {
				t.Fatalf("the log holds %d differentials, want none", st.LogLen)
			}
			d := o.next(t)
			bad := d
			bad.Hyper.T += 5
			bad.Seal()
			if err := s.Append(bad); !errors.Is(err, ErrMismatch) {
				t.Fatalf("Append of optimizer step %d after %d: %v, want ErrMismatch", bad.Hyper.T, d.Hyper.T-1, err)
			}
			if err := s.Append(d); err != nil {
				t.Fatal(err)
			}
			checkRange(t, s, o, 3, 4, defaults)
		})
	}
}
