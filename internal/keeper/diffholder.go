package keeper

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"

	"github.com/gorun/gorun/internal/diffstore"
)

// ---- The holder's side --------------------------------------------------

// recPool is a holder's free list of one owner's record buffers: the
// records its stores drop once no Restore can read them (Fold,
// FoldChecked, Truncate: diffstore.Store.SetRecycle), which the next
// differentials' records are read (diff) or encoded (encodeDeposits) into
// instead of fresh memory the kernel must fault in again. It keeps at
// most max buffers (Fold+2: what a fold hands back, and a step or two of
// slack) and gives a buffer only for a record of its very length (a
// lossless owner's records all have one), so that the bytes it holds and
// the store's count of a record are the same. Its bytes count in the
// owner's reservation (ownerReplica.diffMem). Safe for concurrent use.
type recPool struct {
	mu     sync.Mutex
	bufs   [][]byte
	bytes  uint64
	max    int
	closed bool // cleared (the owner's stores went) and not set up since
}

// setMax sets how many buffers the pool keeps, and opens it (a new store
// of the owner hands its records back to it).
func (p *recPool) setMax(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.max, p.closed = n, false
}

// put keeps b for a later record, unless the pool is full or closed
// (then the garbage collector takes it): a store dropped while it folded
// hands its records back after the owner's pool was cleared.
func (p *recPool) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b) == 0 || p.closed || len(p.bufs) >= p.max {
		return
	}
	p.bufs = append(p.bufs, b[:len(b):len(b)])
	p.bytes += uint64(len(b))
}

// get returns a buffer of n bytes from the pool (its content is
// garbage), or nil if it has none of that length. Buffers of another
// length are dropped: the owner's records changed size.
func (p *recPool) get(n uint64) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.bufs) > 0 {
		k := len(p.bufs) - 1
		b := p.bufs[k]
		p.bufs[k] = nil
		p.bufs = p.bufs[:k]
		p.bytes -= uint64(len(b))
		if uint64(len(b)) == n {
			return b
		}
	}
	return nil
}

// any returns a buffer from the pool whatever its length, or nil.
func (p *recPool) any() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := len(p.bufs) - 1
	if k < 0 {
		return nil
	}
	b := p.bufs[k]
	p.bufs[k] = nil
	p.bufs = p.bufs[:k]
	p.bytes -= uint64(len(b))
	return b
}

// size returns the bytes the pool holds.
func (p *recPool) size() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// clear drops every buffer and closes the pool (the owner's stores
// went): what their folds still hand back goes to the garbage collector.
func (p *recPool) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.bufs)
	p.bufs, p.bytes, p.closed = p.bufs[:0], 0, true
}

// recordBuf returns an empty buffer for a record of owner that a local
// peer encodes (encodeDeposits): one of the owner's record pool, of the
// length of the owner's records as held here, or nil (the encoder then
// allocates). A record that comes out of another length than the
// buffer's is clipped to a copy of its own (a lossy codec's records vary):
// a record's buffer is what its store counts.
func (st *replicaStore) recordBuf(owner int) []byte {
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil
	}
	return o.recs.any()[:0]
}

// diffMem is what an owner's diff-mode copy holds in memory: its
// stores' bases, refreshes, logs and spare buffers, and the record
// buffers kept for reuse.
func (o *ownerReplica) diffMem() uint64 {
	var n int64
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds != nil {
			st := ds.Stats()
			n += st.BaseBytes + st.RefreshBytes + st.LogBytes + st.RefreshLogBytes + st.SpareBytes
		}
	}
	if o.log != nil {
		n += o.log.Bytes()
	}
	return uint64(n) + o.recs.size() + uint64(cap(o.chunk))
}

// chunkBuf returns o's chunk buffer, of n bytes (at most maxBaseChunk).
// o.mu is held.
func (o *ownerReplica) chunkBuf(n int64) []byte {
	if int64(cap(o.chunk)) < n {
		o.chunk = make([]byte, maxBaseChunk)
	}
	return o.chunk[:n]
}

