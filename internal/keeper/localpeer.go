package keeper

// The zero-network gradient source of differential protection ("local
// peer", issue 15). In pure data parallelism with an allreduce every
// data-parallel peer ends a step holding the same reduced gradient,
// bitwise. A rank whose shard gradient is a slice of such a gradient
// declares it (Optimizer.Reduced: the P elements of the full gradient,
// its shard at Off). Then a holder whose host runs a data-parallel peer L
// of the owner (L declared Reduced with the same P) takes the owner's
// gradient slice from L through shared memory instead of the network:
//
//   - The owner sends that holder each step's differential by reference
//     (kindDiffRef): the diff frame without its record, with the owner's
//     slice (P, Off, N) and the CRC32C of its gradient bytes.
//   - The holder's host asks L (its deposit plan, DepositPlan, in
//     ProtectWelcome and every Staged) to write, each step, the slices of
//     the full reduced gradient the owners it holds for need, into the
//     deposit area of L's gradient buffer (GradientFile.Deposit: element
//     i at Deposit+4i, a sparse area of P elements; the service allocates
//     the plan's ranges when it makes the plan). L's Gradient names the
//     plan version it followed.
//   - At L's Commit(s) the service copies and encodes each deposit as the
//     owner encodes its gradient (the job's codec) into a local record,
//     checked by its CRC32C, kept until the owner's differential of s
//     takes it or G passes s.
//   - The holder pairs the owner's differential with the local record of
//     its step, checks the CRC32C of the deposit against the owner's, and
//     appends the whole differential (the diffstore path and the
//     end-to-end CRC check of every restore are the network's). If the
//     record is missing it waits for L's commit of the step (in lockstep
//     with the owner's), ending the wait when L commits the step without
//     it, L's session ends, a restart begins, or after localWaitMax; then
//     it answers failNoLocal, and the owner sends that step's
//     differential with its record, and keeps using the network for that
//     holder for localRetry steps (failNoPeer: for the rest of the
//     placement), so that a dead peer does not cost a wait per step.
//
// Trust: a deposit is the trainer's claim that L's reduced gradient is
// the owner's; the CRC32C of the owner's gradient bytes, which every
// reference carries, checks that claim before a step is acknowledged, so a
// wrong deposit costs a network fallback, never an acknowledged step that
// does not restore.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

const (
	kindDiffRef = 9

	// Why a holder refused a differential by reference.
	failNoLocal = 5 // no local record of the step: send it with its record (and try later)
	failNoPeer  = 6 // no local peer can give the owner's gradient here: never in this placement

	// refDescSize: after a kindDiffRef's diffDesc (record length 0):
	// P(8) off(8) n(8) the gradient's CRC32C(4) reserved(4).
	refDescSize = 32
	// localRetry is how many steps an owner sends a holder its
	// differentials with the record after a failNoLocal.
	localRetry = 16
	// localRecsPerOwner bounds the local records kept per owner.
	localRecsPerOwner = 8
)

// localWaitMax bounds a holder's wait for a local record (a variable for
// tests).
var localWaitMax = 10 * time.Second

// testHookDepositCopy, if set (by tests), is called as a local rank's
// Commit copies owner's deposit of step; false interrupts the copy (no
// record is made, as if the commit was cut short).
var testHookDepositCopy func(rank int, step int64, owner int) bool

// ---- The local peer's side (the rank that deposits) ---------------------

// depOwner is one owner's slice in a deposit plan: [lo, hi) of the full
// reduced gradient.
type depOwner struct {
	owner  int
	lo, hi int64
}

type depPlan struct {
	ver    uint64
	owners []depOwner // by owner
	at     int64      // the rank's committed step when the plan was made
}

func (p *depPlan) wire() *protect.DepositPlan {
	w := &protect.DepositPlan{Version: p.ver}
	for _, o := range p.owners {
		w.Ranges = append(w.Ranges, protect.DepositRange{Lo: o.lo, Hi: o.hi})
	}
	return w
}

