package keeper

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
)

// ---- The holder's side -------------------------------------------------

// replicaBuf is one buffer of an owner's replica.
type replicaBuf struct {
	step  int64  // the complete step held, or -1 (empty or being received)
	gen   uint64 // the owner's restart generation when it sent step
	table []tableEntry
	data  [][]byte
	// recv, when not nil, is the claim of the put receiving into data:
	// that put writes data without the owner's lock, so nothing else may
	// (a put taking the buffer over gives it new slices).
	recv *bufClaim
	// pin, when its count is not 0, is held by gets (and has checks)
	// reading data without the owner's lock: nothing may write data
	// meanwhile (a put taking the buffer over gives it new slices and a
	// new pin).
	pin *bufPin
	// A buffer is never claimed and pinned at once: a claimed buffer
	// holds no step, and only a buffer holding a step is pinned.
}

// bufClaim is a put's claim on the buffer it receives into; guarded by
// the owner's mu. A buffer taken over (supersede) leaves its slices to
// the claim, still counted by the store (held) until the put ends; the
// take-over ends the put's read (its bytes are dead anyway).
type bufClaim struct {
	conn net.Conn // the put's link
	held uint64   // the bytes of superseded slices still counted for it
}

// bufPin counts the readers of a buffer's data; guarded by the owner's
// mu. A reader keeps its pin, not the buffer, so that a buffer reset
// under it (replicaStore.sweep) is no matter; slices superseded under
// it stay counted by the store (held) until the last reader lets go.
type bufPin struct {
	n    int
	held uint64
}

// supersede takes b's slices away from it (b is reset or given new
// ones): a put still receiving into them, or readers still reading them,
// keep them alive, so they stay counted in the store's bytes until that
// put or the last of those readers ends; the put is made to end now.
// It returns the bytes freed at once (no one uses the slices), for the
// caller to release (replicaStore.reserve). o.mu is held.
func (b *replicaBuf) supersede() (free uint64) {
	n := bufBytes(b.data)
	switch {
	case b.recv != nil:
		b.recv.held += n
		// Its data would be refused at its end: end it now rather than
		// when (if ever) its stalled sender sends the rest.
		b.recv.conn.SetReadDeadline(time.Now())
	case b.pinned():
		b.pin.held += n
	default:
		free = n
	}
	b.table, b.data, b.recv, b.pin = nil, nil, nil, nil
	return free
}

// release lets go of one reader's pin and returns the bytes of the
// superseded slices it was the last reader of, for the caller to release
// (replicaStore.reserve). The owner's mu is held.
func (p *bufPin) release() (free uint64) {
	p.n--
	if p.n == 0 {
		free, p.held = p.held, 0
	}
	return free
}

// unpin lets go of pin, taken on one of o's buffers, and releases the
// superseded slices it was the last reader of. o.mu is not held.
func (st *replicaStore) unpin(o *ownerReplica, pin *bufPin) {
	o.mu.Lock()
	free := pin.release()
	o.mu.Unlock()
	st.reserve(0, free)
}

// pinned reports whether a get is sending b's data, or a has checking
// it. o.mu is held.
func (b *replicaBuf) pinned() bool { return b.pin != nil && b.pin.n > 0 }

