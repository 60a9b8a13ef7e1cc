package diffstore

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// checkSums returns a FoldChecked check that compares the folded state
// with the owner's true state's CRC32Cs, and counts its calls.
func checkSums(o *owner, regions []Region, calls *int) func(int64, [][]byte) error {
	return func(step int64, got [][]byte) error {
		*calls++
		want, ok := o.states[step]
		if !ok {
			return fmt.Errorf("no state of step %d", step)
		}
		for i, r := range regions {
			if g, w := crc32.Checksum(got[i], castagnoli), crc32.Checksum(want[r.Name], castagnoli); g != w {
				return fmt.Errorf("step %d region %q: CRC32C %08x, want %08x", step, r.Name, g, w)
			}
		}
		return nil
	}
}

// TestFoldChecked: a check that refuses leaves the base and the log as
// they were (every step still restores, bit for bit) and FoldChecked's
// error wraps ErrFoldRefused and the check's; a check that passes sees
// the owner's state at the fold's end, and the store then stands as after
// Fold, with the old base's buffer kept as the next fold's spare.
func TestFoldChecked(t *testing.T) {
	o := newOwner(60, 700, lossless)
	s := o.newStore(t)
	regions, _ := o.layout()
	sendBase(t, s, o, 0)
	for range 9 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	errNo := errors.New("no")
	var seen int64
	err := s.FoldChecked(5, defaults, func(step int64, got [][]byte) error {
		seen = step
		for i, r := range regions {
			if !bytes.Equal(got[i], o.states[step][r.Name]) {
				t.Errorf("the check got region %q of step %d unlike the owner's", r.Name, step)
			}
		}
		return errNo
	})
	if !errors.Is(err, ErrFoldRefused) || !errors.Is(err, errNo) || seen != 5 {
		t.Fatalf("FoldChecked with a refusing check = %v (checked step %d), want ErrFoldRefused and the check's error at step 5", err, seen)
	}
	checkRange(t, s, o, 0, 9, defaults)
	if st := s.Stats(); st.Folds != 0 || st.FoldsRejected != 1 || st.SpareBytes != regions[1].Size {
		t.Fatalf("after a refused fold: Stats = %+v, want no fold, one rejected, the spare kept", st)
	}

	calls := 0
	if err := s.FoldChecked(6, defaults, checkSums(o, regions, &calls)); err != nil || calls != 1 {
		t.Fatalf("FoldChecked = %v after %d checks", err, calls)
	}
	checkRange(t, s, o, 6, 9, defaults)
	if st := s.Stats(); st.Folds != 1 || st.FoldedSteps != 6 || st.LogLen != 3 || st.SpareBytes != regions[1].Size {
		t.Fatalf("after a checked fold: Stats = %+v", st)
	}
	// G bounds it as it bounds Fold; nothing to fold calls no check.
	s.SetG(7)
	if err := s.FoldChecked(9, defaults, checkSums(o, regions, &calls)); err != nil || calls != 2 {
		t.Fatalf("FoldChecked = %v after %d checks", err, calls)
	}
	checkRange(t, s, o, 7, 9, defaults)
	if err := s.FoldChecked(9, defaults, checkSums(o, regions, &calls)); err != nil || calls != 2 {
		t.Fatalf("FoldChecked with nothing to fold = %v after %d checks", err, calls)
	}
}

