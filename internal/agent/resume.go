package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// The agent's part of gorun --resume (internal/wire/resume.go has the
// protocol): before it starts the ranks of the first epoch table, it
// reports each local rank's reach on disk (resumeReach), waits for the
// launcher's T (the first G it publishes), rebuilds each local rank's
// state at T into its slots (preloadRanks: cascade.Load into
// keeper.Keeper.Preload's staged slot) and only then starts the ranks, which
// restore T from their own slots.

// resumeReach reads, for each of ranks, the newest step its state can be
// rebuilt at from the durable tier in dir: the commit record's step
// (every rank must hold a complete version of it) plus its contiguous
// differentials (cascade.Reach). It stops between ranks once ctx is done
// (a read that hangs in the kernel is not interrupted: readReach).
func resumeReach(ctx context.Context, host int, dir string, ranks []int) *wire.ResumeReach {
	out := &wire.ResumeReach{Host: host, Ranks: []wire.ResumeRank{}}
	fail := func(err error) *wire.ResumeReach {
		out.Err, out.Ranks = truncateMsg(err.Error()), []wire.ResumeRank{}
		return out
	}
	base, err := durable.ReadCommitted(dir)
	if err != nil {
		return fail(err)
	}
	out.Base = base
	m, err := durable.ReadManifest(dir)
	if err != nil {
		return fail(err)
	}
	ls, err := durable.List(dir)
	if err != nil {
		return fail(err)
	}
	for _, r := range ranks {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		k := wire.ResumeRank{Rank: r, To: -1}
		switch {
		case r >= len(m.Regions):
			k.Err = fmt.Sprintf("the checkpoint directory's job has %d ranks", len(m.Regions))
		case !hasVersion(ls, r, base):
			k.Err = fmt.Sprintf("no complete version of the committed step %d in %s", base, dir)
		default:
			sp, stop := cascade.Reach(dir, r, m.Regions[r], base)
			k.To = sp.To
			if stop != nil {
				k.Stop = truncateMsg(stop.Error())
			}
		}
		out.Ranks = append(out.Ranks, k)
	}
	return out
}

// readReach reads the ranks' reach on disk (cfg.ReadReach, else
// resumeReach), or returns nil once ctx is done first (the job stops).
//
// The read runs on a goroutine of its own that cleanup does not wait for:
// a read of the checkpoint directory that hangs in the kernel (a stalled
// network file system) cannot be interrupted, and must not keep the
// agent from exiting once the launcher stops the job (cleanup waits for
// the goroutines of --resume and of a roll-back, which cancel ctx
// first). It is of the agent's group all the same: Run waits for it a
// bounded time at its end (goroutineWait), then logs it left. It uses nothing the agent closes at exit (not the protection,
// not the control plane): it only reads files and hands back its result,
// into a buffer nobody may read.
func (a *agent) readReach(ctx context.Context, dir string, ranks []int) *wire.ResumeReach {
	read := a.cfg.ReadReach
	if read == nil {
		read = resumeReach
	}
	got := make(chan *wire.ResumeReach, 1)
	host := a.cfg.Host
	a.tasks.Go("reach read", func() { got <- read(ctx, host, dir, ranks) })
	select {
	case r := <-got:
		return r
	case <-ctx.Done():
		return nil
	}
}

// hasVersion reports whether the listing has a complete version of step
// for rank (it does not read the data: Load does, and checks it).
func hasVersion(ls *durable.Listing, r int, step int64) bool {
	for _, rl := range ls.Ranks {
		if rl.Rank != r {
			continue
		}
		return slices.ContainsFunc(rl.Bases, func(b durable.BaseFile) bool {
			return b.Step == step && (b.State == durable.StateComplete || b.State == durable.StateCommitted)
		})
	}
	return false
}

// preloadRanks rebuilds each of ranks' state at step target from the
// durable tier in dir (base: the commit record's step) into its slots on
// h, as committed step target (keeper.Keeper.Preload). It stops at the first
// rank that fails, whose error names it.
func preloadRanks(ctx context.Context, h *keeper.Keeper, dir string, base, target int64, ranks []int, log *slog.Logger) error {
	return fromDisk(ctx, dir, base, target, ranks, log, "resuming", "resumed",
		func(r int, rr []protect.Region, fill func([][]byte) (int, error)) (bool, error) {
			return true, h.Preload(r, rr, target, fill)
		})
}

