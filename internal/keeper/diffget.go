package keeper

import (
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// restoreDiff rebuilds owner's replicated regions at step into dst (by
// name, each of its region's size; nil: allocated) and returns the table
// to send them with: the owner's committed CRC32Cs, which the restored
// bytes must match (a *different* replay is an error naming rank, step
// and region), or, when a lossy codec made the step inexact, the restored
// bytes' own (with a warning: they approximate the owner's state).
func (st *replicaStore) restoreDiff(owner int, step int64, dst map[string][]byte) ([]tableEntry, map[string][]byte, error) {
	ds, t, err := st.diffSource(owner, step)
	if err != nil {
		return nil, nil, err
	}
	if dst == nil {
		dst = make(map[string][]byte, len(t))
		for _, e := range t {
			dst[e.name] = make([]byte, e.size)
		}
	}
	for _, e := range t {
		if d, ok := dst[e.name]; !ok || int64(len(d)) != e.size {
			return nil, nil, fmt.Errorf("region %q of %d bytes does not fit here (%d)", e.name, e.size, len(d))
		}
	}
	if err := ds.Restore(step, dst, replay.ReplayOptions{}); err != nil {
		return nil, nil, fmt.Errorf("rank %d step %d: %w", owner, step, err)
	}
	exact := ds.Exact(step)
	if !exact && st.h.cfg.Diff.lossless() {
		// This job promises bitwise restores: an approximation is not
		// one (a lossy differential from an owner configured otherwise).
		return nil, nil, fmt.Errorf("rank %d step %d: the replica here is not exact (a lossy differential) and the job is lossless: not restored", owner, step)
	}
	for i, e := range t {
		got := crc32c.Checksum(dst[e.name])
		switch {
		case got == e.sum:
		case exact:
			return nil, nil, fmt.Errorf("rank %d step %d region %s: replayed state differs from the owner's commit (CRC32C %08x, committed %08x)", owner, step, e.name, got, e.sum)
		default:
			t[i].sum = got
		}
	}
	if !exact {
		st.h.log.Warn("restoring an approximation of a rank's state (--diff-codec is lossy): not the owner's bytes", "rank", owner, "step", step)
	}
	return t, dst, nil
}

// diffSource returns the store of owner that holds step and the owner's
// committed table of step (a copy).
func (st *replicaStore) diffSource(owner int, step int64) (*diffstore.Store, []tableEntry, error) {
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil, nil, fmt.Errorf("no replica of rank %d here", owner)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var ds *diffstore.Store
	for _, x := range []*diffstore.Store{o.cur, o.prev} {
		if x != nil && x.Held(step) {
			ds = x
			break
		}
	}
	t := slices.Clone(o.sums[step])
	if ds == nil || t == nil {
		return nil, nil, fmt.Errorf("no replica of rank %d at step %d here", owner, step)
	}
	return ds, t, nil
}

// testHookStreamPiece, if set (by tests), may replace a piece of a
// diff-mode holder's streamed answer to a get before it is checksummed and
// sent (a replay that differs from the owner's).
var testHookStreamPiece func(holder, owner int, region string, b []byte) []byte

// getDiff answers a get (a restore from another host) in diff mode. An
// exact step is a pieces answer (pieces.go), streamed as the store replays
// it (diffstore.Store.RestorePieces): the header and the owner's committed
// table of the step first, then the regions' bytes in pieces tagged with
// where they go, each window of the optimizer's elements replayed once and
// sent as its W, M and V pieces, so that the holder never holds the whole
// state twice nor replays it thrice. Each region's CRC32C is computed from
// its pieces on the way (combined: they do not come in order); a region
// that ends with another CRC32C than the owner's (a replay that differs,
// which the receiver's check refuses too) is an error naming rank, step
// and region: it is logged and closes the link, and the next region is not
// sent. A step a lossy codec made inexact is restored whole first
// (restoreDiff) and sent as a data answer: its table carries the restored
// bytes' own CRC32Cs, known only at the end.
//
// The replay's windows (diffstore.PiecesMem) are reserved against the
// host's replica-memory reserve before the stream starts and given back
// once it ended: a reserve without room refuses the get (failNoRoom),
// the link kept, as getDiffWhole does.
func (st *replicaStore) getDiff(c net.Conn, h linkHdr) error {
	ds, t, err := st.diffSource(h.owner, h.step)
	if err == nil && (!ds.Exact(h.step) || !sameShape(t, regionTable(ds.Regions()))) {
		return st.getDiffWhole(c, h, t)
	}
	if err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	n := uint64(diffstore.PiecesMem(ds.Optimizer().N, pieceChunk))
	if err := st.reserve(n, 0); err != nil {
		return writeFail(c, h, failNoRoom, fmt.Sprintf("rank %d step %d: %v: a streamed replay's windows of %d bytes: %v", h.owner, h.step, errNoRoom, n, err))
	}
	defer st.reserve(0, n)
	head := linkHdr{kind: kindPieces, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
	// The answer is written under writeAnswer's deadlines: RestorePieces
	// holds the store's fold lock while it writes, and a reader on a host
	// that died would hold it (and the folds and truncations waiting on
	// it) until TCP gives up.
	return writeAnswer(c, nil, func(w io.Writer) error {
		return st.streamPieces(c, w, h, head, ds, t)
	})
}

// streamPieces writes getDiff's pieces answer of h.step from ds (t: the
// owner's committed table) to w, the link c under writeAnswer's
// deadlines. A replay that fails before anything was sent (a fold moved
// the store past the step meanwhile) is refused on c instead (the link
// stays); one that fails after, or a region whose CRC32C differs from the
// owner's, is an error (the link is closed).
func (st *replicaStore) streamPieces(c net.Conn, w io.Writer, h, head linkHdr, ds *diffstore.Store, t []tableEntry) error {
	sent := false
	sendHead := func() error {
		sent = true
		return writeFrame(w, head, t, [][]byte{}) // data non-nil: the length is the regions'
	}
	pw := newPieceWriter(w, t)
	checked := 0
	// check compares the regions before upTo, whole, with the owner's
	// CRC32Cs.
	check := func(upTo int) error {
		for ; checked < upTo; checked++ {
			e := t[checked]
			got, whole := pw.sum(checked)
			if !whole {
				return fmt.Errorf("rank %d step %d region %s: the replay left bytes out", h.owner, h.step, e.name) // not reached: RestorePieces gives every byte
			}
			if got != e.sum {
				err := fmt.Errorf("rank %d step %d region %s: replayed state differs from the owner's commit (CRC32C %08x, committed %08x)", h.owner, h.step, e.name, got, e.sum)
				st.h.log.Error("a replica's replay differs from the owner's commit: closing the link", "rank", h.owner, "step", h.step, "region", e.name, "err", err)
				return err
			}
		}
		return nil
	}
	err := ds.RestorePieces(h.step, pieceChunk, replay.ReplayOptions{}, func(i int, off int64, b []byte) error {
		if !sent {
			if err := sendHead(); err != nil {
				return err
			}
		}
		if err := check(i); err != nil {
			return err
		}
		if testHookStreamPiece != nil {
			b = testHookStreamPiece(h.holder, h.owner, t[i].name, b)
		}
		return pw.write(i, off, b)
	})
	switch {
	case err != nil && !sent:
		// Nothing sent yet, so no write deadline set either: a refusal,
		// the link stays.
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: %v", h.owner, h.step, err))
	case err != nil:
		return err
	case !sent:
		if err := sendHead(); err != nil { // every region empty
			return err
		}
	}
	return check(len(t))
}

// getDiffWhole answers a get in diff mode with the step restored whole
// (restoreDiff) and sent as a data answer. The restored copy's bytes
// (the regions of t) are reserved against the host's replica-memory
// reserve before they are allocated and given back once sent: a reserve
// without room refuses the get (failNoRoom), the link kept.
func (st *replicaStore) getDiffWhole(c net.Conn, h linkHdr, t []tableEntry) error {
	var n uint64
	for _, e := range t {
		n += uint64(max(e.size, 0))
	}
	if err := st.reserve(n, 0); err != nil {
		return writeFail(c, h, failNoRoom, fmt.Sprintf("rank %d step %d: %v: a restored copy of %d bytes: %v", h.owner, h.step, errNoRoom, n, err))
	}
	defer st.reserve(0, n)
	dst := make(map[string][]byte, len(t))
	for _, e := range t {
		dst[e.name] = make([]byte, max(e.size, 0))
	}
	t, data, err := st.restoreDiff(h.owner, h.step, dst)
	if err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	views := make([][]byte, len(t))
	for i, e := range t {
		views[i] = data[e.name]
	}
	// The reserved copy is let go when the reader does not take it
	// (writeAnswer).
	return writeAnswer(c, nil, func(w io.Writer) error {
		return writeFrame(w, linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}, t, views)
	})
}

// regionTable returns a table of regions (names and sizes, no CRC32Cs).
func regionTable(rs []diffstore.Region) []tableEntry {
	t := make([]tableEntry, len(rs))
	for i, r := range rs {
		t[i] = tableEntry{name: r.Name, size: r.Size}
	}
	return t
}
