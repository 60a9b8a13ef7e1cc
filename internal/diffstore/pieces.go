package diffstore

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// DefaultChunk is RestorePieces' piece size when it is given none.
const DefaultChunk = 1 << 20

// PiecesMem returns the most bytes RestorePieces allocates with chunk for
// a store whose optimizer has n elements: its two windows of W, M and V
// (one replayed while the other is emitted), of chunk/4 elements each
// (chunk rounded as RestorePieces rounds it), at most n.
func PiecesMem(n int64, chunk int) int64 {
	return 2 * 3 * 4 * piecesWindow(n, chunk)
}

// piecesWindow returns the elements of one window of RestorePieces with
// chunk for an optimizer of n elements.
func piecesWindow(n int64, chunk int) int64 {
	if chunk <= 0 {
		chunk = DefaultChunk
	}
	chunk = max(4, chunk&^3)
	return max(min(n, int64(chunk/4)), 0)
}

// RestorePieces produces the owner's state at step, the bytes Restore
// would write, bit for bit, as pieces tagged with where they go: it calls
// emit with b, the bytes of region (its index in the regions given to New)
// at offset off, 1 to chunk bytes (chunk is rounded down to a multiple of
// 4, at least 4; 0 means DefaultChunk). Every byte of every region comes
// exactly once. The regions come one after another, in the order given to
// New, all the pieces of one before the first of the next (a region of
// size 0 gets none); within the optimizer region the order is its own:
// first its bytes outside W, M and V (the base's), in pieces, then window
// by window of elements, the window's W, M and V, one piece each. b is
// valid only during the call, and emit must not change it (it may be the
// store's own bytes).
//
// Unlike a stream in region order, which would have to give each
// region's bytes in order and so replay every window three times (once
// for each of W, M and V), it replays each window once (replay.FusedAt on copies of the base's
// elements; the base is left as it is): the compute of Restore, in a few
// pieces of memory. The next window is replayed, on a goroutine that
// RestorePieces owns and ends before it returns, while emit takes the
// current one: a replay does not wait for the link, nor the link for a
// replay.
//
// It holds Restore's guarantees: it does not change the store, a step
// outside the range fails with ErrNotHeld before any call of emit, and it
// waits for a Fold in progress; Folds and Truncate then wait until it
// returns (emit must not call them on this store). An error from emit
// ends the stream: RestorePieces returns it as it is.
func (s *Store) RestorePieces(step int64, chunk int, opt replay.ReplayOptions, emit func(region int, off int64, b []byte) error) error {
	if chunk <= 0 {
		chunk = DefaultChunk
	}
	chunk = max(4, chunk&^3)
	s.foldMu.RLock()
	defer s.foldMu.RUnlock()
	src, es, err := s.view(step)
	if err != nil {
		return err
	}
	for i, b := range src {
		if i == s.optIdx && len(es) > 0 && s.opt.N > 0 {
			err = s.piecesOpt(step, i, b, es, chunk, opt, emit)
		} else {
			err = emitAt(i, 0, b, chunk, emit)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// emitAt passes b, the bytes of region at off, to emit in pieces of at
// most chunk bytes.
func emitAt(region int, off int64, b []byte, chunk int, emit func(int, int64, []byte) error) error {
	for len(b) > 0 {
		n := min(len(b), chunk)
		if err := emit(region, off, b[:n:n]); err != nil {
			return err
		}
		off += int64(n)
		b = b[n:]
	}
	return nil
}

// replayed is a window of elements [lo, lo+len(st.W)) replayed into
// buffer buf, or the replay's error.
type replayed struct {
	buf int
	lo  int64
	st  replay.State
	err error
}

// piecesOpt emits the optimizer region at step: base, the base's bytes
// (8-byte aligned), with es replayed onto its W, M and V, each window once.
func (s *Store) piecesOpt(step int64, region int, base []byte, es []*entry, chunk int, opt replay.ReplayOptions, emit func(int, int64, []byte) error) error {
	n := s.opt.N
	from, ok := s.state(base)
	if !ok {
		panic("diffstore: a base's optimizer region is not aligned") // alloc makes it so
	}
	// The bytes outside W, M and V first: the base's, between the arrays
	// in the order of their offsets.
	offs := [3]int64{s.opt.WOff, s.opt.MOff, s.opt.VOff}
	sorted := slices.Clone(offs[:])
	slices.SortFunc(sorted, cmp.Compare)
	pos := int64(0)
	for _, off := range sorted {
		if err := emitAt(region, pos, base[pos:off], chunk, emit); err != nil {
			return err
		}
		pos = off + 4*n
	}
	if err := emitAt(region, pos, base[pos:], chunk, emit); err != nil {
		return err
	}

	diffs := make([]*replay.Tensor, len(es))
	hypers := make([]replay.Hyper, len(es))
	for i, e := range es {
		diffs[i], hypers[i] = e.tensor, e.hyper
	}
	win := piecesWindow(n, chunk) // elements per window (PiecesMem)
	var bufs [2]replay.State
	for i := range bufs {
		b := make([]float32, 3*win)
		bufs[i] = replay.State{W: b[:win:win], M: b[win : 2*win : 2*win], V: b[2*win:]}
	}
	// The replayer fills a free buffer with the next window while the
	// caller's goroutine emits the one before from the other.
	free := make(chan int, len(bufs))
	for i := range bufs {
		free <- i
	}
	ready := make(chan replayed, len(bufs))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(ready)
		for lo := int64(0); lo < n; lo += win {
			var i int
			select {
			case i = <-free:
			case <-stop:
				return
			}
			k := min(win, n-lo)
			st := replay.State{W: bufs[i].W[:k], M: bufs[i].M[:k], V: bufs[i].V[:k]}
			copy(st.W, from.W[lo:lo+k])
			copy(st.M, from.M[lo:lo+k])
			copy(st.V, from.V[lo:lo+k])
			err := replay.FusedAt(st, int(lo), diffs, hypers, opt)
			ready <- replayed{buf: i, lo: lo, st: st, err: err} // never blocks: one per buffer
			if err != nil {
				return
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for w := range ready {
		if w.err != nil {
			return fmt.Errorf("diffstore: restore of step %d: %w", step, w.err)
		}
		for k, x := range [3][]float32{w.st.W, w.st.M, w.st.V} {
			b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
			if err := emit(region, offs[k]+4*w.lo, b); err != nil {
				return err
			}
		}
		free <- w.buf // never blocks: the buffer came from free
	}
	return nil
}
