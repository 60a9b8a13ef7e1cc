package keeper

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
)

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
