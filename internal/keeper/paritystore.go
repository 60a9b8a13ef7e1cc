package keeper

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/ckpt"
)

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
	// pin counts the ecGet answers being written to their links straight
	// from data (nil: none). No byte of the array an answer pinned is
	// written while the pin is held: mix writes into data only after
	// detach gave the buffer an array of its own (parityStore.detach).
	pin *rowPin
}

// rowPin is a parity buffer's data array as ecGet answers write it to
// their links, outside the row's lock.
type rowPin struct {
	answers int    // being written
	held    uint64 // bytes of the array reserved once it was detached (0: not detached)
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
		for i := range r.bufs {
			if b := &r.bufs[i]; b.pin != nil {
				// Answers are being sent from its array: its bytes stay
				// reserved until the last one ends (unpin).
				b.pin.held = uint64(len(b.data))
				n -= b.pin.held
			}
		}
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
