package keeper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/diffstore"
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

// trunc cuts s to 40 bytes, for quoting a peer's string in an error.
func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

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
	// corrupt is why the rank failed in this generation (its committed
	// state changed in memory), or nil; failed is closed when it is set.
	// A restart clears both.
	corrupt *CorruptError
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

// hello creates the rank's slots, or checks that a restarted rank declares
// the regions its predecessor did.
func (s *service) hello(req *protect.ProtectHello) (*protect.ProtectWelcome, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, err := s.helloLocked(req)
	if err != nil {
		return nil, 0, err
	}
	// The newest session of a rank is the one that may change its state:
	// an older one belongs to a rank process that is gone or gave up.
	s.session++
	s.dep.open = true
	return w, s.session, nil
}

func (s *service) helloLocked(req *protect.ProtectHello) (*protect.ProtectWelcome, error) {
	// A hello that passed its session's checks before the rank left (or
	// the host stopped) must not create files that nothing would remove.
	if s.gone {
		return nil, errLeft
	}
	if s.life.Err() != nil {
		return nil, ErrStopping
	}
	diff := s.h.diffMode()
	if diff {
		if req.Optimizer == nil {
			return nil, errors.New(errNoOptimizer)
		}
		if err := req.Optimizer.Check(req.Regions, req.Gradient); err != nil {
			return nil, fmt.Errorf("--protect-mode diff: %w", err)
		}
	}
	if s.preloaded {
		return s.helloPreloaded(req)
	}
	if s.slots != nil {
		if !slices.Equal(s.regions, req.Regions) {
			return nil, fmt.Errorf("regions %v differ from the %v this rank protected before", req.Regions, s.regions)
		}
		if req.Gradient*4 != s.gradSize() {
			return nil, fmt.Errorf("a gradient of %d elements differs from the %d this rank declared before", req.Gradient, s.gradSize()/4)
		}
		if diff && s.opt != nil && !req.Optimizer.Equal(s.opt) {
			return nil, fmt.Errorf("optimizer %+v differs from the %+v this rank declared before", *req.Optimizer, *s.opt)
		}
		if diff && s.opt == nil {
			s.opt = req.Optimizer.Clone()
		}
		return s.welcome(), nil
	}
	cr := make([]ckpt.Region, len(req.Regions))
	for i, r := range req.Regions {
		cr[i] = ckpt.Region{Name: r.Name, Size: r.Size}
	}
	s.h.claimFiles()
	opt := ckpt.Options{Dir: s.h.cfg.Dir}
	var slots *ckpt.Slots
	err := s.h.names(s.rank, func() error {
		var err error
		slots, err = ckpt.Create(s.h.cfg.Job, s.rank, cr, opt)
		if err != nil || req.Gradient <= 0 {
			return err
		}
		var reduced int64
		if diff && req.Optimizer.Reduced != nil {
			reduced = req.Optimizer.Reduced.N
		}
		if err := s.createGradient(req.Gradient*4, reduced); err != nil {
			slots.Close()
			if _, rerr := ckpt.RemoveOwned(slots.Owned()); rerr != nil {
				s.h.log.Warn("cannot remove the slots of a ProtectHello that failed", "rank", s.rank, "err", rerr)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.owned = append(s.owned, slots.Owned()...)
	s.slots = slots
	if diff {
		s.opt = req.Optimizer.Clone()
	}
	s.regions = slices.Clone(req.Regions)
	s.files = slots.Files()
	s.repl = s.repl[:0]
	for i, r := range s.regions {
		if r.Name != "params" {
			s.repl = append(s.repl, i)
		}
	}
	for i := range 2 {
		s.views[i] = make([][]byte, len(s.files))
	}
	return s.welcome(), nil
}

func (s *service) gradSize() int64 {
	if s.gradFile == nil {
		return 0
	}
	return s.gradFile.Size
}

// createGradient creates the gradient buffer, a file beside the rank's
// slot files and named as theirs are (so that ckpt.RemoveJob removes it
// too): two halves of size bytes, at offsets 0 and stride (GradientFile).
// With reduced > 0 each half also has a deposit area of reduced float32s
// after the page that ends the gradient (GradientFile.Deposit), left
// sparse: a deposit plan allocates its ranges (localpeer.go). The
// caller holds the rank's names lock (Keeper.names); it does not take it
// itself: the lock does not nest (ckpt.Claim.Names).
func (s *service) createGradient(size, reduced int64) error {
	end, dep := size, int64(0)
	if reduced > 0 {
		dep = (size + 4095) &^ 4095
		end = dep + 4*reduced
	}
	stride := (end + 4095) &^ 4095
	f := ckpt.RegionFile{Name: protect.GradientRegion, Size: end, Stride: stride, Path: s.gradientPath()}
	_ = os.Remove(f.Path)
	fd, err := os.OpenFile(f.Path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("gradient buffer: %w", err)
	}
	owned, err := ckpt.OwnFile(fd)
	if err != nil {
		fd.Close()
		os.Remove(f.Path) // made a moment ago, but not held
		return fmt.Errorf("gradient buffer: %w", err)
	}
	drop := func() { _, _ = ckpt.RemoveOwned([]ckpt.OwnedFile{owned}) }
	if reduced > 0 {
		err = fd.Truncate(2 * stride)
		for half := range int64(2) {
			if err == nil && size > 0 {
				err = syscall.Fallocate(int(fd.Fd()), 0, half*stride, size)
			}
		}
	} else {
		err = syscall.Fallocate(int(fd.Fd()), 0, 0, 2*stride)
	}
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	if err != nil && 2*stride > 0 {
		drop()
		return fmt.Errorf("gradient buffer of %d bytes: %w", size, err)
	}
	views, unmap, err := ckpt.MapData(f)
	if err != nil {
		drop()
		return fmt.Errorf("gradient buffer: %w", err)
	}
	s.grad = views
	s.gradUnmap = unmap
	s.owned = append(s.owned, owned)
	s.gradFile = &protect.GradientFile{Path: f.Path, Size: size, Stride: stride}
	if reduced > 0 {
		s.gradFile.Deposit, s.gradFile.Reduced = dep, reduced
	}
	return nil
}

func (s *service) gradientPath() string {
	return ckpt.RegionPath(s.h.cfg.Job, s.rank, protect.GradientRegion, ckpt.Options{Dir: s.h.cfg.Dir})
}

func (s *service) welcome() *protect.ProtectWelcome {
	w := &protect.ProtectWelcome{
		Version: protect.Version, Job: s.h.cfg.Job, Rank: s.rank, Replicas: len(s.h.holders(s.rank)),
		Gradient: s.gradFile, Committed: s.committed, G: s.h.G(), Mode: s.h.mode(),
		Deposits: s.depositPlan(),
	}
	for _, f := range s.files {
		w.Regions = append(w.Regions, protect.RegionFile{Name: f.Name, Size: f.Size, Path: f.Path, Stride: f.Stride})
	}
	return w
}

// stage applies the overwrite rule, then marks the slot to write.
func (s *service) stage(ctx context.Context, ss *Session, step int64) *protect.Staged {
	gen := ss.gen
	// A placement that replaced the session's (since its ProtectHello or
	// its last Restore) ends the wait at once: the rank restores in place.
	replaced := ss.placed.replaced
	s.mu.Lock()
	if s.corrupt != nil {
		err := s.corrupt
		s.mu.Unlock()
		return &protect.Staged{Step: step, Err: err.Error()}
	}
	if step <= s.committed {
		s.mu.Unlock()
		return &protect.Staged{Step: step, Err: fmt.Sprintf("step %d does not follow the committed step %d", step, s.committed)}
	}
	// The slot Stage will overwrite is the one not holding the newest
	// committed step; if it holds an older committed step, that one may
	// go only once the newest is recoverable everywhere.
	mustWait := s.slotStep[0] >= 0 && s.slotStep[1] >= 0
	newest, failed := s.committed, s.failed
	s.mu.Unlock()
	start := time.Now()
	if mustWait {
		if err := s.h.waitG(ctx, s.rank, gen, newest, replaced, failed, s.failure); err != nil {
			if _, ok := errors.AsType[*CorruptError](err); ok {
				return &protect.Staged{Step: step, Err: err.Error()}
			}
			return &protect.Staged{Step: step, Err: fmt.Sprintf("waiting for step %d to be recoverable everywhere: %v", newest, err),
				NewPlacement: errors.Is(err, errNewPlacement)}
		}
	}
	wait := time.Since(start)
	// A durable save may still be reading the slot to overwrite.
	if _, err := s.waitHold(ctx); err != nil {
		return &protect.Staged{Step: step, Err: fmt.Sprintf("waiting for the durable tier to read the slot: %v", err)}
	}
	if err := ss.live(); err != nil {
		return &protect.Staged{Step: step, Err: err.Error()}
	}
	s.reqMu.Lock()
	defer s.reqMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slots == nil {
		return &protect.Staged{Step: step, Err: ErrStopping.Error()}
	}
	if s.h.Gen() != gen || ss.id != s.session || step <= s.committed || mustWait && s.committed != newest || s.heldLocked() != nil {
		return &protect.Staged{Step: step, Err: "the rank's state changed while this stage waited (a restart, or another session)"}
	}
	st, err := s.slots.Stage(uint64(step))
	if err != nil {
		return &protect.Staged{Step: step, Err: err.Error()}
	}
	s.staged = st
	slot := st.Slot()
	if s.slotStep[slot] >= 0 {
		s.slotStep[slot] = noStep
	}
	s.views[slot] = st.Views()
	s.stages.Add(1)
	s.waitNS.Add(int64(wait))
	return &protect.Staged{Step: step, Slot: slot, WaitNS: int64(wait), Deposits: s.depositPlan()}
}

// commit checksums and commits the staged step, then hands it to the
// replicator.
func (s *service) commit(ss *Session, step int64) *protect.Committed {
	gen := ss.gen
	s.mu.Lock()
	if ss.id != s.session {
		s.mu.Unlock()
		return &protect.Committed{Step: step, Err: errSuperseded.Error()}
	}
	st := s.staged
	if st == nil || int64(st.Step()) != step {
		s.mu.Unlock()
		return &protect.Committed{Step: step, Err: fmt.Sprintf("step %d is not the step staged", step)}
	}
	var grad gradRec
	diff := s.h.diffMode()
	if diff {
		i := slices.IndexFunc(s.grads, func(g gradRec) bool { return g.step == step })
		if i < 0 {
			s.mu.Unlock()
			return &protect.Committed{Step: step, Err: fmt.Sprintf("--protect-mode diff: commit of step %d without its Gradient (the rank hands the gradient and hyper-parameters of every step before it commits it)", step)}
		}
		grad = s.grads[i]
	}
	red := s.reduced()
	var plan depPlan
	if diff && red != nil {
		plan = s.planOf(grad.dep)
	}
	s.staged = nil
	s.mu.Unlock()
	// The CRCs of a large state take a while: outside s.mu, so that
	// Status and the replicator are not held up (reqMu keeps requests
	// serial). In diff mode the gradient is encoded meanwhile: the rank
	// does not write its half (step's parity) before Committed.
	var rec []byte
	var encErr error
	var ref *diffRefInfo
	var locals map[int]localRec
	var wg sync.WaitGroup
	if diff {
		wg.Go(func() {
			rec, encErr = s.encodeGradient(grad)
			if red != nil && encErr == nil {
				ref = &diffRefInfo{red: *red, n: grad.n, sum: crc32c.Checksum(s.grad[step%2][:4*grad.n])}
			}
		})
		if len(plan.owners) > 0 {
			wg.Go(func() { locals = s.encodeDeposits(step, plan) })
		}
	}
	err := st.Commit()
	wg.Wait()
	if err != nil {
		s.recs.put(rec)
		return &protect.Committed{Step: step, Err: err.Error()}
	}
	if encErr != nil {
		// The slot is committed but its step can never be replicated:
		// the rank must not go on with it.
		s.recs.put(rec)
		return &protect.Committed{Step: step, Err: fmt.Sprintf("encoding the gradient of step %d: %v", step, encErr)}
	}
	s.mu.Lock()
	if s.h.Gen() != gen {
		// A restart truncated the slots meanwhile (and failed or undid
		// this commit there).
		s.mu.Unlock()
		s.recs.put(rec)
		return &protect.Committed{Step: step, Err: errRestarted.Error()}
	}
	slot := st.Slot()
	s.slotStep[slot] = step
	s.sums[slot] = st.Sums()
	s.slotEpoch[slot] = ss.placed.epoch
	s.slotT[slot] = grad.hyper.T
	s.committed = step
	var od *ownerDiff
	if diff {
		s.grads = slices.DeleteFunc(s.grads, func(g gradRec) bool { return g.step <= step })
		od = s.ownerDiff(grad, rec, slot)
		od.ref = ref
		s.logDiff(od)
	}
	base := s.persistDueLocked(step, slot)
	s.mu.Unlock()
	if base != nil {
		go s.runSave(base) // persist.wg: waited for by truncate and close
	}
	if diff && red != nil {
		// The holders here waiting for this step's deposits take them
		// now, or learn that they will not come.
		s.h.local.committed(s.rank, step, gen, plan.ver, locals)
	}
	// A restart may have begun since the check above (and truncated the
	// step): the hand-off checks the generation again under the lock
	// truncateDiffs takes, so that no step of an older generation is
	// queued, or sent labelled with the new one, after the truncation.
	// The replicator takes over od's reference.
	if testHookHandOff != nil {
		testHookHandOff(s.rank, step)
	}
	s.rep.committed(gen, od, step)
	s.h.cfg.Changed()
	return &protect.Committed{Step: step}
}

// testHookHandOff, if set (by tests), runs in a Commit after the
// generation was checked and before the step is handed to the replicator:
// where a restart may begin.
var testHookHandOff func(rank int, step int64)

// gradRec is a Gradient request, kept for its step's Commit.
type gradRec struct {
	step  int64
	n     int64
	hyper replay.Hyper // diff mode
	dep   uint64       // the deposit plan version the rank followed (localpeer.go)
}

// gradient records the rank's Gradient of step: n elements in the
// buffer's half step mod 2, applied with hyper. It checks the request and
// answers at once; the elements are read (encoded) by step's Commit. In
// diff mode hyper is required, valid, and follows the previous step's
// optimizer step count, and n is the optimizer's N.
func (s *service) gradient(step, n int64, h *protect.Hyper, dep uint64) *protect.GradientDone {
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(format string, args ...any) *protect.GradientDone {
		return &protect.GradientDone{Step: step, Err: fmt.Sprintf(format, args...)}
	}
	if n*4 > s.gradSize() {
		return fail("%d elements exceed the gradient buffer of %d", n, s.gradSize()/4)
	}
	if step <= s.lastGrad {
		return fail("the gradient of step %d does not follow that of step %d", step, s.lastGrad)
	}
	rec := gradRec{step: step, n: n, dep: dep}
	if len(s.grads) >= 2 {
		// Two Gradients not yet committed hold both halves of the buffer:
		// a third would overwrite the half its step's Commit reads.
		return fail("the gradient of step %d: the gradients of steps %d and %d are not committed yet (each half of the gradient buffer is read at its step's Commit)", step, s.grads[0].step, s.grads[1].step)
	}
	if s.h.diffMode() {
		switch {
		case step <= s.committed:
			return fail("the gradient of step %d comes after the step was committed (%d)", step, s.committed)
		case s.opt == nil:
			return fail("%s", errNoOptimizer)
		case h == nil:
			return fail("--protect-mode diff: the gradient of step %d without its hyper-parameters", step)
		case n != s.opt.N:
			return fail("--protect-mode diff: a gradient of %d elements for an optimizer of %d", n, s.opt.N)
		}
		rec.hyper = h.Replay()
		if err := rec.hyper.Validate(); err != nil {
			return fail("the gradient of step %d: %v", step, err)
		}
		if s.lastT != 0 && rec.hyper.T != s.lastT+1 {
			return fail("the gradient of step %d is optimizer step %d, after optimizer step %d", step, rec.hyper.T, s.lastT)
		}
		s.lastT = rec.hyper.T
	}
	s.lastGrad = step
	s.grads = append(s.grads, rec)
	return &protect.GradientDone{Step: step, Bytes: n * 4}
}

// encodeGradient encodes g's elements, in the gradient buffer's half of
// g's step, as a replay record with the job's codec, into a buffer from
// s.recs (a new one if it has none large enough): the caller owns the
// buffer (the record's capacity), and gives it back to s.recs, or to the
// ownerDiff that shares it. It runs under reqMu (Commit), the only user
// of s.enc.
func (s *service) encodeGradient(g gradRec) ([]byte, error) {
	half := s.grad[g.step%2]
	if g.n*4 > int64(len(half)) {
		return nil, fmt.Errorf("%d elements exceed the gradient buffer", g.n)
	}
	var x []float32
	if g.n > 0 {
		x = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(half))), g.n)
	}
	return s.enc.AppendRecord(s.recs.get(0), uint64(g.step), 0, x, s.h.cfg.Diff.codec())
}

// ownerDiff builds the differential of step g.step, just committed in
// slot: the encoded record, the hyper-parameters, the bytes of the
// replicated regions other than the optimizer's (copied: the slot is
// staged over later), sealed, with every replicated region's committed
// CRC32C. It takes over rec's buffer (from encodeGradient), and returns
// the differential with one reference, the caller's. s.mu is held.
func (s *service) ownerDiff(g gradRec, rec []byte, slot int) *ownerDiff {
	od := &ownerDiff{step: g.step, opt: -1}
	od.rec.own(&s.recs, rec)
	d := diffstore.Diff{Step: g.step, Hyper: g.hyper, Record: rec, Other: map[string][]byte{}}
	for _, i := range s.repl {
		r := s.regions[i]
		if r.Name == s.opt.Region {
			od.opt = len(od.table)
		} else {
			d.Other[r.Name] = slices.Clone(s.views[slot][i])
		}
		od.table = append(od.table, tableEntry{name: r.Name, size: r.Size, sum: s.sums[slot][i]})
	}
	d.Seal()
	od.d = d
	od.bytes = int64(diffDescSize + len(rec))
	for _, b := range d.Other {
		od.bytes += int64(len(b))
	}
	return od
}

// addReplBytes counts bytes of bases and differentials sent: the total
// first, then its parts (progress reads them in the other order).
func (s *service) addReplBytes(base, diff int64) {
	s.replBytes.Add(base + diff)
	s.replBaseBytes.Add(base)
	s.replDiffBytes.Add(diff)
}

func (s *service) status() *protect.Status {
	p := s.progress(s.h.place())
	return &protect.Status{
		Committed: p.Committed, Replicated: p.Replicated, G: s.h.G(),
		Stages: p.Stages, WaitNS: p.WaitNS, Holders: slices.Clone(s.h.holders(s.rank)),
	}
}

// fail records that the rank's committed state is corrupt (found by its
// replicator in generation gen), refuses its stages from now on, and has
// the caller fail the rank. A failure of an older generation than the
// host's is dropped: the restart that began since discarded the step.
func (s *service) fail(gen uint64, err *CorruptError) {
	s.mu.Lock()
	if s.h.Gen() != gen || s.corrupt != nil {
		s.mu.Unlock()
		return
	}
	s.corrupt = err
	close(s.failed)
	s.mu.Unlock()
	msg := "a rank's protected state changed in memory after its commit: failing the rank"
	if err.Replay {
		msg = "a replica holder's replay of a rank's differentials differs from its commit (its optimizer step is not replay's): failing the rank"
	}
	s.h.log.Error(msg, "rank", s.rank, "generation", gen, "err", err)
	s.h.cfg.Failed(s.rank, gen, err)
}

// failure returns why the rank failed, or nil.
func (s *service) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.corrupt == nil {
		return nil
	}
	return s.corrupt
}