// deposits is a service's part in the local source: its plans (the
// current one and the one before, which a Gradient may still follow) and
// whether a session of its rank is open. Guarded by service.mu.
type deposits struct {
	cur, prev depPlan
	open      bool
}

// reduced returns the rank's declared Reduced in diff mode, or nil. s.mu
// is held.
func (s *service) reduced() *protect.Reduced {
	if s.opt == nil {
		return nil
	}
	return s.opt.Reduced
}

// depositPlan returns the rank's current plan for its Staged and
// ProtectWelcome answers (nil if it declared no Reduced). s.mu is held.
func (s *service) depositPlan() *protect.DepositPlan {
	if s.reduced() == nil || s.gradFile == nil {
		return nil
	}
	return s.dep.cur.wire()
}

// planOf returns the plan of version ver (current or previous). s.mu is held.
func (s *service) planOf(ver uint64) depPlan {
	switch {
	case ver == 0:
	case ver == s.dep.cur.ver:
		return s.dep.cur
	case ver == s.dep.prev.ver:
		return s.dep.prev
	}
	return depPlan{}
}

// setDeposits makes owners the rank's plan if it differs from the
// current one: the ranges are allocated in both halves of the gradient
// file first (a write into tmpfs never faults for lack of memory then).
// ver numbers plans host-wide.
func (s *service) setDeposits(owners []depOwner, ver *uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gradFile == nil || slices.Equal(s.dep.cur.owners, owners) {
		return
	}
	if err := s.allocDeposits(owners); err != nil {
		s.h.log.Warn("cannot allocate the gradient deposits for local holders; their owners use the network", "rank", s.rank, "err", err)
		owners = nil
		if len(s.dep.cur.owners) == 0 {
			return
		}
	}
	*ver++
	s.dep.prev, s.dep.cur = s.dep.cur, depPlan{ver: *ver, owners: owners, at: s.committed}
	s.h.log.Debug("deposit plan", "rank", s.rank, "version", *ver, "owners", len(owners))
}

func (s *service) allocDeposits(owners []depOwner) error {
	if len(owners) == 0 {
		return nil
	}
	f, err := os.OpenFile(s.gradFile.Path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	g := s.gradFile
	for half := range int64(2) {
		for _, o := range owners {
			if err := syscall.Fallocate(int(f.Fd()), 0, half*g.Stride+g.Deposit+4*o.lo, 4*(o.hi-o.lo)); err != nil {
				return fmt.Errorf("gradient deposits: %w", err)
			}
		}
	}
	return nil
}

// localRec is a local record: an owner's gradient slice of a step,
// encoded from a local peer's deposit.
type localRec struct {
	rec []byte
	sum uint32 // CRC32C of the deposit's bytes
	gen uint64 // the restart generation it was committed in
}

// encodeDeposits copies and encodes each owner's deposit of step (plan
// p) from the half of step, as the owner encodes its gradient. It runs
// under reqMu in Commit, before the rank may write that half again.
func (s *service) encodeDeposits(step int64, p depPlan) map[int]localRec {
	half := s.grad[step%2]
	dep := s.gradFile.Deposit
	out := make(map[int]localRec, len(p.owners))
	var t replay.Tensor
	for _, o := range p.owners {
		if testHookDepositCopy != nil && !testHookDepositCopy(s.rank, step, o.owner) {
			continue
		}
		// The copy is taken first and both the sum and the record are of
		// it: a deposit the rank changed meanwhile does not match the
		// owner's gradient, rather than giving a record unlike its sum.
		cp := slices.Clone(half[dep+4*o.lo : dep+4*o.hi])
		sum := crc32c.Checksum(cp)
		x := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(cp))), len(cp)/4)
		if err := replay.CompressInto(&t, 0, x, s.h.cfg.Diff.codec()); err != nil {
			s.h.log.Warn("encoding a gradient deposit failed", "rank", s.rank, "owner", o.owner, "step", step, "err", err)
			continue
		}
		r := replay.Record{Step: uint64(step), Tensors: []*replay.Tensor{&t}}
		// Encoded into a buffer of the owner's record pool when this host
		// holds it: the store hands it back once it folds the step.
		buf := s.h.store.recordBuf(o.owner)
		rec, err := r.AppendBinary(buf)
		if err != nil {
			continue
		}
		if len(rec) < cap(buf) {
			// Shorter than the pool's records (a lossy codec's vary):
			// a copy of its own length, which is what its store counts.
			rec = bytes.Clone(rec)
		}
		out[o.owner] = localRec{rec: rec, sum: sum}
	}
	return out
}

