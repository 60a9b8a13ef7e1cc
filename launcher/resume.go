package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/wire"
)

// gorun --resume: the launcher's part (internal/wire/resume.go has the
// protocol). Before anything starts it checks the checkpoint directory
// (checkResumeDir: the job's, of this world size and layout, with a
// committed version; else a usage error, exit 2, nothing written); once
// every host with ranks reported its ranks' reach on disk
// (resumeGather) it decides T (cascade.Decide: the global minimum) and
// publishes it as G; the agents then preload their ranks' states at T
// and start them.

// checkResumeDir checks that dir holds the job want describes (its
// world size, protect mode, codec, --ckpt-every and command; the ranks'
// regions are checked when each rank declares them, at its first
// ProtectHello) with a committed version, and returns the commit
// record's step. Its errors are *ConfigErrors naming what does not
// match.
func checkResumeDir(dir string, want *durable.Manifest) (int64, error) {
	bad := func(err error, format string, args ...any) (int64, error) {
		return -1, &ConfigError{Msg: fmt.Sprintf("--resume: "+format, args...), Err: err}
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return bad(err, "the checkpoint directory %s does not exist", dir)
	case err != nil:
		return bad(err, "the checkpoint directory: %v", err)
	case !fi.IsDir():
		return bad(nil, "%s is not a directory", dir)
	}
	have, err := durable.ReadManifest(dir)
	switch {
	case errors.Is(err, durable.ErrNoManifest):
		return bad(err, "%s holds no job (no manifest): nothing to resume", dir)
	case err != nil:
		return bad(err, "%s: %v", dir, err)
	}
	w := *want
	if w.World == have.World {
		w.Regions = have.Regions // the ranks check theirs
	}
	if err := durable.CheckManifest(dir, &w); err != nil {
		if errors.Is(err, durable.ErrMismatch) {
			return bad(err, "%s holds another job or layout: %s", dir, strings.TrimPrefix(err.Error(), durable.ErrMismatch.Error()+": "))
		}
		return bad(err, "%s: %v", dir, err)
	}
	step, err := durable.ReadCommitted(dir)
	switch {
	case errors.Is(err, durable.ErrNotCommitted):
		return bad(err, "%s has no committed version (no checkpoint every rank finished): nothing to resume from", dir)
	case err != nil:
		return bad(err, "%s: %v", dir, err)
	}
	return step, nil
}

// resumeGather collects the hosts' ResumeReach reports and decides T
// once every host with ranks has reported.
//
// The wait is bounded: a host that is lost while it is waited for is
// the machine's (a roll-back moves its ranks and gathers again, a lost
// host stops --resume: lostHost), but a host that keeps sending
// heartbeats and never reports (its read of the checkpoint directory
// hangs, say) would hold the job forever. overdue names the hosts not
// heard from once limit has passed since the gather began; the job then
// stops, saying so.
type resumeGather struct {
	what      string  // what gathers, for its errors: "--resume", or a roll-back's
	epoch     uint64  // the reports taken (a roll-back's epoch; 0 for --resume)
	hostRanks [][]int // each host's ranks (none: a spare)
	base      int64   // the commit record's step the launcher read
	avail     []cascade.Avail
	heard     []bool
	left      int // hosts with ranks not heard yet
	decided   bool

	names []string      // the hosts' names, for the errors (nil: "host N")
	since time.Time     // when the gather began
	limit time.Duration // how long the hosts may take to report (0: no bound)
	asked time.Time     // when the hosts were last asked (a roll-back's OpReach)
	ask   *wire.Control // a roll-back's OpReach, sent again while hosts are silent
}

// errReachOverdue: hosts with ranks did not report their ranks' reach on
// disk within the gather's limit.
var errReachOverdue = errors.New("no report of the ranks' reach on disk")

