package launcher

import (
	"fmt"
	"slices"
	"sync"

	"github.com/gorun/gorun/internal/wire"
)

// progress aggregates the agents' state-protection reports into G, the
// globally recoverable step (DESIGN.md §5): the minimum over ranks of the
// newest step committed on the rank's host and at all its replica holders.
// Each report covers one host's ranks and costs O(its ranks); G is
// recomputed over the hosts (O(hosts)) only when the last host at G moves
// past it, so a step of H hosts costs O(world + H), not O(H²).
type progress struct {
	mu        sync.Mutex
	gen       uint64
	ranks     []wire.RankProgress // by rank
	hostRanks [][]int             // the ranks of each host
	rankHost  []int
	hostMin   []int64 // per host: the minimum Replicated of its ranks
	atG       int     // hosts whose hostMin is at most g
	g         int64
	// resumed is the step a --resume started from (resumeAt), until the
	// metrics take it (takeResumed): G's rise to it ran no step.
	resumed    int64
	hasResumed bool
	publish    func(*wire.GlobalStep)
	// epoch is the newest epoch published: reports taken before their
	// host applied its placement do not raise Replicated (setEpoch).
	epoch uint64
	// folds are each host's figures as a replica holder (diff mode), by
	// host; nil until one reports.
	folds map[int]wire.HostFold
	// Diff mode under erasure coding (trackH): h is the minimum of the
	// ranks' RankProgress.Base (-1: none yet); hostBase and atH keep it
	// as hostMin and atG keep g. H, published with G, is hp: h taken
	// whenever it rises and is not above G, so that H is always a base
	// step every rank coded (never a step in between, as capping h at G
	// would give); hPrev is the H published before hp. A new epoch or a
	// move of ranks takes every rank's Base down to H (rebaseH): a
	// report of the old placement, or of a lost host, never raises H
	// again. baseEpoch is, per rank, the epoch of the report its Base
	// came from (codedIn).
	diffEC    bool
	h         int64
	hp, hPrev int64
	hostBase  []int64
	atH       int
	baseEpoch []uint64
	// d is the durable tier's watermark, the step of the job's commit
	// record (nil: none), and x its resolved step (nil: none), published
	// with G (setDurable).
	d, x *int64
}

// trackH makes p aggregate H too (diff mode under erasure coding), before
// any report: GlobalStep carries it, and the table shows it.
func (p *progress) trackH() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.diffEC, p.h, p.hp, p.hPrev = true, -1, -1, -1
	p.baseEpoch = make([]uint64, len(p.ranks))
	p.hostBase = make([]int64, len(p.hostRanks))
	p.atH = 0
	for h, rs := range p.hostRanks {
		p.hostBase[h] = -1
		if len(rs) == 0 {
			p.hostBase[h] = wire.MaxStep
			continue
		}
		p.atH++
	}
	for i := range p.ranks {
		p.ranks[i].Base = -1
	}
}

// global is the GlobalStep to publish now. p.mu is held.
func (p *progress) global() *wire.GlobalStep {
	g := &wire.GlobalStep{Gen: p.gen, G: p.g}
	if p.diffEC {
		g.H = p.hp
	}
	// D <= X <= G on the wire. G goes back on a roll-back to the disk
	// tier (a new generation at T, and D <= T), while X only moves
	// forward: X is published at most at G then (a smaller X frees less,
	// and the hosts keep the larger one they had).
	if p.d != nil && *p.d <= p.g {
		d := *p.d
		g.D = &d
	}
	if p.x != nil {
		if x := min(*p.x, p.g); x >= 0 && (g.D == nil || *g.D <= x) {
			g.X = &x
		}
	}
	return g
}

// durable returns the durable tier's D and X as last published (nil:
// none), as GlobalStep carries them.
func (p *progress) durable() (d, x *int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.global()
	return g.D, g.X
}

// setDurable publishes d, the step of the durable tier's commit record
// (nil: none yet), and x, its resolved step (d <= x <= G), with G.
func (p *progress) setDurable(d *int64, x int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d != nil {
		v := *d
		p.d = &v
	}
	p.x = &x
	p.publish(p.global())
}

// raiseH publishes h as H if it rose and is not above G, and reports
// whether it did. A minimum of the bases above G (a report's Base is at
// most its Replicated, but G is not recomputed at every report) keeps
// the H before: H is always some step every rank coded a base of. p.mu
// is held.
func (p *progress) raiseH() bool {
	if p.h <= p.hp || p.h > p.g {
		return false
	}
	p.hPrev, p.hp = p.hp, p.h
	return true
}

// H returns the newest step every rank has a coded base of (diff mode
// under erasure coding; -1: none yet), or 0 in other modes.
func (p *progress) H() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.diffEC {
		return 0
	}
	return p.hp
}