// account brings the bytes reserved for o up to date, and forgets the
// CRC32Cs of steps no store or log holds. o.mu is held.
func (st *replicaStore) account(o *ownerReplica) {
	if o.dropped {
		return // dropDiff gave its reservation back; a fold that ends later changes nothing
	}
	n := o.diffMem()
	if err := st.reserve(n, o.held); err != nil {
		// Over the limit already (the data is here): count it anyway, so
		// that the next base is refused.
		st.mu.Lock()
		st.bytes = st.bytes - o.held + n
		st.mu.Unlock()
	}
	o.held = n
	low := int64(math.MaxInt64)
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds == nil {
			continue
		}
		if first, _, ok := ds.Range(); ok {
			low = min(low, first)
		}
	}
	if o.log != nil {
		// A log-only holder's steps: getLog answers each with its table.
		if first, _, ok := o.log.Range(); ok {
			low = min(low, first)
		}
	}
	for s := range o.sums {
		if s < low {
			delete(o.sums, s)
		}
	}
	for s := range o.sumGen {
		if s < low {
			delete(o.sumGen, s)
		}
	}
}

// setSums records the owner's committed CRC32Cs of step, received in
// generation gen. o.mu is held.
func (o *ownerReplica) setSums(step int64, gen uint64, t []tableEntry) {
	if o.sums == nil {
		o.sums = map[int64][]tableEntry{}
	}
	if o.sumGen == nil {
		o.sumGen = map[int64]uint64{}
	}
	o.sums[step], o.sumGen[step] = t, gen
}

// diffNewest returns the newest step o's stores hold, or -1. o.mu is held.
func (o *ownerReplica) diffNewest() int64 {
	n := int64(noStep)
	for _, ds := range []*diffstore.Store{o.cur, o.prev} {
		if ds == nil {
			continue
		}
		if _, last, ok := ds.Range(); ok {
			n = max(n, last)
		}
	}
	return n
}

// dropDiff drops o's stores. o.mu is held.
func (st *replicaStore) dropDiff(o *ownerReplica) {
	if o.bw != nil {
		o.bw.Abort()
	}
	o.cur, o.prev, o.bw, o.log = nil, nil, nil, nil
	o.recs.clear()
	st.h.forgetDrift(o.rank)
	o.chunk = nil
	clear(o.sums)
	clear(o.sumGen)
	o.diverged = nil
	st.reserve(0, o.held)
	o.held = 0
}

// checkOwner refuses (returns why, "" if none) a diff-mode request for
// o: not a holder of this placement, dropped, or of an older generation
// than one known. o.mu is held; o.gen is raised to h.gen otherwise.
func (st *replicaStore) checkOwner(o *ownerReplica, h linkHdr) (uint32, string) {
	if refuse := st.notHolder(h); refuse != "" {
		return failOther, refuse
	}
	if o.dropped {
		return failOther, fmt.Sprintf("rank %d's replicas are no longer kept here", h.owner)
	}
	if known := max(o.gen, st.h.Gen()); h.gen < known {
		return failStale, fmt.Sprintf("rank %d step %d: a request of restart generation %d, this holder knows generation %d", h.owner, h.step, h.gen, known)
	}
	o.gen = h.gen
	return 0, ""
}

// writeGap refuses a differential that does not follow, with the step
// the holder takes next (-1: it needs a base).
func writeGap(w io.Writer, h linkHdr, next int64, msg string) error {
	h.gen = uint64(next)
	return writeFail(w, h, failGap, msg)
}

// drain reads and drops n bytes of a request's data.
func drain(r io.Reader, n uint64) error {
	_, err := io.CopyN(io.Discard, r, int64(n))
	return err
}

