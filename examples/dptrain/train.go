package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/protect"
)

// collectives is what the trainer needs from its communicator.
// *comm.Comm implements it; the tests use an in-process fake.
type collectives interface {
	Rank() int
	Size() int
	Barrier(ctx context.Context) error
	// Broadcast returns root's b on every rank.
	Broadcast(ctx context.Context, root int, b []byte) ([]byte, error)
	// AllreduceInt64 sums x over the ranks, in place.
	AllreduceInt64(ctx context.Context, x []int64) error
	// Allgather returns every rank's bytes, indexed by rank.
	Allgather(ctx context.Context, mine []byte) ([][]byte, error)
	// Done is closed once the world can no longer be used (gorun moved
	// the job to a new epoch); Err then says why.
	Done() <-chan struct{}
	Err() error
}

// defaultChunk is how many parameters one collective call carries: it bounds
// the memory of the int64 gradient sums (8 bytes each) and of the byte
// buffers, whatever --params is.
const defaultChunk = 1 << 20

// errCrashed is what a crash hook that does not end the process returns.
var errCrashed = errors.New("crashed on purpose (--fail-at-step)")

// runOptions are the trainer's settings that do not come from flags.
type runOptions struct {
	out    io.Writer            // rank 0's report; nil discards it
	chunk  int                  // parameters per collective call; 0 means defaultChunk
	bounds []int                // shard boundaries, len size+1; nil means shardBounds
	crash  func(step int) error // FailRank calls it at FailAtStep; nil returns errCrashed
	// protect connects to the state protection with the rank's regions
	// (with Config.Protect); nil: protect.Connect.
	protect func(ctx context.Context, regions []protect.Region, opt protect.Options) (protector, error)
	// rebuild joins the next epoch's world once gorun has published it
	// (comm.Comm.Rebuild), bounded by ctx; the old world is closed. Nil:
	// the rank cannot survive an epoch change.
	rebuild func(ctx context.Context) (collectives, error)
	// errOut takes the rank's notes on recovery; nil discards them.
	errOut io.Writer
	// notices carries SIGUSR1s (Slurm's preemption notice): each one the
	// rank gets is noted on errOut at the next step, and training goes
	// on unchanged. Nil: none.
	notices <-chan os.Signal
}

// lossPoint is the loss at the start of one step (before its update).
type lossPoint struct {
	Step int
	Loss float64
}

// result is what a run computed; it is the same on every rank.
type result struct {
	ParamsHash    [sha256.Size]byte // the final parameters, little-endian float32, index order
	OptimizerHash [sha256.Size]byte // m, then v, then the master weights, each in index order
	Losses        []lossPoint
}

// shardBounds splits n parameters into size contiguous shards: rank r owns
// [b[r], b[r+1]); every shard has n/size parameters and the last one also
// the remainder.
func shardBounds(n, size int) []int {
	b := make([]int, size+1)
	for r := range size {
		b[r] = r * (n / size)
	}
	b[size] = n
	return b
}

// checkWorld reports whether cfg can run on size ranks.
func (cfg *Config) checkWorld(size int) error {
	if cfg.Batch%size != 0 {
		return usageError("world size %d does not divide --batch %d; use a batch that is a multiple of the number of ranks", size, cfg.Batch)
	}
	if cfg.FailAtStep >= 0 && cfg.FailRank >= size {
		return usageError("--fail-rank %d: the world has only %d ranks", cfg.FailRank, size)
	}
	return nil
}

// trainer is one rank's training state.
type trainer struct {
	c          collectives
	cfg        Config
	rank, size int
	bounds     []int // shard boundaries
	lo, hi     int   // this rank's shard
	first      int   // this rank's first sample in the global batch
	chunk      int

	params          []float32 // all parameters, replicated
	master, m, v, g []float32 // this rank's shard: master weights, Adam moments, gradient
	basisKey        uint64
	coef            []float32 // this step's coefficients of this rank's samples, row-major
	scratch         kernelScratch
	sums            []int64   // one chunk of fixed-point gradient sums
	sampleLoss      []float64 // this rank's samples' loss, this step
	lossBits        []int64   // every sample's loss as float64 bits, for the reduction
	buf             []byte    // one chunk of little-endian float32s
	timer           *time.Timer
	prot            protector // state protection, or nil
	diff            bool      // prot is in differential mode: each step's gradient goes to it
	meta            []byte    // the meta region's bytes

	rebuild  func(ctx context.Context) (collectives, error) // runOptions.rebuild
	rebuilds int                                            // worlds rebuilt in place so far
	crash    func(step int) error                           // runOptions.crash
	errOut   io.Writer                                      // runOptions.errOut, never nil
	notices  <-chan os.Signal                               // runOptions.notices
}