func newResumeGather(hostRanks [][]int, world int, base int64) *resumeGather {
	g := &resumeGather{what: "--resume", hostRanks: hostRanks, base: base, avail: make([]cascade.Avail, world), heard: make([]bool, len(hostRanks))}
	for _, rs := range hostRanks {
		if len(rs) > 0 {
			g.left++
		}
	}
	return g
}

// hostName names host h for an error.
func (g *resumeGather) hostName(h int) string {
	if h < len(g.names) {
		return "host " + g.names[h]
	}
	return fmt.Sprintf("host %d", h)
}

// silent returns the hosts with ranks not heard from yet.
func (g *resumeGather) silent() []int {
	var out []int
	for h, rs := range g.hostRanks {
		if len(rs) > 0 && !g.heard[h] {
			out = append(out, h)
		}
	}
	return out
}

// overdue returns, at now, an error (errReachOverdue) naming the hosts
// with ranks that did not report within the limit since the gather
// began; nil before, without a limit, or once decided.
func (g *resumeGather) overdue(now time.Time) error {
	if g.decided || g.limit <= 0 || now.Sub(g.since) < g.limit {
		return nil
	}
	hs := g.silent()
	if len(hs) == 0 {
		return nil
	}
	who := g.hostName(hs[0])
	if len(hs) > 1 {
		names := make([]string, len(hs))
		for i, h := range hs {
			names[i] = strings.TrimPrefix(g.hostName(h), "host ")
		}
		who = "hosts " + strings.Join(names, ", ")
	}
	return fmt.Errorf("%s: %s: %w within %v", g.what, who, errReachOverdue, g.limit)
}

// tick is the gather's housekeeping at now: an error once it is overdue
// (overdue), else whether to ask the silent hosts again (every
// resendEvery since they were last asked, when the gather has a
// request to send again and resendEvery > 0).
func (g *resumeGather) tick(now time.Time, resendEvery time.Duration) (bool, error) {
	if g.decided {
		return false, nil
	}
	if err := g.overdue(now); err != nil {
		return false, err
	}
	if g.ask == nil || resendEvery <= 0 || now.Sub(g.asked) < resendEvery || len(g.silent()) == 0 {
		return false, nil
	}
	g.asked = now
	return true, nil
}

// tickFromTable is --resume's tick: its limit runs from the first epoch
// table (tableOut: the table is out; the agents read their reach once
// they have it), and nothing is due before.
func (g *resumeGather) tickFromTable(now time.Time, tableOut bool) error {
	if g.since.IsZero() {
		if !tableOut {
			return nil
		}
		g.since = now
	}
	_, err := g.tick(now, 0)
	return err
}

// lostHost returns an error if lost host h was still to report (its
// ranks' reach will never come), else nil.
func (g *resumeGather) lostHost(h int) error {
	if g.decided || h >= len(g.hostRanks) || len(g.hostRanks[h]) == 0 || g.heard[h] {
		return nil
	}
	return fmt.Errorf("%s: %s was lost before it reported its ranks' reach on disk", g.what, g.hostName(h))
}

// add takes host's report. It returns the plan once every host with
// ranks has reported (once: later reports return nil), or an error that
// stops the job: a report that does not match the host's ranks or the
// base, a rank that cannot be resumed, no step common to every rank.
func (g *resumeGather) add(r *wire.ResumeReach) (*cascade.Plan, error) {
	if g.decided || r.Epoch != g.epoch || r.Host >= len(g.hostRanks) || g.heard[r.Host] {
		return nil, nil
	}
	mine := g.hostRanks[r.Host]
	if len(mine) == 0 {
		return nil, nil // a spare has nothing to say
	}
	if r.Err != "" {
		return nil, fmt.Errorf("%s: host %d cannot read the checkpoint directory: %s", g.what, r.Host, r.Err)
	}
	if r.Base != g.base {
		return nil, fmt.Errorf("%s: host %d reads the committed step %d, the launcher %d (a directory that changed, or is not shared alike?)", g.what, r.Host, r.Base, g.base)
	}
	got := make([]int, 0, len(r.Ranks))
	for _, k := range r.Ranks {
		got = append(got, k.Rank)
	}
	slices.Sort(got)
	if !slices.Equal(got, slices.Sorted(slices.Values(mine))) {
		return nil, fmt.Errorf("%s: host %d reported ranks %v, it runs %v", g.what, r.Host, got, mine)
	}
	for _, k := range r.Ranks {
		if k.Err != "" {
			return nil, fmt.Errorf("%s: rank %d cannot be resumed: %s", g.what, k.Rank, k.Err)
		}
		g.avail[k.Rank] = cascade.Avail{Disk: []cascade.Span{{From: g.base, To: k.To}}}
	}
	g.heard[r.Host] = true
	g.left--
	if g.left > 0 {
		return nil, nil
	}
	g.decided = true
	p, err := cascade.Decide(g.avail)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", g.what, err)
	}
	return &p, nil
}