// ownerReplica is what this host holds of one owner rank.
type ownerReplica struct {
	mu      sync.Mutex // held neither while a buffer is received (replicaBuf.recv) nor read (replicaBuf.pin); guards the fields below
	bufs    [2]replicaBuf
	gen     uint64 // the newest restart generation known for the owner: older puts are refused
	dropped bool   // no longer kept here (replicaStore.sweep)
	// spare: no rank of this host holds the owner's replicas in the
	// current placement (they left, or moved to other ranks): the copy is
	// kept, serving restores, until G passes its newest step.
	spare bool

	// Diff mode (diff.go; bufs unused): cur is the owner's base and log,
	// which receives; prev the store a newer base replaced, kept (serving
	// restores) until cur holds G.
	rank      int
	cur, prev *diffstore.Store
	bw        *diffstore.BaseWriter  // the refresh being received into cur, or nil
	bwGen     uint64                 // the owner's generation when bw began
	sums      map[int64][]tableEntry // the owner's committed CRC32Cs of the steps held
	// sumGen is the owner's restart generation in which each step of
	// sums was received or confirmed (kindHas): a restart to g keeps the
	// steps after g of its own generation, as full mode keeps buffers.
	sumGen map[int64]uint64
	// diverged: a fold found that the replay of the owner's
	// differentials differs from its commit (difffold.go, foldLoop); the
	// owner's differentials are refused with failDiverged until a base
	// or a restart.
	diverged   *CorruptError
	held       uint64      // the bytes reserved for the stores (replicaStore.reserve)
	foldQueued atomic.Bool // queued for the fold goroutine
	// recs holds the owner's record buffers its stores handed back,
	// for the next differentials' records (diffholder.go, recPool).
	recs recPool
	// chunk is the buffer a base's or a refresh's chunks are read into
	// before they are copied into the store (guarded by mu), kept from
	// one chunk to the next.
	chunk []byte
	// log (diff mode under EC): this host is one of the owner's log-only
	// holders (Placement.Logs): the owner's differentials after its
	// newest coded base, with no base (diffstore.Log); nil otherwise.
	log *diffstore.Log
	// logSeq, logFenced and logFence (diff mode under EC, eclog.go):
	// logSeq is the placement (placement.seq) the log's fence is of; when
	// logFenced, the log's steps after logFence may be of a trajectory
	// the ranks abandoned: a placement began, resuming from its G, since
	// the owner last anchored the log (logBegin). getLog serves no step
	// after it.
	logSeq    uint64
	logFenced bool
	logFence  int64
	// logEpoch is the epoch of the placement the owner had resumed under
	// when it last anchored the log (its logBegin's; 0: none): a
	// placement no newer fences nothing (fenceLog).
	logEpoch uint64
	// hmin (diff mode under EC): the newest H the owner said its base
	// reached (baseH): the stores keep their bases at least there.
	hmin int64
}

// newest returns the newest complete step held, or -1. o.mu is held.
func (o *ownerReplica) newest() int64 {
	return max(o.bufs[0].step, o.bufs[1].step, o.diffNewest())
}

// replicaStore holds the replicas this host's ranks keep for others.
type replicaStore struct {
	h      *Keeper
	mu     sync.Mutex
	owners map[int]*ownerReplica
	conns  map[net.Conn]struct{}
	closed bool
	bytes  uint64 // held in all buffers
	// restoring is the part of bytes the restores in progress reserved
	// for their buffers (memHold, ecrestore_mem.go).
	restoring uint64
	limit     uint64 // what bytes may reach; 0: half the host's memory (tests set it)
}

// reserve accounts for a buffer growing from old to n bytes: it fails if
// the replicas held here would take more than half the host's memory. A
// buffer that shrinks (n ≤ old) is always accounted.
func (st *replicaStore) reserve(n, old uint64) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	limit := cmp.Or(st.limit, physicalMemory()/2)
	if next := st.bytes - old + n; n > old && limit > 0 && next > limit {
		return fmt.Errorf("the replicas held here would take %d bytes, more than half this host's memory", next)
	}
	st.bytes = st.bytes - old + n
	return nil
}

func newReplicaStore(h *Keeper) *replicaStore {
	return &replicaStore{h: h, owners: map[int]*ownerReplica{}, conns: map[net.Conn]struct{}{}}
}

func (st *replicaStore) owner(r int) *ownerReplica {
	st.mu.Lock()
	defer st.mu.Unlock()
	o := st.owners[r]
	if o == nil {
		o = &ownerReplica{rank: r, bufs: [2]replicaBuf{{step: noStep}, {step: noStep}}, hmin: noStep}
		st.owners[r] = o
	}
	return o
}

func (st *replicaStore) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	for c := range st.conns {
		c.Close()
	}
	st.owners = map[int]*ownerReplica{}
}

// restart begins restart generation gen, in which every rank resumes from
// step g: the replicas of steps after g sent in older generations are
// dropped (they were never recoverable and are gone from their owners'
// slots), and puts from older generations are refused from now on. A
// roll-back (Keeper.RollBack) also forgets the H an owner said its stores'
// bases reached (baseH) when it is past g: it was of the abandoned
// schedule.
func (st *replicaStore) restart(gen uint64, g int64, rollback bool) {
	st.mu.Lock()
	owners := make([]*ownerReplica, 0, len(st.owners))
	for _, o := range st.owners {
		owners = append(owners, o)
	}
	st.mu.Unlock()
	for _, o := range owners {
		o.mu.Lock()
		o.gen = max(o.gen, gen)
		for i := range o.bufs {
			if b := &o.bufs[i]; b.gen < gen && b.step > g {
				b.step = noStep
			}
		}
		if rollback && o.hmin > g {
			o.hmin = noStep
		}
		if st.h.diffMode() {
			st.restartDiff(o, gen, g)
		}
		o.mu.Unlock()
	}
}

