package keeper

// Replication between hosts (DEADPOOL §V-B). After a rank's step commits,
// its replicator sends the replicated regions of that slot to the rank's
// replica holders, over authenticated links from each local rank to each
// holder's host (dialed by the sending host, request and answer in turn),
// so that a host's ranks replicate side by side. The holder's host keeps two
// buffers per owner, the newest complete step and the one being received,
// checks every region's CRC32C against the owner's and acknowledges; the
// owner counts a step replicated once every holder acknowledged it.
//
// A link carries requests from the dialer and answers from the acceptor:
//
//	request  = header table [data]
//	answer   = header (table data | message)
//	header   = magic(1)=0xA7 kind(1) count(2) owner(4) holder(4) reserved(4) step(8) gen(8) length(8)
//	table    = count × (nameLen(1) name size(8) crc32c(4))
//
// big-endian. Kinds: put (the owner's regions, data follows), has (does
// the holder hold owner's step with exactly the table's regions and
// CRC32Cs, and do its bytes still match them? no data; acknowledged if
// so), get (a holder's replica of owner
// at step), getSlot (a rank's own slot regions at step, for params), and
// the answers ack, data, fail (length = the message's bytes; reserved =
// why, see failCRC). Everything read is bounds-checked before use; a
// malformed request closes the link.
//
// With erasure coding (Config.EC, ec.go) the links carry five more
// kinds: ecChunk, ecCommit, ecHas, ecGet and getRange (10 to 14), whose
// table is followed by a sub-header
//
//	ecHdr = group(4) stripe(4) row(2) member(2) crc(4) off(8) n(8) epoch(8)
//
// and, for ecChunk, its data: see ecstore.go and PROTOCOL.md ("Erasure
// coding").
//
// In diff mode (Config.Mode ModeDiff) the holder keeps a base and a
// differential log per owner instead of two buffers, and the links carry
// four more kinds (base, diff, baseChunk, baseCommit): see diff.go; it
// answers a get of an exact step with a pieces answer: see pieces.go.
//
// gen is the owner host's restart generation when it read the step from
// its slot. A holder refuses a put older than the newest generation it
// knows for that owner (its own, or one a put of the owner carried): a
// put of a step after G from before a restart, still queued on an old
// link, would otherwise replace the same step of the new generation, and
// its CRCs match its bytes, so a restore would take it.

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
)

const (
	linkMagic   = 0xA7
	linkHdrSize = 40

	kindPut     = 1
	kindGet     = 2
	kindGetSlot = 3
	kindHas     = 4
	kindAck     = 0x81
	kindData    = 0x82
	kindFail    = 0x83

	maxFailMsg = 4096

	// Why a holder refused a request (the reserved word of a fail answer).
	failOther = 0
	failCRC   = 1 // a put's data did not match the owner's CRC32C
	failStale = 2 // a put's generation is older than one the holder knows
)

type linkHdr struct {
	kind   byte
	count  int
	owner  int
	holder int
	why    uint32 // of a fail answer: failOther, failCRC, failStale
	step   int64
	gen    uint64
	length uint64
}

func (h *linkHdr) put(b []byte) {
	b[0], b[1] = linkMagic, h.kind
	binary.BigEndian.PutUint16(b[2:], uint16(h.count))
	binary.BigEndian.PutUint32(b[4:], uint32(h.owner))
	binary.BigEndian.PutUint32(b[8:], uint32(h.holder))
	binary.BigEndian.PutUint32(b[12:], h.why)
	binary.BigEndian.PutUint64(b[16:], uint64(h.step))
	binary.BigEndian.PutUint64(b[24:], h.gen)
	binary.BigEndian.PutUint64(b[32:], h.length)
}

func parseLinkHdr(b []byte) (linkHdr, error) {
	h := linkHdr{
		kind: b[1], count: int(binary.BigEndian.Uint16(b[2:])),
		owner: int(binary.BigEndian.Uint32(b[4:])), holder: int(binary.BigEndian.Uint32(b[8:])),
		why:  binary.BigEndian.Uint32(b[12:]),
		step: int64(binary.BigEndian.Uint64(b[16:])), gen: binary.BigEndian.Uint64(b[24:]),
		length: binary.BigEndian.Uint64(b[32:]),
	}
	switch {
	case b[0] != linkMagic:
		return h, errors.New("not a replication frame")
	case h.count > protect.MaxRegions:
		return h, fmt.Errorf("%d regions", h.count)
	case h.owner > 1<<30 || h.holder > 1<<30:
		return h, fmt.Errorf("rank %d or %d out of range", h.owner, h.holder)
	case h.step < noStep || h.step > protect.MaxStep:
		return h, fmt.Errorf("step %d out of range", h.step)
	}
	return h, nil
}

