package keeper

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
)

// Placement is one epoch's view of the job for a host's state protection
// (the epoch table's, internal/wire.EpochTable): which ranks run where,
// who holds whose replicas, and where the ranks that cannot restore from
// their own host's slot restore from.
type Placement struct {
	Ranks   []int          // this host's ranks in the epoch (local-rank order)
	HostOf  []int          // every rank's host index
	Holders [][]int        // every rank's replica holders (nil: no replicas)
	Sources map[int]Source // ranks restoring from elsewhere than their own slot (wire.RestoreRow)
	// EC is the erasure-coding layout, with Hosts, Data and Parity as
	// host indices (nil: replicas only). Holders are then the clear
	// copies' holders (a rank's data host's lowest rank; none for a rank
	// that runs on its data host) and the parity rows go to each group's
	// Parity hosts.
	EC []topology.ECGroup
	// Epoch is the epoch table's epoch in which this placement took
	// effect, and G the step its ranks resume from (-1: the start). With
	// EC they label and order the parity rows' shares: a step after G
	// committed under an older placement belongs to a trajectory the
	// ranks abandoned (an in-place recovery rolls back to G without a new
	// restart generation), and its shares are never mixed with those of
	// the steps committed since (ecstore.go).
	Epoch uint64
	G     int64
	// Logs and H are for --protect-mode diff under EC
	// (wire.EpochTable.Logs and H): every rank's log-only holders
	// (topology.ECLogHolders; nil: none), and the newest step every rank
	// has a coded base of when the epoch was published (-1: none).
	Logs [][]int
	H    int64
}

// Source is where a rank restores step G from when its own host's slot
// cannot serve it (hot-swap's restore plan, wire.RestoreRow): the
// replicated regions (optimizer, meta) from the copy kept on rank Opt's
// host, which may no longer be one of the rank's holders (it has the copy
// that exists), and params from the slot of data-parallel peer Params.
// With Decode, the replicated regions are rebuilt from the erasure code
// of the rank's group (Placement.EC) instead, and Opt is unused.
type Source struct {
	Opt, Params int
	Decode      bool
}

// placement is the placement a Keeper works with: New's (from its
// Config), then each SetPlacement's. It is never changed once
// published (Keeper.pl): a new one replaces it.
type placement struct {
	seq     uint64 // 0 for New's, one more for each SetPlacement of another layout
	world   int    // ranks in the job (-1: unknown, New's)
	ranks   []int
	svcs    map[int]*service // by rank: this host's ranks
	hostOf  func(rank int) int
	holders [][]int
	sources map[int]Source
	// ec is the erasure-coding layout (nil: none); diff, that the job
	// runs --protect-mode diff (with ec: only base steps are coded,
	// ecdiff_owner.go). epoch and g are Placement's (New's:
	// Config.Epoch, and -1); logs and h too (diff mode under EC:
	// every rank's log-only holders, and the H the epoch was published
	// with; a later epoch with the same layout replaces the placement by
	// a copy with its H, withH, and leaves the rest, epoch and g too).
	ec    *ecLayout
	diff  bool
	epoch uint64
	g     int64
	logs  [][]int
	h     int64
	// replaced is closed when a SetPlacement replaces this placement: it
	// ends the stages waiting at the overwrite rule.
	replaced chan struct{}
}

// same reports whether p describes this placement: the same ranks here,
// hosts, holders and Sources (New's placement, from its Config,
// included: the agent's first epoch table repeats it).
func (pl *placement) same(p *Placement) bool {
	var ec []topology.ECGroup
	if pl.ec != nil {
		ec = pl.ec.groups
	}
	if !slices.Equal(pl.ranks, p.Ranks) || !maps.Equal(pl.sources, p.Sources) ||
		pl.world >= 0 && pl.world != len(p.HostOf) || !sameEC(ec, p.EC) {
		return false
	}
	for r := range max(len(pl.logs), len(p.Logs)) {
		var ls []int
		if r < len(p.Logs) {
			ls = p.Logs[r]
		}
		if !slices.Equal(pl.logsOf(r), ls) {
			return false
		}
	}
	for r, h := range p.HostOf {
		if pl.hostOf(r) != h {
			return false
		}
	}
	for r := range max(len(pl.holders), len(p.Holders)) {
		var hs []int
		if r < len(p.Holders) {
			hs = p.Holders[r]
		}
		if !slices.Equal(pl.holdersOf(r), hs) {
			return false
		}
	}
	return true
}