// hAtMost returns H for an epoch resuming from g: the newest H published
// that is not above g (the one before the last when the last is), or -1
// (no coded base to decode at) when neither is; 0 outside diff mode under
// erasure coding. The machine's G lags the G here by at most one report,
// in which H rose at most once.
func (p *progress) hAtMost(g int64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.diffEC:
		return 0
	case p.hp <= g:
		return p.hp
	case p.hPrev <= g:
		return p.hPrev
	}
	return -1
}

// codedIn returns, in diff mode under erasure coding, the minimum over
// ranks of Base as reported under the newest epoch published (or a
// later one), or -1 while some rank has not reported under it: every
// rank coded its bases up to there under that epoch's placement. The
// published H does not say so: it stays at the old placement's bases
// until the new ones pass it. O(world).
func (p *progress) codedIn() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.diffEC || len(p.ranks) == 0 {
		return -1
	}
	m := int64(wire.MaxStep)
	for i, r := range p.ranks {
		if p.baseEpoch[i] < p.epoch {
			return -1
		}
		m = min(m, r.Base)
	}
	return m
}

// setEpoch records that epoch was published (its placement may change
// replica holders); in diff mode under erasure coding a later epoch
// rebases H (rebaseH).
func (p *progress) setEpoch(epoch uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if epoch > p.epoch && p.diffEC {
		p.rebaseH()
	}
	p.epoch = max(p.epoch, epoch)
}

// rebaseH takes every rank's Base down to the published H, as a new
// placement starts a new base schedule: a Base above H may be of the old
// schedule (a step some rank never coded under the new one) or of a lost
// host (a moved rank's last report), and must not raise H once the others
// pass it. H stays: its bases are still held while the ranks code the
// new schedule's first. p.mu is held; hostBase and atH are taken again.
func (p *progress) rebaseH() {
	for i := range p.ranks {
		p.ranks[i].Base = min(p.ranks[i].Base, p.hp)
	}
	p.h, p.atH = p.hp, 0
	for h, rs := range p.hostRanks {
		b := int64(wire.MaxStep) // a host without ranks holds H back no more
		for _, r := range rs {
			b = min(b, p.ranks[r].Base)
		}
		p.hostBase[h] = b
		if b <= p.h {
			p.atH++
		}
	}
}

func newProgress(hostRanks [][]int, rankHost []int, publish func(*wire.GlobalStep)) *progress {
	p := &progress{hostRanks: hostRanks, rankHost: rankHost, g: -1, publish: publish,
		ranks: make([]wire.RankProgress, len(rankHost)), hostMin: make([]int64, len(hostRanks))}
	for r := range p.ranks {
		p.ranks[r] = wire.RankProgress{Rank: r, Committed: -1, Replicated: -1}
	}
	for h, rs := range hostRanks {
		p.hostMin[h] = -1
		if len(rs) == 0 {
			p.hostMin[h] = wire.MaxStep // a spare holds G back no more than it reports
			continue
		}
		p.atG++
	}
	return p
}

// handle takes one host's report. It returns an error for a report that
// names ranks of another host.
func (p *progress) handle(u *wire.UpProgress) error {
	if u.Host >= len(p.hostRanks) {
		return fmt.Errorf("progress from host %d of %d", u.Host, len(p.hostRanks))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if u.Gen != p.gen {
		return nil // from before a restart
	}
	for _, r := range u.Ranks {
		if r.Rank >= len(p.rankHost) || p.rankHost[r.Rank] != u.Host {
			return fmt.Errorf("host %d reported rank %d, which is not its own", u.Host, r.Rank)
		}
	}
	if u.Fold != nil {
		if p.folds == nil {
			p.folds = map[int]wire.HostFold{}
		}
		p.folds[u.Host] = *u.Fold
	}
	for _, r := range u.Ranks {
		if u.Epoch < p.epoch {
			// Taken under an older placement: its Replicated (and Base)
			// may count holders the rank no longer has, so it raises
			// nothing.
			r.Replicated = min(r.Replicated, p.ranks[r.Rank].Replicated)
			r.Base = min(r.Base, p.ranks[r.Rank].Base)
		} else if p.diffEC {
			p.baseEpoch[r.Rank] = u.Epoch
		}
		p.ranks[r.Rank] = r
	}
	advanced := p.advance(u.Host, p.hostMin, &p.atG, &p.g, func(r wire.RankProgress) int64 { return r.Replicated })
	if p.diffEC {
		p.advance(u.Host, p.hostBase, &p.atH, &p.h, func(r wire.RankProgress) int64 { return r.Base })
		if p.raiseH() {
			advanced = true
		}
	}
	if advanced {
		p.publish(p.global())
	}
	return nil
}

// advance takes host's new minimum of step(rank) over its ranks into
// hostMin, and raises the global minimum *at (counted by *n hosts at or
// below it) once the last host at it moved past it. It reports whether
// *at rose. p.mu is held.
func (p *progress) advance(host int, hostMin []int64, n *int, at *int64, step func(wire.RankProgress) int64) bool {
	m := int64(wire.MaxStep)
	for _, r := range p.hostRanks[host] {
		m = min(m, step(p.ranks[r]))
	}
	old := hostMin[host]
	hostMin[host] = m
	switch {
	case old <= *at && m > *at:
		*n--
	case old > *at && m <= *at:
		*n++
	}
	if *n > 0 || len(hostMin) == 0 {
		return false
	}
	// The last host at the minimum moved past it.
	g := slices.Min(hostMin)
	*n = 0
	for _, hm := range hostMin {
		if hm <= g {
			*n++
		}
	}
	if g > *at {
		*at = g
		return true
	}
	return false
}

// republish publishes G again, for an agent that missed it (NATS does not
// redeliver): the launcher calls it every tick.
func (p *progress) republish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.g >= 0 {
		p.publish(p.global())
	}
}

