package keeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
	"github.com/gorun/gorun/topology"
)

// ErrStopping: the host's state protection is shutting down.
var ErrStopping = errors.New("rank: state protection stopping")

// Config describes one host's state protection.
type Config struct {
	Job string
	// LinkKey authenticates the replication links between hosts
	// (comm.Secret.LinkKey; ranks never hold it).
	LinkKey comm.Key
	Host    int // this host's index
	Hosts   int // number of hosts of the job
	// Ranks are this host's ranks (none for a spare's: SetPlacement
	// gives it ranks).
	Ranks []int
	// Dir holds the slot files ("" = /dev/shm).
	Dir string
	// Holders[r] are the ranks holding rank r's replicas, for every rank
	// of the job (nil or empty: no replicas). Peers[r] are the ranks at
	// r's (tp, pp) coordinate, in data-parallel order, for restoring
	// params (Tier-2).
	Holders [][]int
	Peers   func(rank int) []int
	// HostOf maps a rank to its host index. Holders and HostOf are the
	// first placement's: SetPlacement replaces them.
	HostOf func(rank int) int
	// Listener accepts replication links from other hosts (nil: none are
	// expected, e.g. a single-host job). The Keeper owns it.
	Listener net.Listener
	// Changed is called (from any goroutine, never under a lock the caller
	// might need) when a rank's progress changed: see Keeper.Progress.
	Changed func()
	// Failed is called (from any goroutine, never under a lock) when local
	// rank rank of restart generation gen cannot go on: its committed
	// state is corrupt (a *CorruptError; a holder refused its bytes and
	// the rank's slot no longer matches its committed CRC32Cs). Its step
	// will never be replicated, so G stops and every rank would wait at
	// the overwrite rule: the caller must fail the rank (kill it and report
	// it, so that the job restarts or stops). The rank's own Stage
	// requests are refused with err meanwhile. Nil: only logged.
	Failed func(rank int, gen uint64, err error)
	// LinkFailed is called (from any goroutine, never under a lock) when
	// replication from this host to host failed at the link (it could not
	// be dialed, or broke; not a refusal by the host): once per host per
	// placement (New's, then each SetPlacement's). The replication is
	// retried meanwhile. Nil: only logged.
	LinkFailed func(host int, err error)
	// Mode is how the replicated regions reach the holders: ModeFull
	// ("" too) or ModeDiff, configured by Diff.
	Mode protect.ProtectMode
	Diff DiffConfig
	// EC is the first placement's erasure-coding layout (Placement.EC;
	// nil: replicas only), Epoch the epoch of the table it comes from
	// (Placement.Epoch). In diff mode (ModeDiff) only base steps are
	// coded and the differentials since are kept on M hosts
	// (PROTOCOL.md, "Erasure coding and diff mode").
	EC    []topology.ECGroup
	Epoch uint64
	// DiffLog, in diff mode, has every local rank's differentials
	// appended to the job's durable directory too (difflog.go; nil:
	// none).
	DiffLog *DiffLogConfig
	// Persist is the durable tier (gorun --ckpt-dir; persist.go): each
	// rank's bases on disk. The zero value has none.
	Persist PersistConfig
	Log     *slog.Logger
}

// DiffConfig configures differential protection (Config.Mode ModeDiff).
//
// A holder keeps, per owner, a base (the owner's replicated regions), a
// refresh's buffers while one arrives, up to two spare sets of them (a
// fold's and a refresh's, reused rather than faulted in afresh each
// time), and the differentials not folded yet with their record buffers
// kept for reuse (Fold+2): with the lossless codec, whose records are a
// third of the optimizer region (W, M and V, one gradient), about
// (4 + (Fold+2)/3) times the owner's optimizer state at the most (5⅓ at
// the default Fold of 8), against full mode's 2 (two buffers). The
// agent reserves it as it grows, and refuses what would pass half the
// host's memory. A
// lossless log never holds more than Fold+1 differentials (folds pass a
// refresh in progress); a lossy one, whose folds stop at a refresh's step,
// at most about 2×Fold, the refresh being paced over at most Fold steps.
type DiffConfig struct {
	// Fold: a holder folds an owner's log into its base once the log
	// holds this many steps (gorun --diff-fold; 0 means 8).
	Fold int
	// BaseEvery: each holder gets a fresh base of the owner's state every
	// this many steps, in chunks paced over min(BaseEvery/2, Fold) steps
	// (gorun --base-every; 0 means 100).
	BaseEvery int
	// Codec encodes the gradients (gorun --diff-codec, ParseDiffCodec):
	// lossless unless a lossy codec was asked for. The zero value is
	// lossless (replay's Raw codec), as "raw" is.
	Codec replay.Options
}

// Defaults of DiffConfig.
const (
	defaultFold      = 8
	defaultBaseEvery = 100
)