// tableEntry describes one region in a frame.
type tableEntry struct {
	name string
	size int64
	sum  uint32
}

func appendTable(b []byte, t []tableEntry) []byte {
	for _, e := range t {
		b = append(b, byte(len(e.name)))
		b = append(b, e.name...)
		b = binary.BigEndian.AppendUint64(b, uint64(e.size))
		b = binary.BigEndian.AppendUint32(b, e.sum)
	}
	return b
}

func readTable(r io.Reader, n int) ([]tableEntry, error) {
	if n < 0 || n > protect.MaxRegions {
		return nil, fmt.Errorf("%d regions", n)
	}
	t := make([]tableEntry, n)
	var nb [1]byte
	var rest [12]byte
	for i := range t {
		if _, err := io.ReadFull(r, nb[:]); err != nil {
			return nil, err
		}
		if nb[0] == 0 || int(nb[0]) > ckpt.MaxRegionName {
			return nil, fmt.Errorf("region name of %d bytes", nb[0])
		}
		name := make([]byte, nb[0])
		if _, err := io.ReadFull(r, name); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(r, rest[:]); err != nil {
			return nil, err
		}
		e := tableEntry{name: string(name), size: int64(binary.BigEndian.Uint64(rest[:])), sum: binary.BigEndian.Uint32(rest[8:])}
		if !ckpt.ValidRegionName(e.name) || e.size < 0 || e.size > protect.MaxRegionSize {
			return nil, fmt.Errorf("bad region %q of %d bytes", trunc(e.name), e.size)
		}
		for _, p := range t[:i] {
			if p.name == e.name {
				return nil, fmt.Errorf("region %q twice", e.name)
			}
		}
		t[i] = e
	}
	return t, nil
}

// tableBytes is the data that follows a table: its regions' sizes (0 for
// a request's table, whose sizes are 0).
func tableBytes(t []tableEntry) uint64 {
	var n uint64
	for _, e := range t {
		n += uint64(e.size)
	}
	return n
}

// writeFrame writes a header, a table and the data views; the header's
// count comes from the table, its length too when data follow (nil data:
// a table alone, of length 0).
func writeFrame(w io.Writer, h linkHdr, t []tableEntry, data [][]byte) error {
	h.count, h.length = len(t), 0
	if data != nil {
		h.length = tableBytes(t)
	}
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45)
	h.put(b)
	b = appendTable(b, t)
	bufs := net.Buffers{b}
	for _, d := range data {
		if len(d) > 0 {
			bufs = append(bufs, d)
		}
	}
	_, err := bufs.WriteTo(w)
	return err
}

func writeFail(w io.Writer, h linkHdr, why uint32, msg string) error {
	if len(msg) > maxFailMsg {
		msg = msg[:maxFailMsg]
	}
	h.kind, h.count, h.why, h.length = kindFail, 0, why, uint64(len(msg))
	b := make([]byte, linkHdrSize, linkHdrSize+len(msg))
	h.put(b)
	b = append(b, msg...)
	_, err := w.Write(b)
	return err
}

// refusePut drains a put's data, then refuses it: the link stays in
// step.
func refusePut(c io.ReadWriter, h linkHdr, why uint32, msg string) error {
	if _, err := io.CopyN(io.Discard, c, int64(h.length)); err != nil {
		return err
	}
	return writeFail(c, h, why, msg)
}

