package keeper

// Diff mode under erasure coding, the holders' side (ecdiff_owner.go has
// the owner's; PROTOCOL.md "Erasure coding and diff mode"):
//
//   - the clear copy's holder keeps its ordinary store, pinned at H (its
//     G is H, Keeper.pin: no fold, a refresh past H verified and waiting);
//     baseH (kind 15, this file) raises that pin for one owner before a
//     refresh begins, so that BeginBase never drops a verified base H
//     already depends on;
//   - the log-only holders (Placement.Logs) keep the owner's
//     differentials after H with no base (ownerReplica.log);
//   - the parity rows keep H's buffer (paritystore.go, bufFor).

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/gorun/gorun/internal/diffstore"
)

// kindBaseH is the baseH request (owner → clear copy's holder; no table,
// no data): "H >= step".
const kindBaseH = 15

// failBehindH: the holder refused baseH because its stores of the owner
// hold no step up to H (it lags, or lost its store; it holds something):
// asking again would not change that, and none of its steps is one a
// decode at H (or any later H) reads. The owner sends the base whole,
// without baseH. Any other refusal of baseH passes (a placement or a
// restart generation switching), and baseH is asked again.
const failBehindH = 10

// errBehindH is a baseH refused with failBehindH (remoteError.Is).
var errBehindH = errors.New("the holder holds no step up to H")

// baseH receives an owner's baseH: the holder's stores of h.owner keep
// their bases at h.step at least (their G is raised to it), which
// installs a verified refresh of that step. The step must be one the
// holder holds (H <= G <= what the holder acknowledged), unless it holds
// nothing of the owner (a spare that takes the place of a lost host, or
// a holder that lost its store): there is no base to keep, and the owner
// sends the base whole next.
func (st *replicaStore) baseH(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length != 0 || len(t) != 0 {
		return fmt.Errorf("baseH with %d regions and %d bytes of data", len(t), h.length)
	}
	if msg := st.notHolder(h); msg != "" {
		return writeFail(c, h, failOther, msg)
	}
	if !st.h.place().ecDiff() {
		return writeFail(c, h, failOther, "baseH outside diff mode under erasure coding")
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return writeFail(c, h, why, msg)
	}
	if n := o.diffNewest(); h.step > n && (o.cur != nil || o.prev != nil) {
		return writeFail(c, h, failBehindH, fmt.Sprintf("rank %d: baseH %d, this holder holds up to step %d", h.owner, h.step, n))
	}
	o.hmin = max(o.hmin, h.step)
	st.setGDiff(o, st.h.G())
	st.account(o)
	return writeAck(c, h)
}

// keepsH reports whether o, a copy no rank of this host holds any more,
// must still be kept in diff mode under EC: its store holds H (it may be
// the data host's copy of o's shard at H, which a decode reads), or its
// log holds differentials after H (the new log holders start at the new
// placement's G). o.mu is held.
func (st *replicaStore) keepsH(o *ownerReplica) bool {
	if !st.h.place().ecDiff() {
		return false
	}
	hb := st.h.H()
	if hb < 0 {
		return o.cur != nil || o.prev != nil || o.log != nil
	}
	for _, ds := range [...]*diffstore.Store{o.cur, o.prev} {
		if ds != nil && ds.Held(hb) {
			return true
		}
	}
	return st.logAfter(o, hb)
}

// logHolder reports whether h.holder holds h.owner's log here under the
// current placement (diff mode under EC).
func (st *replicaStore) logHolder(h linkHdr) bool {
	p := st.h.place()
	return p.ecDiff() && p.svcs[h.holder] != nil && slices.Contains(p.logsOf(h.owner), h.holder)
}

// graftBase takes a whole base of h.owner at h.step (kind 5: the owner's
// snapshot of a base step, sent whole when the holder could not take it
// in chunks, sendChunks) into o's current store, which holds that step,
// as a refresh of it: a chunked refresh's BeginBase, chunks and commit in
// one request. The store keeps its base and its differentials, those
// after the step included, and installs the refresh once G (H here)
// reaches it, as a committed refresh (kind 8). A store made of the base
// alone would hold the step and nothing after it: the differentials
// after it the holder acknowledged, which the owner may no longer have,
// would be lost to it. The caller checked that the store holds h.step
// and has the table's layout, read the optimizer's descriptor, and
// accounts o after; o.mu is held.
func (st *replicaStore) graftBase(c net.Conn, h linkHdr, t []tableEntry, o *ownerReplica) error {
	total := tableBytes(t)
	refuse := func(why uint32, msg string) error {
		if err := drain(c, total); err != nil {
			return err
		}
		return writeFail(c, h, why, msg)
	}
	if verifiedBase(o.cur, h.step) && slices.Equal(o.sums[h.step], t) {
		// Held verified already, of the same commit (an owner that
		// forgot where its refresh stood: baseChunk refused it). A new
		// refresh would drop it until its last byte came, and for
		// good if the link broke first, while H may name it: the
		// bytes are read and dropped, and the base acknowledged.
		if err := drain(c, total); err != nil {
			return err
		}
		o.setSums(h.step, h.gen, t)
		return writeAck(c, h)
	}
	if o.bw == nil || o.bw.Step() != h.step {
		// The refresh's buffers are reserved before BeginBase allocates
		// them (baseChunk's); account then counts them.
		size := uint64(o.cur.Size())
		if err := st.reserve(o.held+size, o.held); err != nil {
			return refuse(failOther, fmt.Sprintf("rank %d: a base of %d bytes at step %d: %v", h.owner, size, h.step, err))
		}
		o.held += size
	}
	w, err := o.cur.BeginBase(h.step) // replaces a refresh in progress
	o.bw = nil
	if err != nil {
		return refuse(failStale, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	buf := o.chunkBuf(int64(min(total, maxBaseChunk)))
	for _, e := range t {
		for off := int64(0); off < e.size; {
			n := min(e.size-off, int64(len(buf)))
			if _, err := io.ReadFull(c, buf[:n]); err != nil {
				w.Abort()
				return err
			}
			if err := w.Write(e.name, off, buf[:n]); err != nil {
				w.Abort()
				return err // cannot be: the range is the region's, the refresh current
			}
			off += n
		}
	}
	sums := make(map[string]uint32, len(t))
	for _, e := range t {
		sums[e.name] = e.sum
	}
	if err := w.Commit(h.step, sums); err != nil {
		w.Abort()
		why := uint32(failStale)
		if errors.Is(err, diffstore.ErrCorrupt) {
			why = failCRC
		}
		return writeFail(c, h, why, fmt.Sprintf("rank %d step %d: %v", h.owner, h.step, err))
	}
	o.setSums(h.step, h.gen, t)
	return writeAck(c, h)
}