// withH returns a copy of pl with H hb: the same placement (its seq, its
// services and its replaced channel), published by a later epoch table
// with the same layout (SetPlacement).
func (pl *placement) withH(hb int64) *placement {
	np := *pl
	np.h = hb
	return &np
}

// errNewPlacement: a stage waited at the overwrite rule when a new
// placement began.
var errNewPlacement = errors.New("a new placement (epoch) began: restore from G")

func (p *placement) holdersOf(rank int) []int {
	if rank >= 0 && rank < len(p.holders) {
		return p.holders[rank]
	}
	return nil
}

// logsOf returns rank's log-only holders (diff mode under EC), or nil.
func (p *placement) logsOf(rank int) []int {
	if rank >= 0 && rank < len(p.logs) {
		return p.logs[rank]
	}
	return nil
}

// ecDiff reports whether the placement runs diff mode under erasure
// coding: bases coded at aligned steps, differentials kept on M hosts
// (ecdiff_owner.go).
func (p *placement) ecDiff() bool { return p.ec != nil && p.diff }

// logTargets returns rank's log-only holders with their hosts: targets
// of its differentials (kinds 6) only, never of a base.
func (p *placement) logTargets(rank int) []holderKey {
	ls := p.logsOf(rank)
	out := make([]holderKey, len(ls))
	for i, r := range ls {
		out[i] = holderKey{rank: r, host: p.hostOf(r), log: true}
	}
	return out
}

// diffTargets returns the targets of rank's differentials: its clear
// copy's holders (or replica holders), then its log-only holders.
func (p *placement) diffTargets(rank int) []holderKey {
	return append(p.targets(rank), p.logTargets(rank)...)
}

// targets returns the holders of rank's replicas with their hosts.
func (p *placement) targets(rank int) []holderKey {
	hs := p.holdersOf(rank)
	out := make([]holderKey, len(hs))
	for i, r := range hs {
		out[i] = holderKey{rank: r, host: p.hostOf(r)}
	}
	return out
}

// holds reports whether one of this host's ranks holds owner's
// replicas (or, in diff mode under EC, its log) under p.
func (p *placement) holds(owner int) bool {
	for _, x := range p.holdersOf(owner) {
		if p.svcs[x] != nil {
			return true
		}
	}
	for _, x := range p.logsOf(owner) {
		if p.svcs[x] != nil {
			return true
		}
	}
	return false
}

// holderKey names one replica holder: a rank, on a host. A rank that
// moves to another host is a new holder (its copies stayed behind). row
// is 0 for a replica (or an EC clear copy), j+1 for parity row j
// (ec.go): the parity holder rank on the row's host. log marks a log-only
// holder (diff mode under EC: Placement.Logs), which takes differentials
// and never a base.
type holderKey struct {
	rank, host, row int
	log             bool
}

// place returns the current placement.
func (h *Keeper) place() *placement { return h.pl.Load() }

// svc returns local rank rank's service, or nil.
func (h *Keeper) svc(rank int) *service { return h.place().svcs[rank] }

// holders returns rank's replica holders.
func (h *Keeper) holders(rank int) []int { return h.place().holdersOf(rank) }

// hostOf returns rank's host index (-1: unknown).
func (h *Keeper) hostOf(rank int) int { return h.place().hostOf(rank) }

// ErrPlacement: a Placement given to SetPlacement is inconsistent.
var ErrPlacement = errors.New("rank: bad placement")