func (c DiffConfig) fold() int      { return cmp.Or(max(c.Fold, 0), defaultFold) }
func (c DiffConfig) baseEvery() int { return cmp.Or(max(c.BaseEvery, 0), defaultBaseEvery) }

// refreshSteps returns over how many steps the owner spreads a base
// refresh: min(BaseEvery/2, Fold), at least 1, so that a holder whose
// folds stop at the refresh (a lossy log) holds about 2×Fold
// differentials at most.
func (c DiffConfig) refreshSteps() int64 {
	return int64(max(1, min(c.baseEvery()/2, c.fold())))
}

// codec returns the options gradients are encoded with.
func (c DiffConfig) codec() replay.Options {
	if c.Codec == (replay.Options{}) {
		return replay.Options{Lossless: true}
	}
	return c.Codec
}

// lossless reports whether restores are bitwise (the codec is Raw).
func (c DiffConfig) lossless() bool { return c.codec().Lossless }

// Progress is one local rank's protection progress.
type Progress struct {
	Rank       int
	Committed  int64 // newest step committed locally, or -1
	Replicated int64 // newest step committed locally and acknowledged by every current holder since it became one, or -1
	Stages     int64 // Stage requests served
	WaitNS     int64 // their total wait at the overwrite rule
	// Replication: steps sent to every holder, the time that took
	// (from the first byte to the last acknowledgement) and the bytes
	// sent, summed over holders.
	ReplSteps int64
	ReplNS    int64
	ReplBytes int64
	// Of ReplBytes (diff mode): whole states, to holders lacking a base
	// and as paced refreshes (ReplBaseBytes), and differentials
	// (ReplDiffBytes). In full mode every byte is a base's.
	ReplBaseBytes int64
	ReplDiffBytes int64
	// Of the differentials the holders took (diff mode): those whose
	// gradient a holder took from a local data-parallel peer (sent by
	// reference, localpeer.go), and those sent with it.
	DiffLocal int64
	DiffNet   int64
	// The holders of the current placement whose newest differential
	// went by reference (they use the local source now), and with the
	// record.
	SourceLocal, SourceNet int
	// Restores: Restore requests served to the rank (answered with a
	// step, not an error) in this restart generation; a rank that
	// restores again in place after an epoch change counts again.
	Restores int64
	// Base (diff mode under EC): the newest base step b <= Replicated
	// whose every parity row acknowledged the rank's share of b and whose
	// clear bytes at b are kept on the rank's data host (its clear
	// holder's store pinned at b, or the owner's retained snapshot when it
	// runs on its data host); -1 for none. 0 in other modes.
	Base int64
	// Durable is the rank's durable tier (persist.go), nil without one
	// or before the rank opened its store.
	Durable *DurableProgress
}

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

// Restart begins restart generation gen, in which every rank resumes from
// step g (the launcher's G when it stopped the ranks; -1: from scratch):
// every local rank's steps after g are discarded, so that the ranks
// restarted next restore g and stage g+1, and so are the replicas this
// host holds of other ranks' steps after g from older generations; puts
// of older generations are refused from now on. The ranks must be stopped.
func (h *Keeper) Restart(gen uint64, g int64) error {
	return h.restart(gen, g, false)
}

// RollBack is Restart for a roll-back of the job to the durable tier at
// step t (hotswap.RollbackToDisk; the ranks' states at t are reloaded
// next, Reload). In diff mode under erasure coding it also forgets H:
// the coded bases and the logs after them were of a base schedule that
// the roll-back abandons (H may be past t, and no base step at or before
// t is known to be held complete in the new placement), so the schedule
// restarts from t as at the job's start — t is b_0, every owner codes it
// again, and H is -1 until the launcher publishes the new generation's H
// from the new reports (SetH). What the stores, rows and logs keep of
// steps up to t (Restart drops those after t of older generations) is
// never named by H again: H rises only to bases coded in the new
// generation, t or later. In other modes RollBack is Restart.
func (h *Keeper) RollBack(gen uint64, t int64) error {
	return h.restart(gen, t, true)
}

func (h *Keeper) restart(gen uint64, g int64, rollback bool) error {
	h.pmu.Lock()
	defer h.pmu.Unlock()
	// No progress report is taken while the generation and the ranks'
	// steps disagree: one with the new generation and a discarded step
	// would let the launcher's G pass g.
	h.rmu.Lock()
	h.gmu.Lock()
	h.gen, h.g, h.resumed = gen, g, g
	if rollback && h.place().ecDiff() {
		h.hb = noStep
	}
	close(h.gwake)
	h.gwake = make(chan struct{})
	h.gmu.Unlock()
	h.store.restart(gen, g, rollback)
	h.parity.restart(gen, g, rollback)
	var errs []error
	p := h.place()
	for _, r := range sortedRanks(p) {
		s := p.svcs[r]
		s.restores.Store(0)
		if err := s.truncate(g); err != nil {
			errs = append(errs, err)
		}
	}
	h.rmu.Unlock()
	h.cfg.Changed()
	return errors.Join(errs...)
}

