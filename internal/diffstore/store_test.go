package diffstore

import (
	"bytes"
	"errors"
	"maps"
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