// verifySlot checks every region of committed slot slot, which holds step,
// against the CRC32Cs taken at its commit (kept here, out of the rank's
// reach). It returns a *CorruptError for the first region that differs.
// The caller makes sure the slot is not staged over meanwhile.
func (s *service) verifySlot(slot int, step int64) *CorruptError {
	s.mu.Lock()
	views, sums, regions := s.views[slot], s.sums[slot], s.regions
	held := s.slotStep[slot] == step
	s.mu.Unlock()
	if !held {
		return nil // truncated by a restart meanwhile: nothing to verify
	}
	for i, v := range views {
		if got := crc32c.Checksum(v); got != sums[i] {
			return &CorruptError{Rank: s.rank, Step: step, Region: regions[i].Name, Sum: sums[i], Got: got}
		}
	}
	return nil
}

// truncate discards every step after g (a restart resumes from g), then
// has the holders asked what they hold (a restarted holder may have
// dropped steps, a replaced one holds nothing) and sent the newest step
// left if they lack it: Replicated says it only then.
func (s *service) truncate(g int64) error {
	s.persistTruncate(g)
	s.rep.reset()
	s.rep.forget() // before the slots change: no report pairs a new committed step with old acks
	err := s.truncateSlots(g)
	s.rep.truncateDiffs(g)
	s.resetDiffLog(g)
	s.mu.Lock()
	committed := s.committed
	s.mu.Unlock()
	s.rep.want(committed)
	return err
}