// Close ends the session: its rank's process closed its socket or is
// gone. The holders waiting on this host for the rank's deposits stop
// waiting (if it is the rank's newest session).
func (ss *Session) Close() {
	s := ss.svc
	s.mu.Lock()
	cur := ss.hello && ss.id == s.session && s.dep.open
	if cur {
		s.dep.open = false
	}
	s.mu.Unlock()
	if cur {
		s.h.local.notify()
	}
}

// ---- The holder's host ---------------------------------------------------

// localNeed is the slice of the full reduced gradient an owner asked for
// by reference.
type localNeed struct{ p, off, n int64 }

type recKey struct {
	owner int
	step  int64
}

// localPeers is a host's local source: the owners whose differentials
// come by reference, which local rank deposits each one's slice, and the
// local records made at those ranks' commits.
type localPeers struct {
	h  *Keeper
	mu sync.Mutex // guards the fields below; order: localPeers.mu, then service.mu
	// wake is closed and replaced when a record comes, a source commits,
	// or a source's session opens or ends.
	wake  chan struct{}
	needs map[int]localNeed
	src   map[int]int // owner → the local rank that deposits its slice
	recs  map[recKey]localRec
	// done[L] is the newest step local rank L committed (in generation
	// doneGen[L]) since it deposits.
	done    map[int]int64
	doneGen map[int]uint64
	doneVer map[int]uint64 // the plan version of that commit's deposits
	ver     uint64         // the newest deposit plan version given out
	waiting int            // takes waiting for a record
}

func newLocalPeers(h *Keeper) *localPeers {
	return &localPeers{h: h, wake: make(chan struct{}), needs: map[int]localNeed{}, src: map[int]int{},
		recs: map[recKey]localRec{}, done: map[int]int64{}, doneGen: map[int]uint64{}, doneVer: map[int]uint64{}}
}

// notify wakes the waits for records.
func (lp *localPeers) notify() {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	lp.notifyLocked()
}

func (lp *localPeers) notifyLocked() {
	close(lp.wake)
	lp.wake = make(chan struct{})
}

// committed records that local rank L committed step in generation gen,
// with the deposits of plan version ver, giving the local records recs
// (by owner).
func (lp *localPeers) committed(l int, step int64, gen, ver uint64, recs map[int]localRec) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	for o, r := range recs {
		r.gen = gen
		lp.recs[recKey{o, step}] = r
		// At most localRecsPerOwner per owner: the oldest go.
		if oldest := step - localRecsPerOwner; oldest >= 0 {
			for k := range lp.recs {
				if k.owner == o && k.step <= oldest {
					delete(lp.recs, k)
				}
			}
		}
	}
	lp.done[l], lp.doneGen[l], lp.doneVer[l] = step, gen, ver
	lp.notifyLocked()
}

// prune drops the records of steps up to g (G: no owner sends them).
func (lp *localPeers) prune(g int64) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	for k := range lp.recs {
		if k.step <= g {
			delete(lp.recs, k)
		}
	}
}

// replan gives every local rank its plan under the current placement.
func (lp *localPeers) replan() {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	lp.replanLocked()
}

// replanLocked assigns each owner held here whose differentials come by
// reference a local source (the lowest data-parallel peer of it on this
// host that declared a reduced gradient of the same size) and gives every
// local rank its plan. lp.mu is held.
func (lp *localPeers) replanLocked() {
	p := lp.h.place()
	assign := map[int][]depOwner{}
	clear(lp.src)
	for o, nd := range lp.needs {
		if !p.holds(o) {
			delete(lp.needs, o)
			continue
		}
		if l, _ := lp.pick(p, o, nd); l >= 0 {
			lp.src[o] = l
			assign[l] = append(assign[l], depOwner{owner: o, lo: nd.off, hi: nd.off + nd.n})
		}
	}
	for r, s := range p.svcs {
		owners := assign[r]
		slices.SortFunc(owners, func(a, b depOwner) int { return a.owner - b.owner })
		s.setDeposits(owners, &lp.ver)
	}
}

