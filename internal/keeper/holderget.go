package keeper

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/protect"
)

// notHolder says why h.holder does not hold h.owner's replicas here in
// the current placement, or "" if it does.
func (st *replicaStore) notHolder(h linkHdr) string {
	p := st.h.place()
	if p.svcs[h.holder] == nil {
		return fmt.Sprintf("rank %d is not on host %d", h.holder, st.h.cfg.Host)
	}
	if !slices.Contains(p.holdersOf(h.owner), h.holder) && !slices.Contains(p.logsOf(h.owner), h.holder) {
		return fmt.Sprintf("rank %d does not hold rank %d's replicas", h.holder, h.owner)
	}
	return ""
}

// has acknowledges that this host holds h.owner's step h.step with the
// regions, sizes and CRC32Cs of table t (the owner's, from its commit),
// its bytes checked against those CRC32Cs (in full mode: a buffer that
// fails is dropped), or refuses. The buffer then counts as the owner's generation h.gen's
// (a restart of this host does not drop it).
func (st *replicaStore) has(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length != 0 {
		return fmt.Errorf("has with %d bytes of data", h.length)
	}
	if refuse := st.notHolder(h); refuse != "" {
		return writeFail(c, h, failOther, refuse)
	}
	st.mu.Lock()
	o := st.owners[h.owner]
	st.mu.Unlock()
	if o == nil {
		return writeFail(c, h, failOther, fmt.Sprintf("no replica of rank %d here", h.owner))
	}
	o.mu.Lock()
	if known := max(o.gen, st.h.Gen()); h.gen < known {
		o.mu.Unlock()
		return writeFail(c, h, failStale, fmt.Sprintf("rank %d step %d: a request of restart generation %d, this holder knows generation %d", h.owner, h.step, h.gen, known))
	}
	if !o.dropped && o.hasDiff(h, t, st.h.place().ecDiff()) {
		o.gen = max(o.gen, h.gen)
		o.confirmDiff(h.step, h.gen)
		o.mu.Unlock()
		return writeAck(c, h)
	}
	b, pin := o.pinStep(h.step, t)
	if b == nil {
		o.mu.Unlock()
		return writeFail(c, h, failOther, fmt.Sprintf("no replica of rank %d at step %d with these regions here", h.owner, h.step))
	}
	data := b.data
	o.mu.Unlock()
	// The table matching is not the data matching: a copy rotten since
	// its put (memory) would be counted as a good one until the owner
	// replaced it, two steps later. Checked, a rotten copy is dropped and
	// refused, and the owner sends the step again. The check (a full
	// CRC32C pass) runs with the buffer pinned, not under the owner's
	// lock, which puts, gets, the sweep and the debug flip wait for.
	if testHookHasCheck != nil {
		testHookHasCheck(o)
	}
	e, got, bad := badRegion(t, data)
	why, refuse := st.hasVerdict(o, b, pin, h, e, got, bad)
	if refuse != "" {
		return writeFail(c, h, why, refuse)
	}
	return writeAck(c, h)
}

// hasVerdict lets go of the pin of has h on b, which it checked (bad:
// region e's bytes have CRC32C got), and records the outcome: a refusal
// (why, refuse), or "" for an acknowledgement. The answer is written
// after, without the owner's lock (a stalled reader would hold it).
func (st *replicaStore) hasVerdict(o *ownerReplica, b *replicaBuf, pin *bufPin, h linkHdr, e tableEntry, got uint32, bad bool) (why uint32, refuse string) {
	o.mu.Lock()
	// Meanwhile a put may have taken the buffer over (new slices, no
	// longer this pin: nothing writes a pinned buffer's slices), the
	// sweep dropped it, or a restart come.
	still := !o.dropped && b.step == h.step && b.pin == pin
	free := pin.release()
	defer st.reserve(0, free) // after o.mu is let go
	defer o.mu.Unlock()
	if known := max(o.gen, st.h.Gen()); h.gen < known {
		return failStale, fmt.Sprintf("rank %d step %d: a request of restart generation %d, this holder knows generation %d", h.owner, h.step, h.gen, known)
	}
	if bad {
		st.h.log.Warn("a held replica no longer matches its owner's CRC32C; dropped, asking the owner for it again",
			"owner", h.owner, "step", h.step, "region", e.name, "crc32c", fmt.Sprintf("%08x", got), "want", fmt.Sprintf("%08x", e.sum))
		if still {
			b.step = noStep
		}
		return failOther, fmt.Sprintf("the replica of rank %d step %d held here: region %s: CRC32C %08x, the owner's is %08x", h.owner, h.step, e.name, got, e.sum)
	}
	if !still {
		return failOther, fmt.Sprintf("the replica of rank %d step %d held here was replaced while it was checked", h.owner, h.step)
	}
	o.gen = max(o.gen, h.gen)
	b.gen = max(b.gen, h.gen)
	return 0, ""
}