// truncateSlots discards every step after g. The replicator is reset.
func (s *service) truncateSlots(g int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staged = nil
	if s.corrupt != nil {
		// The corrupt step is after g (it was never replicated, so G
		// never reached it): discarded below.
		s.corrupt, s.failed = nil, make(chan struct{})
	}
	if s.slots == nil {
		return nil
	}
	if g >= 0 {
		if err := s.slots.Truncate(uint64(g)); err != nil {
			return err
		}
	}
	for i, st := range s.slotStep {
		if st > g || g < 0 {
			s.slotStep[i] = noStep
		}
	}
	if g < 0 {
		// A restart from scratch: forget every step.
		if err := s.slots.Clear(); err != nil {
			return err
		}
	}
	s.committed = max(s.slotStep[0], s.slotStep[1])
	// The rank resumes from g: the Gradients after it go, and the next
	// one's optimizer step follows g's.
	s.grads, s.lastGrad, s.lastT = nil, noStep, 0
	for i, st := range s.slotStep {
		if st >= 0 && st == s.committed {
			s.lastT = s.slotT[i]
		}
	}
	return nil
}

// removeFiles removes the files the service made (after close) whose
// names still lead to them, and returns the paths it left because
// another process made them since.
func (s *service) removeFiles() (left []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.owned) == 0 {
		return nil, nil
	}
	ran := false
	err = s.h.names(s.rank, func() error {
		ran = true
		var err error
		left, err = ckpt.RemoveOwned(s.owned)
		return err
	})
	if !ran {
		// The lock failed, or another agent held it for ckpt.NamesWait
		// (stopped inside Create, say): the files stay, for the job's
		// last agent here; a leftover is better than a hang.
		ckpt.Disown(s.owned)
	}
	s.owned = nil
	return left, err
}

// removeFilesLog is removeFiles, logging the files it left.
func (s *service) removeFilesLog() error {
	left, err := s.removeFiles()
	if len(left) > 0 {
		s.h.log.Info("left a rank's files another agent of the job made since (a spare that took the rank over)", "rank", s.rank, "files", left)
	}
	return err
}

// close stops the service: its requests in flight end (it waits for
// them, and for the readers of its slots) and its slots are unmapped.
// The files stay (removeFiles).
func (s *service) close() error {
	s.stop()
	s.rep.stop()
	s.closeDiffLog()
	perr := s.persistClose() // before the slots are unmapped: no save reads them then
	s.reqMu.Lock()
	defer s.reqMu.Unlock()
	s.mapMu.Lock() // no reader holds views of the slots
	defer s.mapMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.gradUnmap != nil {
		errs = append(errs, s.gradUnmap())
		s.gradUnmap, s.grad = nil, [2][]byte{}
	}
	if s.slots != nil {
		errs = append(errs, s.slots.Close())
		s.slots = nil
	}
	errs = append(errs, perr)
	return errors.Join(errs...)
}