// fromDisk rebuilds each of ranks' state at step target from the durable
// tier in dir (base: the commit record's step) through put, which hands
// the rank's slot views to fill and reports whether it filled them (a
// rank whose slots hold target already may keep them). doing and done
// name the operation in errors and logs ("resuming", "resumed"). It
// stops at the first rank that fails, whose error names it.
func fromDisk(ctx context.Context, dir string, base, target int64, ranks []int, log *slog.Logger, doing, done string,
	put func(r int, rr []protect.Region, fill func([][]byte) (int, error)) (bool, error)) error {
	m, err := durable.ReadManifest(dir)
	if err != nil {
		return err
	}
	for _, r := range ranks {
		if r >= len(m.Regions) {
			return fmt.Errorf("rank %d: the checkpoint directory's job has %d ranks", r, len(m.Regions))
		}
		regions := m.Regions[r]
		rr := make([]protect.Region, len(regions))
		for i, g := range regions {
			rr[i] = protect.Region{Name: g.Name, Size: g.Size}
		}
		start := time.Now()
		var got cascade.Loaded
		loaded, err := put(r, rr, func(views [][]byte) (int, error) {
			var err error
			got, err = cascade.Load(ctx, dir, r, regions, base, target, views, replay.ReplayOptions{})
			return got.AdamT, err
		})
		if err != nil {
			return fmt.Errorf("rank %d: %s step %d: %w", r, doing, target, err)
		}
		if !loaded {
			log.Info("a rank's slots hold the step already", "rank", r, "step", target)
			continue
		}
		if !got.Exact {
			log.Warn(done+" a rank's state from lossy differentials: an approximation of the state it had, not bitwise", "rank", r, "step", target)
		}
		log.Info(done+" a rank's state from the checkpoint directory", "rank", r, "step", target, "base", base,
			"differentials replayed", got.Replayed, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// resumer is a --resume in progress on this host: from the first
// table, whose ranks wait, until they start. Owned by the agent's loop;
// its goroutines (the reach, then the preload) end before cleanup closes
// the protection (stopResume; a read of the reach that hangs is not
// waited for: readReach).
type resumer struct {
	t       *wire.EpochTable
	places  []wire.Placement
	ctx     context.Context
	cancel  context.CancelFunc
	wg      subgroup
	done    chan error // the preload's end (nil until it began)
	target  int64      // T, once known (-1 before)
	aborted bool       // the job stopped first: the ranks were reported not started

	mu    sync.Mutex
	reach []byte // the report sent, sent again at heartbeats until T comes
}

// beginResume holds the ranks of table t (places: this host's) back,
// reads their reach on disk and sends it to the launcher, on a goroutine.
// The loop then waits for T (resumeTarget) and the preload (resumeDone).
func (a *agent) beginResume(t *wire.EpochTable, places []wire.Placement) {
	r := &resumer{t: t, places: places, target: -1, wg: newSubgroup(&a.tasks, "resume")}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	a.res = r
	ranks := make([]int, len(places))
	for i, pl := range places {
		ranks[i] = pl.Rank
	}
	dir := a.protect.persist.Dir
	a.log.Info("resuming from the checkpoint directory: reading the ranks' reach", "dir", dir, "ranks", ranks)
	r.wg.Go(func() {
		reach := a.readReach(r.ctx, dir, ranks)
		if reach == nil {
			return // the job stopped first
		}
		msg := wire.Marshal(reach)
		r.mu.Lock()
		r.reach = msg
		r.mu.Unlock()
		if err := a.ctl.Publish(a.subj.Resume, msg); err != nil {
			a.log.Warn("cannot send the ranks' reach on disk", "err", err)
		}
	})
}

// resumeHeartbeat sends the ranks' reach again while T has not come (a
// message lost on the control plane is not sent again otherwise; the
// launcher takes each host's first).
func (a *agent) resumeHeartbeat() {
	r := a.res
	if r == nil || r.target >= 0 {
		return
	}
	r.mu.Lock()
	msg := r.reach
	r.mu.Unlock()
	if msg != nil {
		_ = a.ctl.Publish(a.subj.Resume, msg)
	}
}

// resumeTarget is the channel on which the loop learns T: the first G
// the launcher publishes while the ranks wait (nil when not resuming).
func (a *agent) resumeTarget() <-chan int64 {
	if a.res == nil || a.res.target >= 0 || a.res.aborted {
		return nil
	}
	return a.resumeT
}

// resumeDone is the channel on which the preload's end comes (nil when
// none runs).
func (a *agent) resumeDone() <-chan error {
	if a.res == nil {
		return nil
	}
	return a.res.done
}

// resumeAt has the ranks' states at T rebuilt into their slots, on a
// goroutine (resumeDone says when).
func (a *agent) resumeAt(target int64) {
	r := a.res
	r.target = target
	r.done = make(chan error, 1)
	ranks := make([]int, len(r.places))
	for i, pl := range r.places {
		ranks[i] = pl.Rank
	}
	dir := a.protect.persist.Dir
	a.log.Info("resuming the ranks at the step every rank reaches on disk", "step", target, "ranks", ranks)
	r.wg.Go(func() {
		base, err := durable.ReadCommitted(dir)
		if err == nil {
			err = preloadRanks(r.ctx, a.prot.host, dir, base, target, ranks, a.log)
		}
		r.done <- err
	})
}

// resumed starts the ranks once their states are in their slots, or
// fails the host if they could not be rebuilt.
func (a *agent) resumed(err error) error {
	r := a.res
	r.done = nil
	a.res = nil
	if r.aborted {
		return nil // reported not started already
	}
	if err != nil {
		return fmt.Errorf("--resume: %w", err)
	}
	err = a.launch(a.table, a.places, true)
	close(a.stdinReady)
	return err
}

// abortResume: the job stops before the ranks resumed (a stop or kill
// from the launcher, which may have found that they cannot be): the
// ranks are reported not started, and a preload in progress is
// cancelled (resumed, or cleanup's stopResume, collects it).
func (a *agent) abortResume() {
	r := a.res
	if r == nil || r.aborted {
		return
	}
	r.aborted = true
	r.cancel()
	a.ranks = []*rankProc{}
	a.notStarted(r.t, r.places)
	close(a.stdinReady)
}

// stopResume ends a resume in progress and waits for its goroutines
// (cleanup, before the protection closes).
func (a *agent) stopResume() {
	if a.res == nil {
		return
	}
	a.res.cancel()
	a.res.wg.Wait()
}
