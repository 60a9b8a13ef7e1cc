package diffstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// concat returns the owner's regions at step concatenated in the order
// of its layout, as ReadBase reads them.
func (o *owner) concat(step int64) []byte {
	regions, _ := o.layout()
	var b []byte
	for _, r := range regions {
		b = append(b, o.states[step][r.Name]...)
	}
	return b
}

// checkReadBase checks ReadBase(step) over ranges that cross the regions'
// boundaries and the end (zeros past it).
func checkReadBase(t *testing.T, s *Store, o *owner, step int64) {
	t.Helper()
	want := o.concat(step)
	size := int64(len(want))
	for _, r := range [][2]int64{{0, size}, {0, 1}, {metaSize - 3, 7}, {size - 5, 40}, {size, 9}, {size + 100, 3}, {17, 0}} {
		dst := bytes.Repeat([]byte{0xEE}, int(r[1]))
		if err := s.ReadBase(step, r[0], dst); err != nil {
			t.Fatalf("ReadBase(%d, %d, %d bytes): %v", step, r[0], r[1], err)
		}
		exp := make([]byte, r[1])
		if r[0] < size {
			copy(exp, want[r[0]:])
		}
		if !bytes.Equal(dst, exp) {
			t.Fatalf("ReadBase(%d, %d, %d bytes) differs from the owner's bytes at byte %d", step, r[0], r[1], firstDiff(dst, exp))
		}
	}
}

// TestReadBase: ReadBase reads the base at its step, and a verified
// refresh that waits for G at its; any other step (a refresh not
// verified, a base a fold moved on, a lossy fold's) is ErrNotHeld.
func TestReadBase(t *testing.T) {
	o := newOwner(70, 300, lossless)
	s := o.newStore(t)
	notHeld := func(step int64) {
		t.Helper()
		if err := s.ReadBase(step, 0, make([]byte, 10)); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("ReadBase(%d): %v, want ErrNotHeld", step, err)
		}
	}
	notHeld(0)
	sendBase(t, s, o, 0)
	checkReadBase(t, s, o, 0)
	if err := s.ReadBase(0, -1, make([]byte, 1)); !errors.Is(err, ErrMismatch) {
		t.Fatalf("ReadBase from offset -1: %v, want ErrMismatch", err)
	}
	for range 8 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	notHeld(3)
	s.SetG(2) // pinned below the refresh
	w, err := s.BeginBase(6)
	if err != nil {
		t.Fatal(err)
	}
	writeChunks(t, w, o.states[6], 3)
	notHeld(6) // written, not verified
	if err := w.Commit(6, sums(o.states[6])); err != nil {
		t.Fatal(err)
	}
	checkReadBase(t, s, o, 0) // the base stays until G reaches 6
	checkReadBase(t, s, o, 6) // the verified refresh
	s.SetG(6)                 // installs it
	notHeld(0)
	checkReadBase(t, s, o, 6)
	if err := s.Fold(8, defaults); err != nil {
		t.Fatal(err)
	}
	checkReadBase(t, s, o, 6) // G is 6: the fold stopped there
	s.SetG(8)
	if err := s.Fold(8, defaults); err != nil {
		t.Fatal(err)
	}
	notHeld(6)
	checkReadBase(t, s, o, 8) // folded from lossless records: exact

	lossy := newOwner(71, 300, int8Codec)
	ls := lossy.newStore(t)
	sendBase(t, ls, lossy, 0)
	if err := ls.Append(lossy.next(t)); err != nil {
		t.Fatal(err)
	}
	if err := ls.Fold(1, defaults); err != nil {
		t.Fatal(err)
	}
	if err := ls.ReadBase(1, 0, make([]byte, 10)); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("ReadBase of a base folded from lossy records: %v, want ErrNotHeld", err)
	}
}