// rollback sets G back to t (a roll-back to the durable tier), before
// the restart that follows, and publishes it. In diff mode under erasure
// coding H goes back to -1 (and every rank's Base with it): the base
// schedule restarts from t, its b_0, as at the job's start (the hosts
// forget H too, keeper.Keeper.RollBack), and H rises again only from the
// new generation's reports, to t once every rank coded it. The old
// schedule's bases are never named again, past t or not.
func (p *progress) rollback(t int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.g = min(p.g, t)
	if p.diffEC {
		p.h, p.hp, p.hPrev = -1, -1, -1
		for i := range p.ranks {
			p.ranks[i].Base = -1
		}
	}
	p.publish(p.global())
}

// restart begins generation gen: G stays where it is (every rank resumes
// from it), and what was reported beyond it is forgotten.
func (p *progress) restart(gen uint64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen = gen
	for i := range p.ranks {
		r := &p.ranks[i]
		r.Committed, r.Replicated = min(r.Committed, p.g), min(r.Replicated, p.g)
		r.Restores = 0 // counted per generation
		newProcess(r)
	}
	p.atG = 0
	for h := range p.hostMin {
		if len(p.hostRanks[h]) > 0 {
			p.hostMin[h] = min(p.hostMin[h], p.g)
			p.atG++ // every host with ranks is at g or below now
		}
	}
	if p.diffEC {
		// H stays too: the bases at H are still held while the ranks
		// code the new epoch's.
		p.rebaseH()
	}
	return p.g
}

// newProcess forgets the figures a rank's process counts from its start
// (the protection wait, the replication bytes): the next report, of a
// new process, counts from 0 (metricsProgress adds its figures whole).
func newProcess(r *wire.RankProgress) {
	r.WaitNS, r.ReplBytes = 0, 0
}

// move moves ranks from host from to host to (a splice): the reports
// of to cover them from now on, those of from are refused. G stays; the
// two hosts' minimums are taken again; in diff mode under erasure coding
// H stays and every rank's Base is taken down to it (rebaseH: the moved
// ranks' last reports came from the lost host).
func (p *progress) move(ranks []int, from, to int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range ranks {
		p.rankHost[r] = to
		// Its durable markers were the lost host's: the rank's new host
		// reports its own once it opened the rank's store.
		p.ranks[r].D = nil
		newProcess(&p.ranks[r]) // (a rank moved by a restart: again)
	}
	p.hostRanks[from] = slices.DeleteFunc(slices.Clone(p.hostRanks[from]), func(r int) bool { return slices.Contains(ranks, r) })
	p.hostRanks[to] = append(slices.Clone(p.hostRanks[to]), ranks...)
	p.atG = 0
	for h, rs := range p.hostRanks {
		m := int64(wire.MaxStep) // a host without ranks holds G back no more
		for _, r := range rs {
			m = min(m, p.ranks[r].Replicated)
		}
		p.hostMin[h] = m
		if m <= p.g {
			p.atG++
		}
	}
	if p.diffEC {
		p.rebaseH()
	}
}

// rank returns rank r's last report.
func (p *progress) rank(r int) wire.RankProgress {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ranks[r]
}

// takeResumed is the step a --resume started from, once (ok false:
// none, or taken).
func (p *progress) takeResumed() (t int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok = p.resumed, p.hasResumed
	p.hasResumed = false
	return t, ok
}

// G returns the globally recoverable step, or -1.
func (p *progress) G() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.g
}

// used reports whether any rank protects its state.
func (p *progress) used() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.ranks {
		if r.Committed >= 0 || r.Stages > 0 || r.Restores > 0 {
			return true
		}
	}
	return false
}
