package keeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
)

// Keeper is the state protection of one host: a service per local rank and
// the replicas this host holds for others.
type Keeper struct {
	cfg  Config
	log  *slog.Logger
	life context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	pmu sync.Mutex                // serializes SetPlacement and Restart
	pl  atomic.Pointer[placement] // the current placement: this host's ranks and services, holders, hosts

	// corrupt: the local ranks whose last restore failed with copies
	// failing their CRC32C (errors.go), until their exit is reported.
	corruptMu sync.Mutex
	corrupt   map[int]corruptNote

	lfmu   sync.Mutex
	lfSeq  uint64       // the placement lfDone belongs to
	lfDone map[int]bool // hosts reported to LinkFailed in placement lfSeq

	gmu   sync.Mutex
	g     int64         // the globally recoverable step known here, or -1
	gen   uint64        // restart generation
	gwake chan struct{} // closed and replaced whenever g changes
	// hb is H (diff mode under EC, SetH): the newest step every rank has
	// a coded base of, as known here, or -1. resumed is the step the
	// last Restart resumed from (-1: none): with Placement.G, the anchor
	// of the base schedule (ecdiff_owner.go).
	hb      int64
	resumed int64

	store  *replicaStore
	parity *parityStore // the parity rows of erasure coding held here (ecstore.go)
	links  *linkPool
	local  *localPeers // diff mode: the gradients local peers deposit for the owners held here

	// Diff mode: the holder's folds (foldLoop), and their figures.
	folds     chan *ownerReplica
	foldNS    atomic.Int64
	foldSteps atomic.Int64
	// drifts are the last drift of a lossy log measured per owner
	// (diffstore.Drift, by owner rank), for FoldStats.
	driftMu sync.Mutex
	drifts  map[int]diffstore.Drift

	waiters atomic.Int64 // stages waiting at the overwrite rule
	rmu     sync.RWMutex // held by Restart, and read-held by Progress

	claimOnce   sync.Once
	claim       atomic.Pointer[ckpt.Claim] // this job's files on this machine are in use
	noNamesLock sync.Once                  // the log said that the names cannot be locked (names)

	dur persistHost // the durable tier's watermark (persist.go)
}

// claimFiles claims the job's slot files on this machine (ckpt.ClaimJob)
// before the first of them is created: jobs that protect nothing create
// nothing in /dev/shm.
func (h *Keeper) claimFiles() {
	h.claimOnce.Do(func() {
		c, err := ckpt.ClaimJob(h.cfg.Job, ckpt.Options{Dir: h.cfg.Dir})
		if err != nil {
			h.log.Warn("cannot claim the job's protected state files; if this agent is killed, they stay until removed by hand", "err", err)
			return
		}
		h.claim.Store(c)
	})
}

// names runs fn holding the names lock of rank's files (ckpt.Claim.Names),
// around making or removing them: other agents of the job that share the
// directory (network namespace hosts share /dev/shm) make and remove the
// same names. Without a claim, fn runs alone; where the names cannot
// be locked (ckpt.ErrNoNamesLock), fn runs without the lock, said once
// in the log. It gives up when another process holds the lock for
// ckpt.NamesWait (ckpt.ErrNamesBusy): fn does not run then.
func (h *Keeper) names(rank int, fn func() error) error {
	var ferr error
	err := h.claim.Load().Names(rank, func() error { ferr = fn(); return ferr })
	if errors.Is(err, ckpt.ErrNoNamesLock) {
		h.noNamesLock.Do(func() {
			h.log.Warn("cannot lock the names of the ranks' protected state files; another agent of the job sharing the directory may remove a rank's files as it makes them", "err", err)
		})
		return ferr
	}
	return err
}

