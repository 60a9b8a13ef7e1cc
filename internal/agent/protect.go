package agent

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
	"github.com/nats-io/nats.go"
)

// protection runs the host's state protection (internal/keeper): a service
// per local rank, the replicas this host holds, the progress reports to
// the launcher and G from it.
type protection struct {
	a    *agent
	host *keeper.Keeper
	kick chan struct{} // progress changed
	fail chan rankStateFailure
	stop chan struct{} // closed by close
	done chan struct{} // the publisher ended
	gsub *nats.Subscription
	// placed is the placement given to the service last (owned by the
	// agent's loop).
	placed keeper.Placement
	// epoch is the newest epoch whose table the service has applied (set
	// by the loop after SetPlacement, read by the publisher before it
	// takes a report: the report is of that placement or a later one).
	epoch atomic.Uint64
	// flipDone is closed when the GORUN_DEBUG_FLIP_REPLICAS hook's
	// goroutine ended (debugflip.go); nil without the hook.
	flipDone chan struct{}
}

// rankStateFailure is a local rank whose state protection failed
// (keeper.Config.Failed: its protected state is corrupt, or the host's
// replica-memory reserve cannot hold its copy): the agent's loop kills
// it (failRank).
type rankStateFailure struct {
	rank int
	gen  uint64
	err  error
}

// protectSettings are the job's protect mode and diff-mode settings, as
// keeper.Config takes them, and its durable tier's (durable.go).
type protectSettings struct {
	mode    protect.ProtectMode
	diff    keeper.DiffConfig
	persist keeper.PersistConfig
	// diffBatch (--diff-batch) and resume (--resume) are the durable
	// tier's differential log and resume settings, checked here.
	diffBatch int
	resume    bool
}

// CheckDiffCodec says what is wrong with a diff codec as gorun
// --diff-codec and a job spec give it (protect.ParseDiffCodec's form), or
// nil: the launcher checks a job's before it starts any agent.
func CheckDiffCodec(codec string) error {
	_, err := protect.ParseDiffCodec(codec)
	return err
}

// parseProtect reads the protection settings of the launcher's job spec
// (gorun --protect-mode, --diff-fold, --base-every, --diff-codec): the
// mode with protect.ParseProtectMode ("" is full), the codec from its flag
// form with protect.ParseDiffCodec ("" is raw). It refuses, with an error
// wrapping ErrJobSpec, an unknown mode or codec, a fold or base period
// out of range, and diff settings without diff mode; then the durable
// tier's settings (parsePersist).
func parseProtect(s *wire.JobSpec) (protectSettings, error) {
	ps, err := parseProtectMode(s)
	if err != nil {
		return ps, err
	}
	return parsePersist(s, ps)
}

func parseProtectMode(s *wire.JobSpec) (protectSettings, error) {
	mode := protect.ModeFull
	if s.ProtectMode != "" {
		m, err := protect.ParseProtectMode(s.ProtectMode)
		if err != nil {
			return protectSettings{}, fmt.Errorf("%w: %w", ErrJobSpec, err)
		}
		mode = m
	}
	if mode != protect.ModeDiff {
		if s.DiffFold != 0 || s.BaseEvery != 0 || s.DiffCodec != "" {
			return protectSettings{}, fmt.Errorf("%w: diff settings (fold %d, base every %d, codec %q) with protect mode %s",
				ErrJobSpec, s.DiffFold, s.BaseEvery, s.DiffCodec, mode)
		}
		return protectSettings{mode: mode}, nil
	}
	if s.DiffFold < 0 || s.DiffFold > wire.MaxDiffFold || s.BaseEvery < 0 || int64(s.BaseEvery) > wire.MaxBaseEvery {
		return protectSettings{}, fmt.Errorf("%w: diff fold %d or base every %d out of range", ErrJobSpec, s.DiffFold, s.BaseEvery)
	}
	codec := s.DiffCodec
	if codec == "" {
		codec = "raw"
	}
	c, err := protect.ParseDiffCodec(codec)
	if err != nil {
		return protectSettings{}, fmt.Errorf("%w: %w", ErrJobSpec, err)
	}
	return protectSettings{mode: mode, diff: keeper.DiffConfig{Fold: s.DiffFold, BaseEvery: s.BaseEvery, Codec: c}}, nil
}

// listenReplicas opens the host's replication listener on addr (other
// hosts' agents connect to it), or returns nil when it cannot.
func listenReplicas(addr string) (net.Listener, int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return nil, 0, fmt.Errorf("replication listener: %w", err)
	}
	return ln, ln.Addr().(*net.TCPAddr).Port, nil
}