// pick returns the local rank to deposit owner o's slice nd under p, or
// -1 and whether one may come later (a peer here that has not declared
// its optimizer yet).
func (lp *localPeers) pick(p *placement, o int, nd localNeed) (int, bool) {
	if lp.h.cfg.Peers == nil {
		return -1, false
	}
	later := false
	best := -1
	for _, x := range lp.h.cfg.Peers(o) {
		s := p.svcs[x]
		if s == nil || x == o {
			continue
		}
		s.mu.Lock()
		red, hello := s.reduced(), s.opt != nil
		s.mu.Unlock()
		switch {
		case !hello:
			later = true
		case red != nil && red.N == nd.p && (best < 0 || x < best):
			best = x
		}
	}
	return best, later
}

// take returns the local record of owner's step, waiting for it (see
// the file's comment), or why there is none (failNoLocal, failNoPeer), a
// message and, for failNoLocal, the step from which the owner may send
// by reference again: soon after a plan its peer has not followed yet,
// localRetry steps on otherwise. sum is the CRC32C of the owner's
// gradient.
func (lp *localPeers) take(ctx context.Context, owner int, step int64, nd localNeed, sum uint32) ([]byte, uint32, int64, string) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	lp.needs[owner] = nd
	lp.replanLocked()
	var timeout <-chan time.Time
	for {
		gen := lp.h.Gen()
		l, ok := lp.src[owner]
		if !ok {
			if _, later := lp.pick(lp.h.place(), owner, nd); later {
				return nil, failNoLocal, step + localRetry, fmt.Sprintf("no data-parallel peer of rank %d declared its optimizer on this host yet", owner)
			}
			return nil, failNoPeer, 0, fmt.Sprintf("no data-parallel peer of rank %d on this host holds a reduced gradient of %d elements", owner, nd.p)
		}
		if r, ok := lp.recs[recKey{owner, step}]; ok && r.gen == gen {
			delete(lp.recs, recKey{owner, step})
			if r.sum != sum {
				lp.h.log.Warn("a local peer's deposit differs from the owner's gradient; the owner sends it", "owner", owner, "step", step, "peer", l)
				return nil, failNoLocal, step + localRetry, fmt.Sprintf("rank %d's deposit of rank %d's gradient of step %d differs from it (CRC32C %08x, the owner's %08x)", l, owner, step, r.sum, sum)
			}
			return r.rec, 0, 0, ""
		}
		if lp.doneGen[l] == gen && lp.done[l] >= step {
			retry := step + localRetry
			if s := lp.h.place().svcs[l]; s != nil {
				// A plan the peer has not followed yet, made since it
				// committed p.at: it does at its second step after its
				// next Stage.
				s.mu.Lock()
				p := s.dep.cur
				s.mu.Unlock()
				if lp.doneVer[l] != p.ver && lp.done[l] < p.at+4 && slices.ContainsFunc(p.owners, func(d depOwner) bool { return d.owner == owner }) {
					retry = max(lp.done[l]+2, step+1)
				}
			}
			return nil, failNoLocal, retry, fmt.Sprintf("rank %d committed step %d without a deposit of rank %d's gradient", l, step, owner)
		}
		open := false
		if s := lp.h.place().svcs[l]; s != nil {
			s.mu.Lock()
			open = s.dep.open
			s.mu.Unlock()
		}
		if !open {
			return nil, failNoLocal, step + localRetry, fmt.Sprintf("rank %d, the local peer of rank %d, has no session", l, owner)
		}
		if timeout == nil {
			t := time.NewTimer(localWaitMax)
			defer t.Stop()
			timeout = t.C
		}
		wake := lp.wake
		lp.waiting++
		lp.mu.Unlock()
		select {
		case <-wake:
		case <-timeout:
			lp.mu.Lock()
			lp.waiting--
			return nil, failNoLocal, step + localRetry, fmt.Sprintf("rank %d did not commit step %d within %v", l, step, localWaitMax)
		case <-ctx.Done():
			lp.mu.Lock()
			lp.waiting--
			return nil, failNoLocal, step + localRetry, ErrStopping.Error()
		}
		lp.mu.Lock()
		lp.waiting--
	}
}

