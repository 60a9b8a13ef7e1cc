package keeper

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gorun/gorun/ckpt"
)

// CorruptError says that a rank's committed state changed in memory after
// it was committed (memory corruption, or a write through the read-write
// views into a committed slot): its bytes no longer match the CRC32Cs
// taken at commit. The step can never be replicated, so it can never
// become recoverable everywhere, and the job cannot go on without failing
// the rank (Config.Failed). It matches ckpt.ErrCorrupt.
type CorruptError struct {
	Rank   int
	Step   int64
	Region string
	Sum    uint32 // the region's CRC32C as committed
	Got    uint32 // its bytes' CRC32C now
	// Replay: found by a replica holder in diff mode, whose replay of the
	// rank's differentials up to Step does not give the state the rank
	// committed (ErrReplayDiffers); Detail is the holder's account.
	Replay bool
	// Detail, without Replay: what was found when it names no region (a
	// parity row holding other bytes of the rank's share of Step than
	// those of its commit, read by an earlier encoding).
	Detail string
}

// ErrReplayDiffers: in diff mode, a replica holder's replay of a rank's
// differentials does not give the state the rank committed: the
// trainer's optimizer step is not replay.Step with the gradient and
// hyper-parameters it handed (PROTOCOL.md, the optimizer contract), so
// the holder's copy cannot restore the rank. A *CorruptError with Replay
// set matches it.
var ErrReplayDiffers = errors.New("the replay of the rank's differentials differs from its committed state (its optimizer step is not replay.Step of the gradient and hyper-parameters it handed)")

func (e *CorruptError) Error() string {
	if e.Replay {
		return fmt.Sprintf("rank %d step %d: %v: %s", e.Rank, e.Step, ErrReplayDiffers, e.Detail)
	}
	if e.Region == "" && e.Detail != "" {
		return fmt.Sprintf("state of rank %d corrupted in memory: step %d: %s", e.Rank, e.Step, e.Detail)
	}
	return fmt.Sprintf("state of rank %d corrupted in memory: step %d, CRC mismatch in region %s (CRC32C %08x, committed %08x)",
		e.Rank, e.Step, e.Region, e.Got, e.Sum)
}

func (e *CorruptError) Unwrap() error { return ckpt.ErrCorrupt }

// Is reports whether target is ErrReplayDiffers and e was found by a
// holder's replay.
func (e *CorruptError) Is(target error) bool { return e.Replay && target == ErrReplayDiffers }

// ErrUnrecoverable is wrapped by a restore by decode (erasure coding,
// Source.Decode) that cannot rebuild the rank's state at the step: fewer
// than K of its stripe's K+M shards are left, none of the stripe's parity
// rows answers, or no K of the shards left rebuild bytes that match the
// rank's committed CRC32Cs. It is never wrong bytes: nothing is committed.
// No retry can help at that step.
var ErrUnrecoverable = errors.New("rank: unrecoverable from the erasure-coded stripe")

// ErrCopyCRC is wrapped by a fetch or copy of a rank's state (a replica
// holder's copy, a slot) whose bytes do not match the CRC32Cs the rank
// committed them with: the copy changed in memory after it was taken.
// It is never used: another copy, or the durable tier, may serve.
var ErrCopyCRC = errors.New("the copy's bytes do not match their committed CRC32C")

// ErrCopiesCorrupt is matched by a *CopiesCorruptError: a restore that
// failed, some of whose replica holders' copies failed their CRC32C.
var ErrCopiesCorrupt = errors.New("rank: replica copies failed their CRC32C")

// CopiesCorruptError is a restore of rank Rank at step Step that failed
// (no copy, no decode, nor the durable tier gave the state), whose copies
// at holder ranks Holders failed their CRC32C (ErrCopyCRC). Err is the
// restore's error. The agent reports Holders with the rank's exit
// (Keeper.TakeCorruptCopies), so that the launcher counts those copies as
// lost. It matches ErrCopiesCorrupt and whatever Err matches.
type CopiesCorruptError struct {
	Rank    int
	Step    int64
	Holders []int
	Err     error
}

func (e *CopiesCorruptError) Error() string {
	return fmt.Sprintf("rank %d step %d: the copies at holder ranks %v failed their CRC32C: %v", e.Rank, e.Step, e.Holders, e.Err)
}

func (e *CopiesCorruptError) Unwrap() []error { return []error{ErrCopiesCorrupt, e.Err} }

// corruptNote is a failed restore's CopiesCorruptError, kept until the
// agent reports the rank's exit. gen is the restart generation the
// restore ran in: a note of another generation is of a rank process
// gone (a restore still running when its rank was killed), never of the
// exit being reported.
type corruptNote struct {
	gen     uint64
	step    int64
	holders []int
}

// noteCorruptCopies keeps the holders whose copies of rank's state at
// step failed their CRC32C in a failed restore of generation gen (none:
// forgets the rank's).
func (h *Keeper) noteCorruptCopies(rank int, gen uint64, step int64, holders []int) {
	h.corruptMu.Lock()
	defer h.corruptMu.Unlock()
	if len(holders) == 0 {
		delete(h.corrupt, rank)
		return
	}
	if h.corrupt == nil {
		h.corrupt = map[int]corruptNote{}
	}
	h.corrupt[rank] = corruptNote{gen, step, slices.Clone(holders)}
}

// ForgetCorruptCopies drops local rank's note of a failed restore, if
// any: the agent calls it as it spawns a process for the rank, whose
// restore is a new one.
func (h *Keeper) ForgetCorruptCopies(rank int) {
	h.noteCorruptCopies(rank, 0, 0, nil)
}

// TakeCorruptCopies returns, and forgets, the step and holder ranks of
// local rank's last restore if it failed with copies failing their
// CRC32C (a CopiesCorruptError) in the host's current restart
// generation; ok is false otherwise (a note of an earlier generation is
// dropped). The agent calls it as the rank exits, to report them with
// its exit.
func (h *Keeper) TakeCorruptCopies(rank int) (step int64, holders []int, ok bool) {
	gen := h.Gen()
	h.corruptMu.Lock()
	defer h.corruptMu.Unlock()
	n, ok := h.corrupt[rank]
	delete(h.corrupt, rank)
	if !ok || n.gen != gen {
		return 0, nil, false
	}
	return n.step, n.holders, true
}
