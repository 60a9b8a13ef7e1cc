package keeper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/gorun/gorun/comm"
)

// Restart begins restart generation gen, in which every rank resumes from
// step g (the launcher's G when it stopped the ranks; -1: from scratch):
// every local rank's steps after g are discarded, so that the ranks
// restarted next restore g and stage g+1, and so are the replicas this
// host holds of other ranks' steps after g from older generations; puts
// of older generations are refused from now on. The ranks must be stopped.
func (h *Keeper) Restart(gen uint64, g int64) error {
	return h.restart(gen, g, false)
}

// RollBack is Restart for a roll-back of the job to the durable tier at
// step t (hotswap.RollbackToDisk; the ranks' states at t are reloaded
// next, Reload). In diff mode under erasure coding it also forgets H:
// the coded bases and the logs after them were of a base schedule that
// the roll-back abandons (H may be past t, and no base step at or before
// t is known to be held complete in the new placement), so the schedule
// restarts from t as at the job's start — t is b_0, every owner codes it
// again, and H is -1 until the launcher publishes the new generation's H
// from the new reports (SetH). What the stores, rows and logs keep of
// steps up to t (Restart drops those after t of older generations) is
// never named by H again: H rises only to bases coded in the new
// generation, t or later. In other modes RollBack is Restart.
func (h *Keeper) RollBack(gen uint64, t int64) error {
	return h.restart(gen, t, true)
}

func (h *Keeper) restart(gen uint64, g int64, rollback bool) error {
	h.pmu.Lock()
	defer h.pmu.Unlock()
	// No progress report is taken while the generation and the ranks'
	// steps disagree: one with the new generation and a discarded step
	// would let the launcher's G pass g.
	h.rmu.Lock()
	h.gmu.Lock()
	h.gen, h.g, h.resumed = gen, g, g
	if rollback && h.place().ecDiff() {
		h.hb = noStep
	}
	close(h.gwake)
	h.gwake = make(chan struct{})
	h.gmu.Unlock()
	h.store.restart(gen, g, rollback)
	h.parity.restart(gen, g, rollback)
	var errs []error
	p := h.place()
	for _, r := range sortedRanks(p) {
		s := p.svcs[r]
		s.restores.Store(0)
		if err := s.truncate(g); err != nil {
			errs = append(errs, err)
		}
	}
	h.rmu.Unlock()
	h.cfg.Changed()
	return errors.Join(errs...)
}

// Gen returns the restart generation.
func (h *Keeper) Gen() uint64 {
	h.gmu.Lock()
	defer h.gmu.Unlock()
	return h.gen
}

// slowWait is how long a stage waits at the overwrite rule before the
// service says so in its log.
const slowWait = 30 * time.Second

// errRestarted: the ranks were restarted since the session began (its
// rank process is gone).
var errRestarted = errors.New("the ranks were restarted since this session began")

// waitG waits until g ≥ step in generation gen, ctx ends, the host stops,
// a restart begins another generation, a new placement begins
// (errNewPlacement), or failed is closed (the rank failed: it returns
// failure()).
// replaced is the placement's in which the stage began.
func (h *Keeper) waitG(ctx context.Context, rank int, gen uint64, step int64, replaced, failed <-chan struct{}, failure func() error) error {
	h.waiters.Add(1)
	defer h.waiters.Add(-1)
	t := time.NewTimer(slowWait)
	defer t.Stop()
	slow := t.C
	for {
		h.gmu.Lock()
		g, wake, cur := h.g, h.gwake, h.gen
		h.gmu.Unlock()
		if cur != gen {
			return errRestarted
		}
		if g >= step {
			return nil
		}
		select {
		case <-wake:
		case <-slow:
			h.log.Warn("a stage waits at the overwrite rule: some rank has not committed, or not replicated, this step",
				"rank", rank, "step", step, "G", g, "waited", slowWait)
		case <-failed:
			if err := failure(); err != nil {
				return err
			}
			failed = nil // cleared by a restart: the generation check ends the wait
		case <-replaced:
			return errNewPlacement
		case <-ctx.Done():
			return ctx.Err()
		case <-h.life.Done():
			return ErrStopping
		}
	}
}

func sortedRanks(p *placement) []int {
	rs := make([]int, 0, len(p.svcs))
	for r := range p.svcs {
		rs = append(rs, r)
	}
	slices.Sort(rs)
	return rs
}

// Progress returns every local rank's progress, in rank order, with the
// restart generation it belongs to.
func (h *Keeper) Progress() (uint64, []Progress) {
	h.rmu.RLock()
	defer h.rmu.RUnlock()
	gen := h.Gen()
	p := h.place()
	out := make([]Progress, 0, len(p.svcs))
	for _, r := range sortedRanks(p) {
		pr := p.svcs[r].progress(p)
		if p.ecDiff() {
			pr.Base = p.svcs[r].rep.baseIn(p, pr.Replicated)
		}
		out = append(out, pr)
	}
	return gen, out
}

// Close stops the host's state protection: pending requests fail, links
// close, the replicas held are dropped and the slots unmapped. The slot
// files stay (see RemoveFiles). With a durable tier it first waits, a
// bounded time, for the newest watermark and resolved step published
// (SetDurable) to be applied to every local store, which it then closes.
func (h *Keeper) Close() error {
	h.pmu.Lock() // no SetPlacement adds services meanwhile
	defer h.pmu.Unlock()
	// The durable tier's last watermark first (bounded): the stores
	// close below.
	h.persistFinish()
	h.stop()
	if h.cfg.Listener != nil {
		h.cfg.Listener.Close()
	}
	h.links.close()
	h.store.close()
	h.parity.close()
	h.wg.Wait()
	var errs []error
	p := h.place()
	for _, r := range sortedRanks(p) {
		errs = append(errs, p.svcs[r].close())
	}
	return errors.Join(errs...)
}

// RemoveFiles removes the slot files this host made for its ranks (after
// Close), and releases the job's claim: the last process of the job on
// this machine to release it removes whatever of the job's files is left.
// A rank's file whose name another process made since is left to it:
// agents of the job that share the directory (network namespace hosts
// share /dev/shm) use the same names for a rank, and a spare that took
// this host's ranks over may be using them.
func (h *Keeper) RemoveFiles() error {
	var errs []error
	p := h.place()
	for _, r := range sortedRanks(p) {
		errs = append(errs, p.svcs[r].removeFilesLog())
	}
	if c := h.claim.Load(); c != nil {
		_, err := c.Release()
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (h *Keeper) acceptLoop(ln net.Listener) {
	defer h.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			from, err := comm.AcceptLink(c, h.linkAuth(), h.cfg.Host, h.cfg.Hosts)
			if err != nil {
				h.log.Warn("refused a replication link", "remote", c.RemoteAddr().String(), "err", err)
				c.Close()
				return
			}
			h.store.serve(h.life, from, c)
		}()
	}
}

func (h *Keeper) linkAuth() comm.LinkAuth {
	return comm.LinkAuth{Job: h.cfg.Job, Key: h.cfg.LinkKey, Purpose: "replica"}
}

func (h *Keeper) String() string { return fmt.Sprintf("host %d", h.cfg.Host) }
