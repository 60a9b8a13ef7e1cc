package diffstore

import (
	"bytes"
	"errors"
	"maps"
	"testing"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// newLog returns an empty log for o's layout.
func (o *owner) newLog(t testing.TB) *Log {
	t.Helper()
	regions, opt := o.layout()
	l, err := NewLog(regions, opt)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// logState is what a test can observe of a log without changing it.
type logState struct {
	next        int64
	first, last int64
	ok          bool
	n           int
	bytes       int64
}

func observeLog(l *Log) logState {
	f, last, ok := l.Range()
	return logState{l.Next(), f, last, ok, l.Len(), l.Bytes()}
}

// logRecords returns the differentials Records(from, to) emits.
func logRecords(l *Log, from, to int64) ([]Diff, error) {
	var ds []Diff
	err := l.Records(from, to, func(d Diff) error {
		d.Other = maps.Clone(d.Other)
		ds = append(ds, d)
		return nil
	})
	return ds, err
}

// sameDiff reports whether a and b carry the same step, hyper-parameters,
// record, other regions and seal.
func sameDiff(a, b Diff) bool {
	return a.Step == b.Step && a.Hyper == b.Hyper && a.Sum == b.Sum && bytes.Equal(a.Record, b.Record) &&
		maps.EqualFunc(a.Other, b.Other, bytes.Equal)
}

// TestNewLogRefuses: NewLog checks the layout as New does.
func TestNewLogRefuses(t *testing.T) {
	ok := []Region{{Name: "optimizer", Size: 8 + 12*10}, {Name: "meta", Size: 64}}
	for _, opt := range []Optimizer{
		{Region: "opt", N: 10, WOff: 8, MOff: 48, VOff: 88},
		{Region: "optimizer", N: 10, WOff: 8, MOff: 44, VOff: 88},
	} {
		if _, err := NewLog(ok, opt); err == nil {
			t.Fatalf("NewLog accepted %+v", opt)
		}
	}
	if _, err := NewLog(nil, Optimizer{}); err == nil {
		t.Fatal("NewLog accepted no regions")
	}
}

// TestLogAppendRefuses: a differential that is out of sequence, corrupt
// or does not fit is refused with the right error and leaves the log
// unchanged; the right one is then taken.
func TestLogAppendRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
		bend func(o *owner, d *Diff) // makes step 4's differential bad
	}{
		{"flipped byte", ErrCorrupt, func(o *owner, d *Diff) { d.Record = bytes.Clone(d.Record); d.Record[len(d.Record)/2] ^= 0x10 }},
		{"truncated record", ErrCorrupt, func(o *owner, d *Diff) { d.Record = d.Record[:len(d.Record)-8] }},
		{"no record", ErrCorrupt, func(o *owner, d *Diff) { d.Record = nil }},
		{"gap", ErrGap, func(o *owner, d *Diff) { *d = o.next(t) }},
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
			l := o.newLog(t)
			l.TruncateThrough(0)
			for range 3 {
				if err := l.Append(o.next(t)); err != nil {
					t.Fatal(err)
				}
			}
			d := o.next(t) // step 4
			good := d
			good.Other = maps.Clone(d.Other)
			before := observeLog(l)
			tc.bend(o, &d)
			d.Seal() // the owner sent it so: the checks past the sum
			if err := l.Append(d); !errors.Is(err, tc.want) {
				t.Fatalf("Append: %v, want %v", err, tc.want)
			}
			if after := observeLog(l); after != before {
				t.Fatalf("the log changed: %+v, was %+v", after, before)
			}
			if err := l.Append(good); err != nil {
				t.Fatalf("the right differential after the refused one: %v", err)
			}
			if _, last, _ := l.Range(); last != 4 {
				t.Fatalf("Range ends at %d, want 4", last)
			}
		})
	}
	t.Run("unsealed", func(t *testing.T) {
		o := newOwner(8, 50, lossless)
		l := o.newLog(t)
		d := o.next(t)
		d.Other[metaName] = bytes.Clone(d.Other[metaName])
		d.Other[metaName][3] ^= 1 // damaged after the owner sealed it
		if err := l.Append(d); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Append: %v, want ErrCorrupt", err)
		}
		if got := observeLog(l); got != (logState{next: -1}) {
			t.Fatalf("a refused first differential changed the log: %+v", got)
		}
	})
}