// check validates p for a host of hosts hosts, host index host.
func (p *Placement) check(host, hosts int) error {
	world := len(p.HostOf)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrPlacement}, args...)...)
	}
	for r, h := range p.HostOf {
		if h < 0 || h >= hosts {
			return bad("rank %d on host %d of %d", r, h, hosts)
		}
	}
	seen := map[int]bool{}
	for _, r := range p.Ranks {
		switch {
		case r < 0 || r >= world:
			return bad("rank %d of a world of %d", r, world)
		case p.HostOf[r] != host:
			return bad("rank %d is on host %d, not on this host %d", r, p.HostOf[r], host)
		case seen[r]:
			return bad("rank %d placed twice", r)
		}
		seen[r] = true
	}
	for r, h := range p.HostOf {
		if h == host && !seen[r] {
			return bad("rank %d is on this host %d but not among its ranks %v", r, host, p.Ranks)
		}
	}
	if len(p.Holders) > world {
		return bad("holders for %d ranks in a world of %d", len(p.Holders), world)
	}
	// hotswap places no holder on its owner's host (the copy would go
	// with it), nor a holder twice.
	for o, hs := range p.Holders {
		for i, x := range hs {
			switch {
			case x < 0 || x >= world || x == o:
				return bad("rank %d held by rank %d in a world of %d", o, x, world)
			case slices.Contains(hs[:i], x):
				return bad("rank %d held twice by rank %d", o, x)
			case p.HostOf[x] == p.HostOf[o]:
				return bad("rank %d held by rank %d on its own host %d", o, x, p.HostOf[o])
			}
		}
	}
	if len(p.Logs) > world {
		return bad("log holders for %d ranks in a world of %d", len(p.Logs), world)
	}
	for o, ls := range p.Logs {
		for i, x := range ls {
			switch {
			case x < 0 || x >= world || x == o:
				return bad("rank %d's log held by rank %d in a world of %d", o, x, world)
			case slices.Contains(ls[:i], x) || o < len(p.Holders) && slices.Contains(p.Holders[o], x):
				return bad("rank %d's log held twice by rank %d", o, x)
			case p.HostOf[x] == p.HostOf[o]:
				return bad("rank %d's log held by rank %d on its own host %d", o, x, p.HostOf[o])
			}
		}
	}
	if p.H < noStep || p.H > protect.MaxStep {
		return bad("H %d out of range", p.H)
	}
	for r, s := range p.Sources {
		if r < 0 || r >= world || s.Opt < 0 || s.Opt >= world || s.Params < 0 || s.Params >= world {
			return bad("rank %d restores from ranks %d and %d in a world of %d", r, s.Opt, s.Params, world)
		}
	}
	if p.G < noStep || p.G > protect.MaxStep {
		return bad("G %d out of range", p.G)
	}
	if len(p.EC) > 0 {
		for _, g := range p.EC {
			for _, h := range g.Hosts {
				if h < 0 || h >= hosts {
					return bad("erasure-coding group on host %d of %d", h, hosts)
				}
			}
		}
		return checkEC(p.EC, world, func(r int) int { return p.HostOf[r] })
	}
	return nil
}