// TestFoldCheckedRefreshWins: a refresh committed while a checked fold
// replays wins (its base is later), the check passing or not; a lossy log
// is folded no further than a refresh in progress, as by Fold.
func TestFoldCheckedRefreshWins(t *testing.T) {
	o := newOwner(61, 500, lossless)
	s := o.newStore(t)
	regions, _ := o.layout()
	sendBase(t, s, o, 0)
	for range 8 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	s.testFoldHook = func() { sendBase(t, s, o, 7) }
	calls := 0
	if err := s.FoldChecked(4, defaults, checkSums(o, regions, &calls)); err != nil || calls != 1 {
		t.Fatalf("FoldChecked = %v after %d checks", err, calls)
	}
	s.testFoldHook = nil
	checkRange(t, s, o, 7, 8, defaults)
	if st := s.Stats(); st.Refreshes != 2 {
		t.Fatalf("Stats = %+v, want the refresh installed", st)
	}

	lo := newOwner(62, 500, replay.Options{})
	ls := lo.newStore(t)
	sendBase(t, ls, lo, 0)
	for range 6 {
		if err := ls.Append(lo.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ls.BeginBase(3); err != nil {
		t.Fatal(err)
	}
	var step int64
	if err := ls.FoldChecked(6, defaults, func(s int64, _ [][]byte) error { step = s; return nil }); err != nil || step != 3 {
		t.Fatalf("lossy FoldChecked with a refresh at 3 in progress = %v, folded to %d", err, step)
	}
	if f, l, _ := ls.Range(); f != 3 || l != 6 {
		t.Fatalf("Range = %d, %d; want 3, 6", f, l)
	}
}

// TestRecycle: Fold, FoldChecked and Truncate hand back exactly the
// records they drop, each once; a refresh's commit and Append's no-ops
// hand back none.
func TestRecycle(t *testing.T) {
	o := newOwner(63, 300, lossless)
	s := o.newStore(t)
	regions, _ := o.layout()
	var got []*byte
	s.SetRecycle(func(rec []byte) { got = append(got, unsafe.SliceData(rec)) })
	sendBase(t, s, o, 0)
	recs := map[int64]*byte{}
	for range 12 {
		d := o.next(t)
		recs[d.Step] = unsafe.SliceData(d.Record)
		if err := s.Append(d); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, steps ...int64) {
		t.Helper()
		var want []*byte
		for _, st := range steps {
			want = append(want, recs[st])
		}
		if !slicesEqual(got, want) {
			t.Fatalf("%s handed back %d records, want those of steps %v", what, len(got), steps)
		}
		got = nil
	}
	if err := s.Fold(3, defaults); err != nil {
		t.Fatal(err)
	}
	expect("Fold(3)", 1, 2, 3)
	calls := 0
	if err := s.FoldChecked(5, defaults, checkSums(o, regions, &calls)); err != nil {
		t.Fatal(err)
	}
	expect("FoldChecked(5)", 4, 5)
	if err := s.FoldChecked(7, defaults, func(int64, [][]byte) error { return errors.New("no") }); err == nil {
		t.Fatal("a refused FoldChecked returned nil")
	}
	expect("a refused FoldChecked")
	if err := s.Truncate(10); err != nil {
		t.Fatal(err)
	}
	expect("Truncate(10)", 11, 12)
	sendBase(t, s, o, 8) // drops steps 6 to 8 from the log: a Restore may read them
	expect("a refresh's commit")
	checkRange(t, s, o, 8, 10, defaults)
}

func slicesEqual(a, b []*byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestReuseUnderRestores runs the receive path (Appends into recycled
// record buffers, base refreshes into reused buffers), checked folds and
// Restores and RestorePieces side by side, with every buffer the store
// gives back or keeps for reuse overwritten at once (the recycle function
// and testPoison): a buffer handed back while a Restore could still read
// it makes that restore differ from the owner's state, and races under
// -race.
func TestReuseUnderRestores(t *testing.T) {
	const steps = 160
	o := newOwner(64, 1500, lossless)
	regions, _ := o.layout()
	diffs := make([]Diff, steps+1)
	for i := 1; i <= steps; i++ {
		diffs[i] = o.next(t)
	}
	s := o.newStore(t)
	s.testPoison = true
	var poolMu sync.Mutex
	var pool [][]byte
	recycled := 0
	s.SetRecycle(func(rec []byte) {
		for i := range rec {
			rec[i] = 0x5A
		}
		poolMu.Lock()
		recycled++
		if len(pool) < 4 {
			pool = append(pool, rec)
		}
		poolMu.Unlock()
	})
	sendBase(t, s, o, 0)

	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, 8)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	// The folds, as a holder's fold goroutine runs them.
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			_, last, _ := s.Range()
			calls := 0
			if err := s.FoldChecked(last-2, defaults, checkSums(o, regions, &calls)); err != nil {
				fail(err)
				return
			}
		}
	})
	// Restores, whole and in pieces, of random steps in range.
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			for k := 0; ; k++ {
				select {
				case <-done:
					return
				default:
				}
				first, last, _ := s.Range()
				step := first + rng.Int64N(last-first+1)
				var got map[string][]byte
				var err error
				if k%2 == 0 {
					got, err = restore(s, step, defaults)
				} else {
					got, err = restorePieces(s, step)
				}
				if errors.Is(err, ErrNotHeld) {
					continue // a fold passed it meanwhile
				}
				if err != nil {
					fail(err)
					return
				}
				for name, want := range o.states[step] {
					if !bytes.Equal(got[name], want) {
						fail(fmt.Errorf("restore of step %d (%d): region %q differs at byte %d", step, k%2, name, firstDiff(got[name], want)))
						return
					}
				}
			}
		})
	}
	// The receive path.
	for step := int64(1); step <= steps; step++ {
		d := diffs[step]
		poolMu.Lock()
		var buf []byte
		if n := len(pool); n > 0 && len(pool[n-1]) == len(d.Record) {
			buf, pool = pool[n-1], pool[:n-1]
		}
		poolMu.Unlock()
		if buf == nil {
			buf = make([]byte, len(d.Record))
		}
		copy(buf, d.Record)
		d.Record = buf
		if err := s.Append(d); err != nil {
			t.Fatal(err)
		}
		if step%4 == 0 {
			// Let the folds keep up (a real condition, with a deadline).
			deadline := time.Now().Add(20 * time.Second)
			for first, _, _ := s.Range(); first < step-6; first, _, _ = s.Range() {
				if time.Now().After(deadline) {
					t.Fatalf("the folds did not reach step %d", step-6)
				}
				runtime.Gosched()
			}
		}
		if step%13 == 0 {
			// Installed, or (every other one) superseded by a fold.
			tryBase(t, s, o, step-3, step%26 == 0)
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	close(done)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	first, last, _ := s.Range()
	checkRange(t, s, o, first, last, defaults)
	st := s.Stats()
	t.Logf("%d records recycled; %+v", recycled, st)
	if recycled < steps/3 || st.Folds < steps/16 || st.Refreshes < 2 || st.RefreshesSuperseded < 2 {
		t.Fatalf("nothing recycled (%d) or folded: the test proves nothing; %+v", recycled, st)
	}
}

// tryBase sends a base refresh at step, as sendBase does, unless the
// store's base is past it already; if passed, it commits it only once
// the base is past it (the refresh is verified and dropped).
func tryBase(t *testing.T, s *Store, o *owner, step int64, passed bool) {
	t.Helper()
	w, err := s.BeginBase(step)
	if errors.Is(err, ErrStale) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	st := o.states[step]
	writeChunks(t, w, st, 1)
	if passed {
		// Commit once a fold passed the refresh's step (the folds go on).
		deadline := time.Now().Add(20 * time.Second)
		for first, _, _ := s.Range(); first <= step; first, _, _ = s.Range() {
			if time.Now().After(deadline) {
				t.Fatalf("the folds did not pass step %d", step)
			}
			runtime.Gosched()
		}
	}
	if err := w.Commit(step, sums(st)); err != nil {
		t.Fatal(err)
	}
}

// restorePieces assembles RestorePieces' answer of step.
func restorePieces(s *Store, step int64) (map[string][]byte, error) {
	got := map[string][]byte{}
	for _, r := range s.regions {
		got[r.Name] = make([]byte, r.Size)
	}
	err := s.RestorePieces(step, 1000, defaults, func(region int, off int64, b []byte) error {
		copy(got[s.regions[region].Name][off:], b)
		return nil
	})
	return got, err
}

// TestRefreshesAndFoldsShareSpares: checked folds going on while base
// refreshes arrive (a lossless log: each refresh is verified and dropped
// as the folds pass it) cycle through a bounded set of optimizer-region
// buffers: the base, a fold's spare and a refresh's. A store that kept
// one spare allocated a fresh region for every refresh or fold that found
// it taken (fresh memory is faulted in again each time).
func TestRefreshesAndFoldsShareSpares(t *testing.T) {
	o := newOwner(64, 500, lossless)
	s := o.newStore(t)
	regions, _ := o.layout()
	opt := 1 // the optimizer region's index in regions
	sendBase(t, s, o, 0)
	seen := map[*byte]bool{}
	note := func(b []byte) {
		if len(b) > 0 {
			seen[unsafe.SliceData(b)] = true
		}
	}
	var calls int
	for cycle := range 6 {
		for range 4 {
			if err := s.Append(o.next(t)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.FoldChecked(o.step, defaults, checkSums(o, regions, &calls)); err != nil {
			t.Fatal(err)
		}
		// A refresh of the step folded to, arriving while the log goes on
		// and another checked fold passes it.
		b := o.step
		w, err := s.BeginBase(b)
		if err != nil {
			t.Fatal(err)
		}
		note(w.bufs[opt])
		st := o.states[b]
		writeChunks(t, w, st, 2)
		for range 3 {
			if err := s.Append(o.next(t)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.FoldChecked(o.step, defaults, checkSums(o, regions, &calls)); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		note(s.base.data[opt])
		s.mu.Unlock()
		if err := w.Commit(b, sums(st)); err != nil {
			t.Fatal(err)
		}
		checkRange(t, s, o, o.step, o.step, defaults)
		if len(seen) > 3 {
			t.Fatalf("cycle %d: %d optimizer buffers used, want at most 3 (base, a fold's spare, a refresh's)", cycle, len(seen))
		}
	}
	if st := s.Stats(); st.RefreshesSuperseded != 6 {
		t.Fatalf("%d refreshes verified and dropped, want 6: %+v", st.RefreshesSuperseded, st)
	}
}