// tablePlacement is table t's placement for the state protection of
// host: its ranks, every rank's host and holders, the restore plan, the
// erasure-coding layout (tableEC), and the table's epoch and G (which
// label the erasure-coded shares of the steps committed in it); in diff
// mode under EC also every rank's log-only holders and H.
func tablePlacement(t *wire.EpochTable, host int) keeper.Placement {
	p := keeper.Placement{HostOf: make([]int, t.World), Holders: t.HolderLists(), // rows checked by wire
		Epoch: t.Epoch, G: t.G, Logs: t.LogLists(), H: t.H}
	hostRanks := make([][]int, len(t.Hosts))
	for h, places := range t.Placements() {
		for _, pl := range places {
			p.HostOf[pl.Rank] = h
			hostRanks[h] = append(hostRanks[h], pl.Rank)
			if h == host {
				p.Ranks = append(p.Ranks, pl.Rank)
			}
		}
	}
	if len(t.Restore) > 0 {
		p.Sources = make(map[int]keeper.Source, len(t.Restore))
		for _, row := range t.Restore {
			p.Sources[row.Rank] = keeper.Source{Opt: row.Opt, Params: row.Params, Decode: row.Decode}
		}
	}
	p.EC = tableEC(t.EC, hostRanks)
	return p
}

// tableEC returns the erasure-coding groups of ec (checked by wire; nil
// for none) as topology.PlanEC plans them, with the table's host indices:
// Workers[i] are the ranks the table places on Hosts[i], ascending
// (hostRanks: per host, its ranks), and reduction group i's Members the
// ranks at index i of the K data groups. Reduction Targets are left nil:
// the agents send each member's share straight to the parity hosts, and
// only ECGroup.Traffic reads them.
func tableEC(ec *wire.ECTable, hostRanks [][]int) []topology.ECGroup {
	if ec == nil {
		return nil
	}
	groups := make([]topology.ECGroup, len(ec.Groups))
	for gi, row := range ec.Groups {
		g := &groups[gi]
		g.Hosts, g.Data, g.Parity = slices.Clone(row.Hosts), slices.Clone(row.Data), slices.Clone(row.Parity)
		g.Workers = make([][]int, len(row.Hosts))
		for i, h := range row.Hosts {
			g.Workers[i] = slices.Sorted(slices.Values(hostRanks[h]))
		}
		g.DataGroups = make([][]int, len(row.DataGroups))
		for j, dg := range row.DataGroups {
			g.DataGroups[j] = slices.Clone(dg)
		}
		l := len(row.DataGroups[0]) // K >= 1 data groups of one length
		g.Reductions = make([]topology.Reduction, l)
		for i := range l {
			members := make([]int, len(row.DataGroups))
			for j, dg := range row.DataGroups {
				members[j] = dg[i]
			}
			g.Reductions[i] = topology.Reduction{Members: members}
		}
	}
	return groups
}

