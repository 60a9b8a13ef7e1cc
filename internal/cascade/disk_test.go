package cascade_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/replay"
)

const testRank = 3

// regionsOf returns o's regions as the manifest lists them.
func regionsOf(o *difflogtest.Owner) []durable.Region {
	rs, _ := o.Layout()
	out := make([]durable.Region, len(rs))
	for i, r := range rs {
		out[i] = durable.Region{Name: r.Name, Size: r.Size}
	}
	return out
}

// saveBase writes o's state at step as testRank's durable version.
func saveBase(t *testing.T, dir string, o *difflogtest.Owner, step int64) {
	t.Helper()
	s, err := durable.Open(dir, testRank, regionsOf(o), durable.Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Save(context.Background(), step, o.State(step), o.Sums(step), nil); err != nil {
		t.Fatal(err)
	}
}

// appendLog writes o's records of steps from to to in batches of batch.
func appendLog(t *testing.T, dir string, o *difflogtest.Owner, from, to int64, batch int) {
	t.Helper()
	for a := from; a <= to; a += int64(batch) {
		b := min(a+int64(batch)-1, to)
		var recs [][]byte
		for s := a; s <= b; s++ {
			recs = append(recs, o.Encoded(s))
		}
		if err := durable.AppendBatch(dir, testRank, a, b, recs); err != nil {
			t.Fatal(err)
		}
	}
}

func buffers(rs []durable.Region) [][]byte {
	out := make([][]byte, len(rs))
	for i, r := range rs {
		out[i] = make([]byte, r.Size)
	}
	return out
}

// checkState fails unless got is o's state at step, bit for bit.
func checkState(t *testing.T, o *difflogtest.Owner, step int64, got [][]byte) {
	t.Helper()
	want := o.State(step)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("region %d differs from the owner's at step %d", i, step)
		}
	}
}

// TestLoadIsTheOwnersState: a rank's state rebuilt from the durable tier
// (its base, and in diff mode its differentials replayed) is the state
// the owner committed, bit for bit, for every number of differentials.
func TestLoadIsTheOwnersState(t *testing.T) {
	for _, tc := range []struct {
		name        string
		base, reach int64
		batch       int
		target      int64
	}{
		{"full mode: the base alone", 5, 5, 1, 5},
		{"one differential", 5, 6, 4, 6},
		{"16 differentials in batches of 4", 5, 21, 4, 21},
		{"64 differentials, one batch", 0, 64, 64, 64},
		{"70 differentials: two fused passes", 2, 72, 8, 72},
		{"to a step inside the log", 5, 30, 8, 17},
		{"to the base with a log after it", 5, 30, 8, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := difflogtest.NewOwner(7, 3001, 11, replay.Options{Lossless: true}, false)
			o.Advance(int(tc.reach))
			dir := t.TempDir()
			saveBase(t, dir, o, tc.base)
			if tc.reach > tc.base {
				appendLog(t, dir, o, tc.base+1, tc.reach, tc.batch)
			}
			rs := regionsOf(o)
			sp, stop := cascade.Reach(dir, testRank, rs, tc.base)
			if stop != nil || sp != (cascade.Span{From: tc.base, To: tc.reach}) {
				t.Fatalf("Reach: %+v (%v), want [%d, %d]", sp, stop, tc.base, tc.reach)
			}
			dst := buffers(rs)
			got, err := cascade.Load(context.Background(), dir, testRank, rs, tc.base, tc.target, dst, replay.ReplayOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Replayed != int(tc.target-tc.base) || !got.Exact {
				t.Errorf("Load: %+v, want %d replayed, exact", got, tc.target-tc.base)
			}
			checkState(t, o, tc.target, dst)
		})
	}
}