// train runs the whole job on one rank.
//
// With Config.Protect it survives gorun's in-place recovery: when a
// collective fails because the job moved to a new epoch (comm's
// ErrEpochChanged), or a peer was lost (then gorun publishes the new
// epoch: a replacement runs the lost ranks), the rank rebuilds its world
// (runOptions.rebuild, bounded by Config.RebuildTimeout), restores the
// state of step G from the state protection, which rolls every rank back
// to the epoch's recoverable step, and goes on from G+1, as often as
// epochs change. The ranks gorun started in the new epoch do the same
// from the start (join), so that both meet in the same collectives.
func train(ctx context.Context, c collectives, cfg Config, o runOptions) (*result, error) {
	t, err := newTrainer(c, cfg, o)
	if err != nil {
		return nil, err
	}
	defer t.timer.Stop()
	out := o.out
	if out == nil || t.rank != 0 {
		out = io.Discard
	}
	fmt.Fprintf(out, "dptrain: %d ranks, %d parameters (%d per rank, last %d), batch %d (%d per rank), compute %d, %d steps, seed %d\n",
		t.size, cfg.Params, t.bounds[1]-t.bounds[0], t.bounds[t.size]-t.bounds[t.size-1],
		cfg.Batch, cfg.Batch/t.size, cfg.Compute, cfg.Steps, cfg.Seed)

	if cfg.Protect {
		connect := o.protect
		if connect == nil {
			connect = func(ctx context.Context, regions []protect.Region, opt protect.Options) (protector, error) {
				return protect.Connect(ctx, regions, opt)
			}
		}
		p, err := connect(ctx, t.regions(), protect.Options{Optimizer: t.optimizer()})
		if err != nil {
			return nil, fmt.Errorf("state protection: %w", err)
		}
		defer p.Close()
		t.prot = p
		t.diff = p.Mode() == protect.ModeDiff
	}

	res := &result{}
	first, err := t.join(ctx, out)
	for {
		if err == nil {
			if err = t.run(ctx, first, res, out); err == nil {
				return res, nil
			}
		}
		if err = t.rebuildWorld(ctx, err); err != nil {
			return nil, err
		}
		first, err = t.join(ctx, out)
	}
}

// join brings the rank into its world, at the start and after every
// rebuild: it checks that every rank runs the same job, resumes from the
// protected state (or the checkpoint) if there is one, and returns the
// first step to run. Every rank of the world calls it at the same point.
func (t *trainer) join(ctx context.Context, out io.Writer) (int, error) {
	// Every rank must run the same job: compare with rank 0's flags.
	mine := []byte(t.cfg.jobFlags())
	theirs, err := t.c.Broadcast(ctx, 0, mine)
	if err != nil {
		return 0, fmt.Errorf("comparing flags with rank 0: %w", err)
	}
	if string(theirs) != string(mine) {
		return 0, usageError("rank %d's flags differ from rank 0's:\n  rank 0:  %s\n  rank %d: %s", t.rank, theirs, t.rank, mine)
	}
	var first int
	switch {
	case t.prot != nil:
		first, err = t.restore(ctx)
	case t.cfg.CkptDir != "":
		first, err = t.resumeCheckpoint(ctx)
	}
	if err != nil {
		return 0, err
	}
	if first == 0 {
		// Nothing to resume from: the initial state. (Not before: a rank
		// that resumes would only overwrite it, and a replacement must
		// come up fast.)
		t.reset()
	}
	if first > 0 {
		how := ""
		if t.rebuilds > 0 {
			how = " (in place)"
		}
		fmt.Fprintf(out, "dptrain: resuming after step %d%s\n", first-1, how)
	}
	return first, nil
}