// New starts a host's state protection. Nothing is created on disk
// until a rank says ProtectHello.
func New(cfg Config) (*Keeper, error) {
	if cfg.HostOf == nil {
		return nil, errors.New("rank: Config.HostOf is nil")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Changed == nil {
		cfg.Changed = func() {}
	}
	if cfg.Failed == nil {
		cfg.Failed = func(int, uint64, error) {}
	}
	if cfg.LinkFailed == nil {
		cfg.LinkFailed = func(int, error) {}
	}
	if err := cfg.Persist.check(); err != nil {
		return nil, err
	}
	h := &Keeper{cfg: cfg, log: log, g: noStep, hb: noStep, resumed: noStep, gwake: make(chan struct{}), lfDone: map[int]bool{}, dur: persistHost{d: noStep, x: noStep, appliedD: noStep, appliedX: noStep, local: -1}}
	ec, err := newECLayout(cfg.EC, -1, cfg.HostOf)
	if err != nil {
		return nil, err
	}
	h.life, h.stop = context.WithCancel(context.Background())
	p := &placement{replaced: make(chan struct{}), world: -1, ranks: slices.Clone(cfg.Ranks), svcs: map[int]*service{}, hostOf: cfg.HostOf, holders: cfg.Holders, sources: map[int]Source{},
		ec: ec, diff: h.diffMode(), epoch: cfg.Epoch, g: noStep}
	for _, r := range cfg.Ranks {
		p.svcs[r] = newService(h, r)
	}
	h.pl.Store(p)
	for _, s := range p.svcs {
		s.rep.placed(p)
	}
	h.store = newReplicaStore(h)
	h.parity = newParityStore(h)
	h.local = newLocalPeers(h)
	h.links = newLinkPool(h)
	if h.diffMode() {
		if !cfg.Diff.lossless() {
			log.Warn("--diff-codec is lossy: restores from other hosts are approximations of the ranks' state, never bitwise", "codec", fmt.Sprintf("%+v", cfg.Diff.Codec))
		}
		h.folds = make(chan *ownerReplica, 64)
		h.wg.Add(1)
		go h.foldLoop()
	}
	if cfg.Listener != nil {
		h.wg.Add(1)
		go h.acceptLoop(cfg.Listener)
	}
	h.startPersist()
	return h, nil
}

// mode returns the job's protect mode.
func (h *Keeper) mode() protect.ProtectMode { return cmp.Or(h.cfg.Mode, protect.ModeFull) }

// diffMode reports whether the job runs --protect-mode diff.
func (h *Keeper) diffMode() bool { return h.cfg.Mode == protect.ModeDiff }

// FoldStats are a host's figures as a replica holder in diff mode: the
// steps its background folds replayed into bases, and the time that took;
// with a lossy --diff-codec, how far each owner's replay had drifted from
// the owner's true state when its last base refresh arrived.
type FoldStats struct {
	Steps int64
	NS    int64
	// Drifts are the last drift measured of each owner held here whose
	// log is lossy, by owner rank (nil: none measured; never in a
	// lossless job).
	Drifts map[int]diffstore.Drift
}

// PerStep returns the mean fold time per folded step, or 0.
func (f FoldStats) PerStep() time.Duration {
	if f.Steps == 0 {
		return 0
	}
	return time.Duration(f.NS / f.Steps)
}

// FoldStats returns the host's fold figures (zero in full mode).
func (h *Keeper) FoldStats() FoldStats {
	h.driftMu.Lock()
	defer h.driftMu.Unlock()
	return FoldStats{Steps: h.foldSteps.Load(), NS: h.foldNS.Load(), Drifts: maps.Clone(h.drifts)}
}

// forgetDrift drops owner's drift: its stores here went.
func (h *Keeper) forgetDrift(owner int) {
	h.driftMu.Lock()
	defer h.driftMu.Unlock()
	delete(h.drifts, owner)
}

// noteDrift records owner's drift d if its store measured a new one
// (measured counts them: diffstore.Stats.DriftsMeasured, before and
// after a fold), and logs it.
func (h *Keeper) noteDrift(owner int, before, after diffstore.Stats) {
	if after.DriftsMeasured == before.DriftsMeasured || after.Drift == nil {
		return
	}
	d := *after.Drift
	h.driftMu.Lock()
	if h.drifts == nil {
		h.drifts = map[int]diffstore.Drift{}
	}
	h.drifts[owner] = d
	h.driftMu.Unlock()
	h.log.Info("lossy differentials: a replica holder's replay had drifted from the rank's true weights when its base refresh arrived",
		"rank", owner, "step", d.Step, "steps since exact", d.Steps, "max |dw|", d.MaxAbs, "rms dw / rms w", d.RelRMS, "non-finite", d.NonFinite)
}

// linkFailed reports a failed link to host to Config.LinkFailed, once
// per host per placement.
func (h *Keeper) linkFailed(host int, err error) {
	seq := h.place().seq
	h.lfmu.Lock()
	if h.lfSeq != seq {
		h.lfSeq = seq
		clear(h.lfDone)
	}
	done := h.lfDone[host]
	h.lfDone[host] = true
	h.lfmu.Unlock()
	if !done {
		h.log.Warn("replication link failed", "host", host, "err", err)
		h.cfg.LinkFailed(host, err)
	}
}

// Session returns a new protocol session for a connection of rank, or nil
// if rank is not one of this host's.
func (h *Keeper) Session(rank int) *Session {
	p := h.place()
	s := p.svcs[rank]
	if s == nil {
		return nil
	}
	return &Session{svc: s, gen: h.Gen(), placed: p}
}

// SetG records a newer globally recoverable step (older ones are ignored)
// and wakes the stages waiting for it.
// The copies this host keeps of owners none of its ranks holds any more
// go once G passes them.
func (h *Keeper) SetG(gen uint64, g int64) {
	h.gmu.Lock()
	if gen != h.gen || g <= h.g {
		h.gmu.Unlock()
		return
	}
	h.g = g
	close(h.gwake)
	h.gwake = make(chan struct{})
	h.gmu.Unlock()
	h.store.sweep(nil, g)
	h.parity.sweep(nil, h.parityKeep(g))
	h.local.prune(g)
}

// SetH records a newer H of restart generation gen (older ones are
// ignored): in diff mode under EC, the newest step every rank has a coded
// base of (wire.GlobalStep.H, H <= G). The clear copies' stores keep their
// bases at H unfolded, the parity rows of H and later stay, and the logs
// keep the differentials after H; what is older goes. It does nothing in
// other modes.
func (h *Keeper) SetH(gen uint64, hb int64) {
	if !h.place().ecDiff() {
		return
	}
	h.gmu.Lock()
	if gen != h.gen {
		h.gmu.Unlock()
		return
	}
	h.gmu.Unlock()
	h.raiseH(hb)
}

// raiseH makes H hb if that is newer (SetH's, or a placement's H), then
// has the stores keep what H needs and drop what is older, and wakes the
// local owners whose next base waits for H.
func (h *Keeper) raiseH(hb int64) {
	h.gmu.Lock()
	if hb <= h.hb {
		h.gmu.Unlock()
		return
	}
	h.hb = hb
	g := h.g
	h.gmu.Unlock()
	h.store.sweep(nil, g)
	h.parity.sweep(nil, h.parityKeep(g))
	for _, s := range h.place().svcs {
		s.rep.hAdvanced(hb)
	}
}

// H returns H as known here (diff mode under EC), or -1.
func (h *Keeper) H() int64 {
	h.gmu.Lock()
	defer h.gmu.Unlock()
	return h.hb
}

// pin returns the step the clear copies' stores keep as their base given
// G g: H in diff mode under EC (no fold passes it), else g.
func (h *Keeper) pin(g int64) int64 {
	if !h.place().ecDiff() {
		return g
	}
	return min(g, h.H())
}

// parityKeep returns the oldest step a spare parity row must still hold
// given G g (parityStore.sweep): H in diff mode under EC, where recovery
// decodes at H, else g.
func (h *Keeper) parityKeep(g int64) int64 {
	return h.pin(g)
}

// Active reports whether any local rank protects its state.
func (h *Keeper) Active() bool {
	for _, s := range h.place().svcs {
		s.mu.Lock()
		on := s.slots != nil
		s.mu.Unlock()
		if on {
			return true
		}
	}
	return false
}

// G returns the globally recoverable step known here, or -1.
func (h *Keeper) G() int64 {
	h.gmu.Lock()
	defer h.gmu.Unlock()
	return h.g
}
