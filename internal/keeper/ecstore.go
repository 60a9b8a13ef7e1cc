package keeper

// The parity store: the parity rows of erasure coding a host keeps
// (ec.go), and the EC request kinds of the replication links.
//
// Protocol (the link's request = header table [ecHdr [data]]; replica.go's
// header has the formats, PROTOCOL.md "Erasure coding" the rules):
//
//   - ecChunk: bytes [off, off+length) of owner's share of parity row of
//     stripe of group, for step (gen, ecHdr.epoch), owner being member x
//     of the stripe and its shard n bytes long; ecHdr.crc is the CRC32C
//     of the bytes. The holder checks the CRC, then XORs the bytes into
//     the row, unless they are in already: a resend is acknowledged
//     without being XORed twice if its CRC32C is that of the chunks of
//     the share that came for those bytes, and refused (failShare) if
//     not. Answer: ack, or fail (failCRC: damaged on the way; failShare;
//     failNoRoom: the row's buffer does not fit in this host's memory for
//     replicas).
//   - ecCommit: the owner's table (its replicated regions' names, sizes
//     and committed CRC32Cs) and the CRC32C of its whole share (ecHdr.crc).
//     The holder checks that every byte of the share came and that their
//     CRC32C is that one, then counts the member in. Its ack is the one
//     the owner's Replicated counts. A mismatch is refused (failCRC) and
//     changes nothing.
//   - ecHas: is owner's share of step, with exactly that table, in? Ack if
//     so.
//   - ecGet: bytes [off, off+n) of a complete row (every member in, of one
//     step, generation and label), answered with the members' tables.
//   - getRange: bytes [off, off+n) of owner's shard at step from its slot
//     here or from its clear copy (a replica) here, with its table.
//
// Trust: every field of a request is checked before use; a malformed
// request (out of range, lengths that do not add up) closes the link, a
// well-formed one this host cannot serve is refused with a reason and
// the link stays usable.
//
// Which shares may be mixed. A row buffer holds one step of one restart
// generation and one label: the epoch of the placement in which its
// shares' steps were committed (Placement.Epoch of the owner's session).
// A step after the placement's G (Placement.G) committed under an older
// placement belongs to a trajectory the ranks abandoned when they rolled
// back to G in place (same generation, other bytes, maybe other CRC32Cs):
// a share with a newer label empties the buffer first, one with an older
// label is refused (failStale), and ecHas acknowledges only a share of
// the same label, so that no member is ever told its share is in while
// a newer commit of another member may still empty the row. Steps up to
// G are final: their shares are the same whatever their label.
//
// Nothing else ever takes a member's share out of a row once it is in
// (acknowledged): the row is the XOR of the shares, and a share can only
// be taken out with its bytes, which the holder does not keep (that would
// take K times the row's memory) and the owner no longer has. So a member
// whose share in the row turns out to be of other bytes than the ones it
// sends now (a resent chunk whose CRC32C is not that of the chunk that
// came: an earlier encoding read bytes that were not the commit's, or a
// faulty peer) is *refused* for that step and label (failShare: chunks,
// commit), and only it; the row of that step never completes under that
// label, and the owner's rank fails (replicator.ecSend), so that the job
// rolls back to G and commits the step again under a newer label or
// generation, which empties the buffer. A commit whose CRC32C is not that
// of the chunks that came is refused and changes nothing.

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
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
)

const (
	kindECChunk  = 10
	kindECCommit = 11
	kindECHas    = 12
	kindECGet    = 13
	kindGetRange = 14

	// Why a parity host refused (a fail answer's reserved word).
	failShare  = 8 // the row holds other bytes of the member's share of the step
	failNoRoom = 9 // the row's buffer does not fit in the memory replicas may take here

	ecHdrSize = 48
	// maxECRange bounds the bytes of one ecChunk, ecGet or getRange.
	maxECRange = 64 << 20
	// maxShard bounds a shard's length (all its regions).
	maxShard = protect.MaxRegions * protect.MaxRegionSize
	// maxStripes bounds group and stripe indices on the wire.
	maxStripes = 1 << 24
)

// ecHdr is the sub-header of the EC request kinds:
//
//	ecHdr = group(4) stripe(4) row(2) member(2) crc(4) off(8) n(8) epoch(8) h(8)
//
// h is, in an ecChunk or ecCommit of diff mode under EC, the H the
// owner's host knows (-1: none yet): a parity host that learns H later
// than the owner's host takes the larger of its own and h when it picks
// the buffer a new base's share goes to (bufFor), so that the row of the
// H the owner went by stays. Other kinds and modes send -1, and the
// parity host ignores it there.
type ecHdr struct {
	group, stripe, row, member int
	crc                        uint32
	off, n                     int64
	epoch                      uint64
	hb                         int64
}

func (e *ecHdr) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], uint32(e.group))
	binary.BigEndian.PutUint32(b[4:], uint32(e.stripe))
	binary.BigEndian.PutUint16(b[8:], uint16(e.row))
	binary.BigEndian.PutUint16(b[10:], uint16(e.member))
	binary.BigEndian.PutUint32(b[12:], e.crc)
	binary.BigEndian.PutUint64(b[16:], uint64(e.off))
	binary.BigEndian.PutUint64(b[24:], uint64(e.n))
	binary.BigEndian.PutUint64(b[32:], e.epoch)
	binary.BigEndian.PutUint64(b[40:], uint64(e.hb))
}

