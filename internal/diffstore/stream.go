package diffstore

import (
	"cmp"
	"fmt"
	"slices"
	"unsafe"

	"github.com/gorun/gorun/replay"
)

// DefaultChunk is RestoreTo's piece size when it is given none.
const DefaultChunk = 1 << 20

// RestoreTo produces the owner's state at step, the bytes Restore would
// write, bit for bit, as a stream: it calls emit with the regions' bytes
// in the order of the regions given to New, each region's from its first
// byte to its last, in pieces of 1 to chunk bytes (chunk is rounded down
// to a multiple of 4, at least 4; 0 means DefaultChunk). A region of size
// 0 gets no call. b is valid only during the call, and emit must not
// change it (it may be the store's own bytes).
//
// The optimizer's W, M and V are replayed a window of elements at a time
// (replay.FusedAt from copies of the base's elements, the base left as it
// is) into a buffer of three pieces that RestoreTo reuses, so that a
// restore of any size takes a few pieces of memory; the rest of the
// optimizer region is the base's, the other regions the bytes of the last
// differential up to step (or the base's). The region's bytes come in
// order, wherever W, M and V lie in it: each of the three is a pass of its
// own over the windows, which replays all three and keeps one (the
// replay's compute is three times Restore's, its memory a few pieces
// instead of the region).
//
// It holds Restore's guarantees: it does not change the store, a step
// outside the range fails with ErrNotHeld before any call of emit, and it
// waits for a Fold in progress; Folds and Truncate then wait until it
// returns (emit must not call them on this store). An error from emit
// ends the stream: RestoreTo returns it as it is.
func (s *Store) RestoreTo(step int64, chunk int, opt replay.ReplayOptions, emit func(region int, b []byte) error) error {
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
		if i == s.optIdx && len(es) > 0 {
			err = s.streamOpt(step, i, b, es, chunk, opt, emit)
		} else {
			err = emitPieces(i, b, chunk, emit)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// emitPieces passes b to emit in pieces of at most chunk bytes.
func emitPieces(region int, b []byte, chunk int, emit func(int, []byte) error) error {
	for len(b) > 0 {
		n := min(len(b), chunk)
		if err := emit(region, b[:n:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// streamOpt emits the optimizer region at step: base, the base's bytes
// (8-byte aligned), with es replayed onto its W, M and V window by window.
func (s *Store) streamOpt(step int64, region int, base []byte, es []*entry, chunk int, opt replay.ReplayOptions, emit func(int, []byte) error) error {
	n := s.opt.N
	from, ok := s.state(base)
	if !ok {
		panic("diffstore: a base's optimizer region is not aligned") // alloc makes it so
	}
	diffs := make([]*replay.Tensor, len(es))
	hypers := make([]replay.Hyper, len(es))
	for i, e := range es {
		diffs[i], hypers[i] = e.tensor, e.hyper
	}
	win := int64(chunk / 4) // elements per window
	if n < win {
		win = n
	}
	buf := make([]float32, 3*win)
	w, m, v := buf[:win:win], buf[win:2*win:2*win], buf[2*win:]
	// The three arrays in the order of their offsets; k: 0 W, 1 M, 2 V.
	type array struct {
		off int64
		k   int
	}
	arrays := []array{{s.opt.WOff, 0}, {s.opt.MOff, 1}, {s.opt.VOff, 2}}
	slices.SortStableFunc(arrays, func(a, b array) int { return cmp.Compare(a.off, b.off) })
	pos := int64(0)
	for _, a := range arrays {
		if err := emitPieces(region, base[pos:a.off], chunk, emit); err != nil {
			return err
		}
		for lo := int64(0); lo < n; lo += win {
			k := min(win, n-lo)
			st := replay.State{W: w[:k], M: m[:k], V: v[:k]}
			copy(st.W, from.W[lo:lo+k])
			copy(st.M, from.M[lo:lo+k])
			copy(st.V, from.V[lo:lo+k])
			if err := replay.FusedAt(st, int(lo), diffs, hypers, opt); err != nil {
				return fmt.Errorf("diffstore: restore of step %d: %w", step, err)
			}
			out := [3][]float32{st.W, st.M, st.V}[a.k]
			if err := emit(region, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(out))), 4*k)); err != nil {
				return err
			}
		}
		pos = a.off + 4*n
	}
	return emitPieces(region, base[pos:], chunk, emit)
}
