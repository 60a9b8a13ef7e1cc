package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
)

// The agent's part of a roll-back to the durable tier (launcher/
// rollback.go): a lost rank's state at G is in no memory tier. The
// launcher asks every agent for its ranks' reach on disk (OpReach, with
// the new epoch's rank → host table: a spare answers for the ranks it
// takes over), which it answers as for --resume (resumeReach); then it
// restarts every rank with OpRestart{Disk} at T: once the old ranks have
// ended and the table is here, the state protection discards every step
// after T (Host.Restart: the slots, the durable store, the differential
// log), each local rank's state at T is rebuilt from disk into its slots
// (Host.Reload, cascade.Load), survivors' too, and only then do the
// ranks start, restoring T from their own slots.

// rollback is the agent's roll-back work in progress: the reach it
// reads and the reload before a restart. Its goroutines end before
// cleanup closes the protection (stopRollback); a read of the reach that
// hangs is not waited for (readReach).
type rollback struct {
	wg     subgroup
	ctx    context.Context
	cancel context.CancelFunc
	done   chan error // the reload's end (nil when none runs)

	taken uint64 // the newest OpReach's epoch taken (the launcher sends it again while it waits)

	mu    sync.Mutex
	asked uint64 // the epoch of the newest OpReach
	reach []byte // its answer, sent again at heartbeats until the restart comes (nil: none)
}

func (a *agent) rollbackState() *rollback {
	if a.rb == nil {
		a.rb = &rollback{wg: newSubgroup(&a.tasks, "roll-back")}
		a.rb.ctx, a.rb.cancel = context.WithCancel(context.Background())
	}
	return a.rb
}

// reachDisk answers an OpReach: this host's ranks in c.Ranks, and their
// reach on disk, on a goroutine.
func (a *agent) reachDisk(c *wire.Control) {
	var ranks []int
	for r, h := range c.Ranks {
		if h == a.cfg.Host {
			ranks = append(ranks, r)
		}
	}
	dir := a.protect.persist.Dir
	if len(ranks) == 0 || dir == "" {
		return
	}
	rb := a.rollbackState()
	if c.Epoch <= rb.taken {
		// Sent again: the answer is being read, or is sent again at
		// heartbeats (reachHeartbeat); an older epoch's is of no use.
		return
	}
	rb.taken = c.Epoch
	a.log.Info("rolling back to the checkpoint directory: reading the ranks' reach", "dir", dir, "ranks", ranks, "epoch", c.Epoch)
	rb.mu.Lock()
	rb.asked, rb.reach = c.Epoch, nil
	rb.mu.Unlock()
	rb.wg.Go(func() {
		r := a.readReach(rb.ctx, dir, ranks)
		if r == nil {
			return // the job stopped first
		}
		r.Epoch = c.Epoch
		msg := wire.Marshal(r)
		rb.mu.Lock()
		if rb.asked == c.Epoch {
			rb.reach = msg // (an earlier epoch's answer is not sent again)
		}
		rb.mu.Unlock()
		if err := a.ctl.Publish(a.subj.Resume, msg); err != nil {
			a.log.Warn("cannot send the ranks' reach on disk", "err", err)
		}
	})
}

// reachHeartbeat sends the ranks' reach again while the launcher has
// not decided (a message lost on the control plane is not sent again
// otherwise; the launcher takes each host's first, of its epoch).
func (a *agent) reachHeartbeat() {
	if a.rb == nil {
		return
	}
	a.rb.mu.Lock()
	msg := a.rb.reach
	a.rb.mu.Unlock()
	if msg != nil {
		_ = a.ctl.Publish(a.subj.Resume, msg)
	}
}

// reload rebuilds the state at step t of every rank this host places
// from disk, on a goroutine; rollbackDone says when.
func (a *agent) reload(t int64) {
	rb := a.rollbackState()
	rb.mu.Lock()
	rb.asked, rb.reach = 0, nil // decided: T is here
	rb.mu.Unlock()
	rb.done = make(chan error, 1)
	ranks := make([]int, len(a.places))
	for i, pl := range a.places {
		ranks[i] = pl.Rank
	}
	dir := a.protect.persist.Dir
	a.log.Info("rolling the ranks back to the step every rank reaches on disk", "step", t, "ranks", ranks)
	host := a.prot.host
	rb.wg.Go(func() {
		base, err := durable.ReadCommitted(dir)
		if err == nil {
			err = reloadRanks(rb.ctx, host, dir, base, t, ranks, a.log)
		}
		rb.done <- err
	})
}

// rollbackDone is the channel on which a reload's end comes (nil when
// none runs).
func (a *agent) rollbackDone() <-chan error {
	if a.rb == nil {
		return nil
	}
	return a.rb.done
}

// reloaded starts the ranks once their states at T are in their slots;
// if the job stopped meanwhile, it reports them not started.
func (a *agent) reloaded(err error) error {
	a.rb.done = nil
	if a.stopped {
		a.notStarted(a.table, a.places)
		return nil
	}
	if err != nil {
		return fmt.Errorf("rolling back to the checkpoint directory: %w", err)
	}
	return a.launch(a.table, a.places, true)
}

// stopRollback cancels a reload and waits for the roll-back's goroutines.
func (a *agent) stopRollback() {
	if a.rb == nil {
		return
	}
	a.rb.cancel()
	a.rb.wg.Wait()
}

// reloadRanks rebuilds each of ranks' state at step target from the
// durable tier in dir (base: the commit record's step) into its slots
// on h (keeper.Keeper.Reload): a rank whose slots hold target already keeps
// it. It stops at the first rank that fails, whose error names it.
func reloadRanks(ctx context.Context, h *keeper.Keeper, dir string, base, target int64, ranks []int, log *slog.Logger) error {
	return fromDisk(ctx, dir, base, target, ranks, log, "rolling back to", "rolled back",
		func(r int, rr []protect.Region, fill func([][]byte) (int, error)) (bool, error) {
			return h.Reload(r, rr, target, fill)
		})
}