// TestReadBaseUnderRefreshes: ReadBase of the base and of verified
// refreshes while refreshes are received, verified, installed and
// aborted, with every buffer the store takes back overwritten
// (testPoison): a read that succeeds gives the owner's bytes at its step.
func TestReadBaseUnderRefreshes(t *testing.T) {
	const steps = 60
	o := newOwner(72, 700, lossless)
	for range steps {
		o.next(t)
	}
	s := o.newStore(t)
	s.testPoison = true
	sendBase(t, s, o, 0)
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, 4)
	var cur, reads atomic.Int64 // the refresh's step; the reads that found their step
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 11))
			for {
				select {
				case <-done:
					return
				default:
				}
				step := cur.Load() - rng.Int64N(2) // the refresh's, or the base's
				if step < 0 {
					continue // before the first refresh: no base before step 0
				}
				want := o.concat(step)
				off := rng.Int64N(int64(len(want)))
				dst := make([]byte, 1+rng.IntN(len(want)))
				err := s.ReadBase(step, off, dst)
				if errors.Is(err, ErrNotHeld) {
					continue
				}
				exp := make([]byte, len(dst))
				copy(exp, want[off:])
				if err != nil || !bytes.Equal(dst, exp) {
					errs <- fmt.Errorf("ReadBase(%d, %d, %d bytes): %v, or bytes that differ at %d", step, off, len(dst), err, firstDiff(dst, exp))
					return
				}
				reads.Add(1)
			}
		})
	}
	for b := int64(1); b <= steps; b++ {
		w, err := s.BeginBase(b)
		if err != nil {
			t.Fatal(err)
		}
		cur.Store(b)
		writeChunks(t, w, o.states[b], 5)
		if b%5 == 0 {
			w.Abort()
			continue
		}
		if err := w.Commit(b, sums(o.states[b])); err != nil {
			t.Fatal(err)
		}
		// Let the readers find the verified refresh before it installs.
		for n, until := reads.Load(), time.Now().Add(10*time.Second); reads.Load() < n+2 && time.Now().Before(until); {
			runtime.Gosched()
		}
		if b%3 != 0 {
			s.SetG(b) // installs it; every third waits for the next
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if reads.Load() == 0 {
		t.Fatal("no read found its step")
	}
	t.Logf("reads that found their step: %d", reads.Load())
}

// TestStoreRecords: Records gives back the differentials after the base as
// Append took them, and ErrGap for any step it does not hold after it.
func TestStoreRecords(t *testing.T) {
	o := newOwner(73, 200, lossless)
	s := o.newStore(t)
	if err := s.Records(0, 1, func(Diff) error { return nil }); !errors.Is(err, ErrGap) {
		t.Fatalf("Records without a base: %v, want ErrGap", err)
	}
	sendBase(t, s, o, 0)
	sent := map[int64]Diff{}
	for range 9 {
		d := o.next(t)
		sent[d.Step] = d
		if err := s.Append(d); err != nil {
			t.Fatal(err)
		}
	}
	s.SetG(3)
	if err := s.Fold(3, defaults); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		from, to int64
		ok       bool
	}{{3, 9, true}, {5, 6, true}, {9, 9, true}, {2, 9, false}, {3, 10, false}, {0, 1, false}} {
		var got []Diff
		err := s.Records(tc.from, tc.to, func(d Diff) error { got = append(got, d); return nil })
		if !tc.ok {
			if !errors.Is(err, ErrGap) || len(got) != 0 {
				t.Errorf("Records(%d, %d): %d emitted, %v; want none and ErrGap", tc.from, tc.to, len(got), err)
			}
			continue
		}
		if err != nil || len(got) != int(tc.to-tc.from) {
			t.Fatalf("Records(%d, %d): %d emitted, %v", tc.from, tc.to, len(got), err)
		}
		for i, d := range got {
			if s := tc.from + 1 + int64(i); !sameDiff(d, sent[s]) {
				t.Fatalf("Records(%d, %d): step %d is not the differential taken", tc.from, tc.to, s)
			}
		}
	}
	// Replayed onto another store's base, they restore the owner's steps.
	r := o.newStore(t)
	sendBase(t, r, o, 3)
	if err := s.Records(3, 9, r.Append); err != nil {
		t.Fatal(err)
	}
	checkRange(t, r, o, 3, 9, defaults)
}
