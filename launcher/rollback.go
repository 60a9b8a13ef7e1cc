package launcher

import (
	"strings"
	"time"

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
	g.names, g.limit = j.hostNames(), j.cfg.ReachTimeout
	g.since, g.asked = time.Now(), time.Now()
	g.ask = &wire.Control{Op: wire.OpReach, Epoch: a.Epoch, G: a.Base, Ranks: j.rankHostTable()}
	j.reach = g
	j.broadcast(g.ask)
}

// defaultReachTimeout is Config.ReachTimeout's default.
const defaultReachTimeout = 10 * time.Minute

// reachTick bounds the gathers of the hosts' reach on disk: a roll-back's
// OpReach is sent again every heartbeat timeout to the hosts (an agent
// takes each epoch's once; one lost on the control plane is not sent
// again otherwise), and a gather whose limit passed with hosts with ranks
// not heard from stops the job, naming them: the roll-back's through the
// machine (DiskReach with the error), --resume's at once. --resume's
// limit runs from the first epoch table (the agents read their reach
// once they have it).
func (j *job) reachTick(now time.Time) {
	if j.stopping {
		// Nothing is waited for once the job stops (the machine's
		// abort, say): no OpReach sent again, no second stop.
		j.reach, j.resume = nil, nil
		return
	}
	if g := j.reach; g != nil {
		resend, err := g.tick(now, j.cfg.HeartbeatTimeout)
		switch {
		case err != nil:
			j.reach = nil
			j.step(hotswap.DiskReach{Epoch: g.epoch, T: -1, Err: strings.TrimPrefix(err.Error(), g.what+": ")})
		case resend:
			j.log.Debug("asking again for the ranks' reach on disk", "epoch", g.epoch, "silent", g.silent())
			j.broadcast(g.ask)
		}
	}
	if g := j.resume; g != nil {
		if err := g.tickFromTable(now, j.rv.Table() != nil); err != nil {
			j.resume = nil
			j.fail(ExitFailure, "%v; stopping the job", err)
		}
	}
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

// hostNames returns every host's name, in host order.
func (j *job) hostNames() []string {
	ns := make([]string, len(j.hosts))
	for i, h := range j.hosts {
		ns[i] = h.name
	}
	return ns
}
