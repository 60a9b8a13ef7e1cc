package keeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// noStep is the step -1, "none" (protect.NoStep).
const noStep = protect.NoStep

// errNoOptimizer is the answer to a diff-mode ProtectHello without an
// Optimizer: the contract a trainer must meet.
const errNoOptimizer = "--protect-mode diff needs a trainer that declares its replay optimizer (protect.Options.Optimizer; see protect/PROTOCOL.md)"

// decode decodes a request payload strictly (unknown fields refused).
func decode(b []byte, v any) error { return wire.DecodeSock(b, v) }

// service is one local rank's state protection. Requests come from the
// rank's sessions (normally one) and are served one at a time.
type service struct {
	h    *Keeper
	rank int
	// life ends when the service closes (the rank left the host, or the
	// host stops): it ends the requests in flight.
	life context.Context
	stop context.CancelFunc

	reqMu sync.Mutex // serializes requests
	// mapMu is read-held by readers of the mapped slot memory outside a
	// request (readSlot: another rank's restore, a peer's getSlot), and
	// held by close while it unmaps the slots. Order: reqMu, mapMu, mu.
	mapMu sync.RWMutex

	mu       sync.Mutex // guards the fields below
	session  uint64     // the newest session's id
	slots    *ckpt.Slots
	regions  []protect.Region
	files    []ckpt.RegionFile
	repl     []int // indices of the replicated regions (all but params)
	views    [2][][]byte
	slotStep [2]int64 // the committed step each slot holds, or -1
	// slotT is the optimizer step count (diff mode) of each slot's
	// committed step, 0 if not known (a step restored from another host).
	slotT [2]int
	sums  [2][]uint32
	// slotEpoch is the epoch (Placement.Epoch) of the session placement
	// each slot's step was committed under: the label of its erasure-coded
	// shares (ecstore.go).
	slotEpoch [2]uint64
	staged    *ckpt.Staged
	committed int64
	// The gradient buffer's two halves (ping-pong by step parity).
	grad      [2][]byte
	gradFile  *protect.GradientFile
	gradUnmap func() error
	// owned are the files this service made (its slots', its gradient
	// buffer), by inode: the only ones removeFiles removes. Another
	// agent of the job sharing the directory may have made rank's names
	// since (a spare that took the rank over; ckpt/owned.go).
	owned []ckpt.OwnedFile
	// opt is the rank's replay optimizer as declared (diff mode), or nil.
	opt *protect.Optimizer
	// dep: the deposits the rank writes for local holders (localpeer.go).
	dep deposits
	// grads are the Gradient requests not yet committed, oldest first
	// (at most two: a rank may hand step s+1's before step s commits).
	grads    []gradRec
	lastGrad int64 // the newest step a Gradient named since the last restore, or -1
	// lastT is the optimizer step count (diff mode) of lastGrad, or after
	// a restore of the step restored to (slotT), or 0 if not known: the
	// next Gradient's must follow it.
	lastT int
	// enc encodes the diff-mode gradient records (under reqMu), into
	// buffers from recs: the buffers of records no send reads any more
	// (ownerDiff.release).
	enc  replay.Encoder
	recs bufPool
	// corrupt is why the rank failed in this generation (a
	// *CorruptError: its committed state changed in memory; or errNoRoom:
	// a base's snapshot that does not fit for good, ecdiff_mem.go), or
	// nil; failed is closed when it is set. A restart clears both.
	corrupt error
	failed  chan struct{}
	// gone: the rank left this host (SetPlacement): its sessions fail.
	gone bool

	restores  atomic.Int64 // Restore requests served in this generation
	stages    atomic.Int64
	waitNS    atomic.Int64
	replSteps atomic.Int64
	replNS    atomic.Int64
	replBytes atomic.Int64
	// Of replBytes: bases (whole states, sent to a holder lacking one or
	// as a paced refresh) and differentials (diff mode).
	replBaseBytes atomic.Int64
	replDiffBytes atomic.Int64

	rep   replicator // this rank's outgoing replication (replica.go)
	local ownerLocal // its differentials by reference (localpeer.go)
	// preloaded: Preload put the rank's state in its slots and the rank
	// has not said ProtectHello since (resume.go). Guarded by mu.
	preloaded bool
	// dlog appends its differentials to disk (difflog.go), or is nil.
	// Set by newService, then immutable.
	dlog *difflog.Writer

	// dur is the rank's durable tier (persist.go); holds[i], under mu,
	// is closed once a durable save has read slot i (nil: no save reads
	// it): a stage does not overwrite a held slot.
	dur   persist
	holds [2]chan struct{}
}

func newService(h *Keeper, rank int) *service {
	s := &service{h: h, rank: rank, committed: noStep, lastGrad: noStep, slotStep: [2]int64{noStep, noStep}, failed: make(chan struct{})}
	// Two records: in steady state one is being sent while the next
	// step's is encoded.
	s.recs.max = 2
	s.life, s.stop = context.WithCancel(h.life)
	s.rep.init(s)
	s.dlog = h.newDiffLog(rank)
	if s.dlog != nil {
		// The steps queued for the disk hold their records too: as many
		// more buffers kept, so that a commit does not allocate (and
		// fault in) a fresh one while the writer appends a batch.
		s.recs.max += h.cfg.DiffLog.queue()
	}
	return s
}

