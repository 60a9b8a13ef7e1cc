package agent

import (
	"strconv"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// Restart in place (torchrun's --max-restarts): when a rank fails and the
// job has restarts left, the launcher tells every agent to restart its
// ranks in a new generation and epoch. The agent kills its ranks, and once
// all have ended and the new epoch's table is here, has the state
// protection discard the steps after G (the step every rank resumes from)
// and starts the ranks again, with the generation in GORUN_RESTART_COUNT.
//
// Everything about a rank is its generation's: the ends of the ranks the
// restart kills, their sockets and fences, are never taken for those of
// the new generation's ranks, which run in the restart's epoch (see
// rankSockets.restart). Processes the old ranks daemonized are killed
// before the new ones start.

// beginRestart handles an OpRestart.
func (a *agent) beginRestart(c *wire.Control) {
	if c.Gen <= a.gen || a.restart != nil && c.Gen <= a.restart.Gen {
		return
	}
	a.log.Info("restarting the ranks", "generation", c.Gen, "epoch", c.Epoch, "from step", c.G)
	a.restart = c
	if a.socks != nil {
		a.socks.restart(c.Gen, c.Epoch)
	}
	a.signalAll(syscall.SIGKILL, true)
	a.tryRestart()
}

// tryRestart starts the pending restart's ranks once the old ones ended
// and its table arrived; if the job is stopping meanwhile, it reports
// them as not started instead, without waiting for the table.
func (a *agent) tryRestart() {
	r := a.restart
	if r == nil || a.running > 0 || a.ranks == nil {
		return
	}
	if !a.stopped && (a.table == nil || a.table.Epoch < r.Epoch) {
		return
	}
	a.restart = nil
	a.gen = r.Gen
	// Whatever the old ranks left running out of their process groups
	// would hold ports, files and GPU memory beside the new ones.
	killOrphans(a.cfg.Job, nil, time.Now().Add(a.cfg.ExitTimeout), a.log)
	if a.stopped {
		// The launcher waits for the end of every rank of the new
		// generation: those of the newest table here now, and those a
		// later table places here anew (newEpoch).
		a.notStarted(a.table, a.places)
		return
	}
	if a.prot != nil {
		if err := a.restartProtection(r); err != nil {
			a.log.Error("state protection cannot restart", "err", err)
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: a.cfg.Host, Rank: -1, Msg: "state protection cannot restart: " + err.Error()})
			return
		}
	}
	if r.Disk && a.prot != nil && len(a.places) > 0 {
		// A roll-back: the ranks start once their states at G are
		// rebuilt from disk (rollback.go).
		a.reload(r.G)
		return
	}
	if err := a.launch(a.table, a.places, true); err != nil {
		a.event(&wire.Event{Kind: wire.EventAgentError, Host: a.cfg.Host, Rank: -1, Msg: err.Error()})
	}
}

// restartProtection has the state protection begin restart r's
// generation from r.G: keeper.Keeper.Restart, or for a roll-back to the
// durable tier (r.Disk) keeper.Keeper.RollBack (in diff mode under EC the
// base schedule starts again from G: H goes back to -1).
func (a *agent) restartProtection(r *wire.Control) error {
	if r.Disk {
		return a.prot.host.RollBack(r.Gen, r.G)
	}
	return a.prot.host.Restart(r.Gen, r.G)
}

// restartEnv is the restart part of a rank's environment.
func restartEnv(gen uint64, maxRestarts int) []string {
	g := strconv.FormatUint(gen, 10)
	return []string{
		wire.EnvRestartCount + "=" + g,
		wire.EnvTorchRestartCount + "=" + g,
		wire.EnvTorchMaxRestarts + "=" + strconv.Itoa(maxRestarts),
	}
}