// TestLoadLossy: a lossy log replays to an approximation, said so; the
// regions carried whole are exact.
func TestLoadLossy(t *testing.T) {
	o := difflogtest.NewOwner(8, 2000, 1, replay.Options{}, false) // int8 below 100K elements
	o.Advance(6)
	dir := t.TempDir()
	saveBase(t, dir, o, 2)
	appendLog(t, dir, o, 3, 6, 2)
	rs := regionsOf(o)
	dst := buffers(rs)
	got, err := cascade.Load(context.Background(), dir, testRank, rs, 2, 6, dst, replay.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Exact || got.Replayed != 4 {
		t.Errorf("Load: %+v, want 4 replayed, inexact", got)
	}
	if !bytes.Equal(dst[1], o.State(6)[1]) {
		t.Error("meta differs from the owner's")
	}
}

// TestReachStops: the differentials stop at the first one that is
// missing or does not verify; Load past that fails, never rebuilding
// another state.
func TestReachStops(t *testing.T) {
	const base, reach = 4, 20
	for _, tc := range []struct {
		name   string
		params bool
		edit   func(t *testing.T, dir string, o *difflogtest.Owner)
		to     int64 // Reach's end
		stop   error
		msg    string
	}{
		{
			name: "a batch lost (a gap)",
			edit: func(t *testing.T, dir string, o *difflogtest.Owner) {
				rm(t, dir, "diff.9-12")
			},
			to: 8, stop: durable.ErrGap,
		},
		{
			name: "a batch corrupt on disk",
			edit: func(t *testing.T, dir string, o *difflogtest.Owner) {
				flip(t, filepath.Join(dir, "r3", "diff.13-16"), 200)
			},
			to: 12, stop: durable.ErrCorrupt,
		},
		{
			name: "a record whose seal is not the owner's",
			edit: func(t *testing.T, dir string, o *difflogtest.Owner) {
				r := *o.Record(10)
				r.Diff.Sum ^= 1
				rewrite(t, dir, o, 9, 12, 10, &r)
			},
			to: 9, msg: "seal",
		},
		{
			name: "a record of another layout",
			edit: func(t *testing.T, dir string, o *difflogtest.Owner) {
				r := *o.Record(10)
				r.Regions = append([]difflog.Region(nil), r.Regions...)
				r.Regions[1].Name = "other"
				r.Diff.Other = map[string][]byte{"other": r.Diff.Other["meta"]}
				r.Diff.Seal()
				rewrite(t, dir, o, 9, 12, 10, &r)
			},
			to: 9, msg: "the rank's",
		},
		{
			name: "Adam's step count skips",
			edit: func(t *testing.T, dir string, o *difflogtest.Owner) {
				r := *o.Record(10)
				r.Diff.Hyper.T++
				r.Diff.Seal()
				rewrite(t, dir, o, 9, 12, 10, &r)
			},
			to: 9, msg: "Adam step",
		},
		{
			name:   "a region the differentials do not carry (params)",
			params: true,
			to:     base, msg: `"params" is not in its differentials`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := difflogtest.NewOwner(9, 500, 1, replay.Options{Lossless: true}, tc.params)
			o.Advance(reach)
			dir := t.TempDir()
			saveBase(t, dir, o, base)
			appendLog(t, dir, o, base+1, reach, 4)
			if tc.edit != nil {
				tc.edit(t, dir, o)
			}
			rs := regionsOf(o)
			sp, stop := cascade.Reach(dir, testRank, rs, base)
			if sp.To != tc.to {
				t.Errorf("Reach to %d (%v), want %d", sp.To, stop, tc.to)
			}
			if stop == nil || tc.stop != nil && !errors.Is(stop, tc.stop) || !strings.Contains(stop.Error(), tc.msg) {
				t.Errorf("Reach stopped: %v, want %v saying %q", stop, tc.stop, tc.msg)
			}
			dst := buffers(rs)
			if _, err := cascade.Load(context.Background(), dir, testRank, rs, base, tc.to, dst, replay.ReplayOptions{}); err != nil {
				t.Errorf("Load to the reach %d: %v", tc.to, err)
			} else {
				checkState(t, o, tc.to, dst)
			}
			if _, err := cascade.Load(context.Background(), dir, testRank, rs, base, tc.to+1, buffers(rs), replay.ReplayOptions{}); !errors.Is(err, cascade.ErrDisk) {
				t.Errorf("Load past the reach: %v, want ErrDisk", err)
			}
		})
	}
}