// diffRef receives a differential of h.owner at h.step by reference: the
// record comes from a local peer's deposit (take), or the holder answers
// failNoLocal or failNoPeer.
func (st *replicaStore) diffRef(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length < diffDescSize+refDescSize || h.step < 0 {
		return fmt.Errorf("differential by reference of %d bytes, step %d", h.length, h.step)
	}
	var db [diffDescSize + refDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return err
	}
	dd := parseDiffDesc(db[:diffDescSize])
	if dd.opt >= len(t) || dd.recLen != 0 {
		return fmt.Errorf("differential by reference: optimizer region %d of %d, a record of %d bytes", dd.opt, len(t), dd.recLen)
	}
	others := tableBytes(t) - uint64(t[dd.opt].size)
	if h.length != diffDescSize+refDescSize+others {
		return fmt.Errorf("differential by reference of %d bytes with other regions of %d", h.length, others)
	}
	rd := db[diffDescSize:]
	nd := localNeed{p: int64(binary.BigEndian.Uint64(rd)), off: int64(binary.BigEndian.Uint64(rd[8:])), n: int64(binary.BigEndian.Uint64(rd[16:]))}
	sum := binary.BigEndian.Uint32(rd[24:])
	if r := (protect.Reduced{N: nd.p, Off: nd.off}); nd.n < 1 || nd.n > protect.MaxGradient || r.Check(nd.n) != nil {
		return fmt.Errorf("differential by reference of a slice [%d, +%d) of %d elements", nd.off, nd.n, nd.p)
	}
	_, release, ok, err := st.admitDiff(c, h, t, dd.opt, 0, others)
	if !ok {
		return err
	}
	defer release()
	d := diffstore.Diff{Step: h.step, Hyper: dd.hyper, Other: map[string][]byte{}, Sum: dd.sum}
	for i, e := range t {
		if i == dd.opt {
			continue
		}
		b := make([]byte, e.size)
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		d.Other[e.name] = b
	}
	rec, why, retry, msg := st.h.local.take(st.h.life, h.owner, h.step, nd, sum)
	if rec == nil {
		h.gen = uint64(retry) // read as remoteError.next
		return writeFail(c, h, why, fmt.Sprintf("rank %d step %d: %s", h.owner, h.step, msg))
	}
	d.Record = rec
	return st.takeDiff(c, h, t, d)
}

// ---- The owner's side ----------------------------------------------------

// diffRefInfo is what a differential by reference carries instead of the
// record: the owner's slice of the reduced gradient and its CRC32C.
type diffRefInfo struct {
	red protect.Reduced
	n   int64
	sum uint32
}

// refFrame returns the request's bytes of od by reference for holder h.
func (od *ownerDiff) refFrame(h linkHdr) (net.Buffers, int64) {
	n := int64(diffDescSize + refDescSize)
	for i, e := range od.table {
		if i != od.opt {
			n += e.size
		}
	}
	b := frameHead(h, od.table, uint64(n), nil)
	at := len(b)
	b = appendDiffDesc(b, od)
	binary.BigEndian.PutUint64(b[at+16:], 0) // no record
	for _, v := range []int64{od.ref.red.N, od.ref.red.Off, od.ref.n} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	b = binary.BigEndian.AppendUint32(b, od.ref.sum)
	b = binary.BigEndian.AppendUint32(b, 0)
	bufs := net.Buffers{b}
	for i, e := range od.table {
		if i != od.opt && e.size > 0 {
			bufs = append(bufs, od.d.Other[e.name])
		}
	}
	return bufs, n
}