// writeAck acknowledges request h.
func writeAck(w io.Writer, h linkHdr) error {
	a := linkHdr{kind: kindAck, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
	var ab [linkHdrSize]byte
	a.put(ab[:])
	_, err := w.Write(ab[:])
	return err
}

// bufBytes is the size of a buffer's data.
func bufBytes(data [][]byte) uint64 {
	var n uint64
	for _, d := range data {
		n += uint64(len(d))
	}
	return n
}

// readAck reads the answer to request h: nil if it is h's
// acknowledgement, the holder's refusal (a *remoteError), or an error
// for anything else.
func readAck(r io.Reader, h linkHdr) error {
	a, err := readAnswer(r)
	if err != nil {
		return err
	}
	if a.kind != kindAck || a.owner != h.owner || a.step != h.step || a.holder != h.holder {
		return fmt.Errorf("unexpected answer kind %#x for rank %d step %d", a.kind, a.owner, a.step)
	}
	return nil
}

// readAnswer reads an answer's header, and a fail's message as an error.
func readAnswer(r io.Reader) (linkHdr, error) {
	var hb [linkHdrSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return linkHdr{}, err
	}
	h, err := parseLinkHdr(hb[:])
	if err != nil {
		return h, err
	}
	if h.kind == kindFail {
		if h.length > maxFailMsg {
			return h, fmt.Errorf("failure message of %d bytes", h.length)
		}
		msg := make([]byte, h.length)
		if _, err := io.ReadFull(r, msg); err != nil {
			return h, err
		}
		e := &remoteError{why: h.why, msg: string(msg)}
		if h.why == failGap || h.why == failNoLocal || h.why == failDiverged {
			e.next = int64(h.gen)
		}
		return h, e
	}
	return h, nil
}

var (
	// errPutDamaged: a holder received data that does not match the
	// CRC32Cs the owner committed (see replicator.send).
	errPutDamaged = errors.New("the data received did not match the owner's CRC32C")
	// errPutStale: a holder refused a put from an older restart
	// generation than one it knows.
	errPutStale = errors.New("the put is from an older restart generation")
)

// remoteError is a request the other host refused; the link stays usable.
// It matches errPutDamaged or errPutStale when the holder said why.
type remoteError struct {
	why  uint32
	msg  string
	next int64 // failGap: the step the holder takes next, -1 if it needs a base; failNoLocal: the step to try again from
}

func (e *remoteError) Error() string { return "refused by the holder: " + e.msg }

func (e *remoteError) Is(target error) bool {
	return e.why == failCRC && target == errPutDamaged || e.why == failStale && target == errPutStale ||
		e.why == failGap && target == errHolderGap || e.why == failPending && target == errDiffPending ||
		e.why == failBehindH && target == errBehindH
}

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
	// differentials differs from its commit (diff.go, foldLoop); the
	// owner's differentials are refused with failDiverged until a base
	// or a restart.
	diverged   *CorruptError
	held       uint64      // the bytes reserved for the stores (replicaStore.reserve)
	foldQueued atomic.Bool // queued for the fold goroutine
	// recs holds the owner's record buffers its stores handed back,
	// for the next differentials' records (diff.go, recPool).
	recs recPool
	// chunk is the buffer a base's or a refresh's chunks are read into
	// before they are copied into the store (guarded by mu), kept from
	// one chunk to the next.
	chunk []byte
	// log (diff mode under EC): this host is one of the owner's log-only
	// holders (Placement.Logs): the owner's differentials after its
	// newest coded base, with no base (diffstore.Log); nil otherwise.
	log *diffstore.Log
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
	limit  uint64 // what bytes may reach; 0: half the host's memory (tests set it)
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
	err := writeFrame(c, d, t, data)
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
		linkErr = writeFrame(c, d, t, data)
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

// ---- The owner's side --------------------------------------------------

// replicator sends one rank's committed steps to its holders, every one
// in order to each holder: a holder must have every step that G may come
// to name (when step s+1 commits before step s is sent, G may still be
// s), and the overwrite rule keeps a step's slot until the next one is
// replicated. Steps older than the G known here are not sent (nothing
// will ever restore them).
//
// It keeps what each holder of the current placement is known to hold
// (acked): the newest step the holder acknowledged in this generation
// since it became a holder. A holder it knows nothing of (a new holder,
// a holder that moved to another host, every holder after a restart or a
// restore) is first asked whether it holds the step to send (kindHas:
// after a restart the holders on surviving hosts do), and sent it if not.
// The rank's Replicated is the oldest of its current holders' steps:
// it claims a step only once every holder of the placement has it.
//
// A send that fails is retried, with a backoff, for as long as the failure
// may be transient: a link down, a holder not yet restarted or not yet in
// the new placement, data damaged on the way. A holder that refuses the
// data as not matching the owner's CRC32Cs has the owner verify its slot
// against the CRC32Cs of its commit; if the slot no longer matches them,
// the rank's state is corrupt and no retry can help: the replicator stops
// until the next restart and the rank is failed (service.fail).
type replicator struct {
	s       *service
	mu      sync.Mutex // guards the fields below
	wantS   int64      // newest committed step to replicate
	acked   map[holderKey]int64
	ver     uint64 // changes when acked is forgotten or the holders change: a send begun before records nothing
	running bool
	cancel  context.CancelFunc
	done    chan struct{}
	wake    chan struct{} // ends a backoff wait early (new placement or addresses)
	stopped bool          // the service closed
	failed  bool          // the rank's state is corrupt: nothing to send until reset
	// restoring: the rank's slot is being rewritten (restoreRemote):
	// nothing starts the loop until resume.
	restoring bool

	fails atomic.Int64 // rounds that failed (and were retried, or stopped), ever

	// Diff mode (diff.go).
	dq      []*ownerDiff        // differentials some holder may still need, consecutive steps
	dqBytes int64               // their bytes on the wire
	dnext   map[holderKey]int64 // the step each holder takes next; absent: ask it, or send it a base
	dfails  map[holderKey]int   // consecutive refusals of a differential as damaged
	ref     *refresh            // the base refresh being sent, or nil
	refStep int64               // the step of the last refresh (at first, of the first step sent), or -1
	refProg map[holderKey]*refProg
	refPool bufPool // the snapshot buffer of a refresh nothing reads any more, for the next

	// Erasure coding (ecsend.go): the share buffers, used by one send at
	// a time (the loop's, or in diff mode the base's sendShares).
	ec ecBufs
	// Diff mode under EC: the base schedule and the coded bases
	// (ecdiff_owner.go).
	ecb ecBase
}

func (r *replicator) init(s *service) {
	r.s, r.wantS, r.refStep = s, noStep, noStep
	r.acked = map[holderKey]int64{}
	r.dnext, r.dfails, r.refProg = map[holderKey]int64{}, map[holderKey]int{}, map[holderKey]*refProg{}
	r.wake = make(chan struct{}, 1)
	r.refPool.max = 1
}

// replicatedIn returns the newest step every holder of placement p
// acknowledged since it became one (MaxStep when the rank has no
// holders): derived from acked and p each time, so that a report taken
// under a new placement never counts the holders of the one before.
//
// In diff mode under EC the parity rows hold base steps only: the
// minimum is over the differentials' targets (the clear copy's holder
// and the log-only holders), capped by the coded bases (capLocked).
func (r *replicator) replicatedIn(p *placement) int64 {
	ts := p.allTargets(r.s.rank)
	if len(ts) == 0 {
		return protect.MaxStep // every committed step
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := int64(protect.MaxStep)
	for _, k := range ts {
		if k.row > 0 && p.ecDiff() {
			continue
		}
		a, ok := r.acked[k]
		if !ok {
			a = noStep
		}
		m = min(m, a)
	}
	if p.ecDiff() {
		m = min(m, r.capLocked(p))
	}
	return m
}

// want has step, newly committed, (and the steps before it that a holder
// lacks) replicated.
func (r *replicator) want(step int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.failed {
		return
	}
	r.wantS = max(r.wantS, step)
	r.startLocked()
}

func (r *replicator) startLocked() {
	if r.running || r.restoring || r.wantS < 0 {
		return
	}
	r.running = true
	ctx, cancel := context.WithCancel(r.s.h.life)
	r.cancel, r.done = cancel, make(chan struct{})
	if r.s.h.diffMode() {
		go r.loopDiff(ctx, cancel, r.done)
		return
	}
	go r.loop(ctx, cancel, r.done)
}

// forget drops what is known of the holders: each is asked again before
// Replicated counts it. The replicator is not running (reset).
func (r *replicator) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.acked)
	clear(r.dnext)
	clear(r.dfails)
	clear(r.refProg)
	r.ver++
}