// resumeLost says why the loss of host h stops --resume, or nil: its
// ranks' reach will never come (it had not reported it), or other hosts'
// ranks still wait for T or for their states to be rebuilt, and cannot
// move (their agents refuse a new epoch before their preload). When no
// other host's ranks wait, the resume is over, and the loss is the
// machine's as any other.
func (j *job) resumeLost(h int) error {
	if len(j.hosts[h].ranks) == 0 {
		return nil // a spare
	}
	if j.resume != nil {
		if err := j.resume.lostHost(h); err != nil {
			return err
		}
	}
	waiting := j.waitingToResume(h)
	if waiting == nil {
		j.resuming = false
		return nil
	}
	return fmt.Errorf("--resume: host %s was lost before the ranks' states were rebuilt from the checkpoint directory (%s wait for theirs, and cannot move to a new epoch)",
		j.hosts[h].name, hostsRanks(waiting))
}

// waitingToResume returns the names of the live hosts other than host
// except whose ranks have not started (they wait for their states).
func (j *job) waitingToResume(except int) []string {
	var out []string
	for i, h := range j.hosts {
		if i != except && !h.lost && len(h.ranks) > 0 && h.ranGen == 0 {
			out = append(out, h.name)
		}
	}
	return out
}

// hostsRanks names the ranks of hosts: "host a's ranks", "hosts a, b's ranks".
func hostsRanks(hosts []string) string {
	if len(hosts) == 1 {
		return "host " + hosts[0] + "'s ranks"
	}
	return "hosts " + strings.Join(hosts, ", ") + "'s ranks"
}

// onResume takes a host's reach on disk; once every host with ranks has
// answered, it publishes T as G (the agents then rebuild their ranks'
// states at T and start them) and tells the machine, or stops the job
// when the ranks cannot be resumed.
func (j *job) onResume(r *wire.ResumeReach) {
	j.log.Debug("a host's reach on disk", "host", r.Host, "epoch", r.Epoch, "base", r.Base, "err", r.Err)
	if j.reach != nil {
		j.onRollbackReach(r)
		return
	}
	if j.resume == nil {
		return // not resuming, or decided already
	}
	plan, err := j.resume.add(r)
	if err != nil {
		j.resume = nil
		j.fail(ExitFailure, "%v", err)
		return
	}
	if plan == nil {
		return
	}
	j.resume = nil
	if plan.T > plan.Base {
		j.out.report("resuming from step %d: the committed version of step %d and %d differentials replayed on every rank", plan.T, plan.Base, plan.T-plan.Base)
	} else {
		j.out.report("resuming from step %d, the committed version", plan.T)
	}
	j.prog.resumeAt(plan.T)
	j.step(hotswap.GPublished{G: plan.T})
}

// resumeAt makes t, the step a resumed job's ranks restore, its G, and
// publishes it (the agents take their first G as T).
func (p *progress) resumeAt(t int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t > p.g {
		p.g = t
	}
	p.resumed, p.hasResumed = t, true
	p.publish(p.global())
}