// parseECHdr decodes an ecHdr, checking its ranges: group and stripe below
// maxStripes, row and member below ckpt.MaxShards, off and n in [0,
// maxShard] with off+n ≤ maxShard, h at least -1.
func parseECHdr(b []byte) (ecHdr, error) {
	e := ecHdr{
		group: int(binary.BigEndian.Uint32(b[0:])), stripe: int(binary.BigEndian.Uint32(b[4:])),
		row: int(binary.BigEndian.Uint16(b[8:])), member: int(binary.BigEndian.Uint16(b[10:])),
		crc: binary.BigEndian.Uint32(b[12:]),
		off: int64(binary.BigEndian.Uint64(b[16:])), n: int64(binary.BigEndian.Uint64(b[24:])),
		epoch: binary.BigEndian.Uint64(b[32:]), hb: int64(binary.BigEndian.Uint64(b[40:])),
	}
	switch {
	case e.group >= maxStripes || e.stripe >= maxStripes:
		return e, fmt.Errorf("group %d stripe %d out of range", e.group, e.stripe)
	case e.row >= 256 || e.member >= 256:
		return e, fmt.Errorf("row %d member %d out of range", e.row, e.member)
	case e.off < 0 || e.n < 0 || e.off > maxShard || e.n > maxShard-e.off:
		return e, fmt.Errorf("range of %d bytes at %d out of range", e.n, e.off)
	case e.hb < noStep:
		return e, fmt.Errorf("H %d out of range", e.hb)
	}
	return e, nil
}

func readECHdr(r io.Reader) (ecHdr, error) {
	var b [ecHdrSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return ecHdr{}, err
	}
	return parseECHdr(b[:])
}

// ecMember is one member's share in a complete parity row: its rank,
// the restart generation and label (Placement.Epoch) it was committed
// in, its shard's length and its table (regions, sizes, committed
// CRC32Cs: the shard is the regions concatenated in this order).
type ecMember struct {
	rank   int
	gen    uint64
	epoch  uint64
	length int64
	table  []tableEntry
}

func appendMembers(b []byte, ms []ecMember) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(ms)))
	for _, m := range ms {
		b = binary.BigEndian.AppendUint32(b, uint32(m.rank))
		b = binary.BigEndian.AppendUint64(b, m.gen)
		b = binary.BigEndian.AppendUint64(b, m.epoch)
		b = binary.BigEndian.AppendUint64(b, uint64(m.length))
		b = append(b, byte(len(m.table)))
		b = appendTable(b, m.table)
	}
	return b
}

// readMembers reads the members of an ecGet answer: 1 to 255 of them,
// each with a table whose sizes add up to its length.
func readMembers(r io.Reader) ([]ecMember, error) {
	var nb [2]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(nb[:]))
	if n < 1 || n >= 256 {
		return nil, fmt.Errorf("%d members", n)
	}
	ms := make([]ecMember, n)
	var mb [29]byte
	for i := range ms {
		if _, err := io.ReadFull(r, mb[:]); err != nil {
			return nil, err
		}
		m := ecMember{rank: int(binary.BigEndian.Uint32(mb[0:])), gen: binary.BigEndian.Uint64(mb[4:]),
			epoch: binary.BigEndian.Uint64(mb[12:]), length: int64(binary.BigEndian.Uint64(mb[20:]))}
		if m.rank > 1<<30 || m.length < 0 || m.length > maxShard {
			return nil, fmt.Errorf("member rank %d of %d bytes out of range", m.rank, m.length)
		}
		t, err := readTable(r, int(mb[28]))
		if err != nil {
			return nil, err
		}
		if tableBytes(t) != uint64(m.length) {
			return nil, fmt.Errorf("member rank %d: regions of %d bytes for a shard of %d", m.rank, tableBytes(t), m.length)
		}
		m.table = t
		ms[i] = m
	}
	return ms, nil
}

// ---- The holder's side ---------------------------------------------------

// ecRowKey names one parity row of one stripe.
type ecRowKey struct{ group, stripe, row int }

// memberShare is what a row buffer has of one member's share.
type memberShare struct {
	rank   int // -1: nothing yet
	length int64
	cov    cover // the share's bytes XORed in so far, and their CRC32C
	// chunks are the chunks XORed in, as they came (sorted, disjoint),
	// each with its CRC32C: a resend is compared with them.
	chunks []span
	table  []tableEntry
	in     bool   // committed (ecCommit checked)
	bad    string // why the member's share is refused for this step (failShare), or ""
}

// maxShareChunks bounds the chunks of one member's share a row buffer
// keeps (an owner sends a chunk of ecChunkSize bytes at most, cut at
// region boundaries: 256 GiB of 4 MiB chunks).
const maxShareChunks = 1 << 16

// addChunk records the chunk of n bytes at off, CRC32C crc, XORed in.
func (m *memberShare) addChunk(off, n int64, crc uint32) {
	i, _ := slices.BinarySearchFunc(m.chunks, off, func(s span, off int64) int { return cmp.Compare(s.lo, off) })
	m.chunks = slices.Insert(m.chunks, i, span{lo: off, hi: off + n, crc: crc})
}