// placed switches to placement p's holders: those that left are
// forgotten, the new ones (and the ones that moved to another host) are
// asked, and the newest committed step is sent to those that lack it.
func (r *replicator) placed(p *placement) {
	s := r.s
	s.mu.Lock()
	committed := s.committed
	s.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := p.allTargets(s.rank)
	changed := len(ts) != len(r.acked)
	for k := range r.acked {
		if !slices.Contains(ts, k) {
			delete(r.acked, k)
			changed = true
		}
	}
	for k := range r.dnext {
		if !slices.Contains(ts, k) {
			delete(r.dnext, k)
			delete(r.dfails, k)
			delete(r.refProg, k)
		}
	}
	for _, k := range ts {
		if _, ok := r.acked[k]; !ok {
			changed = true
		}
	}
	if changed {
		r.ver++
	}
	r.poke()
	if r.stopped || r.failed || committed < 0 {
		return
	}
	r.wantS = max(r.wantS, committed)
	r.startLocked()
}

// poke ends the loop's backoff wait, if it is in one.
func (r *replicator) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// reset cancels the replication in flight and waits for it to end; a
// replicator stopped by a corrupt state may start again.
func (r *replicator) reset() {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.wantS, r.failed = noStep, false
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	r.stopShares()
}

// pause cancels the replication in flight, waits for it to end, and
// keeps it from starting again until resume: the slots are rewritten.
// What the holders acknowledged is forgotten (each is asked again).
func (r *replicator) pause() {
	r.mu.Lock()
	r.restoring = true
	r.mu.Unlock()
	r.reset()
	r.forget()
}