// rebuildWorld decides whether cause, the error that stopped training,
// can be survived in place, and if so replaces the rank's world with the
// new epoch's: it returns nil when the rank is to join again, cause
// (wrapped with why not) when the rank must end.
//
// Survivable, with Config.Protect: the epoch changed (comm's
// ErrEpochChanged); a peer was lost (comm's ErrPeerLost), if the new
// epoch comes within Config.RebuildTimeout; the state protection
// refused a stage (a new placement ended a stage waiting at the overwrite
// rule: the epoch is about to change), likewise.
func (t *trainer) rebuildWorld(ctx context.Context, cause error) error {
	epochChanged := errors.Is(cause, comm.ErrEpochChanged)
	var se *protect.ServiceError
	if !epochChanged && !errors.Is(cause, comm.ErrPeerLost) && !(errors.As(cause, &se) && se.Op == "stage") {
		return cause
	}
	switch {
	case ctx.Err() != nil:
		return cause
	case t.prot == nil && epochChanged:
		return fmt.Errorf("%w: gorun moved the job to a new epoch (--recovery in-place); dptrain rebuilds its state in place only with --protect (use it, or gorun --recovery restart)", cause)
	case t.prot == nil:
		return cause
	case t.rebuild == nil:
		return fmt.Errorf("%w (this communicator cannot join a new epoch)", cause)
	case t.cfg.RebuildTimeout <= 0:
		return fmt.Errorf("%w (--rebuild-timeout 0: not waiting for a new epoch)", cause)
	}
	fmt.Fprintf(t.errOut, "dptrain: rank %d: %v; waiting for the new epoch to rebuild in place\n", t.rank, cause)
	rctx, cancel := context.WithTimeout(ctx, t.cfg.RebuildTimeout)
	defer cancel()
	start := time.Now()
	c, err := t.rebuild(rctx)
	if err != nil {
		return fmt.Errorf("%w; no new epoch joined within --rebuild-timeout %v: %w", cause, t.cfg.RebuildTimeout, err)
	}
	if c.Rank() != t.rank || c.Size() != t.size {
		return fmt.Errorf("%w; the new epoch makes this rank %d of %d, not %d of %d: in-place recovery keeps the world", cause, c.Rank(), c.Size(), t.rank, t.size)
	}
	fmt.Fprintf(t.errOut, "dptrain: rank %d: joined the new epoch in %v\n", t.rank, time.Since(start).Round(time.Millisecond))
	t.c = c
	t.rebuilds++
	// The staging in flight, if any, is of a step the restore discards:
	// a new placement ends it if it waits at the overwrite rule.
	if err := t.prot.Wait(rctx); err != nil {
		fmt.Fprintf(t.errOut, "dptrain: rank %d: the staging in flight when the epoch changed ended with: %v\n", t.rank, err)
	}
	return nil
}

// run trains steps first… and finishes: the final hashes, and the report.
func (t *trainer) run(ctx context.Context, first int, res *result, out io.Writer) error {
	cfg := &t.cfg
	// Steps from first on are trained again after a rollback.
	res.Losses = slices.DeleteFunc(res.Losses, func(p lossPoint) bool { return p.Step >= first })
	start := time.Now()
	for s := first; s < cfg.Steps; s++ {
		t.noteNotices(s)
		if s == cfg.FailAtStep && t.rank == cfg.FailRank && t.rebuilds == 0 {
			if cfg.FailWipeState && t.prot != nil {
				// The state to wipe is the committed one, not one a
				// staging still in flight would write over again.
				if err := t.prot.Wait(ctx); err != nil {
					return fmt.Errorf("state protection: %w", err)
				}
			}
			crash := t.crash
			if crash == nil {
				crash = func(int) error { return errCrashed }
			}
			if err := crash(s); err != nil {
				return err
			}
		}
		loss, logged, err := t.step(ctx, s)
		if err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		switch {
		case logged && cfg.DeviceGrad:
			fmt.Fprintf(out, "step %d\n", s) // no loss: the device computed it
		case logged:
			res.Losses = append(res.Losses, lossPoint{s, loss})
			fmt.Fprintf(out, "step %d loss %.9g\n", s, loss)
		}
		if err := t.checkpoint(s); err != nil {
			return err
		}
	}
	if t.prot != nil {
		if err := t.prot.Wait(ctx); err != nil {
			return fmt.Errorf("state protection: %w", err)
		}
	}
	t.noteNotices(cfg.Steps)
	elapsed := time.Since(start)
	if cfg.DeviceGrad {
		// No step gathered the parameters: the shards' master weights
		// make them, once, for the hash.
		if err := t.allgatherParams(ctx); err != nil {
			return err
		}
	}
	var err error
	if res.ParamsHash, err = t.paramsHash(ctx); err != nil {
		return err
	}
	if res.OptimizerHash, err = t.optimizerHash(ctx); err != nil {
		return err
	}
	// Nobody leaves (and closes its communicator) while a peer may still
	// be receiving from it.
	if err := t.c.Barrier(ctx); err != nil {
		return fmt.Errorf("final barrier: %w", err)
	}
	if n := cfg.Steps - first; n > 0 {
		fmt.Fprintf(out, "dptrain: %d steps in %.3fs, %.3f ms/step\n", n, elapsed.Seconds(),
			float64(elapsed.Microseconds())/1e3/float64(n))
	}
	if t.prot != nil && cfg.Steps > first {
		st := t.prot.Stats()
		n := time.Duration(max(st.Stages, 1))
		fmt.Fprintf(out, "dptrain: protection per step: copy %v, commit %v, overwrite-rule wait %v, trainer wait %v\n",
			(st.Copy / n).Round(time.Microsecond), (st.Commit / n).Round(time.Microsecond),
			(st.RuleWait / n).Round(time.Microsecond), (st.Wait / n).Round(time.Microsecond))
	}
	fmt.Fprintf(out, "params sha256 %x\n", res.ParamsHash)
	fmt.Fprintf(out, "optimizer sha256 %x\n", res.OptimizerHash)
	return nil
}

