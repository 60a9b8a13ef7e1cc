package diffstore

import (
	"errors"
	"math"
	"testing"

	"github.com/gorun/gorun/replay"
)

// Base refreshes (base.go): a first base while differentials flow, one
// that fails its CRCs or never commits, BeginBase before any base, writes
// refused, and a refresh beside Fold and a log bounded meanwhile.

// TestFirstBaseWhileDiffsFlow: a holder that joins gets its first base in
// chunks while the differentials after it arrive.
func TestFirstBaseWhileDiffsFlow(t *testing.T) {
	o := newOwner(2, 500, lossless)
	for range 5 {
		o.next(t)
	}
	s := o.newStore(t)
	w, err := s.BeginBase(5)
	if err != nil {
		t.Fatal(err)
	}
	cs := chunks(o.rng, o.states[5])
	for i := 6; i <= 9; i++ {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatalf("Append(%d) during the first refresh: %v", i, err)
		}
		if err := w.Write(cs[0].region, cs[0].off, cs[0].b); err != nil {
			t.Fatal(err)
		}
		cs = cs[1:]
		if _, _, ok := s.Range(); ok {
			t.Fatal("a range before the first base committed")
		}
	}
	for _, c := range cs {
		if err := w.Write(c.region, c.off, c.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(5, sums(o.states[5])); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 5, 9, defaults)
}

