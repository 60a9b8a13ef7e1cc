package keeper

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gorun/gorun/durable"
)

// persistHost is a host's side of the durable tier's watermark: the
// newest commit record and resolved step the launcher published
// (SetDurable), applied by its loop (Keeper.persistLoop).
type persistHost struct {
	mu sync.Mutex
	d  int64 // the newest watermark published, or -1
	x  int64 // the newest resolved step published, or -1
	// appliedD and appliedX are the watermark and resolved step the loop
	// is applying or applied last (-1: none), and local whether the
	// host's directory is its own (1: it writes a commit record there
	// too; 0: the launcher's; -1: not known yet). A store opened in a
	// directory of the host's own starts from what was applied, never
	// from a watermark whose commit record the directory may not hold.
	appliedD, appliedX int64
	local              int
	kick               chan struct{}
	// rounds counts the loop's rounds that took a new watermark up,
	// applied or not (tests wait for them).
	rounds int
	// doneD and doneX are the watermark and resolved step the loop
	// applied whole (every local store reclaimed; -1: none), and
	// roundDone is closed, and replaced, at the end of each of its
	// rounds: Close waits on them (persistFinish). closing: Close is
	// waiting (tests look).
	doneD, doneX int64
	roundDone    chan struct{}
	closing      bool
}

// D returns the newest durable watermark (the job's commit record) the
// launcher published to this host, or -1.
func (h *Keeper) D() int64 {
	d, _ := h.durable()
	return d
}

// X returns the newest durable resolved step the launcher published to
// this host, or -1.
func (h *Keeper) X() int64 {
	_, x := h.durable()
	return x
}

// durable returns the newest durable watermark and resolved step the
// launcher published to this host (-1: none).
func (h *Keeper) durable() (d, x int64) {
	h.dur.mu.Lock()
	defer h.dur.mu.Unlock()
	return h.dur.d, h.dur.x
}

// SetD takes a newer durable watermark d: SetDurable(d, -1).
func (h *Keeper) SetD(d int64) { h.SetDurable(d, noStep) }

// SetDurable takes a newer durable watermark d, the step of the job's
// commit record (wire.GlobalStep.D), and a newer resolved step x
// (wire.GlobalStep.X: every step up to it other than d is abandoned);
// older ones and -1 are ignored. The host's loop commits d in the host's
// own directory, when that is not the launcher's, and has every local
// rank's store reclaim what a recovery at d cannot need and free the
// versions abandoned. It does nothing without a durable tier.
func (h *Keeper) SetDurable(d, x int64) {
	if !h.cfg.Persist.on() {
		return
	}
	h.dur.mu.Lock()
	if d <= h.dur.d && x <= h.dur.x {
		h.dur.mu.Unlock()
		return
	}
	h.dur.d, h.dur.x = max(h.dur.d, d), max(h.dur.x, x)
	h.dur.mu.Unlock()
	select {
	case h.dur.kick <- struct{}{}:
	default:
	}
	h.cfg.Changed() // the reports stop carrying the regions
}

// startPersist starts the host's watermark loop, with a durable tier.
func (h *Keeper) startPersist() {
	if !h.cfg.Persist.on() {
		return
	}
	h.dur.kick = make(chan struct{}, 1)
	h.dur.doneD, h.dur.doneX = noStep, noStep
	h.dur.roundDone = make(chan struct{})
	h.wg.Add(1)
	go h.persistLoop()
}

// persistCloseWait bounds how long Close waits for the host's loop to
// apply the newest watermark and resolved step (persistFinish): below
// the launcher's wait for its agents to exit (launcher.exitWait), which
// kills those that stay.
const persistCloseWait = 2 * time.Second

// persistFinish waits, at most persistCloseWait, until the host's loop
// has applied the newest watermark and resolved step published
// (SetDurable) to every local store: the end of a job, where the
// launcher's last commit reaches the host as it is told to exit
// (wire.OpExit carries it), must not leave behind it the versions and
// markers the commit record makes useless. Close calls it before it
// stops the loop; a host that cannot (its stores slow or failing, its
// own commit record not written) says what it leaves.
func (h *Keeper) persistFinish() {
	if !h.cfg.Persist.on() || h.dur.kick == nil {
		return
	}
	timeout := time.NewTimer(persistCloseWait)
	defer timeout.Stop()
	for {
		h.dur.mu.Lock()
		h.dur.closing = true
		d, x, doneD, doneX, round := h.dur.d, h.dur.x, h.dur.doneD, h.dur.doneX, h.dur.roundDone
		h.dur.mu.Unlock()
		if d <= doneD && x <= doneX {
			return
		}
		select {
		case <-round:
		case <-timeout.C:
			h.log.Warn("durable tier: closing before the last commit record was applied: this host's ranks may keep versions and markers it makes useless, and versions it abandoned, in the checkpoint directory (a --resume ignores them and frees them)",
				"dir", h.cfg.Persist.Dir, "committed", d, "resolved", x, "applied", doneD, "applied resolved", doneX, "waited", persistCloseWait)
			return
		case <-h.life.Done():
			return
		}
	}
}

