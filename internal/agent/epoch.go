package agent

import (
	"fmt"
	"slices"
	"syscall"

	"github.com/gorun/gorun/internal/wire"
)

// newEpoch takes a later epoch's table, once this host's ranks have
// started: the state protection switches to its placement, the ranks
// running get the table (their collectives then fail with
// comm.ErrEpochChanged until they rebuild), and the launcher is told this
// host has it (EventEpoch).
//
// A table of a later generation than the ranks' restarts them in it (as
// wire.OpRestart does, which the launcher sends first; a host that missed
// it restarts all the same). The restart then starts the table's ranks of
// this host: a spare gets the ranks it replaces, a host whose ranks moved
// away starts none. A table of the same generation (in-place recovery)
// starts just the ranks newly placed here, in its epoch, and kills those
// no longer placed here; the others run on. Once the job is stopping, no
// rank starts: those a table places here anew are reported ended
// (notStarted), as they would have been had the table come before the
// stop.
func (a *agent) newEpoch(t *wire.EpochTable) {
	a.log.Info("new epoch", "epoch", t.Epoch, "generation", t.Gen)
	if t.Gen > a.gen && (a.restart == nil || t.Gen > a.restart.Gen) {
		a.beginRestart(&wire.Control{Op: wire.OpRestart, Gen: t.Gen, Epoch: t.Epoch, G: t.G})
	}
	prev, places := a.places, a.hostPlaces(t)
	if a.socks != nil {
		a.socks.setEpoch(t, len(places))
	}
	if a.prot != nil {
		if err := a.prot.setTable(t); err != nil {
			a.log.Error("state protection cannot follow the new epoch", "err", err)
			a.event(&wire.Event{Kind: wire.EventAgentError, Host: a.cfg.Host, Rank: -1, Msg: "state protection: " + err.Error()})
		}
	}
	a.pmiKVS.setEpoch(t)
	a.table, a.places = t, places
	switch fresh := a.newlyPlaced(prev); {
	case a.restart != nil:
		a.tryRestart()
	case t.Gen != a.gen:
		// A table of a generation the ranks have left: nothing to start.
	case a.stopped:
		// (A rank no longer placed here ends by the stop.)
		if len(fresh) > 0 {
			a.notStarted(t, fresh)
		}
	default:
		a.replace(t, fresh)
	}
	a.event(&wire.Event{Kind: wire.EventEpoch, Host: a.cfg.Host, Rank: -1, Gen: a.gen, Epoch: t.Epoch})
}

// replace carries out an in-place epoch change of this host to table t:
// ranks running that t no longer places here are killed (as stopped:
// their end is no failure), and fresh, the ranks t newly places here,
// start.
func (a *agent) replace(t *wire.EpochTable, fresh []wire.Placement) {
	for _, p := range a.ranks {
		if !p.ended && !a.placed(p.place.Rank) {
			a.log.Info("killing a rank moved away from this host", "rank", p.place.Rank, "epoch", t.Epoch)
			p.movedAway = true
			p.stopped.Store(true)
			p.signal(syscall.SIGKILL)
		}
	}
	if len(fresh) == 0 {
		return
	}
	a.log.Info("starting ranks newly placed here", "epoch", t.Epoch, "ranks", len(fresh))
	if err := a.launch(t, fresh, false); err != nil {
		a.event(&wire.Event{Kind: wire.EventAgentError, Host: a.cfg.Host, Rank: -1, Msg: err.Error()})
	}
}

// newlyPlaced returns the places of this host in the current table whose
// ranks prev, its places in the table before, did not have.
func (a *agent) newlyPlaced(prev []wire.Placement) []wire.Placement {
	var fresh []wire.Placement
	for _, pl := range a.places {
		if !slices.ContainsFunc(prev, func(q wire.Placement) bool { return q.Rank == pl.Rank }) {
			fresh = append(fresh, pl)
		}
	}
	return fresh
}

// placed says whether the current table places rank on this host.
func (a *agent) placed(rank int) bool {
	return slices.ContainsFunc(a.places, func(pl wire.Placement) bool { return pl.Rank == rank })
}

// hostPlaces returns this host's places in t (none if t has fewer hosts).
func (a *agent) hostPlaces(t *wire.EpochTable) []wire.Placement {
	if a.cfg.Host >= len(t.Hosts) {
		return nil
	}
	return t.Placements()[a.cfg.Host]
}

// idle says whether table t leaves this host without ranks for now: it is
// a spare, or its ranks moved away. An idle host never reports itself
// done (EventAgentDone): it may get ranks in a later table, and ends with
// OpExit, its launcher's end or a fence.
func (a *agent) idle(t *wire.EpochTable) bool {
	return len(a.hostPlaces(t)) == 0 && (a.hadRanks || a.cfg.Host < len(t.Hosts) && t.Hosts[a.cfg.Host].Spare)
}

// fencedIn says whether t marks this host fenced.
func (a *agent) fencedIn(t *wire.EpochTable) bool {
	return a.cfg.Host < len(t.Hosts) && t.Hosts[a.cfg.Host].Fenced
}

// fenced ends the agent of a host that table t fenced: Run's cleanup
// kills the ranks and removes the job's files.
func (a *agent) fenced(t *wire.EpochTable) error {
	a.log.Warn("this host is fenced out of the job: killing its ranks and exiting", "epoch", t.Epoch)
	return fmt.Errorf("%w (epoch %d)", ErrFenced, t.Epoch)
}