// chunkSum returns the CRC32C of the bytes [off, off+n) that came, if
// they are whole chunks that came one after the other.
func (m *memberShare) chunkSum(off, n int64) (uint32, bool) {
	i, found := slices.BinarySearchFunc(m.chunks, off, func(s span, off int64) int { return cmp.Compare(s.lo, off) })
	if !found {
		return 0, false
	}
	var sum uint32
	for at := off; i < len(m.chunks) && m.chunks[i].lo == at; i++ {
		c := m.chunks[i]
		sum, at = ckpt.CombineCRC32C(sum, c.crc, c.hi-c.lo), c.hi
		if at == off+n {
			return sum, true
		}
	}
	return 0, false
}

// parityBuf is one buffer of a row: one step's row being accumulated or
// complete.
type parityBuf struct {
	step  int64 // -1: empty
	gen   uint64
	epoch uint64
	// data[:n] is the row so far, n the longest member's shard: each byte
	// the XOR of the shares that passed it (mix); the bytes no share
	// passed yet hold nothing of the row. data is kept, longer perhaps,
	// from one step to the next.
	data []byte
	n    int64
	mem  []memberShare
}

// mix puts member x's share bytes d at off into the row: XORed into the
// bytes another member's share passed already, copied over the others
// (which hold nothing of the row yet), so that a row is never cleared.
func (b *parityBuf) mix(x int, off int64, d []byte) {
	end := off + int64(len(d))
	var rs []span
	for i := range b.mem {
		if i == x {
			continue
		}
		for _, sp := range b.mem[i].cov.spans {
			if lo, hi := max(sp.lo, off), min(sp.hi, end); lo < hi {
				rs = append(rs, span{lo: lo, hi: hi})
			}
		}
	}
	slices.SortFunc(rs, func(a, b span) int { return int(a.lo - b.lo) })
	pos := off
	for _, r := range rs {
		if r.hi <= pos {
			continue
		}
		lo := max(r.lo, pos)
		copy(b.data[pos:lo], d[pos-off:lo-off])
		ckpt.Accumulate(b.data[lo:r.hi], d[lo-off:r.hi-off])
		pos = r.hi
	}
	copy(b.data[pos:end], d[pos-off:])
}

func (b *parityBuf) complete() bool {
	if b.step < 0 || len(b.mem) == 0 {
		return false
	}
	for _, m := range b.mem {
		if !m.in {
			return false
		}
	}
	return true
}

// members returns the buffer's members' tables (it is complete).
func (b *parityBuf) members() []ecMember {
	out := make([]ecMember, len(b.mem))
	for i, m := range b.mem {
		out[i] = ecMember{rank: m.rank, gen: b.gen, epoch: b.epoch, length: m.length, table: m.table}
	}
	return out
}

// empty makes b hold nothing of k members; its data is kept, zeroed, for
// the next step.
func (b *parityBuf) empty(k int) {
	b.step, b.gen, b.epoch, b.n = noStep, 0, 0, 0
	b.mem = make([]memberShare, k)
	for i := range b.mem {
		b.mem[i].rank = noStep
	}
}

// parityRow is what this host holds of one row of one stripe: two
// buffers, the newest complete step and the one being accumulated, with
// the victim rule of the replica store (replicaStore.put).
type parityRow struct {
	mu      sync.Mutex // guards the fields below
	bufs    [2]parityBuf
	gen     uint64 // the newest restart generation known: older shares are refused
	spare   bool   // no rank of this host holds the row in the current placement
	dropped bool
	// noRoom is when the row's last refusal for want of memory was
	// logged: once every noRoomLog.
	noRoom time.Time
}

// noRoomLog is how often a parity host logs that a row does not fit.
const noRoomLog = 30 * time.Second

func (r *parityRow) newestComplete() int64 {
	n := int64(noStep)
	for i := range r.bufs {
		if r.bufs[i].complete() {
			n = max(n, r.bufs[i].step)
		}
	}
	return n
}

func (r *parityRow) bytes() uint64 {
	return uint64(len(r.bufs[0].data) + len(r.bufs[1].data))
}

// parityStore holds the parity rows this host's ranks keep. Its bytes are
// accounted with the replicas' (replicaStore.reserve).
type parityStore struct {
	h    *Keeper
	mu   sync.Mutex
	rows map[ecRowKey]*parityRow
}

func newParityStore(h *Keeper) *parityStore {
	return &parityStore{h: h, rows: map[ecRowKey]*parityRow{}}
}

func (ps *parityStore) row(k ecRowKey, create bool) *parityRow {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	r := ps.rows[k]
	if r == nil && create {
		r = &parityRow{bufs: [2]parityBuf{{step: noStep}, {step: noStep}}}
		ps.rows[k] = r
	}
	return r
}

func (ps *parityStore) all() map[ecRowKey]*parityRow {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return maps.Clone(ps.rows)
}

func (ps *parityStore) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.rows = map[ecRowKey]*parityRow{}
}

// restart begins restart generation gen resuming from g: the rows of
// steps after g accumulated in older generations are emptied, and shares
// of older generations refused from now on. A roll-back in diff mode
// under EC (rollback, Keeper.RollBack) empties every row of an older
// generation, of g and before too: the base schedule restarts from g,
// every owner codes g again, and its state at g, reloaded from the
// durable tier, need not be the bytes it coded at g in the old
// generation (a lossy --diff-codec's replay is not): an old row of g,
// g being final, would take the new shares as resends of the old ones
// and refuse them. No H of the new generation names an old row.
func (ps *parityStore) restart(gen uint64, g int64, rollback bool) {
	all := rollback && ps.h.place().ecDiff()
	for _, r := range ps.all() {
		r.mu.Lock()
		r.gen = max(r.gen, gen)
		for i := range r.bufs {
			if b := &r.bufs[i]; b.gen < gen && (b.step > g || all) {
				b.empty(len(b.mem))
			}
		}
		r.mu.Unlock()
	}
}