// startProtection starts the state protection of this host's ranks of
// table t (none on a spare: it may hold replicas, and get ranks later).
// It owns ln from then on.
func (a *agent) startProtection(t *wire.EpochTable, ln net.Listener) (*protection, error) {
	pl := tablePlacement(t, a.cfg.Host)
	var peers func(int) []int
	if l, err := topology.NewLayout(t.World, max(a.spec.TP, 1), max(a.spec.PP, 1)); err == nil {
		peers = l.DPGroup
	}
	// A host may get more ranks later (a spare, in-place recovery).
	p := &protection{a: a, kick: make(chan struct{}, 1), fail: make(chan rankStateFailure, max(len(pl.Ranks), 16)), stop: make(chan struct{}), done: make(chan struct{}), placed: pl}
	newHost := keeper.New
	if a.cfg.newHost != nil {
		newHost = a.cfg.newHost
	}
	h, err := newHost(keeper.Config{
		Job: a.cfg.Job, LinkKey: a.cfg.Creds.Link, Host: a.cfg.Host, Hosts: len(t.Hosts), Ranks: pl.Ranks,
		Holders: pl.Holders, Peers: peers, HostOf: func(r int) int { return pl.HostOf[r] },
		Listener: ln, Changed: p.changed, Failed: p.failed, LinkFailed: p.linkFailed, Log: a.log,
		Mode: a.protect.mode, Diff: a.protect.diff, EC: pl.EC, Epoch: pl.Epoch, Persist: a.protect.persist,
		DiffLog: a.protect.diffLog(), Dir: a.slotOpt().Dir,
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	p.host = h
	if len(pl.Sources) > 0 || len(pl.Logs) > 0 {
		// NewHost takes no restore plan and no log-only holders (diff
		// mode under EC): a host that starts in a recovery epoch (a spare
		// joining late), or in any epoch of diff mode under EC, gets them
		// now through SetPlacement (which keeps the rest as NewHost made
		// it).
		p.placed = keeper.Placement{}
	}
	if err := p.setTable(t); err != nil {
		h.Close()
		return nil, err
	}
	sub, err := a.ctl.Subscribe(a.subj.G, p.onG)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("subscribing to G: %w", err)
	}
	p.gsub = sub
	a.tasks.Go("state protection publisher", p.publish)
	p.startDebugFlip()
	return p, nil
}

// setTable switches the service to table t: the hosts' replication
// addresses (a fenced host has none), and t's placement if it changed.
func (p *protection) setTable(t *wire.EpochTable) error {
	addrs := make([]string, len(t.Hosts))
	for i, h := range t.Hosts {
		if h.ReplicaPort > 0 && !h.Fenced {
			addrs[i] = net.JoinHostPort(h.Addr, strconv.Itoa(h.ReplicaPort))
		}
	}
	p.host.SetAddrs(addrs)
	pl := tablePlacement(t, p.a.cfg.Host)
	if !reflect.DeepEqual(pl, p.placed) {
		if err := p.host.SetPlacement(pl); err != nil {
			return fmt.Errorf("epoch %d: %w", t.Epoch, err)
		}
		p.placed = pl
	}
	// The step the epoch resumes from, for a host that missed its
	// publication (a spare that joined later); a newer G than the
	// service's own only, and of its generation (a restart's comes with
	// Restart).
	if t.G >= 0 {
		p.host.SetG(t.Gen, t.G)
		p.host.SetH(t.Gen, t.H) // diff mode under EC; nothing in other modes
	}
	if t.Epoch > p.epoch.Load() {
		p.epoch.Store(t.Epoch)
	}
	return nil
}

// linkFailed reports that replication from this host to host failed
// (keeper.Config.LinkFailed): the launcher suspects that host at once.
// It is called from the service's goroutines.
func (p *protection) linkFailed(host int, err error) {
	a := p.a
	a.log.Warn("replication to a host failed", "to", host, "err", err)
	a.event(&wire.Event{Kind: wire.EventReplFailed, Host: a.cfg.Host, Rank: -1, Peer: host, Msg: truncateMsg(err.Error())})
}

// truncateMsg bounds an event's message.
func truncateMsg(s string) string {
	const limit = 1024
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

func (p *protection) changed() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// publish sends the ranks' progress to the launcher whenever it changed:
// changes that come while a report is being sent go in the next one, so
// the launcher gets at most one message per host per change burst.
func (p *protection) publish() {
	defer close(p.done)
	a := p.a
	for {
		select {
		case <-p.kick:
		case <-p.stop:
			return
		}
		epoch := p.epoch.Load() // before the report: see epoch
		gen, ps := p.host.Progress()
		u := &wire.UpProgress{Host: a.cfg.Host, Gen: gen, Epoch: epoch, Ranks: make([]wire.RankProgress, len(ps))}
		for i, q := range ps {
			u.Ranks[i] = wire.RankProgress{Rank: q.Rank, Committed: q.Committed, Replicated: q.Replicated, Stages: q.Stages, WaitNS: q.WaitNS,
				ReplSteps: q.ReplSteps, ReplNS: q.ReplNS, ReplBytes: q.ReplBytes, Restores: q.Restores,
				ReplBaseBytes: q.ReplBaseBytes, ReplDiffBytes: q.ReplDiffBytes, DiffLocal: q.DiffLocal, DiffNet: q.DiffNet,
				SourceLocal: q.SourceLocal, SourceNet: q.SourceNet, Base: q.Base, D: durableReport(q.Durable)}
		}
		if f := p.host.FoldStats(); f.Steps > 0 || len(f.Drifts) > 0 {
			u.Fold = &wire.HostFold{Steps: f.Steps, NS: f.NS}
			for _, r := range slices.Sorted(maps.Keys(f.Drifts)) {
				d := f.Drifts[r]
				u.Fold.Drift = append(u.Fold.Drift, wire.FoldDrift{Rank: r, Step: d.Step, Steps: d.Steps, MaxAbs: d.MaxAbs, RelRMS: d.RelRMS, NonFinite: d.NonFinite})
			}
		}
		if err := a.ctl.Publish(a.subj.Progress, wire.Marshal(u)); err != nil {
			a.log.Warn("cannot report protection progress", "err", err)
		}
	}
}

// failed hands a rank whose state is corrupt to the agent's loop (it is
// called on the rank's replicator goroutine, which Host.Close waits for:
// it must not block once the protection stops).
func (p *protection) failed(r int, gen uint64, err error) {
	select {
	case p.fail <- rankStateFailure{r, gen, err}:
	case <-p.stop:
	}
}

// failures are the ranks to fail (none before the protection starts).
func (p *protection) failures() <-chan rankStateFailure {
	if p == nil {
		return nil
	}
	return p.fail
}

// failRank kills the rank of f's generation, if it still runs, and has its
// exit reported as a failure saying why (a rank killed by gorun): the
// launcher then restarts the job in place or stops it.
func (a *agent) failRank(f rankStateFailure) {
	for _, p := range a.ranks {
		if p.place.Rank != f.rank || p.gen != f.gen || p.ended {
			continue
		}
		a.log.Error("killing a rank whose state protection failed", "rank", f.rank, "generation", f.gen, "err", f.err)
		p.failWith(f.err.Error())
	}
}

func (p *protection) onG(m *nats.Msg) {
	g, err := wire.DecodeGlobalStep(m.Data)
	if err != nil {
		p.a.log.Warn("bad G from the launcher", "err", err)
		return
	}
	p.host.SetG(g.Gen, g.G)
	if c := p.a.resumeT; c != nil && g.Gen == 0 && g.G >= 0 {
		// --resume: the first G is T, the step the ranks resume from.
		select {
		case c <- g.G:
		default:
		}
	}
	// H <= G (checked by wire): the bases at H are kept once G is
	// known. Nothing in modes other than diff under EC.
	p.host.SetH(g.Gen, g.H)
	if g.D != nil || g.X != nil {
		// The durable tier's watermark and resolved step: commit here,
		// reclaim, free what was abandoned.
		p.host.SetDurable(stepOr(g.D), stepOr(g.X))
	}
}

// stepOr returns *v, or -1 if v is nil.
func stepOr(v *int64) int64 {
	if v == nil {
		return -1
	}
	return *v
}

// close stops the state protection and removes this host's slot files.
func (p *protection) close() {
	if p.gsub != nil {
		_ = p.gsub.Unsubscribe()
	}
	close(p.stop)
	<-p.done
	if p.flipDone != nil {
		<-p.flipDone
	}
	if err := p.host.Close(); err != nil {
		p.a.log.Warn("closing state protection", "err", err)
	}
	if err := p.host.RemoveFiles(); err != nil {
		p.a.log.Warn("cannot remove the ranks' protected state", "err", err)
	}
}

// sweepSlots removes the slot files that dead jobs left in /dev/shm, and
// the Open MPI directories and MPICH segment files (judged by m) in shm
// (their agents or ranks were killed before they could clean up; see
// ckpt.Sweep and sweepShm).
func sweepSlots(opt ckpt.Options, shm string, m mpichSweep, log *slog.Logger) {
	if swept, err := ckpt.Sweep(opt); err != nil {
		log.Warn("sweeping leftover protected state", "err", err)
	} else if len(swept) > 0 {
		log.Info("removed the protected state of ended jobs", "jobs", swept)
	}
	sweepShmLog(shm, "", m, false, log)
}

// slotOpt is where the ranks' slot files are: ckpt's default directory
// (/dev/shm), or Config.slotDir in tests.
func (a *agent) slotOpt() ckpt.Options { return ckpt.Options{Dir: a.cfg.slotDir} }

// sweepJobSlots removes, as the agent ends (after its own claim is
// released: protection.close), the job's slot files and lock file in
// opt's directory when no process holds the job's lock any more: those
// of its agents killed on this machine (or on hosts sharing its
// /dev/shm, as network namespaces do). An agent removes only the files
// it made (ckpt.RemoveOwned), so without this a job whose every host
// with ranks was lost at once, ended by a spare that never made files,
// left them all. Files in use are never removed (ckpt.SweepJob says
// why).
func sweepJobSlots(opt ckpt.Options, job string, log *slog.Logger) {
	if swept, err := ckpt.SweepJob(job, opt); err != nil {
		log.Warn("sweeping the job's leftover protected state", "err", err)
	} else if swept {
		log.Info("removed the protected state the job's ended agents left")
	}
}
