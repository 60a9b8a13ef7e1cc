package launcher

import (
	"strings"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/wire"
)

// A roll-back to the durable tier (hotswap/rollback.go): a lost rank's
// state at G is in no memory tier, and the job has a commit record. The
// machine moves the lost ranks and asks for every rank's reach on disk
// (GatherReach): the launcher asks the agents (OpReach, with the rank →
// host table they do not have yet), which answer as for --resume
// (wire.ResumeReach, on their Resume subject, with the epoch), and takes
// the global minimum (resumeGather, cascade.Decide) to the machine
// (DiskReach). The machine's RollbackToDisk then sets G back to T, and
// the Restart that follows tells the agents (OpRestart with Disk) to
// rebuild every rank's state at T from disk before they start it again.

// gatherReach asks every agent for its ranks' reach on disk in the
// epoch's table (the launcher's, after the splice).
func (j *job) gatherReach(a hotswap.GatherReach) {
	if j.stopping {
		return
	}
	hostRanks := j.placement()
	g := newResumeGather(hostRanks, j.world, a.Base)
	g.what, g.epoch = "the roll-back", a.Epoch
	j.reach = g
	j.broadcast(&wire.Control{Op: wire.OpReach, Epoch: a.Epoch, G: a.Base, Ranks: j.rankHostTable()})
}

// rankHostTable is every rank's host now.
func (j *job) rankHostTable() []int {
	j.tab.Lock()
	defer j.tab.Unlock()
	return append([]int(nil), j.rankHost...)
}

// onRollbackReach takes a host's answer to a gatherReach.
func (j *job) onRollbackReach(r *wire.ResumeReach) {
	g := j.reach
	plan, err := g.add(r)
	switch {
	case err != nil:
		j.reach = nil
		j.step(hotswap.DiskReach{Epoch: g.epoch, T: -1, Err: strings.TrimPrefix(err.Error(), g.what+": ")})
	case plan != nil:
		j.reach = nil
		j.step(hotswap.DiskReach{Epoch: g.epoch, T: plan.T})
	}
}

// rollbackTo sets G back to a.T: the Restart that follows rebuilds the
// ranks' states there.
func (j *job) rollbackTo(a hotswap.RollbackToDisk) {
	j.reach = nil
	if j.stopping {
		return
	}
	j.rollbackT = a.T
	j.prog.rollback(a.T)
}