// resume ends a pause and has step (the rank's newest committed step, -1:
// none) replicated.
func (r *replicator) resume(step int64) {
	r.mu.Lock()
	r.restoring = false
	r.mu.Unlock()
	r.want(step)
}

func (r *replicator) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.reset()
}

// sendPlan is one round of the loop: step, to the holders lacking it.
type sendPlan struct {
	step  int64
	to    []holderKey
	known []bool // whether acked knows to[i] (else it is asked first)
	ver   uint64
}

// planLocked returns the next round: the oldest step that some holder
// lacks, among the slots' steps from G (known here) to wantS, and the
// holders lacking it; step -1 when every holder is up to date. r.mu is
// held.
func (r *replicator) planLocked() sendPlan {
	s := r.s
	ts := s.h.place().allTargets(s.rank)
	g := s.h.G()
	s.mu.Lock()
	steps := s.slotStep
	s.mu.Unlock()
	next := func(after int64) int64 {
		n := int64(noStep)
		for _, st := range steps {
			if st > after && st >= g && st <= r.wantS && (n < 0 || st < n) {
				n = st
			}
		}
		return n
	}
	p := sendPlan{step: noStep, ver: r.ver}
	for _, k := range ts {
		a, ok := r.acked[k]
		if !ok {
			a = noStep
		}
		n := next(a)
		switch {
		case n < 0:
		case p.step < 0 || n < p.step:
			p.step, p.to, p.known = n, []holderKey{k}, []bool{ok}
		case n == p.step:
			p.to, p.known = append(p.to, k), append(p.known, ok)
		}
	}
	return p
}