// pinStep pins the complete buffer of o holding step with regions t
// (replicaBuf.pin) and returns it and the pin, or nil. o.mu is held.
func (o *ownerReplica) pinStep(step int64, t []tableEntry) (*replicaBuf, *bufPin) {
	for i := range o.bufs {
		b := &o.bufs[i]
		if o.dropped || b.step < 0 || b.step != step || !slices.Equal(b.table, t) || len(b.data) != len(t) {
			continue
		}
		if b.pin == nil {
			b.pin = &bufPin{}
		}
		b.pin.n++
		return b, b.pin
	}
	return nil, nil
}

// testHookHasCheck, if set (by tests), is called while a has checks the
// bytes of a buffer of o.
var testHookHasCheck func(o *ownerReplica)

// badRegion returns the first region of data (of table t) whose bytes do
// not match its CRC32C (and the bytes' CRC32C), if any.
func badRegion(t []tableEntry, data [][]byte) (e tableEntry, got uint32, bad bool) {
	for i, e := range t {
		if got := crc32c.Checksum(data[i]); got != e.sum {
			return e, got, true
		}
	}
	return tableEntry{}, 0, false
}

// sweep marks the copies no rank of this host holds under placement p
// (nil: as marked before) as spare, and drops the spare copies whose
// newest step is older than g, the generation's G.
//
// Why a spare copy is kept that long (I3: a copy of every rank's G exists
// somewhere at every instant): when an owner's holders change, its new
// holders have nothing yet, and the owner's own host may be lost before
// they acknowledged G; the old holder's copy, or the copy a restore plan
// names (Source.Opt), is then the one left. A G newer than the copy's
// newest step b was reported by the owner's Replicated under a placement
// where this host no longer received its steps: had the report counted
// this host as a holder, this host would hold a step after b. So every
// holder the owner had when that G was reported acknowledged a step ≥ G,
// and this copy, which cannot serve G, may go.
func (st *replicaStore) sweep(p *placement, g int64) {
	st.mu.Lock()
	owners := make(map[int]*ownerReplica, len(st.owners))
	maps.Copy(owners, st.owners)
	st.mu.Unlock()
	for r, o := range owners {
		o.mu.Lock()
		if p != nil {
			o.spare = !p.holds(r)
		}
		if st.h.diffMode() && !o.dropped {
			st.setGDiff(o, g)
			st.sweepLog(o)
		}
		if !o.spare || o.newest() >= g && o.newest() >= 0 || st.keepsH(o) {
			o.mu.Unlock()
			continue
		}
		o.dropped = true
		var n uint64
		for i := range o.bufs {
			n += o.bufs[i].supersede()
			o.bufs[i] = replicaBuf{step: noStep}
		}
		st.dropDiff(o)
		o.mu.Unlock()
		st.mu.Lock()
		if st.owners[r] == o {
			delete(st.owners, r)
		}
		st.mu.Unlock()
		st.reserve(0, n)
	}
}

// copyOut copies this host's replica of owner at step into dst (by region
// name, each of its size), checking each region's CRC32C: a restore from
// a copy on its own host.
func (st *replicaStore) copyOut(owner int, step int64, dst map[string][]byte) error {
	if st.h.diffMode() {
		_, _, err := st.restoreDiff(owner, step, dst)
		return err
	}
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return fmt.Errorf("no replica of rank %d here", owner)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.bufs {
		if b.step < 0 || b.step != step || len(b.data) != len(b.table) {
			continue
		}
		for i, e := range b.table {
			err := fillRegion(dst, e, step, func(d []byte) error { copy(d, b.data[i]); return nil })
			if err != nil {
				return err
			}
		}
		if len(b.table) != len(dst) {
			return fmt.Errorf("the replica of rank %d step %d has %d regions, want %d", owner, step, len(b.table), len(dst))
		}
		return nil
	}
	return fmt.Errorf("no replica of rank %d at step %d here", owner, step)
}

// fillRegion fills dst[e.name], which must be of e's size, with fill,
// and checks it against e's CRC32C (of step).
func fillRegion(dst map[string][]byte, e tableEntry, step int64, fill func(d []byte) error) error {
	d, ok := dst[e.name]
	if !ok || int64(len(d)) != e.size {
		return fmt.Errorf("region %q of %d bytes does not fit here (%d)", e.name, e.size, len(d))
	}
	if err := fill(d); err != nil {
		return err
	}
	if got := crc32c.Checksum(d); got != e.sum {
		return fmt.Errorf("region %q of step %d: CRC32C %08x, want %08x: %w", e.name, step, got, e.sum, ErrCopyCRC)
	}
	return nil
}

