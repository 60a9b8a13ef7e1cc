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
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
	"unsafe"

	"github.com/gorun/gorun/internal/crc32c"
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