// sweep marks the rows no rank of this host holds under placement p (nil:
// as marked before) as spare, and drops the spare rows with no complete
// step of g or newer (replicaStore.sweep's rule: until then they may be
// the only parity of G).
func (ps *parityStore) sweep(p *placement, g int64) {
	for k, r := range ps.all() {
		r.mu.Lock()
		if p != nil {
			_, why := p.parityHeld(ps.h.cfg.Host, ps.holderOf(p, k), k.group, k.stripe, k.row)
			r.spare = why != ""
		}
		if !r.spare || r.newestComplete() >= g && r.newestComplete() >= 0 {
			r.mu.Unlock()
			continue
		}
		r.dropped = true
		n := r.bytes()
		r.bufs = [2]parityBuf{{step: noStep}, {step: noStep}}
		r.mu.Unlock()
		ps.mu.Lock()
		if ps.rows[k] == r {
			delete(ps.rows, k)
		}
		ps.mu.Unlock()
		ps.h.store.reserve(0, n)
	}
}

// holderOf returns the holder rank of row k under p if it is on this
// host, else -1.
func (ps *parityStore) holderOf(p *placement, k ecRowKey) int {
	if p.ec == nil || k.group >= len(p.ec.rows) || k.row >= len(p.ec.rows[k.group]) {
		return -1
	}
	return p.ec.rows[k.group][k.row].holder
}

// check says why the frame (h, e) of a member's share cannot go to this
// host's row under the current placement, or "": the holder rank keeps
// the row here, and the owner is member e.member of the stripe.
// It returns the stripe's K too.
func (ps *parityStore) check(h linkHdr, e ecHdr) (int, string) {
	p := ps.h.place()
	members, why := p.parityHeld(ps.h.cfg.Host, h.holder, e.group, e.stripe, e.row)
	if why != "" {
		return 0, why
	}
	if e.member >= len(members) || members[e.member] != h.owner {
		return 0, fmt.Sprintf("rank %d is not member %d of stripe %d of group %d (%v)", h.owner, e.member, e.stripe, e.group, members)
	}
	return len(members), ""
}

// final returns the newest step that is final here: G as known, or as
// the placement says.
func (ps *parityStore) final() int64 {
	return max(ps.h.G(), ps.h.place().g)
}

// bufFor returns the buffer of row r for a share of step (gen, epoch)
// of a stripe of k members, emptying or choosing a victim as needed
// (begin: the share may start one), or a refusal (why, message). hb is
// the H the share's owner went by (ecHdr.h, -1 if none): in diff mode
// under EC the victim is never the complete row of the newer of it and
// this host's H. r.mu is held.
func (ps *parityStore) bufFor(r *parityRow, step int64, gen, epoch uint64, k int, begin bool, hb int64) (*parityBuf, uint32, string) {
	if known := max(r.gen, ps.h.Gen()); gen < known {
		return nil, failStale, fmt.Sprintf("step %d: a share of restart generation %d, this holder knows generation %d", step, gen, known)
	}
	final := step <= ps.final()
	for i := range r.bufs {
		b := &r.bufs[i]
		if b.step != step || b.step < 0 {
			continue
		}
		switch {
		case final || b.gen == gen && b.epoch == epoch:
			return b, 0, ""
		case b.gen > gen || b.gen == gen && b.epoch > epoch:
			return nil, failStale, fmt.Sprintf("step %d: a share committed under placement epoch %d, the row holds epoch %d's", step, epoch, b.epoch)
		case !begin:
			return nil, failOther, fmt.Sprintf("step %d: the row holds shares of epoch %d, not %d", step, b.epoch, epoch)
		}
		// A newer commit of the step: the older shares are of an
		// abandoned trajectory.
		b.empty(k)
		b.step, b.gen, b.epoch = step, gen, epoch
		return b, 0, ""
	}
	if !begin {
		return nil, failOther, fmt.Sprintf("no share of step %d here", step)
	}
	// The victim: a buffer of this step or a later one (an abandoned
	// trajectory's), else one that is not complete, else the older. The
	// other keeps the newest complete row, which the overwrite rule may
	// still need: it is the parity of G while this step is not.
	v := 0
	switch b := r.bufs; {
	case b[0].step >= step:
		v = 0
	case b[1].step >= step:
		v = 1
	case b[0].complete() != b[1].complete():
		if b[0].complete() {
			v = 1
		}
	case b[1].step < b[0].step:
		v = 1
	}
	if hb := max(ps.h.H(), hb); ps.h.place().ecDiff() && hb >= 0 && r.bufs[v].complete() && r.bufs[v].step == hb && r.bufs[1-v].step != hb && r.bufs[1-v].step < step {
		// Diff mode under EC: the row of H stays (recovery decodes at
		// H). H is the newer of this host's and the one the share's
		// owner went by (hb): the owners send b_{k+1} once their host
		// knows H >= b_k, which this one may learn later. The other
		// buffer is a later base H does not depend on, and a new
		// placement's first base comes with the placement's H.
		v = 1 - v
	}
	b := &r.bufs[v]
	b.empty(k)
	b.step, b.gen, b.epoch = step, gen, epoch
	return b, 0, ""
}