// progress returns the rank's progress under placement p (the host's
// current one): Replicated is min(committed, the newest step every holder
// of p acknowledged since it became one).
func (s *service) progress(p *placement) Progress {
	s.mu.Lock()
	c := s.committed
	s.mu.Unlock()
	r := min(s.rep.replicatedIn(p), c)
	// The parts before the total: addReplBytes adds the total first, so
	// that ReplBaseBytes + ReplDiffBytes ≤ ReplBytes in every report (the
	// launcher drops one that does not add up).
	base, diff := s.replBaseBytes.Load(), s.replDiffBytes.Load()
	pr := Progress{Rank: s.rank, Committed: c, Replicated: r, Stages: s.stages.Load(), WaitNS: s.waitNS.Load(),
		ReplSteps: s.replSteps.Load(), ReplNS: s.replNS.Load(), ReplBaseBytes: base, ReplDiffBytes: diff,
		ReplBytes: s.replBytes.Load(), Restores: s.restores.Load(),
		DiffLocal: s.local.byRef.Load(), DiffNet: s.local.byNet.Load()}
	pr.SourceLocal, pr.SourceNet = s.local.sources(p, s.rank)
	pr.Durable = s.persistProgress(c)
	return pr
}

// leave marks the service's rank as gone from this host: its sessions
// fail from now on, and so do its requests in flight.
func (s *service) leave() {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	s.stop()
}

// protected reports whether the rank ever said ProtectHello here (its
// slot files exist).
func (s *service) protected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.files != nil
}

// Session is one connection's use of a rank's service: requests other
// than ProtectHello are refused until it has said ProtectHello.
type Session struct {
	svc   *service
	gen   uint64 // the restart generation it belongs to
	id    uint64 // its number among the rank's sessions, from ProtectHello
	hello bool
	// placed is the placement of its rank's newest ProtectHello or
	// Restore on it: if a new placement replaced it since, the rank has
	// not restored in place yet, and its stages do not wait at the
	// overwrite rule (errNewPlacement).
	placed *placement
}

// live returns an error if a newer session of the rank, or a restart,
// has replaced this one.
func (ss *Session) live() error {
	s := ss.svc
	if ss.gen != s.h.Gen() {
		return errRestarted
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return errLeft
	}
	if !ss.hello {
		return nil
	}
	if ss.id != s.session {
		return errSuperseded
	}
	return nil
}

// errSuperseded: the rank opened a newer session.
var errSuperseded = errors.New("a newer session of this rank replaced this one")

// errLeft: the rank left this host (a new placement).
var errLeft = errors.New("the rank no longer runs on this host")

// Handle serves one request of the protocol (a frame of type typ with
// payload b). It returns the answer's type and payload. An error means the
// request was malformed: the caller sends it as an Error frame and closes
// the connection (the service is unaffected).
func (ss *Session) Handle(ctx context.Context, typ byte, b []byte) (byte, any, error) {
	s := ss.svc
	if typ != protect.TypeProtectHello && !ss.hello {
		return 0, nil, fmt.Errorf("message type %d before ProtectHello", typ)
	}
	if err := ss.live(); err != nil && typ != protect.TypeStatus {
		return 0, nil, err
	}
	// The request ends when the service closes, too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	// Requests run one at a time (reqMu), except a stage's wait at the
	// overwrite rule, which must not hold up the others.
	if typ != protect.TypeStage {
		s.reqMu.Lock()
		defer s.reqMu.Unlock()
	}
	switch typ {
	case protect.TypeProtectHello:
		var req protect.ProtectHello
		if err := decode(b, &req); err != nil {
			return 0, nil, err
		}
		if err := req.Check(); err != nil {
			return 0, nil, err
		}
		pl := s.h.place() // before: a placement that comes meanwhile ends the waits
		w, id, err := s.hello(&req)
		if err != nil {
			return protect.TypeProtectWelcome, &protect.ProtectWelcome{Committed: noStep, G: noStep, Err: err.Error()}, nil
		}
		ss.hello, ss.id, ss.placed = true, id, pl
		s.h.local.notify() // a session of a local peer opened
		s.persistOpen()
		return protect.TypeProtectWelcome, w, nil
	case protect.TypeStage, protect.TypeCommit, protect.TypeGradient:
		var req protect.StepReq
		if err := decode(b, &req); err != nil {
			return 0, nil, err
		}
		if err := protect.CheckStep(req.Step); err != nil {
			return 0, nil, err
		}
		switch typ {
		case protect.TypeStage:
			if req.N != 0 || req.Hyper != nil || req.Deposits != 0 {
				return 0, nil, errors.New("stage: unexpected field n")
			}
			return protect.TypeStaged, s.stage(ctx, ss, req.Step), nil
		case protect.TypeCommit:
			if req.N != 0 || req.Hyper != nil || req.Deposits != 0 {
				return 0, nil, errors.New("commit: unexpected field n")
			}
			return protect.TypeCommitted, s.commit(ss, req.Step), nil
		default:
			if req.N < 0 || req.N > protect.MaxGradient {
				return 0, nil, fmt.Errorf("gradient: %d elements out of range", req.N)
			}
			return protect.TypeGradientDone, s.gradient(req.Step, req.N, req.Hyper, req.Deposits), nil
		}
	case protect.TypeRestore, protect.TypeStatus:
		var req protect.Empty
		if err := decode(b, &req); err != nil {
			return 0, nil, err
		}
		if typ == protect.TypeRestore {
			pl := s.h.place()
			res := s.restore(ctx)
			if res.Err == "" {
				s.restores.Add(1)
				ss.placed = pl
			}
			return protect.TypeRestorable, res, nil
		}
		return protect.TypeStatusReply, s.status(), nil
	}
	return 0, nil, fmt.Errorf("unknown message type %d", typ)
}