// TestBaseCommitBadCRC: a base whose bytes do not match the owner's
// CRC32Cs is refused and changes nothing; once its chunks are right, it
// commits.
func TestBaseCommitBadCRC(t *testing.T) {
	o := newOwner(3, 400, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 6 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	w, err := s.BeginBase(4)
	if err != nil {
		t.Fatal(err)
	}
	st := o.states[4]
	for _, c := range chunks(o.rng, st) {
		if err := w.Write(c.region, c.off, c.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Write(optName, 100, []byte{0xFF}); err != nil { // a chunk damaged on the way
		t.Fatal(err)
	}
	before := observe(s)
	if err := w.Commit(4, sums(st)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Commit of a damaged base: %v, want ErrCorrupt", err)
	}
	if after := observe(s); after != before {
		t.Fatalf("the store changed: %+v, was %+v", after, before)
	}
	checkRange(t, s, o, 0, 6, defaults)
	for _, bad := range []map[string]uint32{nil, {optName: 0}, {optName: 0, "other": 0}} {
		if err := w.Commit(4, bad); !errors.Is(err, ErrMismatch) {
			t.Fatalf("Commit(%v): %v, want ErrMismatch", bad, err)
		}
	}
	if err := w.Write(optName, 100, st[optName][100:101]); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(4, sums(st)); err != nil {
		t.Fatalf("Commit once repaired: %v", err)
	}
	checkRange(t, s, o, 4, 6, defaults)
	if err := w.Commit(4, sums(st)); !errors.Is(err, ErrStale) {
		t.Fatalf("a second Commit: %v, want ErrStale", err)
	}
	if st := s.Stats(); st.LogLen != 2 || st.Refreshes != 2 {
		t.Fatalf("Stats = %+v, want 2 differentials and 2 refreshes", st)
	}
}

// TestRefreshInterrupted: a base refresh that never commits (aborted, the
// owner crashed and began another, cut by a Truncate) leaves the old base
// and its log restorable; differentials go on meanwhile.
func TestRefreshInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		interrupt func(t *testing.T, s *Store, w *BaseWriter)
	}{
		{"abort", func(t *testing.T, s *Store, w *BaseWriter) { w.Abort() }},
		{"new refresh", func(t *testing.T, s *Store, w *BaseWriter) {
			if _, err := s.BeginBase(w.Step()); err != nil { // the owner crashed, and begins again
				t.Fatal(err)
			}
		}},
		{"truncate", func(t *testing.T, s *Store, w *BaseWriter) {
			if err := s.Truncate(w.Step() - 1); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwner(4, 600, lossless)
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			for range 5 {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
			}
			w, err := s.BeginBase(5)
			if err != nil {
				t.Fatal(err)
			}
			cs := chunks(o.rng, o.states[5])
			for _, c := range cs[:len(cs)/2] {
				if err := w.Write(c.region, c.off, c.b); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Append(o.next(t)); err != nil {
				t.Fatal(err)
			}
			tc.interrupt(t, s, w)
			last := int64(6)
			if tc.name == "truncate" {
				last = 4
				o.rewind(4) // the owner restarts from step 4
			}
			checkRange(t, s, o, 0, last, defaults)
			for _, c := range cs[len(cs)/2:] {
				if err := w.Write(c.region, c.off, c.b); !errors.Is(err, ErrStale) {
					t.Fatalf("Write to an interrupted refresh: %v, want ErrStale", err)
				}
			}
			if err := w.Commit(5, sums(o.states[5])); !errors.Is(err, ErrStale) {
				t.Fatalf("Commit of an interrupted refresh: %v, want ErrStale", err)
			}
			if err := s.Append(o.next(t)); err != nil {
				t.Fatal(err)
			}
			checkRange(t, s, o, 0, last+1, defaults)
			if st := s.Stats(); st.RefreshesAborted != 1 || st.Refreshes != 1 {
				t.Fatalf("Stats = %+v, want one refresh committed, one aborted", st)
			}
		})
	}
}

func TestBeginBaseBeforeBase(t *testing.T) {
	o := newOwner(5, 100, lossless)
	s := o.newStore(t)
	for range 3 {
		o.next(t)
	}
	sendBase(t, s, o, 3)
	if _, err := s.BeginBase(2); !errors.Is(err, ErrStale) {
		t.Fatalf("BeginBase before the base: %v, want ErrStale", err)
	}
	if _, err := s.BeginBase(-2); !errors.Is(err, ErrMismatch) {
		t.Fatalf("BeginBase(-2): %v, want ErrMismatch", err)
	}
}

func TestWriteRefuses(t *testing.T) {
	o := newOwner(6, 100, lossless)
	s := o.newStore(t)
	w, err := s.BeginBase(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		region string
		off    int64
		n      int
	}{{"nope", 0, 1}, {metaName, -1, 1}, {metaName, 60, 5}, {metaName, 65, 0}, {metaName, 1 << 62, 1}} {
		if err := w.Write(tc.region, tc.off, make([]byte, tc.n)); !errors.Is(err, ErrMismatch) {
			t.Errorf("Write(%q, %d, %d bytes): %v, want ErrMismatch", tc.region, tc.off, tc.n, err)
		}
	}
	if err := w.Write(metaName, 64, nil); err != nil {
		t.Errorf("an empty write at the end: %v", err)
	}
}

// TestRefreshAfterFold: a lossless Fold passes a refresh in progress,
// which is then verified and dropped; so is a refresh begun while a Fold
// was replaying past its step; one at the base's step or later replaces
// it.
func TestRefreshAfterFold(t *testing.T) {
	o := newOwner(9, 800, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 10 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(w *BaseWriter, step int64) {
		t.Helper()
		for _, c := range chunks(o.rng, o.states[step]) {
			if err := w.Write(c.region, c.off, c.b); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Commit(step, sums(o.states[step])); err != nil {
			t.Fatal(err)
		}
	}
	w, err := s.BeginBase(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Fold(6, defaults); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 6, 10, defaults) // the fold passed the refresh
	write(w, 3)                          // verified, and dropped
	checkRange(t, s, o, 6, 10, defaults)

	s.testFoldHook = func() { // the refresh begins while the fold replays
		if w, err = s.BeginBase(7); err != nil {
			t.Error(err)
		}
	}
	if err := s.Fold(8, defaults); err != nil {
		t.Fatal(err)
	}
	s.testFoldHook = nil
	write(w, 7)
	checkRange(t, s, o, 8, 10, defaults)
	sendBase(t, s, o, 9)
	checkRange(t, s, o, 9, 10, defaults)
	if st := s.Stats(); st.RefreshesSuperseded != 2 || st.Refreshes != 2 {
		t.Fatalf("Stats = %+v", st)
	}
}

// TestLogBoundedDuringRefresh: a holder that folds once its log holds D
// steps (as gorun does) while a base refresh trickles in over many steps:
// with a lossless log the folds pass the refresh, so the log never holds
// more than D+1 differentials, and the refresh, committed at last, is
// verified and dropped; with a lossy one they stop at the refresh's step,
// so the log grows until it commits and replaces the base. Every step in
// range restores as before (bitwise, for the lossless log).
func TestLogBoundedDuringRefresh(t *testing.T) {
	const depth, steps, refreshAt = 4, 30, 2
	for _, tt := range []struct {
		name      string
		codec     replay.Options
		maxLog    int   // the longest the log may get
		minLog    int   // the longest it must get (the lossy log grows)
		wantFirst int64 // the base's step after the refresh commits
	}{
		{"lossless", lossless, depth + 1, depth, steps - steps%depth},
		{"lossy", replay.Options{Threshold: 1}, steps - refreshAt, steps - refreshAt, refreshAt},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := newOwner(70, 600, tt.codec)
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			var w *BaseWriter
			var todo []chunk
			longest := 0
			for step := int64(1); step <= steps; step++ {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
				if step == refreshAt {
					var err error
					if w, err = s.BeginBase(refreshAt); err != nil {
						t.Fatal(err)
					}
					todo = chunks(o.rng, o.states[refreshAt])
				}
				if len(todo) > 1 { // one chunk a step; the last one at the end
					if err := w.Write(todo[0].region, todo[0].off, todo[0].b); err != nil {
						t.Fatal(err)
					}
					todo = todo[1:]
				}
				longest = max(longest, s.Stats().LogLen)
				if f, l, _ := s.Range(); l-f >= depth {
					if err := s.Fold(math.MaxInt64, defaults); err != nil {
						t.Fatal(err)
					}
				}
			}
			if longest > tt.maxLog || longest < tt.minLog {
				t.Errorf("the log held up to %d differentials with a refresh in progress; want %d to %d", longest, tt.minLog, tt.maxLog)
			}
			if st := s.Stats(); st.RefreshBytes == 0 {
				t.Fatal("the refresh is not in progress any more")
			}
			for _, c := range todo {
				if err := w.Write(c.region, c.off, c.b); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Commit(refreshAt, sums(o.states[refreshAt])); err != nil {
				t.Fatal(err)
			}
			f, l, _ := s.Range()
			if f != tt.wantFirst || l != steps {
				t.Fatalf("Range after the refresh commits = %d, %d; want %d, %d", f, l, tt.wantFirst, steps)
			}
			st := s.Stats()
			if tt.codec == lossless {
				checkRange(t, s, o, f, l, defaults)
				if st.RefreshesSuperseded != 1 || st.Refreshes != 1 {
					t.Errorf("Stats = %+v, want the refresh dropped", st)
				}
			} else if st.RefreshesSuperseded != 0 || st.Refreshes != 2 || !s.Exact(refreshAt) {
				t.Errorf("Stats = %+v, exact at the refresh %v; want the refresh installed", st, s.Exact(refreshAt))
			}
			if st.RefreshBytes != 0 {
				t.Errorf("a refresh is still in progress: %+v", st)
			}
		})
	}
}