func (r *replicator) loop(ctx context.Context, cancel context.CancelFunc, done chan struct{}) {
	defer close(done)
	defer cancel()
	s := r.s
	var rt roundRetry
	for {
		r.mu.Lock()
		var p sendPlan
		if ctx.Err() == nil && !r.failed {
			p = r.planLocked()
		}
		if p.step < 0 || ctx.Err() != nil || r.failed {
			r.running, r.cancel = false, nil
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		gen, errs, err := r.send(ctx, p)
		r.mu.Lock()
		if r.ver == p.ver {
			for i, k := range p.to {
				if errs[i] == nil {
					r.acked[k] = max(r.acked[k], p.step)
				}
			}
		}
		r.mu.Unlock()
		s.h.cfg.Changed()
		r.afterRound(ctx, gen, err, &rt, "step", p.step)
	}
}

// roundRetry is a replication loop's state between its rounds: the wait
// before the next try after a failure, and the failures in a row. The
// zero value is a loop without failures.
type roundRetry struct {
	backoff  time.Duration // 0: the first wait's, 50 ms
	failures int
	logged   time.Time // when a failure was last logged
}

// afterRound takes a round's outcome err (its generation gen) in the
// replication loop whose retry state is rt: a success resets rt; a
// *CorruptError fails the rank (r.failed: the loop ends at its next
// plan); any other error is counted, logged (the first of a series, then
// every 30 s, with attrs) and waited out before the next round, 50 ms
// doubling to 2 s, cut short by a wake (new work: the wait starts over
// at 50 ms) or by ctx.
func (r *replicator) afterRound(ctx context.Context, gen uint64, err error, rt *roundRetry, attrs ...any) {
	s := r.s
	const first, most = 50 * time.Millisecond, 2 * time.Second
	switch {
	case err == nil:
		rt.backoff, rt.failures = 0, 0
		return
	case ctx.Err() != nil:
		return
	}
	if ce, ok := errors.AsType[*CorruptError](err); ok {
		r.mu.Lock()
		r.failed = true
		r.mu.Unlock()
		s.fail(gen, ce)
		return
	}
	r.fails.Add(1)
	if rt.failures++; rt.failures == 1 || time.Since(rt.logged) > 30*time.Second {
		s.h.log.Warn("replication failed; retrying", append([]any{"rank", s.rank, "mode", s.h.mode()}, append(attrs, "failures", rt.failures, "err", err)...)...)
		rt.logged = time.Now()
	}
	if rt.backoff == 0 {
		rt.backoff = first
	}
	t := time.NewTimer(rt.backoff)
	select {
	case <-t.C:
	case <-r.wake:
		t.Stop()
		rt.backoff = first
	case <-ctx.Done():
		t.Stop()
	}
	rt.backoff = min(2*rt.backoff, most)
}

// send sends p.step to the holders p.to, asking those it knows nothing of
// whether they hold it first. It returns the generation it sent in, each
// holder's error, and their join; when a holder refused the data as
// damaged and the slot no longer matches its commit, a *CorruptError.
func (r *replicator) send(ctx context.Context, p sendPlan) (uint64, []error, error) {
	s := r.s
	step := p.step
	errs := make([]error, len(p.to))
	// The generation is read before the slot: a restart begun after this
	// (a newer generation) waits for this send to end before it truncates
	// the slot, so the bytes sent are never newer than gen says; read
	// after, it could label a step of the old generation with the new one.
	gen := s.h.Gen()
	s.mu.Lock()
	slot := -1
	for i, st := range s.slotStep {
		if st == step {
			slot = i
		}
	}
	if slot < 0 { // truncated by a restore since planLocked
		s.mu.Unlock()
		err := fmt.Errorf("step %d is no longer in a slot", step)
		for i := range errs {
			errs[i] = err
		}
		return gen, errs, err
	}
	var t []tableEntry
	var data [][]byte
	for _, i := range s.repl {
		t = append(t, tableEntry{name: s.regions[i].Name, size: s.regions[i].Size, sum: s.sums[slot][i]})
		data = append(data, s.views[slot][i])
	}
	epoch := s.slotEpoch[slot]
	s.mu.Unlock()
	// The slot holding step is not staged over before step is replicated
	// (the overwrite rule needs it to be), nor truncated before reset
	// waited for this send: its views are stable here.
	start := time.Now()
	var sent atomic.Int64 // holders sent the data (not just asked)
	var wg sync.WaitGroup
	// The parity rows (erasure coding) go together: one encoding for
	// all of them.
	var rows, ri []int
	for i, k := range p.to {
		if k.row > 0 {
			ri = append(ri, i)
		}
	}
	var ecErr error
	var ecBytes int64
	if len(ri) > 0 {
		to, known := make([]holderKey, len(ri)), make([]bool, len(ri))
		for n, i := range ri {
			to[n], known[n] = p.to[i], p.known[i]
		}
		rows = ri
		wg.Go(func() {
			var rerrs []error
			rerrs, ecErr, ecBytes = r.ecSend(ctx, step, slot, gen, epoch, t, data, to, known)
			for n, i := range rows {
				errs[i] = rerrs[n]
			}
		})
	}
	for i, k := range p.to {
		if k.row > 0 {
			continue
		}
		wg.Go(func() {
			hdr := linkHdr{owner: s.rank, holder: k.rank, step: step, gen: gen}
			if !p.known[i] {
				hdr.kind = kindHas
				if s.h.links.has(ctx, k.host, hdr, t) == nil {
					return
				}
			}
			hdr.kind = kindPut
			errs[i] = s.h.links.put(ctx, k.host, hdr, t, data)
			if errs[i] == nil {
				sent.Add(1)
			}
			if le, ok := errors.AsType[*linkError](errs[i]); ok && ctx.Err() == nil {
				s.h.linkFailed(k.host, le)
			}
		})
	}
	wg.Wait()
	if ce, ok := errors.AsType[*CorruptError](ecErr); ok {
		return gen, errs, ce
	}
	if ecBytes > 0 {
		s.replBytes.Add(ecBytes)
	}
	if err := errors.Join(errs...); err != nil {
		if errors.Is(err, errPutDamaged) {
			// The holder's copy did not match the CRC32Cs of the
			// commit. If the slot still does, the bytes were damaged on
			// the way (retried); else they changed here after the commit.
			if ce := s.verifySlot(slot, step); ce != nil {
				return gen, errs, ce
			}
			return gen, errs, fmt.Errorf("%w (rank %d's slot of step %d still matches its commit: damaged in transit)", err, s.rank, step)
		}
		return gen, errs, err
	}
	if ctx.Err() != nil {
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return gen, errs, ctx.Err()
	}
	if n := sent.Load(); n > 0 || ecBytes > 0 {
		s.replSteps.Add(1)
		s.replNS.Add(int64(time.Since(start)))
		s.replBytes.Add(int64(tableBytes(t)) * n)
	}
	return gen, errs, nil
}

// ---- Links to other hosts ----------------------------------------------

type link struct {
	// turn is held (a value in it) by the one request on the link at a
	// time; a request waiting for its turn gives up when its context
	// ends, whatever the request before it waits for.
	turn chan struct{}
	conn atomic.Pointer[net.Conn] // the connection, or nil; read by close without turn
}

type linkPool struct {
	h      *Keeper
	mu     sync.Mutex
	links  map[linkKey]*link
	addrs  []string
	closed bool
}

// linkKey names a link: each local rank has its own to each other host,
// so that the ranks of a host replicate side by side rather than one
// after the other (at most ranks per host × replicas links per host).
// lane is 0 but for a rank's erasure-coding shares to a host that keeps
// several parity rows of its stripe (a host holding several places of a
// group): each row's stream has a lane of its own, as the rows' senders
// run side by side (ecSend).
type linkKey struct{ host, rank, lane int }

func newLinkPool(h *Keeper) *linkPool { return &linkPool{h: h, links: map[linkKey]*link{}} }

// SetAddrs sets the replication address of every host (indexed by host).
// Replications waiting to retry try again at once.
func (h *Keeper) SetAddrs(addrs []string) {
	h.links.mu.Lock()
	h.links.addrs = slices.Clone(addrs)
	h.links.mu.Unlock()
	for _, s := range h.place().svcs {
		s.rep.poke()
	}
}

// linkError is a failure of the link to another host itself (it could
// not be dialed, or broke), not a refusal by that host.
type linkError struct {
	host int
	err  error
}

func (e *linkError) Error() string { return fmt.Sprintf("link to host %d: %v", e.host, e.err) }
func (e *linkError) Unwrap() error { return e.err }

func (p *linkPool) get(host, rank, lane int) (*link, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, "", ErrStopping
	}
	if host != p.h.cfg.Host && (host < 0 || host >= len(p.addrs) || p.addrs[host] == "") {
		return nil, "", fmt.Errorf("no replication address for host %d", host)
	}
	k := linkKey{host, rank, lane}
	l := p.links[k]
	if l == nil {
		l = &link{turn: make(chan struct{}, 1)}
		p.links[k] = l
	}
	if host == p.h.cfg.Host {
		return l, "", nil
	}
	return l, p.addrs[host], nil
}

