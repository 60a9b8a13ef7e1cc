package diffstore

import (
	"bytes"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/replay"
)

// TestAppendDoesNotWaitForFold holds a Fold in the middle of its replay
// (a hook only tests set) and checks that the receive path — Append,
// Range, Exact, Stats, a base refresh — goes on meanwhile: if any of them
// waited for the fold, the test would fail at a deadline. A Restore started
// meanwhile waits, and then sees the folded store.
func TestAppendDoesNotWaitForFold(t *testing.T) {
	o := newOwner(20, 3000, lossless)
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	for range 10 {
		if err := s.Append(o.next(t)); err != nil {
			t.Fatal(err)
		}
	}
	entered, release := make(chan struct{}), make(chan struct{})
	s.testFoldHook = func() {
		close(entered)
		<-release
	}
	folded := make(chan error, 1)
	go func() { folded <- s.Fold(8, replay.ReplayOptions{}) }()
	<-entered

	receive := func() {
		for step := int64(11); step <= 20; step++ {
			if err := s.Append(o.next(t)); err != nil {
				t.Error(err)
				return
			}
			if f, l, ok := s.Range(); !ok || f != 0 || l != step {
				t.Errorf("Range during the fold = %d, %d, %v; want 0, %d", f, l, ok, step)
			}
		}
		if !s.Exact(20) || s.Stats().LogLen != 20 {
			t.Errorf("Exact(20) = %v, Stats = %+v", s.Exact(20), s.Stats())
		}
		w, err := s.BeginBase(15)
		if err != nil {
			t.Error(err)
			return
		}
		for _, c := range chunks(o.rng, o.states[15]) {
			if err := w.Write(c.region, c.off, c.b); err != nil {
				t.Error(err)
				return
			}
		}
		w.Abort()
	}
	// The receive path runs while the fold is held; a deadline (not a
	// timing assertion: it only keeps a regression from hanging the run)
	// reports it if it waits for the fold.
	received := make(chan struct{})
	go func() {
		defer close(received)
		receive()
	}()
	select {
	case <-received:
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("the receive path waited for the fold (no progress in a minute)")
	}
	if t.Failed() {
		close(release)
		return
	}

	restored := make(chan error, 1)
	var got map[string][]byte
	go func() {
		var err error
		got, err = restore(s, 20, replay.ReplayOptions{})
		restored <- err
	}()
	close(release)
	if err := <-folded; err != nil {
		t.Fatal(err)
	}
	if err := <-restored; err != nil {
		t.Fatal(err)
	}
	for name, want := range o.states[20] {
		if !bytes.Equal(got[name], want) {
			t.Fatalf("the restore beside the fold: region %q differs", name)
		}
	}
	checkRange(t, s, o, 8, 20, replay.ReplayOptions{})
}

// TestConcurrentAppendFoldRestore runs the store's users side by side, as
// a holder does (run it with -race): one goroutine appends and reads
// Range, one folds, one restores random steps in range (Restore and
// RestorePieces in turn) and checks them bit for bit, one sends base
// refreshes.
func TestConcurrentAppendFoldRestore(t *testing.T) {
	const steps = 200
	o := newOwner(21, 1000, lossless)
	diffs := make([]Diff, steps+1)
	for i := 1; i <= steps; i++ {
		diffs[i] = o.next(t) // o.states is read-only from here on
	}
	s := o.newStore(t)
	sendBase(t, s, o, 0)
	opt := replay.ReplayOptions{Workers: 1, Block: 256}

	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	wg.Go(func() { // the receive path
		defer close(done)
		for i := 1; i <= steps; i++ {
			if err := s.Append(diffs[i]); err != nil {
				report(err)
				return
			}
			if f, l, ok := s.Range(); !ok || f > l || l != int64(i) {
				report(errors.New("Range inconsistent with the appends"))
				return
			}
			runtime.Gosched() // let the others interleave (no sleep: nothing waits for it)
		}
	})
	wg.Go(func() { // the folder
		for {
			select {
			case <-done:
				return
			default:
			}
			if f, l, ok := s.Range(); ok && l-f > 4 {
				if err := s.Fold(l-2, opt); err != nil {
					report(err)
					return
				}
			}
		}
	})
	wg.Go(func() { // a restore
		for k := 0; ; k++ {
			select {
			case <-done:
				return
			default:
			}
			f, l, ok := s.Range()
			if !ok {
				continue
			}
			step := f + int64(k)%(l-f+1)
			var got map[string][]byte
			var err error
			if k%2 == 0 {
				got, err = restore(s, step, opt)
			} else {
				got = map[string][]byte{}
				for _, r := range s.regions {
					got[r.Name] = make([]byte, r.Size)
				}
				err = s.RestorePieces(step, 1000, opt, func(region int, off int64, b []byte) error {
					copy(got[s.regions[region].Name][off:], b)
					return nil
				})
			}
			if errors.Is(err, ErrNotHeld) {
				continue // folded past meanwhile
			}
			if err != nil {
				report(err)
				return
			}
			for name, want := range o.states[step] {
				if !bytes.Equal(got[name], want) {
					report(errors.New("a concurrent restore differs from the owner's state"))
					return
				}
			}
		}
	})
	wg.Go(func() { // base refreshes, of steps the owner has sent
		for step := int64(10); step < steps; step += 10 {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, l, _ := s.Range(); l >= step {
					break
				}
			}
			w, err := s.BeginBase(step)
			if errors.Is(err, ErrStale) {
				continue // the base was folded past it
			}
			if err != nil {
				report(err)
				return
			}
			for _, c := range chunks(o.rng, o.states[step]) {
				if err := w.Write(c.region, c.off, c.b); err != nil {
					report(err)
					return
				}
			}
			if err := w.Commit(step, sums(o.states[step])); err != nil {
				report(err)
				return
			}
		}
	})
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	f, _, _ := s.Range()
	checkRange(t, s, o, f, steps, opt)
	t.Logf("%+v", s.Stats())
}