// serve answers the requests of host from on c until c fails.
func (st *replicaStore) serve(ctx context.Context, from int, c net.Conn) {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		c.Close()
		return
	}
	st.conns[c] = struct{}{}
	st.mu.Unlock()
	defer func() {
		st.mu.Lock()
		delete(st.conns, c)
		st.mu.Unlock()
		c.Close()
	}()
	log := st.h.log.With("from host", from)
	var hb [linkHdrSize]byte
	var ecBuf []byte // the link's ecChunk buffer, kept from one to the next
	for ctx.Err() == nil {
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return
		}
		h, err := parseLinkHdr(hb[:])
		if err != nil {
			log.Warn("closing a replication link", "err", err)
			return
		}
		t, err := readTable(c, h.count)
		if err != nil {
			log.Warn("closing a replication link", "err", err)
			return
		}
		switch h.kind {
		case kindPut:
			err = st.put(c, h, t)
		case kindHas:
			err = st.has(c, h, t)
		case kindGet:
			err = st.get(c, h)
		case kindGetSlot:
			err = st.getSlot(c, h, t)
		case kindGetLog:
			err = st.getLog(c, h, t) // eclog.go
		case kindECChunk, kindECCommit, kindECHas, kindECGet, kindGetRange:
			err = st.h.parity.serveEC(c, h, t, &ecBuf)
		case kindBase, kindDiff, kindBaseChunk, kindBaseCommit, kindDiffRef, kindBaseH:
			if !st.h.diffMode() {
				err = fmt.Errorf("request kind %d of --protect-mode diff, this host runs full", h.kind)
				break
			}
			switch h.kind {
			case kindBase:
				err = st.base(c, h, t)
			case kindBaseH:
				err = st.baseH(c, h, t)
			case kindDiff:
				if st.logHolder(h) {
					err = st.logDiff(c, h, t)
					break
				}
				err = st.diff(c, h, t)
			case kindBaseChunk:
				err = st.baseChunk(c, h, t)
			case kindDiffRef:
				err = st.diffRef(c, h, t)
			default:
				err = st.baseCommit(c, h, t)
			}
		default:
			err = fmt.Errorf("unknown request kind %d", h.kind)
		}
		if err != nil {
			log.Warn("closing a replication link", "err", err)
			return
		}
	}
}

// put receives owner's step into the holder's buffer. Only a link failure
// or a malformed frame is an error; a refusal is answered.
//
// The owner's lock is not held while the data is read from the network:
// a sender that stalls mid-frame (its host frozen, or partitioned) would
// otherwise hold every request on that owner's replicas (a restore's
// get, a has, the sweep, a restart, the debug flip) until its connection
// died. The buffer being received is claimed instead (replicaBuf.recv):
// it holds no step meanwhile, so nothing else reads it, and a put or
// the sweep that takes it over (replicaBuf.supersede) ends this one: its
// read fails at once (a deadline on c), or it is refused at its end. Its
// slices stay counted against the store's limit until then.
func (st *replicaStore) put(c net.Conn, h linkHdr, t []tableEntry) error {
	total := tableBytes(t)
	if h.length != total || h.step < 0 {
		return fmt.Errorf("put of %d bytes for regions of %d, step %d", h.length, total, h.step)
	}

	if refuse := st.notHolder(h); refuse != "" {
		return refusePut(c, h, failOther, refuse)
	}
	o := st.owner(h.owner)
	buf, claim, data, why, refuse, err := st.claimBuf(o, h, t, c)
	if err != nil {
		return err
	}
	if refuse != "" {
		return refusePut(c, h, why, refuse)
	}
	var rerr error
	for _, d := range data {
		if _, rerr = io.ReadFull(c, d); rerr != nil {
			break
		}
	}
	bad := -1
	var got uint32
	if rerr == nil {
		for i, e := range t {
			if got = crc32c.Checksum(data[i]); got != e.sum {
				bad = i
				break
			}
		}
	}
	o.mu.Lock()
	mine := buf.recv == claim
	if mine {
		buf.recv = nil
	}
	if rerr == nil {
		// A take-over, or a put refused over the limit, may have set a
		// read deadline after this put had read all its data: the link
		// is in step, and its next request must be read. (Every setter
		// holds o.mu and needs the claim attached: none comes after.)
		c.SetReadDeadline(time.Time{})
	}
	superseded := claim.held // the slices it received into, when taken over
	known := max(o.gen, st.h.Gen())
	switch {
	case rerr != nil:
	case !mine || o.dropped:
		why, refuse = failOther, fmt.Sprintf("rank %d step %d: the buffer was taken over while it was received (a newer put, or the replicas dropped)", h.owner, h.step)
	case h.gen < known:
		why, refuse = failStale, fmt.Sprintf("rank %d step %d: a put of restart generation %d, this holder knows generation %d", h.owner, h.step, h.gen, known)
	case bad >= 0:
		why, refuse = failCRC, fmt.Sprintf("rank %d step %d region %s: CRC32C %08x, the owner's is %08x", h.owner, h.step, t[bad].name, got, t[bad].sum)
	default:
		buf.step = h.step
	}
	o.mu.Unlock()
	st.reserve(0, superseded)
	switch {
	case rerr != nil:
		return rerr
	case refuse != "":
		return writeFail(c, h, why, refuse)
	}
	return writeAck(c, h)
}

