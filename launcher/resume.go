package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

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
type resumeGather struct {
	what      string  // what gathers, for its errors: "--resume", or a roll-back's
	epoch     uint64  // the reports taken (a roll-back's epoch; 0 for --resume)
	hostRanks [][]int // each host's ranks (none: a spare)
	base      int64   // the commit record's step the launcher read
	avail     []cascade.Avail
	heard     []bool
	left      int // hosts with ranks not heard yet
	decided   bool
}

func newResumeGather(hostRanks [][]int, world int, base int64) *resumeGather {
	g := &resumeGather{what: "--resume", hostRanks: hostRanks, base: base, avail: make([]cascade.Avail, world), heard: make([]bool, len(hostRanks))}
	for _, rs := range hostRanks {
		if len(rs) > 0 {
			g.left++
		}
	}
	return g
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

// onResume takes a host's reach on disk; once every host with ranks has
// answered, it publishes T as G (the agents then rebuild their ranks'
// states at T and start them) and tells the machine, or stops the job
// when the ranks cannot be resumed.
func (j *job) onResume(r *wire.ResumeReach) {
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
	p.publish(p.global())
}