// ownerLocal is an owner's use of local sources: per holder, the first
// step it sends by reference again (after a failNoLocal), and its
// figures.
type ownerLocal struct {
	mu   sync.Mutex // guards seq, from and last
	seq  uint64     // the placement from and last belong to
	from map[holderKey]int64
	// last says, per holder, whether its newest differential taken went
	// by reference: the source it uses now.
	last map[holderKey]bool

	byRef atomic.Int64 // differentials the holders took from a local peer
	byNet atomic.Int64 // differentials sent with their record
}

// try reports whether the owner sends holder k its differential of step
// by reference: its host runs a data-parallel peer of the owner and no
// failNoLocal of the last localRetry steps says otherwise.
func (ol *ownerLocal) try(s *service, k holderKey, step int64) bool {
	p := s.h.place()
	ol.mu.Lock()
	if ol.seq != p.seq || ol.from == nil {
		ol.seq, ol.from, ol.last = p.seq, map[holderKey]int64{}, map[holderKey]bool{}
	}
	from, ok := ol.from[k]
	ol.mu.Unlock()
	if ok {
		return step >= from
	}
	if s.h.cfg.Peers == nil {
		return false
	}
	for _, x := range s.h.cfg.Peers(s.rank) {
		if x != s.rank && p.hostOf(x) == k.host {
			return true
		}
	}
	ol.mu.Lock()
	if ol.seq == p.seq {
		ol.from[k] = protect.MaxStep
	}
	ol.mu.Unlock()
	return false
}

// off makes the owner send holder k its differentials with the record
// until step from.
func (ol *ownerLocal) off(s *service, k holderKey, from int64) {
	p := s.h.place()
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.seq == p.seq && ol.from != nil {
		ol.from[k] = from
	}
}

// sendDiff sends holder k the differential od: by reference when k's
// host may take it from a local peer, with its record otherwise or when
// the holder has no local record. It returns the bytes sent.
func (r *replicator) sendDiff(ctx context.Context, k holderKey, hdr linkHdr, od *ownerDiff) (int64, error) {
	s := r.s
	var sent int64
	if od.ref != nil && s.local.try(s, k, od.step) {
		hdr.kind = kindDiffRef
		bufs, n := od.refFrame(hdr)
		err := s.h.links.call(ctx, k.host, hdr, bufs)
		sent += n
		var re *remoteError
		if !errors.As(err, &re) || re.why != failNoLocal && re.why != failNoPeer {
			if err == nil || errors.Is(err, errDiffPending) {
				s.local.byRef.Add(1)
				s.local.took(s, k, true)
			}
			return sent, err
		}
		from := od.step + localRetry
		switch {
		case re.why == failNoPeer:
			from = protect.MaxStep
		case re.next > od.step:
			from = min(re.next, od.step+localRetry)
		}
		s.local.off(s, k, from)
		s.h.log.Debug("differential sent with its record: no local record at the holder", "rank", s.rank, "holder", k.rank, "step", od.step, "by reference again from", from, "why", re.msg)
	}
	hdr.kind = kindDiff
	err := s.h.links.call(ctx, k.host, hdr, od.frame(hdr))
	sent += od.bytes
	if err == nil || errors.Is(err, errDiffPending) {
		s.local.byNet.Add(1)
		s.local.took(s, k, false)
	}
	return sent, err
}

// took records that holder k took its newest differential by reference
// (local) or with the record.
func (ol *ownerLocal) took(s *service, k holderKey, local bool) {
	p := s.h.place()
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.seq == p.seq && ol.last != nil {
		ol.last[k] = local
	}
}

// sources counts the holders of placement p whose newest differential
// went by reference (local) and with the record (net).
func (ol *ownerLocal) sources(p *placement, rank int) (local, net int) {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.seq != p.seq {
		return 0, 0
	}
	for _, k := range p.targets(rank) {
		if l, ok := ol.last[k]; ok && l {
			local++
		} else if ok {
			net++
		}
	}
	return local, net
}