// newTrainer checks the world against the configuration and allocates all
// the state; nothing is allocated per step after this.
func newTrainer(c collectives, cfg Config, o runOptions) (*trainer, error) {
	rank, size := c.Rank(), c.Size()
	if err := cfg.checkWorld(size); err != nil {
		return nil, err
	}
	bounds := o.bounds
	if bounds == nil {
		bounds = shardBounds(cfg.Params, size)
	}
	if err := checkBounds(bounds, cfg.Params, size); err != nil {
		return nil, err
	}
	chunk := o.chunk
	if chunk <= 0 {
		chunk = defaultChunk
	}
	errOut := o.errOut
	if errOut == nil {
		errOut = io.Discard
	}
	lo, hi := bounds[rank], bounds[rank+1]
	nloc := cfg.Batch / size
	t := &trainer{
		c: c, cfg: cfg, rank: rank, size: size,
		bounds: bounds, lo: lo, hi: hi, first: rank * nloc, chunk: chunk,
		params:     make([]float32, cfg.Params),
		master:     make([]float32, hi-lo),
		m:          make([]float32, hi-lo),
		v:          make([]float32, hi-lo),
		g:          make([]float32, hi-lo),
		basisKey:   streamKey(cfg.Seed, domainBasis),
		coef:       make([]float32, nloc*cfg.Compute),
		scratch:    newKernelScratch(cfg.Compute),
		sums:       make([]int64, min(chunk, cfg.Params)),
		sampleLoss: make([]float64, nloc),
		lossBits:   make([]int64, cfg.Batch),
		buf:        make([]byte, 4*min(chunk, cfg.Params)),
		timer:      time.NewTimer(time.Hour),
		rebuild:    o.rebuild,
		crash:      o.crash,
		errOut:     errOut,
		notices:    o.notices,
	}
	t.timer.Stop()
	return t, nil // join sets the state: reset, or resumed
}

// noteNotices writes one line on errOut for each SIGUSR1 received
// since the last call, naming the step s about to run (Steps: after the
// last one). The notice changes nothing else: the hashes are those of a
// run without it.
func (t *trainer) noteNotices(s int) {
	for {
		select {
		case <-t.notices:
			fmt.Fprintf(t.errOut, "dptrain: rank %d: got SIGUSR1 at step %d (a preemption notice); going on\n", t.rank, s)
		default:
			return
		}
	}
}

