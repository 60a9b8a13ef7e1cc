package rank

// Diff mode under erasure coding, the holders' side (ecdiff_owner.go has
// the owner's; PROTOCOL.md "Erasure coding and diff mode"):
//
//   - the clear copy's holder keeps its ordinary store, pinned at H (its
//     G is H, Host.pin: no fold, a refresh past H verified and waiting);
//     baseH (kind 15, this file) raises that pin for one owner before a
//     refresh begins, so that BeginBase never drops a verified base H
//     already depends on;
//   - the log-only holders (Placement.Logs) keep the owner's
//     differentials after H with no base (ownerReplica.log);
//   - the parity rows keep H's buffer (ecstore.go, bufFor).

import (
	"fmt"
	"net"
	"slices"

	"github.com/gorun/gorun/internal/diffstore"
)

// kindBaseH is the baseH request (owner → clear copy's holder; no table,
// no data): "H >= step".
const kindBaseH = 15

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
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d: baseH %d, this holder holds up to step %d", h.owner, h.step, n))
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