// claimBuf picks the buffer of o that h's put (with table t) is received
// into and claims it: the buffer, the claim, and the slices to read the
// regions into (the buffer's own, or new ones when another put's claim
// still writes them). It returns a refusal (why, refuse) instead when h
// is no longer for this holder or is stale, or when new slices for it
// would take the replicas held here past their limit while another put
// or a get still uses the buffer's (a put is ended then, and a retry
// finds the buffer free; a get is not: the retries are refused until it
// ends, by its receiver or the link's TCP user timeout); and an error
// when the buffer cannot be reserved.
// c is h's link (a take-over ends the read of the put on it).
func (st *replicaStore) claimBuf(o *ownerReplica, h linkHdr, t []tableEntry, c net.Conn) (buf *replicaBuf, claim *bufClaim, data [][]byte, why uint32, refuse string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	// A new placement may have come meanwhile (and dropped o).
	if refuse := st.notHolder(h); refuse != "" || o.dropped {
		return nil, nil, nil, failOther, cmp.Or(refuse, fmt.Sprintf("rank %d's replicas are no longer kept here", h.owner)), nil
	}
	if known := max(o.gen, st.h.Gen()); h.gen < known {
		return nil, nil, nil, failStale, fmt.Sprintf("rank %d step %d: a put of restart generation %d, this holder knows generation %d", h.owner, h.step, h.gen, known), nil
	}
	o.gen = h.gen
	// The victim: a buffer holding this step or a later one (from before a
	// restart), else the older one. The other keeps the newest step
	// before this one, which the overwrite rule may still need.
	v := 0
	switch b := o.bufs; {
	case b[0].step >= h.step:
		v = 0
	case b[1].step >= h.step:
		v = 1
	case b[1].step < b[0].step:
		v = 1
	}
	buf = &o.bufs[v]
	// Replicas live in this agent's memory: all of them together may take
	// at most half the host's, whatever peers announce.
	total := tableBytes(t)
	switch {
	case buf.recv != nil || buf.pinned():
		// A put still receiving into the buffer (its sender stalled), or
		// a get still sending it (its receiver stalled), keeps its slices
		// until it ends, and they stay counted meanwhile; this put takes
		// new ones, if they fit besides.
		if err := st.reserve(total, 0); err != nil {
			if buf.recv != nil {
				buf.recv.conn.SetReadDeadline(time.Now())
			}
			return nil, nil, nil, failOther, fmt.Sprintf("rank %d step %d: the buffer is still in use by another request, and new memory for it would exceed the limit: %v", h.owner, h.step, err), nil
		}
		st.reserve(0, buf.supersede()) // 0: they are in use
		newSlices(buf, t)
	case !sameShape(buf.table, t):
		old := bufBytes(buf.data)
		if err := st.reserve(total, old); err != nil {
			st.reserve(0, buf.supersede()) // the buffer is dropped
			buf.step = noStep
			return nil, nil, nil, 0, "", fmt.Errorf("put of %d bytes for rank %d: %w", total, h.owner, err)
		}
		newSlices(buf, t)
	}
	buf.step, buf.gen = noStep, h.gen
	buf.table = t
	buf.recv = &bufClaim{conn: c}
	return buf, buf.recv, buf.data, 0, "", nil
}

// newSlices gives buf zeroed slices of t's sizes (already counted).
func newSlices(buf *replicaBuf, t []tableEntry) {
	buf.data, buf.pin = make([][]byte, len(t)), nil
	for i, e := range t {
		buf.data[i] = make([]byte, e.size)
	}
}