// SetPlacement switches the host's state protection to the placement of a
// new epoch:
//
//   - a service is added for every rank newly placed here (a spare's Keeper
//     starts with no ranks and gets them here; the ranks restore step G
//     of the generation Restart began);
//   - the services of ranks that left are closed and their slot files
//     removed; their sessions fail from then on;
//   - replication switches to the new holders and hosts: an owner's
//     Progress.Replicated counts only the holders of this placement, each
//     from the step it acknowledged since it became one, and the owner's
//     newest committed step (and the next ones) are sent to the holders
//     that lack them;
//   - restores use the new holders, hosts and Sources; the copies this
//     host holds of owners none of its ranks holds any more (Sources'
//     included) are kept, and serve restores, until G passes their
//     newest step (see replicaStore.sweep): until then they may be the
//     only copy of G.
//
// A new placement also ends the stages waiting at the overwrite rule
// (their Staged says so): a rank that stays restores from G again
// (Restore, in place) rather than wait for a G that may need it to go
// on. A placement equal to the current one (an epoch table republished,
// or a restart's new epoch) changes nothing but, in diff mode under
// erasure coding, H: the step a restore decodes at is the newest table's.
//
// It returns an error wrapping ErrPlacement, and changes nothing, if p is
// inconsistent (a rank on no host or on several, holders out of range).
func (h *Keeper) SetPlacement(p Placement) error {
	if err := p.check(h.cfg.Host, h.cfg.Hosts); err != nil {
		return err
	}
	if len(p.Logs) > 0 && (len(p.EC) == 0 || !h.diffMode()) {
		return fmt.Errorf("%w: log-only holders outside diff mode under erasure coding", ErrPlacement)
	}
	hostOf := slices.Clone(p.HostOf)
	holders := make([][]int, len(p.Holders))
	for i, hs := range p.Holders {
		holders[i] = slices.Clone(hs)
	}
	h.pmu.Lock()
	defer h.pmu.Unlock()
	if h.life.Err() != nil {
		return ErrStopping
	}
	old := h.place()
	if old.same(&p) {
		if old.ecDiff() {
			// A table republished with the same layout: its H, if newer,
			// still applies (same compares the layout only).
			h.raiseH(p.H)
			if p.H != old.h {
				// A restart in place publishes a new epoch with the same
				// layout: a rank restored from its stripe decodes at
				// this epoch's H, not at the one the layout was first
				// published with (-1 at the job's start: no coded base
				// then). The layout and what watches it stay.
				h.rmu.Lock()
				h.pl.Store(old.withH(p.H))
				h.rmu.Unlock()
			}
		}
		return nil
	}
	np := &placement{replaced: make(chan struct{}), world: len(hostOf),
		seq: old.seq + 1, ranks: slices.Clone(p.Ranks), svcs: make(map[int]*service, len(p.Ranks)),
		hostOf: func(r int) int {
			if r < 0 || r >= len(hostOf) {
				return -1
			}
			return hostOf[r]
		},
		holders: holders, sources: maps.Clone(p.Sources),
		diff: h.diffMode(), epoch: p.Epoch, g: p.G, h: p.H,
	}
	for _, ls := range p.Logs {
		np.logs = append(np.logs, slices.Clone(ls))
	}
	if len(p.EC) > 0 {
		ec, err := newECLayout(p.EC, len(hostOf), np.hostOf)
		if err != nil {
			return err
		}
		np.ec = ec
	}
	if np.sources == nil {
		np.sources = map[int]Source{}
	}
	for _, r := range p.Ranks {
		if s := old.svcs[r]; s != nil {
			np.svcs[r] = s
		} else {
			np.svcs[r] = newService(h, r)
		}
	}
	var left []*service
	for r, s := range old.svcs {
		if np.svcs[r] == nil {
			left = append(left, s)
		}
	}
	// Progress reports and Restart see either placement whole.
	h.rmu.Lock()
	h.pl.Store(np)
	h.rmu.Unlock()
	close(old.replaced)
	if np.ecDiff() {
		h.raiseH(p.H) // the H the epoch was published with: the stores keep it
	}

	h.store.sweep(np, h.G())
	h.parity.sweep(np, h.G())
	var errs []error
	for _, s := range left {
		s.leave()
		if err := s.close(); err != nil {
			errs = append(errs, fmt.Errorf("rank %d, which left this host: %w", s.rank, err))
		}
		if err := s.removeFilesLog(); err != nil {
			errs = append(errs, fmt.Errorf("rank %d, which left this host: %w", s.rank, err))
		}
	}
	for _, r := range np.ranks {
		np.svcs[r].rep.placed(np)
	}
	h.local.replan()
	h.log.Info("state protection placement", "placement", np.seq, "ranks", np.ranks, "left", len(left))
	h.cfg.Changed()
	return errors.Join(errs...)
}
