package keeper

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// diff receives a differential of h.owner at h.step into its current
// store, and acknowledges it only if the store can restore the step.
// Nothing of its size is allocated before admitDiff checked it against
// the store and reserved it.
func (st *replicaStore) diff(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length < diffDescSize || h.step < 0 {
		return fmt.Errorf("differential of %d bytes, step %d", h.length, h.step)
	}
	var db [diffDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return err
	}
	dd := parseDiffDesc(db[:])
	if dd.opt >= len(t) {
		return fmt.Errorf("differential: optimizer region %d of %d", dd.opt, len(t))
	}
	others := tableBytes(t) - uint64(t[dd.opt].size)
	if dd.recLen > uint64(t[dd.opt].size)+maxRecordSlack || h.length != diffDescSize+dd.recLen+others {
		return fmt.Errorf("differential of %d bytes: a record of %d and other regions of %d", h.length, dd.recLen, others)
	}
	rec, release, ok, err := st.admitDiff(c, h, t, dd.opt, dd.recLen, others)
	if !ok {
		return err
	}
	defer release()
	// The whole request is read first: the link stays in step whatever
	// the answer. The store keeps these buffers (and hands the record
	// back to the owner's pool once it drops it).
	if rec == nil {
		rec = make([]byte, dd.recLen)
	}
	d, err := readDiff(c, h, t, dd, rec)
	if err != nil {
		return err
	}
	return st.takeDiff(c, h, t, d)
}

// readDiff reads a differential's data off c, after its descriptor dd:
// the record into rec (dd.recLen bytes), then every other region of t in
// its order, into buffers of their own (the store keeps them).
func readDiff(c net.Conn, h linkHdr, t []tableEntry, dd diffDesc, rec []byte) (diffstore.Diff, error) {
	d := diffstore.Diff{Step: h.step, Hyper: dd.hyper, Record: rec, Other: map[string][]byte{}, Sum: dd.sum}
	if _, err := io.ReadFull(c, d.Record); err != nil {
		return d, err
	}
	for i, e := range t {
		if i == dd.opt {
			continue
		}
		b := make([]byte, e.size)
		if _, err := io.ReadFull(c, b); err != nil {
			return d, err
		}
		d.Other[e.name] = b
	}
	return d, nil
}

