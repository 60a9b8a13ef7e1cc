package diffstore

import (
	"bytes"
	"errors"
	"maps"
	"math"
	"testing"

	"github.com/gorun/gorun/replay"
)

var defaults = replay.ReplayOptions{}

func TestNewRefuses(t *testing.T) {
	ok := []Region{{Name: "optimizer", Size: 8 + 12*10}, {Name: "meta", Size: 64}}
	good := Optimizer{Region: "optimizer", N: 10, WOff: 8, MOff: 48, VOff: 88}
	for _, tc := range []struct {
		name    string
		regions []Region
		opt     Optimizer
	}{
		{"no regions", nil, good},
		{"17 regions", make([]Region, 17), good},
		{"empty name", []Region{{Name: "", Size: 1}, ok[0]}, good},
		{"negative size", []Region{{Name: "meta", Size: -1}, ok[0]}, good},
		{"huge size", []Region{{Name: "meta", Size: MaxRegionSize + 1}, ok[0]}, good},
		{"twice", []Region{ok[0], ok[0]}, good},
		{"no optimizer region", ok, Optimizer{Region: "opt", N: 10, WOff: 8, MOff: 48, VOff: 88}},
		{"N too large", ok, Optimizer{Region: "optimizer", N: 33, WOff: 0, MOff: 0, VOff: 0}},
		{"negative N", ok, Optimizer{Region: "optimizer", N: -1}},
		{"unaligned", ok, Optimizer{Region: "optimizer", N: 10, WOff: 6, MOff: 48, VOff: 88}},
		{"past the end", ok, Optimizer{Region: "optimizer", N: 10, WOff: 8, MOff: 48, VOff: 92}},
		{"negative offset", ok, Optimizer{Region: "optimizer", N: 10, WOff: -4, MOff: 48, VOff: 88}},
		{"overlap", ok, Optimizer{Region: "optimizer", N: 10, WOff: 8, MOff: 44, VOff: 88}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.regions, tc.opt); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	if _, err := New(ok, good); err != nil {
		t.Fatal(err)
	}
}

// snapshot is what a test can observe of a store without changing it.
type snapshot struct {
	first, last int64
	ok          bool
	stats       Stats
}

func observe(s *Store) snapshot {
	f, l, ok := s.Range()
	return snapshot{f, l, ok, s.Stats()}
}

// TestAppendRefuses checks that a differential that is out of sequence,
// corrupt or does not fit is refused with the right error, and that the
// store is then unchanged: same range, same sizes, same restored bytes;
// and that the right differential is then accepted.
func TestAppendRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
		bend func(o *owner, d *Diff) // makes step 4's differential bad
	}{
		{"flipped byte", ErrCorrupt, func(o *owner, d *Diff) { d.Record = bytes.Clone(d.Record); d.Record[len(d.Record)/2] ^= 0x10 }},
		{"truncated record", ErrCorrupt, func(o *owner, d *Diff) { d.Record = d.Record[:len(d.Record)-8] }},
		{"no record", ErrCorrupt, func(o *owner, d *Diff) { d.Record = nil }},
		{"gap", ErrGap, func(o *owner, d *Diff) {
			*d = o.next(t) // step 5 instead of 4
		}},
		{"repeated step, another record", ErrMismatch, func(o *owner, d *Diff) { d.Step, d.Record = 3, encode(t, 3, make([]float32, o.n), lossless) }},
		{"record of another step", ErrMismatch, func(o *owner, d *Diff) { d.Record = encode(t, 5, make([]float32, o.n), lossless) }},
		{"fewer elements", ErrMismatch, func(o *owner, d *Diff) { d.Record = encode(t, 4, make([]float32, o.n-1), lossless) }},
		{"two tensors", ErrMismatch, func(o *owner, d *Diff) {
			g, _ := replay.Compress(0, make([]float32, o.n), lossless)
			d.Record, _ = (&replay.Record{Step: 4, Tensors: []*replay.Tensor{g, g}}).AppendBinary(nil)
		}},
		{"no meta", ErrMismatch, func(o *owner, d *Diff) { d.Other = nil }},
		{"meta too short", ErrMismatch, func(o *owner, d *Diff) { d.Other = map[string][]byte{metaName: make([]byte, metaSize-1)} }},
		{"unknown region", ErrMismatch, func(o *owner, d *Diff) { d.Other = maps.Clone(d.Other); d.Other["rng"] = nil }},
		{"optimizer among the others", ErrMismatch, func(o *owner, d *Diff) { d.Other = map[string][]byte{optName: make([]byte, 8+12*o.n)} }},
		{"bad hyper", ErrMismatch, func(o *owner, d *Diff) { d.Hyper.Beta1 = 1 }},
		{"optimizer step not following", ErrMismatch, func(o *owner, d *Diff) { d.Hyper.T++ }},
		{"negative step", ErrMismatch, func(o *owner, d *Diff) { d.Step = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOwner(7, 300, lossless)
			s := o.newStore(t)
			sendBase(t, s, o, 0)
			for range 3 {
				if err := s.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
			}
			d := o.next(t) // step 4
			good := d
			good.Other = maps.Clone(d.Other)
			before := observe(s)
			tc.bend(o, &d)
			d.Seal() // the owner sent it so: the checks past the sum
			if err := s.Append(d); !errors.Is(err, tc.want) {
				t.Fatalf("Append: %v, want %v", err, tc.want)
			} else {
				t.Log(err)
			}
			if after := observe(s); after != before {
				t.Fatalf("the store changed: %+v, was %+v", after, before)
			}
			checkRange(t, s, o, 0, 3, defaults)
			if tc.want == ErrGap && good.Step != 4 {
				return
			}
			if err := s.Append(good); err != nil {
				t.Fatalf("the right differential after the refused one: %v", err)
			}
			checkRange(t, s, o, 0, 4, defaults)
		})
	}
}