// pipe returns a link to this host itself: an in-process connection
// served by the replica store as an accepted link is (erasure coding
// sends a rank's share of a parity row kept on its own host). p.mu is
// held, p is not closed.
func (p *linkPool) pipe() net.Conn {
	c, srv := net.Pipe()
	p.h.wg.Add(1)
	go func() {
		defer p.h.wg.Done()
		p.h.store.serve(p.h.life, p.h.cfg.Host, srv)
	}()
	return c
}

func (p *linkPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, l := range p.links {
		// A request in flight holds l.turn; closing its conn ends it.
		if c := l.conn.Load(); c != nil {
			(*c).Close()
		}
	}
}

// do runs one request of local rank rank on its link to host: f writes
// it and reads the answer. A link failure drops the connection (the next
// request redials); a refusal keeps it.
func (p *linkPool) do(ctx context.Context, host, rank int, f func(c net.Conn) error) error {
	return p.doLane(ctx, host, rank, 0, f)
}

// doLane is do on lane lane of the link (linkKey).
func (p *linkPool) doLane(ctx context.Context, host, rank, lane int, f func(c net.Conn) error) error {
	l, addr, err := p.get(host, rank, lane)
	if err != nil {
		return err
	}
	if ctx.Err() != nil { // select would pick a free turn as readily
		return context.Cause(ctx)
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { <-l.turn }()
	if l.conn.Load() == nil && host == p.h.cfg.Host {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ErrStopping
		}
		c := p.pipe()
		l.conn.Store(&c)
		p.mu.Unlock()
	}
	if l.conn.Load() == nil {
		c, err := comm.DialLink(ctx, addr, p.h.linkAuth(), p.h.cfg.Host, host)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			return &linkError{host: host, err: err}
		}
		// Stored under p.mu, so that close either sees it or refuses it.
		p.mu.Lock()
		closed := p.closed
		if !closed {
			l.conn.Store(&c)
		}
		p.mu.Unlock()
		if closed {
			c.Close()
			return ErrStopping
		}
	}
	c := *l.conn.Load()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err = f(c)
	_, refused := errors.AsType[*remoteError](err)
	if fired := !stop(); fired || err != nil && !refused {
		if fired && err == nil {
			err = ctx.Err()
		}
		if !fired {
			err = &linkError{host: host, err: err}
		}
		c.Close()
		l.conn.Store(nil)
	}
	return err
}