// admitDiff runs the checks of a differential of h.owner at h.step (table
// t, optimizer region opt, a record of recLen bytes and other regions of
// others) that need none of its data, before the caller allocates any of
// it: h.holder holds h.owner here, the generation is current, the owner
// has a store here, t has exactly its regions (names, sizes, order) with
// the optimizer at opt, and the record is no longer than the job's codec
// makes of the optimizer's N elements. It then reserves the bytes the
// caller is about to read (recLen+others; replicaStore.reserve, as a put
// does) until release, once the data is in the store (whose own bytes
// account then counts), and takes a buffer of recLen bytes from the
// owner's record pool (rec; nil if the pool has none: the caller
// allocates it). The reservation is the same whether the pool had one or
// not (its bytes, reserved already, then count twice until release), so
// that whether a differential fits does not depend on the pool. If it
// refuses (ok false), it drains the request's
// data and answers (err is the link's error, if any): failGap (-1) if the
// owner has no store here, failOther naming the sizes if they do not fit
// the memory. A differential whose sizes are not the store's is not
// answered: err names them, and the link closes without a byte of its
// data read.
func (st *replicaStore) admitDiff(c net.Conn, h linkHdr, t []tableEntry, opt int, recLen, others uint64) (rec []byte, release func(), ok bool, err error) {
	refuse := func(answer func() error) ([]byte, func(), bool, error) {
		if err := drain(c, recLen+others); err != nil {
			return nil, nil, false, err
		}
		return nil, nil, false, answer()
	}
	if msg := st.notHolder(h); msg != "" {
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	why, msg := st.checkOwner(o, h)
	var ds *diffstore.Store
	if msg == "" {
		if ds = o.cur; ds != nil {
			if bad := diffFits(ds, t, opt, recLen, st.h.cfg.Diff.codec()); bad != "" {
				o.mu.Unlock()
				// Not one of the owner's differentials: its data, of a
				// size no store here has, is neither read nor drained.
				return nil, nil, false, fmt.Errorf("rank %d step %d: %s", h.owner, h.step, bad)
			}
		}
	}
	o.mu.Unlock()
	switch {
	case msg != "":
		msg = fmt.Sprintf("rank %d step %d: %s", h.owner, h.step, msg)
		return refuse(func() error { return writeFail(c, h, why, msg) })
	case ds == nil:
		return refuse(func() error { return writeGap(c, h, noStep, fmt.Sprintf("no base of rank %d here", h.owner)) })
	}
	n := recLen + others
	if err := st.reserve(n, 0); err != nil {
		msg := fmt.Sprintf("differential of rank %d step %d: %d bytes (a record of %d, other regions of %d): %v", h.owner, h.step, n, recLen, others, err)
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	if recLen > 0 {
		rec = o.recs.get(recLen)
	}
	return rec, func() { st.reserve(0, n) }, true, nil
}

// diffFits says why a differential with table t (optimizer at opt, a
// record of recLen bytes) cannot be one of ds's owner, or "" if it can.
func diffFits(ds *diffstore.Store, t []tableEntry, opt int, recLen uint64, codec replay.Options) string {
	return layoutFits("base", ds.Regions(), ds.Optimizer(), t, opt, recLen, codec)
}

// layoutFits says why a differential with table t (optimizer at opt, a
// record of recLen bytes) does not fit the owner's declared regions and
// optimizer, kept in the holder's what ("base", "log"), or "".
func layoutFits(what string, regions []diffstore.Region, o diffstore.Optimizer, t []tableEntry, opt int, recLen uint64, codec replay.Options) string {
	if len(t) != len(regions) {
		return fmt.Sprintf("a differential of %d regions, the owner's %s has %d", len(t), what, len(regions))
	}
	for i, r := range regions {
		if t[i].name != r.Name || t[i].size != r.Size {
			return fmt.Sprintf("a differential's region %d is %q of %d bytes, the owner's %s has %q of %d", i, t[i].name, t[i].size, what, r.Name, r.Size)
		}
	}
	if t[opt].name != o.Region {
		return fmt.Sprintf("a differential's optimizer region is %q, the owner's %s has %q", t[opt].name, what, o.Region)
	}
	if limit := maxRecordLen(o.N, codec); recLen > limit {
		return fmt.Sprintf("a record of %d bytes, more than the %d the codec makes of %d elements", recLen, limit, o.N)
	}
	return ""
}

// maxRecordLen returns the longest record of one tensor of n elements
// that codec makes (replay's record format): Raw 4 bytes an element;
// Int8 at most 5 (a scale per block of at least one); TopK at most 6.6
// (ceil(K·n)+10% entries of an index and an fp16 value), plus the
// headers, descriptor, chunk table and padding.
func maxRecordLen(n int64, codec replay.Options) uint64 {
	per := uint64(4)
	if !codec.Lossless {
		per = 7
	}
	return per*uint64(n) + 16*uint64(n>>31+1) + recordHeaderSlack
}

// takeDiff appends differential d of h.owner at h.step (read whole, its
// record included, from the network or a local peer) to the owner's
// current store, and acknowledges it only if the store can restore the
// step.
//
// A step it holds already is taken as the owner's new commit of it, not
// as a no-op, unless the CRC32Cs t it was committed with are those held:
// an owner that went back (an in-place restore to G in the same
// generation) and committed the step again otherwise (another record, or
// the same record with other hyper-parameters or other regions) replaces
// it and the steps after it. A differential the store cannot take after
// what it holds (Adam's step count does not follow, another layout), or
// a step held with other CRC32Cs at the store's base, is answered with a
// gap and no Next: the owner sends a base.
func (st *replicaStore) takeDiff(c net.Conn, h linkHdr, t []tableEntry, d diffstore.Diff) error {
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return writeFail(c, h, why, msg)
	}
	if dv := o.diverged; dv != nil {
		h.gen = uint64(dv.Step) // read as remoteError.next
		return writeFail(c, h, failDiverged, dv.Detail)
	}
	if o.cur == nil {
		return writeGap(c, h, noStep, fmt.Sprintf("no base of rank %d here", h.owner))
	}
	defer st.account(o)
	if o.bw != nil && h.step > o.bw.Step()+2*int64(st.h.cfg.Diff.baseEvery()) {
		// A refresh its owner stopped sending (it crashed, or its link
		// broke for good): Fold does not pass it, so it must go.
		o.bw.Abort()
		o.bw = nil
	}
	if held, ok := o.sums[h.step]; ok && !slices.Equal(held, t) {
		// Held with other CRC32Cs: the owner's new commit of the step
		// supersedes it and what follows it.
		if first, _, ok := o.cur.Range(); ok && h.step <= first {
			return writeGap(c, h, noStep, fmt.Sprintf("rank %d step %d: committed again with other CRC32Cs than the base held here", h.owner, h.step))
		}
		if err := o.cur.Truncate(h.step - 1); err != nil {
			return writeGap(c, h, noStep, fmt.Sprintf("rank %d step %d: committed again with other CRC32Cs: %v", h.owner, h.step, err))
		}
		st.dropSumsAfter(o, h.step-1)
	}
	err := o.cur.Append(d)
	if errors.Is(err, diffstore.ErrMismatch) {
		// A step held already with another record: the owner went back
		// (an in-place restore to G) and took another way from there.
		// Its own steps supersede the ones held after h.step-1.
		if _, last, ok := o.cur.Range(); ok && h.step <= last && o.cur.Truncate(h.step-1) == nil {
			st.dropSumsAfter(o, h.step-1)
			err = o.cur.Append(d)
		}
	}
	switch {
	case errors.Is(err, diffstore.ErrGap):
		return writeGap(c, h, o.cur.Next(), fmt.Sprintf("rank %d: %v", h.owner, err))
	case errors.Is(err, diffstore.ErrCorrupt):
		return writeFail(c, h, failCRC, fmt.Sprintf("rank %d: %v", h.owner, err))
	case errors.Is(err, diffstore.ErrMismatch):
		// It cannot follow what the store holds (sending it again would
		// not change that): a base replaces the store.
		return writeGap(c, h, noStep, fmt.Sprintf("rank %d: %v", h.owner, err))
	case err != nil:
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o.setSums(h.step, h.gen, t)
	st.maybeFold(o)
	if !o.cur.Held(h.step) {
		return writeFail(c, h, failPending, fmt.Sprintf("rank %d step %d taken, not restorable yet", h.owner, h.step))
	}
	return writeAck(c, h)
}

// dropSumsAfter forgets the CRC32Cs of the steps after step that no
// store holds any more (the current one was truncated after step). o.mu
// is held.
func (st *replicaStore) dropSumsAfter(o *ownerReplica, step int64) {
	for s := range o.sums {
		if s > step && (o.prev == nil || !o.prev.Held(s)) {
			delete(o.sums, s)
			delete(o.sumGen, s)
		}
	}
}

// baseChunk receives a chunk of a base refresh at h.step into the current
// store's refresh (begun by the first chunk of that step, once the
// refresh's buffers are reserved). The chunk's bytes are read only after
// the checks that need none of them, and must fall within the store's
// region.
func (st *replicaStore) baseChunk(c net.Conn, h linkHdr, t []tableEntry) error {
	if len(t) != 1 || h.length < 8 || h.length-8 > maxBaseChunk || h.length-8 > uint64(t[0].size) {
		return fmt.Errorf("base chunk of %d bytes for %d regions", h.length, len(t))
	}
	var ob [8]byte
	if _, err := io.ReadFull(c, ob[:]); err != nil {
		return err
	}
	off, n := int64(binary.BigEndian.Uint64(ob[:])), int64(h.length-8)
	refuse := func(answer func() error) error {
		if err := drain(c, uint64(n)); err != nil {
			return err
		}
		return answer()
	}
	if msg := st.notHolder(h); msg != "" {
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return refuse(func() error { return writeFail(c, h, why, msg) })
	}
	if o.cur == nil {
		return refuse(func() error { return writeGap(c, h, noStep, fmt.Sprintf("no base of rank %d here", h.owner)) })
	}
	i := slices.IndexFunc(o.cur.Regions(), func(r diffstore.Region) bool { return r.Name == t[0].name })
	if i < 0 || o.cur.Regions()[i].Size != t[0].size || off < 0 || off > t[0].size-n {
		msg := fmt.Sprintf("rank %d: a base chunk [%d, +%d) of region %q of %d bytes, not one of the owner's base", h.owner, off, n, t[0].name, t[0].size)
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	defer st.account(o)
	if o.bw == nil || o.bw.Step() != h.step {
		if held, ok := st.verifiedBaseFrom(o, h.step); ok {
			// BeginBase would drop a verified base the owner counted
			// coded (see verifiedBaseFrom): the chunk is a late one of
			// a round its owner cancelled, or an owner that forgot
			// where the refresh stood sends it again. The latter gets
			// it whole next (sendChunks' giveUp: graftBase).
			msg := fmt.Sprintf("rank %d: a base refresh of step %d begun while this holder holds a verified base of step %d", h.owner, h.step, held)
			return refuse(func() error { return writeFail(c, h, failStale, msg) })
		}
		// A new refresh: its buffers (the regions' sizes) are reserved
		// before BeginBase allocates them; account then counts them.
		size := uint64(o.cur.Size())
		if err := st.reserve(o.held+size, o.held); err != nil {
			msg := fmt.Sprintf("rank %d: a base refresh of %d bytes at step %d: %v", h.owner, size, h.step, err)
			return refuse(func() error { return writeFail(c, h, failOther, msg) })
		}
		o.held += size
		w, err := o.cur.BeginBase(h.step)
		if err != nil {
			return refuse(func() error { return writeFail(c, h, failStale, fmt.Sprintf("rank %d: %v", h.owner, err)) })
		}
		o.bw, o.bwGen = w, h.gen
	}
	data := o.chunkBuf(n) // Write copies it
	if _, err := io.ReadFull(c, data); err != nil {
		return err
	}
	if err := o.bw.Write(t[0].name, off, data); err != nil {
		why := uint32(failOther)
		if errors.Is(err, diffstore.ErrStale) {
			why, o.bw = failStale, nil
		}
		return writeFail(c, h, why, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	return writeAck(c, h)
}

// verifiedBaseFrom returns the step, at or after step, of a verified
// base o's current store holds (its base, or a committed refresh waiting
// for H), if any: diff mode under erasure coding only. A new refresh of
// step would drop it (BeginBase aborts the refresh waiting, and a base
// of the same step is replaced by one being written), while the owner
// counted it coded (its Base, and so the job's H, may name it) and a
// decode at H reads exactly it (ReadBase). o.mu is held.
func (st *replicaStore) verifiedBaseFrom(o *ownerReplica, step int64) (int64, bool) {
	if o.cur == nil || !st.h.place().ecDiff() {
		return noStep, false
	}
	for s := range o.sums {
		if s >= step && verifiedBase(o.cur, s) {
			return s, true
		}
	}
	return noStep, false
}

// verifiedBase reports whether ds holds a verified base at exactly step:
// its base, exact, or a committed refresh waiting for G (the bytes a
// decode reads, diffstore.Store.ReadBase).
func verifiedBase(ds *diffstore.Store, step int64) bool {
	return ds.ReadBase(step, 0, nil) == nil
}

// baseCommit commits the base refresh at h.step with the owner's CRC32Cs
// of t: the store switches to it once G reaches its step.
func (st *replicaStore) baseCommit(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length != 0 {
		return fmt.Errorf("base commit with %d bytes of data", h.length)
	}
	if msg := st.notHolder(h); msg != "" {
		return writeFail(c, h, failOther, msg)
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return writeFail(c, h, why, msg)
	}
	if o.bw == nil || o.bw.Step() != h.step {
		return writeFail(c, h, failStale, fmt.Sprintf("rank %d: no base refresh of step %d in progress", h.owner, h.step))
	}
	defer st.account(o)
	sums := make(map[string]uint32, len(t))
	for _, e := range t {
		sums[e.name] = e.sum
	}
	if err := o.bw.Commit(h.step, sums); err != nil {
		why := uint32(failStale)
		if errors.Is(err, diffstore.ErrCorrupt) {
			why = failCRC // the refresh stays: its chunks may come again
		} else {
			o.bw = nil
		}
		return writeFail(c, h, why, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o.bw = nil
	o.setSums(h.step, h.gen, t)
	return writeAck(c, h)
}

// hasDiff acknowledges h if one of o's stores (the current one, or the
// previous one a newer base replaced) holds h.step with the regions and
// CRC32Cs of t. In diff mode under EC (ecDiff) only the current one
// counts: the owner's differentials follow it, and the previous one goes
// once H reaches the current one's base. o.mu is held.
func (o *ownerReplica) hasDiff(h linkHdr, t []tableEntry, ecDiff bool) bool {
	if o.diverged != nil || !slices.Equal(o.sums[h.step], t) {
		return false
	}
	stores := []*diffstore.Store{o.cur, o.prev}
	if ecDiff {
		stores = stores[:1]
	}
	for _, ds := range stores {
		if ds != nil && ds.Held(h.step) {
			return true
		}
	}
	return false
}

// confirmDiff records that the owner confirmed step (kindHas) in
// generation gen: step and the steps before it that the stores hold count
// as gen's (a restart of gen keeps them, as full mode keeps a buffer a
// has confirmed). o.mu is held.
func (o *ownerReplica) confirmDiff(step int64, gen uint64) {
	for s, sg := range o.sumGen {
		if s <= step && sg < gen {
			o.sumGen[s] = gen
		}
	}
}
