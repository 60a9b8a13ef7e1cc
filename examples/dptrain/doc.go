// Command dptrain is a deterministic data-parallel trainer for gorun: a
// synthetic model trained with Adam (float32) by a distributed optimizer in
// the ZeRO-1 / Megatron style, whose every bit is reproducible.
//
//	gorun -np 4 -- dptrain --params 1M --steps 200 --seed 1
//
// # Training
//
// Every rank holds the whole fp32 parameter vector. Each rank owns one
// contiguous shard of the optimizer state, the Adam moments m and v and the
// fp32 master weights, so every rank's optimizer shard is unique: that is
// what gorun's state protection must save. Shards are P/world parameters,
// the last one taking the remainder. One step is:
//
//  1. device time: --device-ms of deliberate host idleness, emulating an
//     accelerator running the forward and backward passes (a sleep is the
//     emulation here, not a shortcut: it is the time the host CPU is free
//     while a GPU computes);
//  2. the gradients of the rank's batch/world samples, computed on the CPU,
//     each sample's contribution converted to fixed point (fixed.go);
//  3. an exact reduction of the gradients (AllreduceInt64; the
//     communicator has no reduce-scatter, so each rank keeps its shard's
//     part), converted once to float32;
//  4. Adam(W) on the rank's shard (adam.go), element by element in explicit
//     float32 operations; the master weights become the parameters;
//  5. an all-gather of the parameter shards.
//
// The collectives carry at most 2^20 parameters at a time, so memory beyond
// the model state stays bounded whatever --params is.
//
// # Model and data
//
// Sample s has the target t_i(s) = Σ_{r<K} a_r(s)·u_r(i) over the parameters,
// a rank-K combination of a fixed random basis u (recomputed on the fly, no
// memory) with per-sample coefficients a_r(s) drawn around true
// coefficients. The loss is the squared error ½ Σ_i (w_i - t_i(s))², averaged
// over the batch; its gradient costs K multiply-adds per parameter and sample
// (K is --compute), and Adam brings the loss down to the noise floor of the
// coefficients. Every random number is a counter-based splitmix64 draw keyed
// by the seed and by (step, sample index in the global batch), (parameter
// index, r) or the parameter index, so the data stream does not depend on
// the world size or on which rank handles a sample (data.go, kernel.go).
//
// # Determinism
//
// Integer sums do not depend on grouping, each sample's loss is computed
// whole by one rank in a fixed order, and Adam is elementwise, so the same
// seed gives bitwise the same parameters and optimizer state for every world
// size that divides --batch, for any shard boundaries, on every run. The
// products are converted to float32 before they are added, which forbids
// fused multiply-adds, so other architectures agree too.
//
// # Output
//
// Rank 0 prints the loss per parameter (at the start of step 0, every
// --log-every steps and at the last step) and, at the end, the SHA-256 of
// the final parameters and of the optimizer state gathered in canonical
// order (m, then v, then the master weights, each over all parameters in
// index order, little-endian float32):
//
//	step 0 loss 0.620578653
//	…
//	params sha256 …
//	optimizer sha256 …
//
// Every rank checks that all ranks hold the same parameters before the
// hashes are printed.
//
// # Signals
//
// SIGINT and SIGTERM stop a rank. SIGUSR1 (Slurm's preemption notice,
// which gorun forwards to every rank) does not: every rank that gets it
// prints "dptrain: rank N: got SIGUSR1 at step S (a preemption notice);
// going on" on its standard error before step S (S = --steps: after the
// last) and trains on, to the same hashes. Unhandled, the Go runtime would
// ignore it silently.
//
// # Failures and exit codes
//
// --fail-at-step S --fail-rank R makes rank R crash at the start of step S,
// after steps 0…S-1 completed: it prints a line and exits with code 1, or
// kills itself with the signal named by --fail-signal. It does so only in
// the job's first run: not after gorun restarted the ranks
// (GORUN_RESTART_COUNT > 0), not in a rank gorun started in a later epoch
// to replace a lost one (GORUN_EPOCH > 0), not after a recovery in place.
// Without recovery the other ranks then fail with a lost peer (exit code
// 1). A bad command line, or a world size that does not divide --batch,
// exits with code 2. The ranks compare their flags at the start (and after
// every recovery), all but those of fault injection and
// --rebuild-timeout.
//
// # Recovery
//
// With --protect, gorun protects each rank's optimizer shard and a meta
// region (step and a hash of the flags and world) every step. After gorun
// restarted the ranks (--recovery restart), each resumes from the step G
// every rank can recover, gathers the parameters and goes on at G+1.
//
// Under gorun --recovery in-place the surviving ranks keep their
// processes: when a collective fails because the job moved to a new epoch
// (comm.ErrEpochChanged), or because a peer was lost (comm.ErrPeerLost,
// gorun then publishes the new epoch), or when the state protection ended
// a stage that waited for a step the lost rank would never protect, the
// rank joins the new epoch's world (comm.Comm.Rebuild), waiting for it at
// most --rebuild-timeout (default 2m; 0: it does not wait, the loss ends
// it), restores again (the service rolls it back to the epoch's G,
// discarding its later steps), gathers the parameters and goes on at G+1,
// as many times as epochs change, a change during a recovery too. The
// ranks gorun starts in the new epoch on a replacement host restore from
// their peers' replicas and meet the survivors in the same collectives.
// The steps after G are trained again, so the final hashes are those of a
// run without failure. Without --protect an epoch change ends the rank
// with an error saying so (its state could not be rebuilt in place).
//
// Under gorun --protect-mode diff each rank hands the service its step's
// gradient and Adam hyper-parameters (its update is replay's Adam, so the
// holders replay it bitwise). Without --device-grad the gradient of its
// shard is a slice of the exactly reduced gradient every rank holds: the
// rank declares it (rank.Optimizer.Reduced) and writes, from the same
// sums, the slices its deposit plan asks for (protect.Client.Deposits), so
// that a holder on its host takes its peers' gradients from it, not from
// the network ("local peer" in gorun -v). With --device-grad each shard's
// gradient is emulated on its own rank from its own weights, not reduced:
// no peer has it, and the gradients go over the network.
//
// --ckpt-dir DIR --ckpt-every N is the checkpoint-restart baseline (what a
// torchrun user has), for comparison: after steps N-1, 2N-1, … each rank
// writes its optimizer shard, step and state hash to DIR/rank-<r>.ckpt
// (a temporary file, synced, renamed over it; the previous one is kept as
// rank-<r>.ckpt.prev) and, at start, resumes from the newest step every
// rank has a checkpoint of, training the steps since again (ckpt.go
// documents the file). A corrupt file, or one of a run with other flags
// or another world, is an error, never resumed from. It excludes
// --protect.
package main
