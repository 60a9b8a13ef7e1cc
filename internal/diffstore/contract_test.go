package diffstore

import (
	"errors"
	"testing"
)

// TestHeld: Append takes the differentials that follow a first refresh
// before it commits, but the store holds them (Held, the only ground on
// which a holder acknowledges a step) only once it does.
func TestHeld(t *testing.T) {
	o := newOwner(60, 200, lossless)
	s := o.newStore(t)
	for range 3 {
		o.next(t)
	}
	w, err := s.BeginBase(3)
	if err != nil {
		t.Fatal(err)
	}
	for step := int64(4); step <= 5; step++ {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
		if s.Held(step) {
			t.Fatalf("Held(%d) before the first base committed", step)
		}
	}
	for _, c := range chunks(o.rng, o.states[3]) {
		if err := w.Write(c.region, c.off, c.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(3, sums(o.states[3])); err != nil {
		t.Fatal(err)
	}
	for step, want := range map[int64]bool{2: false, 3: true, 4: true, 5: true, 6: false} {
		if got := s.Held(step); got != want {
			t.Errorf("Held(%d) = %v, want %v", step, got, want)
		}
	}
}

// TestSetG: Fold goes no further than G, and a refresh verified at a step
// past G waits, still in progress, until G reaches it.
func TestSetG(t *testing.T) {
	o := newOwner(61, 200, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 10 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	s.SetG(4)
	if err := s.Fold(8, defaults); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 4, 10, defaults)
	w, err := s.BeginBase(6)
	if err != nil {
		t.Fatal(err)
	}
	cs := chunks(o.rng, o.states[6])
	for _, c := range cs {
		if err := w.Write(c.region, c.off, c.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(6, sums(o.states[6])); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 4, 10, defaults) // verified, waiting for G
	if st := s.Stats(); st.Refreshes != 1 {
		t.Fatalf("Stats.Refreshes = %d before G reached the refresh, want 1", st.Refreshes)
	}
	if err := w.Write(cs[0].region, cs[0].off, cs[0].b); !errors.Is(err, ErrStale) {
		t.Fatalf("Write to a verified refresh: %v, want ErrStale", err)
	}
	s.SetG(5)
	checkRange(t, s, o, 4, 10, defaults)
	if err := s.Fold(9, defaults); err != nil { // G and the refresh both stop it
		t.Fatal(err)
	}
	checkRange(t, s, o, 5, 10, defaults)
	s.SetG(7)
	checkRange(t, s, o, 6, 10, defaults)
	if err := s.Fold(9, defaults); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 7, 10, defaults)
	if st := s.Stats(); st.Refreshes != 2 || st.RefreshesSuperseded != 0 {
		t.Fatalf("Stats = %+v, want 2 refreshes installed", st)
	}
}