// refuseEC drains a request's data, then refuses it.
func refuseEC(c io.ReadWriter, h linkHdr, why uint32, msg string) error {
	return refusePut(c, h, why, msg)
}

// chunk receives an ecChunk (its ecHdr read) into buf, the link's
// buffer. The bytes are read and checked against their CRC32C before the
// row is locked: the K members of a stripe send to one row at once, and
// each link receives while another's chunk is XORed in.
func (ps *parityStore) chunk(c net.Conn, h linkHdr, e ecHdr, buf *[]byte) error {
	n := int64(h.length)
	if h.count != 0 || h.step < 0 || n < 1 || n > maxECRange || e.off > e.n || n > e.n-e.off {
		return fmt.Errorf("ecChunk of %d bytes at %d of a share of %d, %d regions, step %d", n, e.off, e.n, h.count, h.step)
	}
	k, why := ps.check(h, e)
	if why != "" {
		return refuseEC(c, h, failOther, why)
	}
	if int64(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	d := (*buf)[:n]
	sum, err := readSum(c, d)
	if err != nil {
		return err
	}
	if sum != e.crc {
		return writeFail(c, h, failCRC, fmt.Sprintf("rank %d step %d share of row %d at %d: CRC32C %08x, sent %08x", h.owner, h.step, e.row, e.off, sum, e.crc))
	}
	r := ps.row(ecRowKey{e.group, e.stripe, e.row}, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dropped {
		return writeFail(c, h, failOther, "the row is no longer kept here")
	}
	b, fwhy, msg := ps.bufFor(r, h.step, h.gen, e.epoch, k, true, e.hb)
	if b == nil {
		return writeFail(c, h, fwhy, fmt.Sprintf("rank %d: %s", h.owner, msg))
	}
	m := &b.mem[e.member]
	switch {
	case m.rank < 0:
		*m = memberShare{rank: h.owner, length: e.n, cov: cover{size: e.n}}
	case m.rank != h.owner || m.length != e.n:
		return writeFail(c, h, failOther, fmt.Sprintf("member %d of step %d is rank %d with a shard of %d bytes, not rank %d with %d", e.member, h.step, m.rank, m.length, h.owner, e.n))
	case m.bad != "":
		return writeFail(c, h, failShare, m.bad)
	}
	if m.cov.fits(e.off, n) != nil {
		if !covered(&m.cov, e.off, n) {
			return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: a share chunk of %d bytes at %d overlaps others", h.owner, h.step, n, e.off))
		}
		// A resend: in already, if these are the bytes that came.
		switch sum, ok := m.chunkSum(e.off, n); {
		case !ok:
			return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: a share chunk of %d bytes at %d is not cut as the chunks that came", h.owner, h.step, n, e.off))
		case sum != e.crc:
			msg := fmt.Sprintf("rank %d step %d: parity row %d of stripe %d of group %d on host %d holds other bytes of the share at %d (CRC32C %08x) than the ones sent again (%08x), and cannot take them out",
				h.owner, h.step, e.row, e.stripe, e.group, ps.h.cfg.Host, e.off, sum, e.crc)
			if !m.in {
				// Not committed: no commit vouches for the bytes in.
				// (A committed share stays: its commit vouched for them.)
				m.bad = msg
				ps.h.log.Warn("a member's share of a parity row is refused for the step", "err", msg)
			}
			return writeFail(c, h, failShare, msg)
		}
		return writeAck(c, h)
	}
	if len(m.chunks) >= maxShareChunks {
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: more than %d chunks of one share", h.owner, h.step, maxShareChunks))
	}
	if int64(len(b.data)) < e.n {
		if err := ps.grow(r, b, e.n); err != nil {
			if time.Since(r.noRoom) > noRoomLog {
				r.noRoom = time.Now()
				ps.h.log.Error("a parity row does not fit in the memory replicas may take on this host: its stripe's steps are not replicated until there is room",
					"group", e.group, "stripe", e.stripe, "row", e.row, "step", h.step, "from rank", h.owner, "err", err)
			}
			return writeFail(c, h, failNoRoom, err.Error())
		}
	}
	b.n = max(b.n, e.n)
	if err := m.cov.add(e.off, n, e.crc); err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	m.addChunk(e.off, n, e.crc)
	b.mix(e.member, e.off, d)
	return writeAck(c, h)
}

// readPiece bounds one read of readSum: the bytes a read returns are
// checksummed while they are still in the core's cache.
const readPiece = 256 << 10

// readSum fills d from r and returns the CRC32C of its bytes, computed
// read by read: each read's bytes right after the kernel copied them in.
func readSum(r io.Reader, d []byte) (uint32, error) {
	var sum uint32
	for got := 0; got < len(d); {
		n, err := r.Read(d[got:min(got+readPiece, len(d))])
		sum = crc32c.Update(sum, d[got:got+n])
		got += n
		if err != nil && got < len(d) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	return sum, nil
}

// covered says whether every byte of [off, off+n) passed cov.
func covered(cov *cover, off, n int64) bool {
	i := cov.search(off + 1)
	return i > 0 && cov.spans[i-1].lo <= off && cov.spans[i-1].hi >= off+n
}

// grow makes b's data n bytes long, accounting for them.
func (ps *parityStore) grow(r *parityRow, b *parityBuf, n int64) error {
	old := uint64(len(b.data))
	if err := ps.h.store.reserve(uint64(n), old); err != nil {
		return fmt.Errorf("a parity row of %d bytes: %w", n, err)
	}
	d := make([]byte, n)
	copy(d, b.data[:b.n])
	b.data = d
	return nil
}

// commit receives an ecCommit: member e.member's share of step is in.
func (ps *parityStore) commit(c net.Conn, h linkHdr, t []tableEntry, e ecHdr) error {
	if h.length != 0 || h.step < 0 || int64(tableBytes(t)) != e.n {
		return fmt.Errorf("ecCommit of regions of %d bytes for a shard of %d, step %d", tableBytes(t), e.n, h.step)
	}
	k, why := ps.check(h, e)
	if why != "" {
		return writeFail(c, h, failOther, why)
	}
	if testHookECCommit != nil {
		testHookECCommit(h, e)
	}
	r := ps.row(ecRowKey{e.group, e.stripe, e.row}, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	// A share of no bytes (an empty shard) has no chunks: it begins here.
	b, fwhy, msg := ps.bufFor(r, h.step, h.gen, e.epoch, k, e.n == 0, e.hb)
	if b == nil {
		return writeFail(c, h, fwhy, fmt.Sprintf("rank %d: %s", h.owner, msg))
	}
	m := &b.mem[e.member]
	if m.rank < 0 && e.n == 0 {
		*m = memberShare{rank: h.owner}
	}
	switch {
	case m.rank != h.owner || m.length != e.n:
		return writeFail(c, h, failOther, fmt.Sprintf("no share of %d bytes of rank %d step %d here", e.n, h.owner, h.step))
	case m.bad != "":
		return writeFail(c, h, failShare, m.bad)
	case m.in && !slices.Equal(m.table, t):
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d is in with other CRC32Cs (a second commit of the step under one placement)", h.owner, h.step))
	case !m.cov.whole():
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d step %d: %d of the share's %d bytes came", h.owner, h.step, m.cov.n, m.length))
	case m.cov.sum() != e.crc:
		// Chunks that each matched their CRC32C, but not the share's:
		// the commit is wrong, not the bytes (a resend is compared with
		// them). Refused; the other members' shares stay in.
		return writeFail(c, h, failCRC, fmt.Sprintf("rank %d step %d: the share's CRC32C is %08x, the owner's %08x", h.owner, h.step, m.cov.sum(), e.crc))
	}
	m.table, m.in = t, true
	r.gen = max(r.gen, h.gen)
	return writeAck(c, h)
}

// testHookECCommit, if set (by tests), is called by a parity host when an
// ecCommit arrives, before it looks at the row.
var testHookECCommit func(h linkHdr, e ecHdr)

// has answers an ecHas: ack if member e.member's share of step with
// exactly table t is in, of the request's label (or the step is final).
func (ps *parityStore) has(c net.Conn, h linkHdr, t []tableEntry, e ecHdr) error {
	if h.length != 0 {
		return fmt.Errorf("ecHas with %d bytes of data", h.length)
	}
	if _, why := ps.check(h, e); why != "" {
		return writeFail(c, h, failOther, why)
	}
	r := ps.row(ecRowKey{e.group, e.stripe, e.row}, false)
	if r == nil {
		return writeFail(c, h, failOther, "no share of the row here")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dropped {
		return writeFail(c, h, failOther, "the row is no longer kept here")
	}
	b, fwhy, msg := ps.bufFor(r, h.step, h.gen, e.epoch, 0, false, noStep)
	if b == nil {
		return writeFail(c, h, fwhy, msg)
	}
	if m := b.mem[e.member]; m.in && m.rank == h.owner && slices.Equal(m.table, t) {
		r.gen = max(r.gen, h.gen)
		b.gen = max(b.gen, h.gen)
		return writeAck(c, h)
	}
	return writeFail(c, h, failOther, fmt.Sprintf("rank %d's share of step %d with these regions is not in", h.owner, h.step))
}

// read copies bytes [off, off+len(dst)) of the complete row of stripe of
// group at step into dst (zeros past the row's end) and returns its
// members: an error if no complete row of that step is here.
func (ps *parityStore) read(group, stripe, row int, step, off int64, dst []byte) ([]ecMember, error) {
	r := ps.row(ecRowKey{group, stripe, row}, false)
	if r == nil {
		return nil, fmt.Errorf("no parity row %d of stripe %d of group %d here", row, stripe, group)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.bufs {
		b := &r.bufs[i]
		if b.step != step || !b.complete() {
			continue
		}
		copyRange(dst, b.data[:b.n], off)
		return b.members(), nil
	}
	return nil, fmt.Errorf("no complete parity row %d of stripe %d of group %d at step %d here", row, stripe, group, step)
}

// copyRange copies src[off:off+len(dst)] into dst, zeros past src's end.
func copyRange(dst, src []byte, off int64) {
	n := 0
	if off < int64(len(src)) {
		n = copy(dst, src[off:])
	}
	clear(dst[n:])
}

// ecGet answers an ecGet.
func (ps *parityStore) ecGet(c net.Conn, h linkHdr, e ecHdr) error {
	if h.length != 0 || h.count != 0 || e.n > maxECRange {
		return fmt.Errorf("ecGet of %d bytes", e.n)
	}
	p := ps.h.place()
	if _, why := p.parityHeld(ps.h.cfg.Host, h.holder, e.group, e.stripe, e.row); why != "" {
		// A row kept as spare still serves.
		if r := ps.row(ecRowKey{e.group, e.stripe, e.row}, false); r == nil {
			return writeFail(c, h, failOther, why)
		}
	}
	buf := getAnswerBuf(e.n)
	defer putAnswerBuf(buf)
	ms, err := ps.read(e.group, e.stripe, e.row, h.step, e.off, buf)
	if err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	a := linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen, length: uint64(e.n)}
	b := make([]byte, linkHdrSize)
	a.put(b)
	b = appendMembers(b, ms)
	_, err = (&net.Buffers{b, buf}).WriteTo(c)
	return err
}

// shardRange copies bytes [off, off+len(dst)) of owner's shard at step
// (its replicated regions concatenated, zeros past its end) into dst,
// and returns its table. When holder is owner and runs here, the shard
// comes from owner's retained snapshot of base step step (diff mode under
// EC: a rank on its own data host keeps it, service.retainedBase), else
// from its slot; otherwise from the clear copy this host keeps of owner:
// a full-mode replica's buffer of step, or, in diff mode, the base at
// exactly step of one of its stores (diffstore.Store.ReadBase: the base,
// pinned at H under EC, or a verified refresh waiting for G), with the
// CRC32Cs the owner committed at step. The bytes are the source's as
// they are: the caller checks them against the table.
func (h *Keeper) shardRange(owner, holder int, step, off int64, dst []byte) ([]tableEntry, error) {
	if s := h.svc(owner); s != nil && holder == owner {
		var t []tableEntry
		read := func(tab []tableEntry, data [][]byte) error {
			t = slices.Clone(tab)
			copyShard(dst, data, off)
			return nil
		}
		if ok, err := s.retainedBase(step, read); ok || err != nil {
			return t, err
		}
		s.mu.Lock()
		var names []string
		for _, i := range s.repl {
			names = append(names, s.regions[i].Name)
		}
		s.mu.Unlock()
		err := s.readSlot(step, names, read)
		return t, err
	}
	st := h.store
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil, fmt.Errorf("no copy of rank %d here", owner)
	}
	o.mu.Lock()
	for _, b := range o.bufs {
		if b.step >= 0 && b.step == step && len(b.data) == len(b.table) {
			copyShard(dst, b.data, off)
			t := slices.Clone(b.table)
			o.mu.Unlock()
			return t, nil
		}
	}
	// Diff mode: ReadBase needs no lock of o (a store serves its base
	// safely while it folds, installs or truncates), and the copy is not
	// made under o.mu, which the owner's differentials wait for.
	stores := []*diffstore.Store{o.cur, o.prev}
	t := slices.Clone(o.sums[step])
	o.mu.Unlock()
	var errs []error
	for _, ds := range stores {
		if ds == nil || t == nil {
			continue
		}
		if !sameShape(t, regionTable(ds.Regions())) {
			errs = append(errs, fmt.Errorf("a store of rank %d whose regions are not those of its step %d", owner, step))
			continue
		}
		err := ds.ReadBase(step, off, dst)
		if err == nil {
			return t, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no copy of rank %d at step %d here", owner, step)
	}
	return nil, fmt.Errorf("no copy of rank %d at step %d here: %w", owner, step, errors.Join(errs...))
}

// copyShard copies bytes [off, off+len(dst)) of the concatenation of
// data into dst, zeros past its end.
func copyShard(dst []byte, data [][]byte, off int64) {
	n := 0
	for _, d := range data {
		if n == len(dst) {
			break
		}
		if off >= int64(len(d)) {
			off -= int64(len(d))
			continue
		}
		n += copy(dst[n:], d[off:])
		off = 0
	}
	clear(dst[n:])
}

// answerBufs are the buffers ecGet and getRange answers are copied into
// (each ≤ maxECRange bytes), kept for the next answers: a decode asks
// for hundreds of chunks of MiBs, and a buffer allocated for each would
// be faulted in afresh each time (with BenchmarkECRestore, the parity
// hosts' allocations and faults took more time than the copies).
var answerBufs sync.Pool

// getAnswerBuf returns a buffer of n bytes from answerBufs, of unspecified
// contents (read and shardRange write every byte of it).
func getAnswerBuf(n int64) []byte {
	if p, ok := answerBufs.Get().(*[]byte); ok && int64(cap(*p)) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putAnswerBuf(b []byte) {
	answerBufs.Put(&b)
}

// getRange answers a getRange.
func (ps *parityStore) getRange(c net.Conn, h linkHdr, e ecHdr) error {
	if h.length != 0 || h.count != 0 || e.n > maxECRange || h.step < 0 {
		return fmt.Errorf("getRange of %d bytes", e.n)
	}
	buf := getAnswerBuf(e.n)
	defer putAnswerBuf(buf)
	var t []tableEntry
	var err error
	if s := ps.h.svc(h.holder); s != nil && h.holder == h.owner {
		// The rank's service closing ends a write held up by the reader.
		defer context.AfterFunc(s.life, func() { c.SetWriteDeadline(time.Unix(1, 0)) })()
	}
	t, err = ps.h.shardRange(h.owner, h.holder, h.step, e.off, buf)
	if err != nil {
		return writeFail(c, h, failOther, err.Error())
	}
	a := linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
	a.count, a.length = len(t), uint64(e.n)
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45)
	a.put(b)
	b = appendTable(b, t)
	_, err = (&net.Buffers{b, buf}).WriteTo(c)
	return err
}

// serveEC serves one EC request (kinds 10 to 14) whose header and table
// were read: an error closes the link. buf is the link's ecChunk buffer
// (grown as needed).
func (ps *parityStore) serveEC(c net.Conn, h linkHdr, t []tableEntry, buf *[]byte) error {
	if ps.h.diffMode() && ps.h.place().ec == nil {
		return fmt.Errorf("request kind %d of erasure coding, this host runs --protect-mode diff without it", h.kind)
	}
	e, err := readECHdr(c)
	if err != nil {
		return err
	}
	switch h.kind {
	case kindECChunk:
		return ps.chunk(c, h, e, buf)
	case kindECCommit:
		return ps.commit(c, h, t, e)
	case kindECHas:
		return ps.has(c, h, t, e)
	case kindECGet:
		return ps.ecGet(c, h, e)
	default:
		return ps.getRange(c, h, e)
	}
}

// ---- Clients ---------------------------------------------------------------

// writeEC writes an EC request: header, table, ecHdr and data.
func writeEC(w io.Writer, h linkHdr, t []tableEntry, e ecHdr, data []byte) error {
	h.count, h.length = len(t), uint64(len(data))
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45+ecHdrSize)
	h.put(b)
	b = appendTable(b, t)
	var eb [ecHdrSize]byte
	e.put(eb[:])
	b = append(b, eb[:]...)
	bufs := net.Buffers{b}
	if len(data) > 0 {
		bufs = append(bufs, data)
	}
	_, err := bufs.WriteTo(w)
	return err
}

// ecAcked sends EC request h (on the link of rank h.owner to host) and
// waits for its acknowledgement.
func (p *linkPool) ecAcked(ctx context.Context, host int, h linkHdr, t []tableEntry, e ecHdr, data []byte) error {
	return p.ecAckedLane(ctx, host, 0, h, t, e, data)
}

// ecAckedLane is ecAcked on lane lane of the link (linkKey).
func (p *linkPool) ecAckedLane(ctx context.Context, host, lane int, h linkHdr, t []tableEntry, e ecHdr, data []byte) error {
	return p.doLane(ctx, host, h.owner, lane, func(c net.Conn) error {
		if err := writeEC(c, h, t, e, data); err != nil {
			return err
		}
		return readAck(c, h)
	})
}

// errNoRow: the holder has no complete parity row of the step asked for.
var errNoRow = errors.New("no complete parity row")

// ecGet reads bytes [off, off+len(dst)) of parity row row of stripe of
// group at step from host, whose rank holderRank holds it, into dst (zeros
// past the row's end), and returns the row's members: an error if the
// host has no complete row of that step (a refusal, the link kept). The
// bytes are the row's as held: the caller checks what it rebuilds from
// them against the members' tables. len(dst) ≤ 64 MiB.
func (p *linkPool) ecGet(ctx context.Context, host, holderRank int, group, stripe, row int, step int64, off int64, dst []byte) ([]ecMember, error) {
	if len(dst) > maxECRange {
		return nil, fmt.Errorf("ecGet of %d bytes: at most %d per request", len(dst), maxECRange)
	}
	h := linkHdr{kind: kindECGet, owner: holderRank, holder: holderRank, step: step}
	e := ecHdr{group: group, stripe: stripe, row: row, off: off, n: int64(len(dst)), hb: noStep}
	var ms []ecMember
	err := p.do(ctx, host, -1-holderRank, func(c net.Conn) error {
		if err := writeEC(c, h, nil, e, nil); err != nil {
			return err
		}
		a, err := readAnswer(c)
		if err != nil {
			return err
		}
		if a.kind != kindData || a.step != step || a.length != uint64(len(dst)) || a.count != 0 {
			return fmt.Errorf("unexpected answer kind %#x step %d of %d bytes", a.kind, a.step, a.length)
		}
		if ms, err = readMembers(c); err != nil {
			return err
		}
		_, err = io.ReadFull(c, dst)
		return err
	})
	if re, ok := errors.AsType[*remoteError](err); ok {
		return nil, fmt.Errorf("%w: %w", errNoRow, re)
	}
	return ms, err
}

// getRange reads bytes [off, off+len(dst)) of owner's shard at step
// (zeros past its end) from host into dst: from owner's own slot when
// holderRank is owner, else from the clear copy holder rank holderRank
// keeps. It returns owner's table (its regions, sizes and committed
// CRC32Cs, in shard order); the caller checks the bytes against it.
// len(dst) ≤ 64 MiB.
func (p *linkPool) getRange(ctx context.Context, host, holderRank, owner int, step, off int64, dst []byte) ([]tableEntry, error) {
	if len(dst) > maxECRange {
		return nil, fmt.Errorf("getRange of %d bytes: at most %d per request", len(dst), maxECRange)
	}
	h := linkHdr{kind: kindGetRange, owner: owner, holder: holderRank, step: step}
	e := ecHdr{off: off, n: int64(len(dst)), hb: noStep}
	var t []tableEntry
	err := p.do(ctx, host, -1-holderRank, func(c net.Conn) error {
		if err := writeEC(c, h, nil, e, nil); err != nil {
			return err
		}
		a, err := readAnswer(c)
		if err != nil {
			return err
		}
		if a.kind != kindData || a.step != step || a.length != uint64(len(dst)) {
			return fmt.Errorf("unexpected answer kind %#x step %d of %d bytes", a.kind, a.step, a.length)
		}
		if t, err = readTable(c, a.count); err != nil {
			return err
		}
		_, err = io.ReadFull(c, dst)
		return err
	})
	return t, err
}