// persistLoop applies each new watermark and resolved step: a commit
// record in the host's directory if the launcher does not write there (a
// directory on a local disk of each host: it has no manifest, which the
// launcher writes before its first commit), then every local rank's
// reclaim and abandon. A commit record it cannot write stops it there:
// the ranks free nothing past the record the host's directory durably
// holds (its version must stay, and the new record's too), and the
// record is tried again every persistRetry, or at the next watermark. It
// runs until the host stops; Close first waits, bounded, for it to apply
// the newest watermark (persistFinish).
func (h *Keeper) persistLoop() {
	defer h.wg.Done()
	dir := h.cfg.Persist.Dir
	applied, appliedX := int64(noStep), int64(noStep)
	local := -1 // unknown; 1: commit here too; 0: the launcher's directory (persistHost.local)
	var retry <-chan time.Time
	failing := false
	for {
		select {
		case <-h.dur.kick:
		case <-retry:
		case <-h.life.Done():
			return
		}
		retry = nil
		d, x := h.durable()
		if d <= applied && x <= appliedX {
			continue
		}
		if local < 0 {
			local = 0
			if _, err := durable.ReadManifest(dir); errors.Is(err, durable.ErrNoManifest) {
				local = 1
			}
			h.dur.mu.Lock()
			h.dur.local = local
			h.dur.mu.Unlock()
		}
		ok := true
		if local == 1 && d > applied {
			if err := durable.Commit(dir, d); err != nil {
				ok = false
				if !failing {
					h.log.Warn("durable tier: cannot write the commit record in this host's directory: its ranks reclaim nothing until it can (tried again every second)",
						"dir", dir, "step", d, "err", err)
				}
				retry = time.After(persistRetry)
			} else if failing {
				h.log.Warn("durable tier: the commit record is written in this host's directory again", "dir", dir, "step", d)
			}
			failing = !ok
		}
		if ok {
			// Before the stores: one that opens meanwhile starts from
			// these, or is open when its turn comes (persistReclaim
			// waits for its open).
			h.dur.mu.Lock()
			h.dur.appliedD, h.dur.appliedX = d, x
			h.dur.mu.Unlock()
			for _, s := range h.place().svcs {
				if h.life.Err() != nil {
					return
				}
				s.persistReclaim(d, x)
			}
			applied, appliedX = d, x
		}
		h.dur.mu.Lock()
		h.dur.rounds++
		if ok {
			h.dur.doneD, h.dur.doneX = d, x
		}
		close(h.dur.roundDone)
		h.dur.roundDone = make(chan struct{})
		h.dur.mu.Unlock()
		h.cfg.Changed()
	}
}

// persistRetry is how long a host waits before it tries again a commit
// record it could not write in its own directory.
const persistRetry = time.Second

// durableLogEvery is how often at most a store's log says the same thing:
// a full or failing disk has it retry (and warn) at every save.
const durableLogEvery = 30 * time.Second

// quietHandler passes a record on only if no record with its message
// passed in the last every: the durable stores' warnings, which a full
// disk repeats at every save and reclaim, once per rank and period.
type quietHandler struct {
	next  slog.Handler
	every time.Duration
	state *quietState
}

type quietState struct {
	mu   sync.Mutex
	last map[string]time.Time // by message
}

func newQuietHandler(next slog.Handler, every time.Duration) *quietHandler {
	return &quietHandler{next: next, every: every, state: &quietState{last: map[string]time.Time{}}}
}

func (q *quietHandler) Enabled(ctx context.Context, l slog.Level) bool { return q.next.Enabled(ctx, l) }

func (q *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	st := q.state
	st.mu.Lock()
	last, seen := st.last[r.Message]
	pass := !seen || r.Time.Sub(last) >= q.every
	if pass {
		st.last[r.Message] = r.Time
	}
	st.mu.Unlock()
	if !pass {
		return nil
	}
	return q.next.Handle(ctx, r)
}

func (q *quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &quietHandler{next: q.next.WithAttrs(as), every: q.every, state: q.state}
}

func (q *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{next: q.next.WithGroup(name), every: q.every, state: q.state}
}