// Gen returns the restart generation.
func (h *Keeper) Gen() uint64 {
	h.gmu.Lock()
	defer h.gmu.Unlock()
	return h.gen
}

// slowWait is how long a stage waits at the overwrite rule before the
// service says so in its log.
const slowWait = 30 * time.Second

// errRestarted: the ranks were restarted since the session began (its
// rank process is gone).
var errRestarted = errors.New("the ranks were restarted since this session began")

// waitG waits until g ≥ step in generation gen, ctx ends, the host stops,
// a restart begins another generation, a new placement begins
// (errNewPlacement), or failed is closed (the rank failed: it returns
// failure()).
// replaced is the placement's in which the stage began.
func (h *Keeper) waitG(ctx context.Context, rank int, gen uint64, step int64, replaced, failed <-chan struct{}, failure func() error) error {
	h.waiters.Add(1)
	defer h.waiters.Add(-1)
	t := time.NewTimer(slowWait)
	defer t.Stop()
	slow := t.C
	for {
		h.gmu.Lock()
		g, wake, cur := h.g, h.gwake, h.gen
		h.gmu.Unlock()
		if cur != gen {
			return errRestarted
		}
		if g >= step {
			return nil
		}
		select {
		case <-wake:
		case <-slow:
			h.log.Warn("a stage waits at the overwrite rule: some rank has not committed, or not replicated, this step",
				"rank", rank, "step", step, "G", g, "waited", slowWait)
		case <-failed:
			if err := failure(); err != nil {
				return err
			}
			failed = nil // cleared by a restart: the generation check ends the wait
		case <-replaced:
			return errNewPlacement
		case <-ctx.Done():
			return ctx.Err()
		case <-h.life.Done():
			return ErrStopping
		}
	}
}

func sortedRanks(p *placement) []int {
	rs := make([]int, 0, len(p.svcs))
	for r := range p.svcs {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	return rs
}

// Progress returns every local rank's progress, in rank order, with the
// restart generation it belongs to.
func (h *Keeper) Progress() (uint64, []Progress) {
	h.rmu.RLock()
	defer h.rmu.RUnlock()
	gen := h.Gen()
	p := h.place()
	out := make([]Progress, 0, len(p.svcs))
	for _, r := range sortedRanks(p) {
		pr := p.svcs[r].progress(p)
		if p.ecDiff() {
			pr.Base = p.svcs[r].rep.baseIn(p, pr.Replicated)
		}
		out = append(out, pr)
	}
	return gen, out
}

// Close stops the host's state protection: pending requests fail, links
// close, the replicas held are dropped and the slots unmapped. The slot
// files stay (see RemoveFiles). With a durable tier it first waits, a
// bounded time, for the newest watermark and resolved step published
// (SetDurable) to be applied to every local store, which it then closes.
func (h *Keeper) Close() error {
	h.pmu.Lock() // no SetPlacement adds services meanwhile
	defer h.pmu.Unlock()
	// The durable tier's last watermark first (bounded): the stores
	// close below.
	h.persistFinish()
	h.stop()
	if h.cfg.Listener != nil {
		h.cfg.Listener.Close()
	}
	h.links.close()
	h.store.close()
	h.parity.close()
	h.wg.Wait()
	var errs []error
	p := h.place()
	for _, r := range sortedRanks(p) {
		errs = append(errs, p.svcs[r].close())
	}
	return errors.Join(errs...)
}

// RemoveFiles removes the slot files this host made for its ranks (after
// Close), and releases the job's claim: the last process of the job on
// this machine to release it removes whatever of the job's files is left.
// A rank's file whose name another process made since is left to it:
// agents of the job that share the directory (network namespace hosts
// share /dev/shm) use the same names for a rank, and a spare that took
// this host's ranks over may be using them.
func (h *Keeper) RemoveFiles() error {
	var errs []error
	p := h.place()
	for _, r := range sortedRanks(p) {
		errs = append(errs, p.svcs[r].removeFilesLog())
	}
	if c := h.claim.Load(); c != nil {
		_, err := c.Release()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (h *Keeper) acceptLoop(ln net.Listener) {
	defer h.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			from, err := comm.AcceptLink(c, h.linkAuth(), h.cfg.Host, h.cfg.Hosts)
			if err != nil {
				h.log.Warn("refused a replication link", "remote", c.RemoteAddr().String(), "err", err)
				c.Close()
				return
			}
			h.store.serve(h.life, from, c)
		}()
	}
}

func (h *Keeper) linkAuth() comm.LinkAuth {
	return comm.LinkAuth{Job: h.cfg.Job, Key: h.cfg.LinkKey, Purpose: "replica"}
}

func (h *Keeper) String() string { return fmt.Sprintf("host %d", h.cfg.Host) }