// base receives a base of h.owner at h.step: a new store, which becomes
// the current one (the one it replaces is kept as prev while it may be
// the only one holding G).
func (st *replicaStore) base(c net.Conn, h linkHdr, t []tableEntry) error {
	if st.logHolder(h) {
		return st.logBegin(c, h, t)
	}
	total := tableBytes(t)
	if h.length != optDescSize+total || h.step < 0 {
		return fmt.Errorf("base of %d bytes for regions of %d, step %d", h.length, total, h.step)
	}
	var db [optDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return err
	}
	opt, err := parseOptDesc(db[:], t)
	if err != nil {
		return fmt.Errorf("base: %w", err)
	}
	refuse := func(why uint32, msg string) error {
		if err := drain(c, total); err != nil {
			return err
		}
		return writeFail(c, h, why, msg)
	}
	if msg := st.notHolder(h); msg != "" {
		return refuse(failOther, msg)
	}
	regions := make([]diffstore.Region, len(t))
	for i, e := range t {
		regions[i] = diffstore.Region{Name: e.name, Size: e.size}
	}
	ds, err := diffstore.New(regions, opt)
	if err != nil {
		return refuse(failOther, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.recs.setMax(st.h.cfg.Diff.fold() + 2)
	ds.SetRecycle(o.recs.put)
	if why, msg := st.checkOwner(o, h); msg != "" {
		return refuse(why, msg)
	}
	if st.h.place().ecDiff() && o.cur != nil && o.cur.Held(h.step) && slices.Equal(o.cur.Regions(), regions) && o.cur.Optimizer() == opt {
		defer st.account(o)
		return st.graftBase(c, h, t, o)
	}
	// Replicas live in this agent's memory: all of them together may
	// take at most half the host's, whatever peers announce.
	if err := st.reserve(o.held+total, o.held); err != nil {
		return refuse(failOther, fmt.Sprintf("base of %d bytes for rank %d: %v", total, h.owner, err))
	}
	o.held += total
	defer st.account(o)
	w, err := ds.BeginBase(h.step)
	if err != nil {
		return refuse(failOther, err.Error())
	}
	buf := o.chunkBuf(int64(min(total, maxBaseChunk)))
	for _, e := range t {
		for off := int64(0); off < e.size; {
			n := min(e.size-off, int64(len(buf)))
			if _, err := io.ReadFull(c, buf[:n]); err != nil {
				return err
			}
			if err := w.Write(e.name, off, buf[:n]); err != nil {
				return err // cannot be: the range is the region's
			}
			off += n
		}
	}
	sums := make(map[string]uint32, len(t))
	for _, e := range t {
		sums[e.name] = e.sum
	}
	// A new store's G is unbounded until SetG: the base installs now.
	if err := w.Commit(h.step, sums); err != nil {
		why := uint32(failOther)
		if errors.Is(err, diffstore.ErrCorrupt) {
			why = failCRC
		}
		return writeFail(c, h, why, fmt.Sprintf("rank %d step %d: %v", h.owner, h.step, err))
	}
	g := st.h.pin(st.h.G())
	if o.cur != nil && o.prev != nil && !o.cur.Held(g) && o.prev.Held(g) && !ds.Held(g) {
		// Both old stores may be needed: the previous one holds G (as
		// known here: the launcher's may be newer, never older) and the
		// current one steps after it that were acknowledged, which G may
		// come to name and this base does not hold. Dropping either could
		// lose a recoverable step; the owner sends the base again (after
		// a backoff), once G reached the current store's base (setGDiff
		// then drops the previous one).
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d: a base of step %d while this holder keeps two older copies until G (%d here) reaches the newer one's", h.owner, h.step, g))
	}
	ds.SetG(g)
	if o.cur != nil {
		// The current store becomes the previous one: it holds every step
		// acknowledged since the last base; the one before it goes (it
		// was kept only while it alone held G, which it no longer does:
		// see above).
		o.prev = o.cur
		if o.bw != nil {
			o.bw.Abort()
		}
	}
	o.cur, o.bw, o.diverged = ds, nil, nil
	o.setSums(h.step, h.gen, t)
	return writeAck(c, h)
}