// physicalMemory is the host's RAM in bytes (0 if unknown): no replica
// larger than it is accepted.
func physicalMemory() uint64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

func sameShape(a, b []tableEntry) bool {
	return slices.EqualFunc(a, b, func(x, y tableEntry) bool { return x.name == y.name && x.size == y.size })
}

// get sends the replica of h.owner at h.step. The owner's lock is not
// held while the data is written to the network (a receiver that stalls,
// its host frozen, would hold every request on the owner's replicas):
// the buffer is pinned (replicaBuf.pin) instead.
func (st *replicaStore) get(c net.Conn, h linkHdr) error {
	if st.h.diffMode() {
		return st.getDiff(c, h)
	}
	st.mu.Lock()
	o := st.owners[h.owner]
	st.mu.Unlock()
	if o == nil {
		return writeFail(c, h, failOther, fmt.Sprintf("no replica of rank %d here", h.owner))
	}
	o.mu.Lock()
	var pin *bufPin
	var t []tableEntry
	var data [][]byte
	for i := range o.bufs {
		if b := &o.bufs[i]; b.step >= 0 && b.step == h.step {
			if b.pin == nil {
				b.pin = &bufPin{}
			}
			pin, t, data = b.pin, b.table, b.data
			pin.n++
			break
		}
	}
	o.mu.Unlock()
	if pin == nil {
		return writeFail(c, h, failOther, fmt.Sprintf("no replica of rank %d at step %d here", h.owner, h.step))
	}
	d := linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
	// The pinned buffer is let go when the reader does not take it.
	err := writeAnswer(c, nil, func(w io.Writer) error { return writeFrame(w, d, t, data) })
	st.unpin(o, pin)
	return err
}

// getSlot sends regions of local rank h.holder's own slot at h.step.
func (st *replicaStore) getSlot(c net.Conn, h linkHdr, want []tableEntry) error {
	svc := st.h.svc(h.holder)
	if svc == nil {
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d is not on host %d", h.holder, st.h.cfg.Host))
	}
	names := make([]string, len(want))
	for i, e := range want {
		names[i] = e.name
	}
	// The rank's service closing (it leaves this host) ends a write held
	// up by the reader: close waits for readSlot to return.
	defer context.AfterFunc(svc.life, func() { c.SetWriteDeadline(time.Unix(1, 0)) })()
	var linkErr error
	err := svc.readSlot(h.step, names, func(t []tableEntry, data [][]byte) error {
		d := linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
		// The slot's mapping is let go when the reader does not take
		// the answer.
		linkErr = writeAnswer(c, svc.life, func(w io.Writer) error { return writeFrame(w, d, t, data) })
		return linkErr
	})
	if err != nil && linkErr == nil {
		return writeFail(c, h, failOther, err.Error())
	}
	return linkErr
}

// readSlot calls f with views of the named regions of this rank's
// committed slot holding step, verified, and their CRC32Cs as committed.
// The views are valid only during f: the slots stay mapped meanwhile
// (mapMu is read-held; close waits). It takes no other lock of the
// service while f runs (a restore on this host may be asking for it while
// it holds its own): the rank may stage over the slot while the views are
// read, and whoever copies them checks the copy against the CRCs.
func (s *service) readSlot(step int64, names []string, f func(t []tableEntry, data [][]byte) error) error {
	s.mapMu.RLock()
	defer s.mapMu.RUnlock()
	s.mu.Lock()
	slots, regions := s.slots, s.regions
	s.mu.Unlock()
	if slots == nil {
		return fmt.Errorf("rank %d protects nothing", s.rank)
	}
	sn, err := slots.At(uint64(step))
	if err != nil {
		return fmt.Errorf("rank %d: %w", s.rank, err)
	}
	sums := sn.Sums()
	var t []tableEntry
	var data [][]byte
	for _, n := range names {
		i := slices.IndexFunc(regions, func(r protect.Region) bool { return r.Name == n })
		if i < 0 {
			return fmt.Errorf("rank %d has no region %q", s.rank, n)
		}
		v := sn.Region(n)
		t = append(t, tableEntry{name: n, size: int64(len(v)), sum: sums[i]})
		data = append(data, v)
	}
	if testHookSlotRead != nil {
		testHookSlotRead(s)
	}
	return f(t, data)
}

// testHookSlotRead, if set (by tests), is called while a reader of a
// rank's slot holds its views.
var testHookSlotRead func(s *service)