// TestLogSequence: an unanchored log takes any first step; then the
// steps follow; a step at or before the anchor and a held one resent are
// no-ops; Records gives back what Append took, and ErrGap for any range
// the log does not cover.
func TestLogSequence(t *testing.T) {
	o := newOwner(9, 100, int8Codec)
	for range 4 {
		o.next(t)
	}
	l := o.newLog(t)
	if got := l.Next(); got != -1 {
		t.Fatalf("Next of a new log = %d, want -1", got)
	}
	if _, _, ok := l.Range(); ok {
		t.Fatal("a new log has a range")
	}
	sent := map[int64]Diff{}
	for range 6 { // steps 5 to 10
		d := o.next(t)
		sent[d.Step] = d
		if err := l.Append(d); err != nil {
			t.Fatal(err)
		}
	}
	if f, last, ok := l.Range(); !ok || f != 5 || last != 10 || l.Next() != 11 || l.Len() != 6 {
		t.Fatalf("Range = %d, %d, %v, Next %d, Len %d; want 5, 10, true, 11, 6", f, last, ok, l.Next(), l.Len())
	}
	var want int64
	for _, d := range sent {
		want += int64(len(d.Record) + len(d.Other[metaName]))
	}
	if got := l.Bytes(); got != want {
		t.Fatalf("Bytes = %d, want %d", got, want)
	}
	before := observeLog(l)
	if err := l.Append(sent[7]); err != nil {
		t.Fatalf("a held step resent: %v", err)
	}
	l.TruncateThrough(6)
	if err := l.Append(sent[5]); err != nil {
		t.Fatalf("a step before the anchor: %v", err)
	}
	if got := observeLog(l); got.first != 7 || got.last != before.last || got.next != before.next {
		t.Fatalf("after TruncateThrough(6): %+v", got)
	}
	for _, tc := range []struct {
		from, to int64
		ok       bool
	}{
		{6, 10, true}, {7, 9, true}, {8, 8, true}, {20, 3, true},
		{5, 10, false}, {6, 11, false}, {11, 12, false}, {0, 3, false},
	} {
		ds, err := logRecords(l, tc.from, tc.to)
		if !tc.ok {
			if !errors.Is(err, ErrGap) || len(ds) != 0 {
				t.Errorf("Records(%d, %d): %d emitted, %v; want none and ErrGap", tc.from, tc.to, len(ds), err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Records(%d, %d): %v", tc.from, tc.to, err)
		}
		if len(ds) != int(max(0, tc.to-tc.from)) {
			t.Fatalf("Records(%d, %d) emitted %d", tc.from, tc.to, len(ds))
		}
		for i, d := range ds {
			if s := tc.from + 1 + int64(i); !sameDiff(d, sent[s]) {
				t.Fatalf("Records(%d, %d): step %d is not the differential taken", tc.from, tc.to, s)
			}
		}
	}
	for _, tc := range []struct {
		from, to int64
		want     bool
	}{{6, 10, true}, {9, 10, true}, {5, 10, false}, {6, 11, false}, {12, 11, true}} {
		if got := l.Holds(tc.from, tc.to); got != tc.want {
			t.Errorf("Holds(%d, %d) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
	stop := errors.New("stop")
	n := 0
	if err := l.Records(6, 10, func(Diff) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("Records with a failing emit: %v after %d calls, want stop after 1", err, n)
	}
}

var int8Codec = replay.Options{}

// TestLogTruncate: Truncate drops the steps after its step (ErrNotHeld
// before the anchor, unchanged), and the owner's new steps then follow;
// TruncateThrough past the last step anchors the log there, keeping T's
// continuity where it knows it.
func TestLogTruncate(t *testing.T) {
	o := newOwner(10, 80, lossless)
	l := o.newLog(t)
	l.TruncateThrough(0)
	for range 8 {
		if err := l.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	before := observeLog(l)
	if err := l.Truncate(-1); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Truncate before the anchor: %v, want ErrNotHeld", err)
	}
	if got := observeLog(l); got != before {
		t.Fatalf("a refused Truncate changed the log: %+v, was %+v", got, before)
	}
	if err := l.Truncate(5); err != nil {
		t.Fatal(err)
	}
	if got := l.Next(); got != 6 {
		t.Fatalf("Next after Truncate(5) = %d, want 6", got)
	}
	o.rewind(5)
	d6 := o.next(t)
	if err := l.Append(d6); err != nil {
		t.Fatalf("the new step 6 after the restart: %v", err)
	}
	l.TruncateThrough(6) // the anchor's T is known: step 7 must follow it
	if l.Len() != 0 || l.Next() != 7 || l.Bytes() != 0 {
		t.Fatalf("after TruncateThrough(6): %+v", observeLog(l))
	}
	d7 := o.next(t)
	bad := d7
	bad.Hyper.T += 2
	bad.Seal()
	if err := l.Append(bad); !errors.Is(err, ErrMismatch) {
		t.Fatalf("a T that does not follow the anchor's: %v, want ErrMismatch", err)
	}
	if err := l.Append(d7); err != nil {
		t.Fatal(err)
	}
	l.TruncateThrough(20) // past the last: the anchor moves on, T unknown
	if l.Next() != 21 || l.Len() != 0 {
		t.Fatalf("after TruncateThrough(20): %+v", observeLog(l))
	}
	for o.step < 20 {
		o.next(t)
	}
	if err := l.Append(o.next(t)); err != nil {
		t.Fatalf("step 21 after TruncateThrough(20): %v", err)
	}
	l.TruncateThrough(3) // before the anchor: nothing
	if f, last, ok := l.Range(); !ok || f != 21 || last != 21 {
		t.Fatalf("Range after TruncateThrough(3) = %d, %d, %v; want 21, 21, true", f, last, ok)
	}
}

// TestLogRecycle: the records TruncateThrough and Truncate drop go to
// recycle, but only once no Records call in progress can read them.
func TestLogRecycle(t *testing.T) {
	o := newOwner(11, 60, lossless)
	l := o.newLog(t)
	var got []*byte
	l.SetRecycle(func(rec []byte) { got = append(got, unsafe.SliceData(rec)) })
	recs := map[int64]*byte{}
	for range 10 {
		d := o.next(t)
		recs[d.Step] = unsafe.SliceData(d.Record)
		if err := l.Append(d); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, steps ...int64) {
		t.Helper()
		var want []*byte
		for _, s := range steps {
			want = append(want, recs[s])
		}
		if !slicesEqual(got, want) {
			t.Fatalf("%s handed back %d records, want those of steps %v", what, len(got), steps)
		}
		got = nil
	}
	l.TruncateThrough(2)
	expect("TruncateThrough(2)", 1, 2)
	if err := l.Truncate(9); err != nil {
		t.Fatal(err)
	}
	expect("Truncate(9)", 10)
	// A Records in progress: what is dropped meanwhile waits for it.
	err := l.Records(2, 9, func(d Diff) error {
		if d.Step == 3 {
			l.TruncateThrough(5)
			if err := l.Truncate(8); err != nil {
				return err
			}
			expect("while Records reads")
		}
		if unsafe.SliceData(d.Record) != recs[d.Step] {
			t.Errorf("step %d: Records emitted another record", d.Step)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	expect("the end of Records", 3, 4, 5, 9)
}

// TestLogReplaysOntoBase: a store given the owner's base at h and a log's
// differentials after it restores every later step bit for bit: the
// restore path of a rank whose base was decoded.
func TestLogReplaysOntoBase(t *testing.T) {
	o := newOwner(12, 400, lossless)
	l := o.newLog(t)
	for range 3 {
		o.next(t)
	}
	l.TruncateThrough(3)
	for range 9 {
		if err := l.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	s := o.newStore(t)
	sendBase(t, s, o, 3)
	if err := l.Records(3, 12, s.Append); err != nil {
		t.Fatal(err)
	}
	checkRange(t, s, o, 3, 12, defaults)
}

// FuzzLogAppend feeds Append differentials of random bytes and fields (a
// log-only holder takes them from the network): it must never panic, a
// refused one must leave the log unchanged, and an accepted one must be
// given back by Records as it was taken.
func FuzzLogAppend(f *testing.F) {
	o := newOwner(32, 16, lossless)
	good := o.next(f)
	f.Add(int64(1), 100, float32(1e-3), float32(0.01), good.Record, good.Other[metaName], false)
	f.Add(int64(1), 100, float32(1e-3), float32(0.01), good.Record, good.Other[metaName], true)
	int8, _ := replay.Compress(0, make([]float32, 16), replay.Options{})
	rec, _ := (&replay.Record{Step: 1, Tensors: []*replay.Tensor{int8}}).AppendBinary(nil)
	f.Add(int64(1), 100, float32(1e-3), float32(0), rec, make([]byte, metaSize), false)
	f.Add(int64(2), 1, float32(-1), float32(0), []byte("GRDF"), []byte{}, true)
	f.Fuzz(func(t *testing.T, step int64, tt int, lr, wd float32, record, meta []byte, anchored bool) {
		o := newOwner(32, 16, lossless)
		l := o.newLog(t)
		if anchored {
			l.TruncateThrough(0)
		}
		before := observeLog(l)
		d := Diff{Step: step, Hyper: replay.Hyper{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: wd, T: tt}, Record: record, Other: map[string][]byte{metaName: meta}}
		d.Seal()
		if err := l.Append(d); err != nil {
			if after := observeLog(l); after != before {
				t.Fatalf("a refused Append changed the log: %+v, was %+v", after, before)
			}
			return
		}
		if anchored && step <= 0 { // at or before the anchor: a no-op
			if after := observeLog(l); after != before {
				t.Fatalf("a differential before the anchor changed the log: %+v, was %+v", after, before)
			}
			return
		}
		ds, err := logRecords(l, step-1, step)
		if err != nil {
			t.Fatalf("Records of an accepted differential: %v", err)
		}
		if len(ds) != 1 || !sameDiff(ds[0], d) {
			t.Fatal("Records gave back another differential than the one taken")
		}
	})
}