func TestAppendWithoutBase(t *testing.T) {
	o := newOwner(1, 100, lossless)
	s := o.newStore(t)
	if err := s.Append(o.next(t)); !errors.Is(err, ErrGap) {
		t.Fatalf("Append without a base: %v, want ErrGap", err)
	}
	if _, _, ok := s.Range(); ok {
		t.Fatal("an empty store has a range")
	}
	if _, err := restore(s, 0, defaults); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Restore without a base: %v, want ErrNotHeld", err)
	}
}

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

// TestFoldKeepsRestores: folding changes no restored byte, and what it
// folded is no longer in range.
func TestFoldKeepsRestores(t *testing.T) {
	o := newOwner(8, 1000, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 20 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	for _, upTo := range []int64{-5, 0, 3, 3, 10, 19, 25} {
		if err := s.Fold(upTo, replay.ReplayOptions{Workers: 2, Block: 64}); err != nil {
			t.Fatal(err)
		}
		first := min(max(upTo, 0), 20)
		if upTo == 25 {
			first = 20
		}
		checkRange(t, s, o, first, 20, defaults)
	}
	st := s.Stats()
	if st.Folds != 4 || st.FoldedSteps != 20 || st.LogLen != 0 || st.FoldPerStep() <= 0 {
		t.Fatalf("Stats = %+v", st)
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

func TestTruncate(t *testing.T) {
	o := newOwner(10, 500, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 8 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Fold(2, defaults); err != nil {
		t.Fatal(err)
	}
	before := observe(s)
	if err := s.Truncate(1); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Truncate before the base: %v, want ErrNotHeld", err)
	}
	if after := observe(s); after != before {
		t.Fatalf("the store changed: %+v, was %+v", after, before)
	}
	if err := s.Truncate(5); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 2, 5, defaults)
	// The owner restarts from step 5, on another timeline: other gradients.
	o.rewind(5)
	for range 3 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	checkRange(t, s, o, 2, 8, defaults)
	if err := s.Truncate(100); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 2, 8, defaults)
}

// TestRestoreDestinations: Restore into unaligned slices gives the same
// bytes; into the wrong shape it is refused.
func TestRestoreDestinations(t *testing.T) {
	o := newOwner(11, 700, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 3 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	regions, _ := o.layout()
	dst := map[string][]byte{}
	for _, r := range regions {
		dst[r.Name] = make([]byte, r.Size+1)[1:] // not 4-byte aligned
	}
	if err := s.Restore(3, dst, defaults); err != nil {
		t.Fatal(err)
	}
	for name, want := range o.states[3] {
		if !bytes.Equal(dst[name], want) {
			t.Fatalf("region %q differs", name)
		}
	}
	for _, bad := range []map[string][]byte{
		nil,
		{optName: dst[optName]},
		{optName: dst[optName], metaName: dst[metaName][1:]},
		{optName: dst[optName], "other": dst[metaName]},
	} {
		if err := s.Restore(3, bad, defaults); !errors.Is(err, ErrMismatch) {
			t.Fatalf("Restore into %d regions: %v, want ErrMismatch", len(bad), err)
		}
	}
}

// TestLossy: a lossy codec's differentials are accepted and restored, and
// Exact says they are not exact.
func TestLossy(t *testing.T) {
	o := newOwner(12, 5000, replay.Options{Threshold: 1}) // TopK for every tensor
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 4 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Exact(0) || s.Exact(1) || s.Exact(4) || s.Exact(5) {
		t.Fatal("Exact: want step 0 only")
	}
	got, err := restore(s, 4, defaults)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got[optName], o.states[4][optName]) {
		t.Fatal("a TopK replay gave the exact state")
	}
	if !bytes.Equal(got[metaName], o.states[4][metaName]) {
		t.Fatal("the meta region is carried whole, even with a lossy codec")
	}
	if err := s.Fold(2, defaults); err != nil {
		t.Fatal(err)
	}
	if s.Exact(2) {
		t.Fatal("a base folded from lossy differentials is exact")
	}
	sendBase(t, s, o, 3)
	if !s.Exact(3) || s.Exact(4) {
		t.Fatal("Exact after a fresh base: want step 3 only")
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
