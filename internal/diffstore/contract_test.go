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

// TestBaseBeforeFirstStep: a base at step -1 (the owner's state before its
// first step) restores, and the differentials from step 0 follow it.
func TestBaseBeforeFirstStep(t *testing.T) {
	o := newOwner(62, 200, lossless)
	o.step = -1
	o.states = map[int64]map[string][]byte{-1: o.states[0]}
	s := o.newStore(t)
	if got := s.Next(); got != -1 {
		t.Fatalf("Next of an empty store = %d, want -1", got)
	}
	sendBase(t, s, o, -1)
	checkRange(t, s, o, -1, -1, defaults)
	if got := s.Next(); got != 0 {
		t.Fatalf("Next after a base at -1 = %d, want 0", got)
	}
	for range 4 { // steps 0 to 3
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	checkRange(t, s, o, -1, 3, defaults)
	if err := s.Fold(1, defaults); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 1, 3, defaults)
}

// TestDeadRefreshFreesBuffers: a refresh no longer current lets go of its
// buffers (the size of the owner's state) at its next Write or Commit, or
// at its Abort.
func TestDeadRefreshFreesBuffers(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(s *Store, w *BaseWriter) error
	}{
		{"abort", func(s *Store, w *BaseWriter) error { w.Abort(); return nil }},
		{"newer refresh, then write", func(s *Store, w *BaseWriter) error {
			if _, err := s.BeginBase(2); err != nil {
				return err
			}
			return w.Write(metaName, 0, []byte{1})
		}},
		{"truncate, then commit", func(s *Store, w *BaseWriter) error {
			if err := s.Truncate(0); err != nil {
				return err
			}
			return w.Commit(1, map[string]uint32{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwner(63, 200, lossless)
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			for range 2 {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
			}
			w, err := s.BeginBase(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.end(s, w); err != nil && !errors.Is(err, ErrStale) {
				t.Fatal(err)
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.bufs != nil {
				t.Fatal("a dead refresh still holds its buffers")
			}
		})
	}
}