// step runs optimizer step s: device time, gradients, exact reduction, Adam
// on this rank's shard, all-gather of the parameters. On logged steps it
// returns the loss before the update.
func (t *trainer) step(ctx context.Context, s int) (loss float64, logged bool, err error) {
	if err := t.deviceTime(ctx); err != nil {
		return 0, false, err
	}
	cfg := &t.cfg
	if t.diff {
		// The service reads step s's gradient from its buffer in the
		// background once s is staged: the buffer of step s-1 (the other
		// one) may still be read, that of s-2 no longer (the Wait below
		// was passed for s-1).
		t.g = t.prot.GradientBuffer(int64(s))[:len(t.master)]
	}
	if cfg.DeviceGrad {
		deviceGrad(t.g, t.master, cfg.Seed, s, t.lo)
		if t.prot != nil {
			if err := t.prot.Wait(ctx); err != nil {
				return 0, false, fmt.Errorf("state protection: %w", err)
			}
		}
		adamUpdate(t.master, t.m, t.v, t.g, cfg.Adam.consts(s+1))
		copy(t.params[t.lo:t.hi], t.master)
		if t.prot != nil {
			if err := t.protectStep(ctx, s); err != nil {
				return 0, false, fmt.Errorf("state protection: %w", err)
			}
		}
		return 0, s == 0 || s == cfg.Steps-1 || cfg.LogEvery > 0 && s%cfg.LogEvery == 0, nil
	}
	logged = s == 0 || s == cfg.Steps-1 || cfg.LogEvery > 0 && s%cfg.LogEvery == 0
	// The parts of the reduced gradient other ranks' holders on this
	// host take from this rank (diff mode): written from the same sums,
	// at no extra collective.
	var red []float32
	var deposits []protect.DepositRange
	if t.diff {
		red, deposits = t.prot.Deposits(int64(s))
	}
	sampleCoefficients(t.coef, cfg.Seed, s, t.first, len(t.sampleLoss), cfg.Compute)
	clear(t.sampleLoss)
	for a := 0; a < cfg.Params; a += t.chunk {
		if err := ctx.Err(); err != nil {
			return 0, false, context.Cause(ctx)
		}
		b := min(a+t.chunk, cfg.Params)
		sums := t.sums[:b-a]
		var sampleLoss []float64 // nil: no loss this step
		if logged {
			sampleLoss = t.sampleLoss
		}
		gradChunk(sums, sampleLoss, t.params[a:b], a, t.coef, t.scratch, t.basisKey)
		if err := t.c.AllreduceInt64(ctx, sums); err != nil {
			return 0, false, fmt.Errorf("reducing gradients: %w", err)
		}
		// Keep this rank's part: the mean gradient, converted once.
		for i := max(a, t.lo); i < min(b, t.hi); i++ {
			t.g[i-t.lo] = fromFixed(sums[i-a], cfg.Batch)
		}
		for _, d := range deposits {
			for i := max(a, int(d.Lo)); i < min(b, int(d.Hi)); i++ {
				red[i] = fromFixed(sums[i-a], cfg.Batch)
			}
		}
	}
	if logged {
		if loss, err = t.reduceLoss(ctx); err != nil {
			return 0, false, err
		}
	}
	if t.prot != nil {
		// The one synchronization with the state protection: step s-1's
		// state must be in its slot before this update changes it.
		if err := t.prot.Wait(ctx); err != nil {
			return 0, false, fmt.Errorf("state protection: %w", err)
		}
	}
	adamUpdate(t.master, t.m, t.v, t.g, cfg.Adam.consts(s+1))
	copy(t.params[t.lo:t.hi], t.master)
	if err := t.allgatherParams(ctx); err != nil {
		return 0, false, err
	}
	if t.prot != nil {
		if err := t.protectStep(ctx, s); err != nil {
			return 0, false, fmt.Errorf("state protection: %w", err)
		}
	}
	return loss, logged, nil
}

// deviceTime emulates the accelerator computing this step: the host CPU is
// deliberately idle (a sleep is the emulation, not a shortcut), as it is
// while a GPU runs the forward and backward passes. A world that ends
// meanwhile (gorun moved the job to a new epoch) ends it at once: with
// --device-grad a step has no collective that would fail, and the rank
// would otherwise train on, to no use, until the overwrite rule stops it.
func (t *trainer) deviceTime(ctx context.Context) error {
	if err := t.c.Err(); err != nil {
		return err
	}
	if t.cfg.DeviceTime <= 0 {
		return nil
	}
	t.timer.Reset(t.cfg.DeviceTime)
	select {
	case <-t.timer.C:
		return nil
	case <-t.c.Done():
		t.timer.Stop()
		return t.c.Err()
	case <-ctx.Done():
		t.timer.Stop()
		return context.Cause(ctx)
	}
}
