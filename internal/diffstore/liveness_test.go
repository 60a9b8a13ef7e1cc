package diffstore

import (
	"errors"
	"testing"
)

// TestRefreshAfterLostSteps: steps lost before a refresh do not leave the
// store stuck. The differentials after the refresh's step go to the
// refresh, which brings them with it when it commits; Next says where the
// owner must resend from, and a step resent that the store holds already
// is taken as a no-op.
func TestRefreshAfterLostSteps(t *testing.T) {
	o := newOwner(40, 300, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	var diffs []Diff
	for step := int64(1); step <= 7; step++ {
		d := o.next(t)
		diffs = append(diffs, d)
		if step <= 3 {
			if err := s.Append(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := s.Next(); got != 4 {
		t.Fatalf("Next = %d, want 4", got)
	}
	// Steps 4 and 5 are lost; the owner refreshes its base at 5.
	w, err := s.BeginBase(5)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Next(); got != 6 {
		t.Fatalf("Next during the refresh at 5 = %d, want 6", got)
	}
	for _, d := range diffs[5:7] {
		if err := s.Append(d); err != nil {
			t.Fatalf("Append(%d) during the refresh at 5, steps 4 and 5 lost: %v", d.Step, err)
		}
	}
	checkRange(t, s, o, 0, 3, defaults) // the refresh's steps are not restorable yet
	for _, d := range []Diff{diffs[0], diffs[2], diffs[6]} {
		if err := s.Append(d); err != nil {
			t.Fatalf("Append(%d) resent: %v, want a no-op", d.Step, err)
		}
	}
	for _, c := range chunks(o.rng, o.states[5]) {
		if err := w.Write(c.region, c.off, c.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(5, sums(o.states[5])); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 5, 7, defaults)
	if got := s.Next(); got != 8 {
		t.Fatalf("Next after the commit = %d, want 8", got)
	}
	if err := s.Append(o.next(t)); err != nil {
		t.Fatalf("Append(8) after the commit: %v", err)
	}
	checkRange(t, s, o, 5, 8, defaults)
	if err := s.Append(diffs[3]); err != nil { // step 4, before the base
		t.Fatalf("Append(4) before the base: %v, want a no-op", err)
	}
	checkRange(t, s, o, 5, 8, defaults)
}

// TestRefreshLostStepsResent: while a refresh is in progress after lost
// steps, the owner may resend them: the store's log then reaches the
// refresh's step and takes over the refresh's differentials.
func TestRefreshLostStepsResent(t *testing.T) {
	o := newOwner(41, 300, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	var diffs []Diff
	for step := int64(1); step <= 8; step++ {
		diffs = append(diffs, o.next(t))
	}
	for _, i := range []int{0, 1, 5, 6, 2, 3, 4, 7} { // steps 1, 2; then 6, 7 for the refresh at 5; then 3, 4, 5 resent; 8
		if i == 5 {
			if _, err := s.BeginBase(5); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Append(diffs[i]); err != nil {
			t.Fatalf("Append(%d): %v", diffs[i].Step, err)
		}
	}
	checkRange(t, s, o, 0, 8, defaults)
	if other := diffs[3]; true {
		other.Record = diffs[4].Record // step 4 again, with another record
		if err := s.Append(other); err == nil || errors.Is(err, ErrGap) {
			t.Fatalf("Append of a held step with another record: %v, want a refusal other than ErrGap", err)
		}
	}
}

// TestNewerRefreshKeepsDifferentials: a newer BeginBase before the first
// base commits (the owner crashed mid-refresh and began again) keeps the
// differentials the first refresh kept after the newer one's step.
func TestNewerRefreshKeepsDifferentials(t *testing.T) {
	for _, withBase := range []bool{false, true} {
		name := "no base"
		if withBase {
			name = "steps lost after the base"
		}
		t.Run(name, func(t *testing.T) {
			o := newOwner(42, 300, lossless)
			s := o.newStore(t)
			if withBase {
				sendBase(t, s, o, 0)
			}
			for range 5 {
				o.next(t) // lost, or before the holder joined
			}
			if _, err := s.BeginBase(5); err != nil {
				t.Fatal(err)
			}
			for range 4 { // steps 6 to 9
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
			}
			w, err := s.BeginBase(7)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Next(); got != 10 {
				t.Fatalf("Next after the newer refresh = %d, want 10", got)
			}
			if err := s.Append(o.next(t)); err != nil {
				t.Fatalf("Append(10) after the newer refresh: %v", err)
			}
			for _, c := range chunks(o.rng, o.states[7]) {
				if err := w.Write(c.region, c.off, c.b); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Commit(7, sums(o.states[7])); err != nil {
				t.Fatal(err)
			}
			checkRange(t, s, o, 7, 10, defaults)
			if err := s.Append(o.next(t)); err != nil {
				t.Fatalf("Append(11) after the commit: %v", err)
			}
		})
	}
}