// has asks host whether it holds the step of h (a has request) with the
// regions of t, and waits for the answer: nil if it does.
func (p *linkPool) has(ctx context.Context, host int, h linkHdr, t []tableEntry) error {
	return p.acked(ctx, host, h, t, nil)
}

// put sends a put and waits for its acknowledgement.
func (p *linkPool) put(ctx context.Context, host int, h linkHdr, t []tableEntry, data [][]byte) error {
	return p.acked(ctx, host, h, t, data)
}

// acked sends request h with table t and data (nil: none) and waits for
// its acknowledgement.
func (p *linkPool) acked(ctx context.Context, host int, h linkHdr, t []tableEntry, data [][]byte) error {
	return p.do(ctx, host, h.owner, func(c net.Conn) error {
		if err := writeFrame(c, h, t, data); err != nil {
			return err
		}
		return readAck(c, h)
	})
}

// fetch asks host for regions (a get or getSlot request h) and reads them
// into dst, by name, verifying each region's CRC32C and size (readFetched).
func (p *linkPool) fetch(ctx context.Context, host int, h linkHdr, want []tableEntry, dst map[string][]byte) error {
	return p.do(ctx, host, h.owner, func(c net.Conn) error {
		if err := writeFrame(c, h, want, nil); err != nil {
			return err
		}
		return readFetched(c, h, dst)
	})
}

// readFetched reads the answer to request h (a get or getSlot) into dst,
// by name, verifying each region's CRC32C and size, and deleting from dst
// each region it filled: every region of dst must be in the answer. The
// answer is a data answer, or, to a get, a pieces answer (a diff-mode
// holder's: pieces.go), whose pieces it writes where they go.
func readFetched(c io.Reader, h linkHdr, dst map[string][]byte) error {
	a, err := readAnswer(c)
	if err != nil {
		return err
	}
	pieces := a.kind == kindPieces && h.kind == kindGet
	if a.kind != kindData && !pieces || a.step != h.step {
		return fmt.Errorf("unexpected answer kind %#x step %d", a.kind, a.step)
	}
	t, err := readTable(c, a.count)
	if err != nil {
		return err
	}
	if total := tableBytes(t); total != a.length {
		return fmt.Errorf("data of %d bytes for regions of %d", a.length, total)
	}
	if pieces {
		views := make([][]byte, len(t))
		for i, e := range t {
			d, ok := dst[e.name]
			if !ok || int64(len(d)) != e.size {
				return fmt.Errorf("region %q of %d bytes does not fit here (%d)", e.name, e.size, len(d))
			}
			views[i] = d
		}
		if err := readPieces(c, t, views, h.step); err != nil {
			return err
		}
	}
	for _, e := range t {
		if !pieces {
			err := fillRegion(dst, e, h.step, func(d []byte) error { _, err := io.ReadFull(c, d); return err })
			if err != nil {
				return err
			}
		}
		delete(dst, e.name)
	}
	if len(dst) > 0 {
		return fmt.Errorf("regions missing from the answer: %d", len(dst))
	}
	return nil
}

var _ = ckpt.ErrNoStep