// TestLoadRefuses: a base that does not verify, or differentials of
// another history (each valid, but not the steps that followed this
// base), are errors; never another state.
func TestLoadRefuses(t *testing.T) {
	t.Run("base corrupt", func(t *testing.T) {
		o := difflogtest.NewOwner(10, 3000, 1, replay.Options{Lossless: true}, false)
		o.Advance(3)
		dir := t.TempDir()
		saveBase(t, dir, o, 3)
		v, err := durable.List(dir)
		if err != nil {
			t.Fatal(err)
		}
		flipped := 0
		for _, rl := range v.Ranks {
			for _, b := range rl.Bases {
				if rl.Rank == testRank && b.State == durable.StateComplete {
					flip(t, b.Path, 4096*2+100)
					flipped++
				}
			}
		}
		if flipped != 1 {
			t.Fatalf("%d complete versions of rank %d, want 1", flipped, testRank)
		}
		rs := regionsOf(o)
		_, err = cascade.Load(context.Background(), dir, testRank, rs, 3, 3, buffers(rs), replay.ReplayOptions{})
		if !errors.Is(err, cascade.ErrDisk) || !errors.Is(err, durable.ErrCorrupt) {
			t.Errorf("Load: %v, want ErrDisk and durable.ErrCorrupt", err)
		}
	})
	t.Run("differentials of another history", func(t *testing.T) {
		o := difflogtest.NewOwner(11, 300, 1, replay.Options{Lossless: true}, false)
		other := difflogtest.NewOwner(12, 300, 1, replay.Options{Lossless: true}, false)
		o.Advance(5)
		other.Advance(9)
		dir := t.TempDir()
		saveBase(t, dir, o, 5)
		appendLog(t, dir, other, 6, 9, 2) // the same layout and step counts, other gradients
		rs := regionsOf(o)
		if sp, _ := cascade.Reach(dir, testRank, rs, 5); sp.To != 9 {
			t.Fatalf("Reach to %d: the records verify one by one", sp.To)
		}
		_, err := cascade.Load(context.Background(), dir, testRank, rs, 5, 9, buffers(rs), replay.ReplayOptions{})
		if !errors.Is(err, cascade.ErrDisk) || !strings.Contains(err.Error(), "the owner committed") {
			t.Errorf("Load: %v, want the CRC32C check to refuse it", err)
		}
	})
	t.Run("target before base", func(t *testing.T) {
		if _, err := cascade.Load(context.Background(), t.TempDir(), 0, nil, 5, 4, nil, replay.ReplayOptions{}); err == nil {
			t.Error("accepted")
		}
	})
}

// TestLoadBadRecordAfterTargetInItsBatch: a record after the target in
// the target's own batch is checked (its CRC32C) with the rest of the
// batch: one that does not verify fails Load, as Load's comment says.
func TestLoadBadRecordAfterTargetInItsBatch(t *testing.T) {
	o := difflogtest.NewOwner(11, 500, 1, replay.Options{Lossless: true}, false)
	o.Advance(8)
	dir := t.TempDir()
	saveBase(t, dir, o, 0)
	appendLog(t, dir, o, 1, 8, 4) // 1-4, 5-8
	rs := regionsOf(o)
	p := filepath.Join(dir, "r3", "diff.5-8")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	flip(t, p, fi.Size()-1) // step 8's record
	if _, err := cascade.Load(context.Background(), dir, testRank, rs, 0, 6, buffers(rs), replay.ReplayOptions{}); !errors.Is(err, cascade.ErrDisk) || !errors.Is(err, durable.ErrCorrupt) {
		t.Errorf("Load to 6: %v, want ErrDisk and durable.ErrCorrupt (step 8's record)", err)
	}
	dst := buffers(rs)
	if _, err := cascade.Load(context.Background(), dir, testRank, rs, 0, 4, dst, replay.ReplayOptions{}); err != nil {
		t.Errorf("Load to 4, before the batch: %v", err)
	} else {
		checkState(t, o, 4, dst)
	}
}

func rm(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(dir, "r3", name)); err != nil {
		t.Fatal(err)
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// rewrite writes the batch of steps a to b again with step s's record
// replaced by r.
func rewrite(t *testing.T, dir string, o *difflogtest.Owner, a, b, s int64, r *difflog.Record) {
	t.Helper()
	var recs [][]byte
	for x := a; x <= b; x++ {
		rec := o.Encoded(x)
		if x == s {
			var err error
			if rec, err = difflog.Encode(nil, r); err != nil {
				t.Fatal(err)
			}
		}
		recs = append(recs, rec)
	}
	if err := durable.AppendBatch(dir, testRank, a, b, recs); err != nil {
		t.Fatal(err)
	}
}
