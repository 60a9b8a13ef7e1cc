package launcher

import (
	"slices"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/wire"
)

// watch follows a recovery epoch to its stages and reports them to the
// machine (hotswap.RecoveryReport): published once every host with ranks
// has the epoch's table (wire.EventEpoch); with state to restore (G >= 0),
// restored once every rank was served a Restore since (its Restores
// rose) and resumed once every rank also committed a step after G;
// without, resumed once the ranks that had to start have.
type watch struct {
	epoch    uint64
	gen      uint64
	g        int64
	in       []bool // hosts that have the table
	waiting  int    // hosts with ranks that do not yet
	base     []int64
	restored []bool
	resumed  []bool
	nRest    int
	nRes     int
	start    []bool // ranks that must start (no state to restore)
	nStart   int
	stages   [3]bool
}

// newWatch follows epoch, resuming from g, published in this step:
// restarted says every rank was started again (a new generation), else
// moved are the ranks that start on a new host.
func (j *job) newWatch(epoch uint64, g int64, restarted bool, moved []int) *watch {
	w := &watch{epoch: epoch, gen: j.gen, g: g, in: make([]bool, len(j.hosts))}
	for _, h := range j.hosts {
		if len(h.ranks) > 0 {
			w.waiting++
		}
	}
	if g >= 0 {
		// A new generation counts its Restores from 0; in place, the
		// survivors' count goes on.
		w.base = make([]int64, j.world)
		w.restored = make([]bool, j.world)
		w.resumed = make([]bool, j.world)
		if !restarted {
			// A moved rank's service on its new host counts from 0 too.
			for r := range w.base {
				if !slices.Contains(moved, r) {
					w.base[r] = j.prog.rank(r).Restores
				}
			}
		}
		return w
	}
	// Nothing to restore: the epoch resumes once its new processes run.
	w.start = make([]bool, j.world)
	for r := range w.start {
		if restarted || slices.Contains(moved, r) {
			w.start[r] = true
			w.nStart++
		}
	}
	return w
}

func (w *watch) report(j *job, s hotswap.Stage) {
	if w.stages[s] {
		return
	}
	w.stages[s] = true
	j.step(hotswap.RecoveryReport{Epoch: w.epoch, Stage: s})
}

func (w *watch) tableIn(j *job, host int, epoch uint64) {
	if epoch != w.epoch || w.in[host] || len(j.hosts[host].ranks) == 0 {
		return
	}
	w.in[host] = true
	w.waiting--
	if w.waiting == 0 {
		w.report(j, hotswap.StagePublished)
	}
}

func (w *watch) started(j *job, e *wire.Event) {
	if w.start == nil || e.Gen != w.gen || e.Rank >= len(w.start) || !w.start[e.Rank] || j.rankHost[e.Rank] != e.Host {
		return
	}
	w.start[e.Rank] = false
	w.nStart--
	if w.nStart == 0 {
		w.report(j, hotswap.StageResumed)
	}
}

func (w *watch) progress(j *job, u *wire.UpProgress) {
	if w.base == nil || u.Gen != w.gen {
		return
	}
	for _, p := range u.Ranks {
		r := p.Rank
		if r < 0 || r >= len(w.restored) || j.rankHost[r] != u.Host {
			continue // a host the rank has left: its counts are not the rank's now
		}
		if !w.restored[r] && p.Restores > w.base[r] {
			w.restored[r] = true
			w.nRest++
		}
		if w.restored[r] && !w.resumed[r] && p.Committed > w.g {
			w.resumed[r] = true
			w.nRes++
		}
	}
	if j.rec != w {
		return
	}
	if w.nRest == len(w.restored) {
		w.report(j, hotswap.StageRestored)
	}
	if j.rec == w && w.nRes == len(w.resumed) {
		w.report(j, hotswap.StageResumed)
	}
}
