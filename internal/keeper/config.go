package keeper

import (
	"cmp"
	"errors"
	"log/slog"
	"net"

	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
	"github.com/gorun/gorun/topology"
)

// ErrStopping: the host's state protection is shutting down.
var ErrStopping = errors.New("rank: state protection stopping")

// Config describes one host's state protection.
type Config struct {
	Job string
	// LinkKey authenticates the replication links between hosts
	// (jobkey.Secret.LinkKey; ranks never hold it).
	LinkKey jobkey.Key
	Host    int // this host's index
	Hosts   int // number of hosts of the job
	// Ranks are this host's ranks (none for a spare's: SetPlacement
	// gives it ranks).
	Ranks []int
	// Dir holds the slot files ("" = /dev/shm).
	Dir string
	// Holders[r] are the ranks holding rank r's replicas, for every rank
	// of the job (nil or empty: no replicas). Peers[r] are the ranks at
	// r's (tp, pp) coordinate, in data-parallel order, for restoring
	// params (Tier-2).
	Holders [][]int
	Peers   func(rank int) []int
	// HostOf maps a rank to its host index. Holders and HostOf are the
	// first placement's: SetPlacement replaces them.
	HostOf func(rank int) int
	// Listener accepts replication links from other hosts (nil: none are
	// expected, e.g. a single-host job). The Keeper owns it.
	Listener net.Listener
	// Changed is called (from any goroutine, never under a lock the caller
	// might need) when a rank's progress changed: see Keeper.Progress.
	Changed func()
	// Failed is called (from any goroutine, never under a lock) when local
	// rank rank of restart generation gen cannot go on: its committed
	// state is corrupt (a *CorruptError; a holder refused its bytes and
	// the rank's slot no longer matches its committed CRC32Cs), or, in
	// diff mode under erasure coding, the snapshot of a base it retains
	// on its data host has not fit in the host's replica-memory reserve
	// for a while (an error wrapping the reserve's refusal). Its step
	// will never be replicated, so G stops and every rank would wait at
	// the overwrite rule: the caller must fail the rank (kill it and report
	// it, so that the job restarts or stops). The rank's own Stage
	// requests are refused with err meanwhile. Nil: only logged.
	Failed func(rank int, gen uint64, err error)
	// LinkFailed is called (from any goroutine, never under a lock) when
	// replication from this host to host failed at the link (it could not
	// be dialed, or broke; not a refusal by the host): once per host per
	// placement (New's, then each SetPlacement's). The replication is
	// retried meanwhile. Nil: only logged.
	LinkFailed func(host int, err error)
	// Mode is how the replicated regions reach the holders: ModeFull
	// ("" too) or ModeDiff, configured by Diff.
	Mode protect.ProtectMode
	Diff DiffConfig
	// EC is the first placement's erasure-coding layout (Placement.EC;
	// nil: replicas only), Epoch the epoch of the table it comes from
	// (Placement.Epoch). In diff mode (ModeDiff) only base steps are
	// coded and the differentials since are kept on M hosts
	// (PROTOCOL.md, "Erasure coding and diff mode").
	EC    []topology.ECGroup
	Epoch uint64
	// DiffLog, in diff mode, has every local rank's differentials
	// appended to the job's durable directory too (difflog.go; nil:
	// none).
	DiffLog *DiffLogConfig
	// Persist is the durable tier (gorun --ckpt-dir; persist.go): each
	// rank's bases on disk. The zero value has none.
	Persist PersistConfig
	Log     *slog.Logger
}

// DiffConfig configures differential protection (Config.Mode ModeDiff).
//
// A holder keeps, per owner, a base (the owner's replicated regions), a
// refresh's buffers while one arrives, up to two spare sets of them (a
// fold's and a refresh's, reused rather than faulted in afresh each
// time), and the differentials not folded yet with their record buffers
// kept for reuse (Fold+2): with the lossless codec, whose records are a
// third of the optimizer region (W, M and V, one gradient), about
// (4 + (Fold+2)/3) times the owner's optimizer state at the most (5⅓ at
// the default Fold of 8), against full mode's 2 (two buffers). The
// agent reserves it as it grows, and refuses what would pass half the
// host's memory. A
// lossless log never holds more than Fold+1 differentials (folds pass a
// refresh in progress); a lossy one, whose folds stop at a refresh's step,
// at most about 2×Fold, the refresh being paced over at most Fold steps.
type DiffConfig struct {
	// Fold: a holder folds an owner's log into its base once the log
	// holds this many steps (gorun --diff-fold; 0 means 8).
	Fold int
	// BaseEvery: each holder gets a fresh base of the owner's state every
	// this many steps, in chunks paced over min(BaseEvery/2, Fold) steps
	// (gorun --base-every; 0 means 100).
	BaseEvery int
	// Codec encodes the gradients (gorun --diff-codec, ParseDiffCodec):
	// lossless unless a lossy codec was asked for. The zero value is
	// lossless (replay's Raw codec), as "raw" is.
	Codec replay.Options
}

// Defaults of DiffConfig.
const (
	defaultFold      = 8
	defaultBaseEvery = 100
)

func (c DiffConfig) fold() int      { return cmp.Or(max(c.Fold, 0), defaultFold) }
func (c DiffConfig) baseEvery() int { return cmp.Or(max(c.BaseEvery, 0), defaultBaseEvery) }

// refreshSteps returns over how many steps the owner spreads a base
// refresh: min(BaseEvery/2, Fold), at least 1, so that a holder whose
// folds stop at the refresh (a lossy log) holds about 2×Fold
// differentials at most.
func (c DiffConfig) refreshSteps() int64 {
	return int64(max(1, min(c.baseEvery()/2, c.fold())))
}

// codec returns the options gradients are encoded with.
func (c DiffConfig) codec() replay.Options {
	if c.Codec == (replay.Options{}) {
		return replay.Options{Lossless: true}
	}
	return c.Codec
}

// lossless reports whether restores are bitwise (the codec is Raw).
func (c DiffConfig) lossless() bool { return c.codec().Lossless }

// Progress is one local rank's protection progress.
type Progress struct {
	Rank       int
	Committed  int64 // newest step committed locally, or -1
	Replicated int64 // newest step committed locally and acknowledged by every current holder since it became one, or -1
	Stages     int64 // Stage requests served
	WaitNS     int64 // their total wait at the overwrite rule
	// Replication: steps sent to every holder, the time that took
	// (from the first byte to the last acknowledgement) and the bytes
	// sent, summed over holders.
	ReplSteps int64
	ReplNS    int64
	ReplBytes int64
	// Of ReplBytes (diff mode): whole states, to holders lacking a base
	// and as paced refreshes (ReplBaseBytes), and differentials
	// (ReplDiffBytes). In full mode every byte is a base's.
	ReplBaseBytes int64
	ReplDiffBytes int64
	// Of the differentials the holders took (diff mode): those whose
	// gradient a holder took from a local data-parallel peer (sent by
	// reference, localpeer.go), and those sent with it.
	DiffLocal int64
	DiffNet   int64
	// The holders of the current placement whose newest differential
	// went by reference (they use the local source now), and with the
	// record.
	SourceLocal, SourceNet int
	// Restores: Restore requests served to the rank (answered with a
	// step, not an error) in this restart generation; a rank that
	// restores again in place after an epoch change counts again.
	Restores int64
	// Base (diff mode under EC): the newest base step b <= Replicated
	// whose every parity row acknowledged the rank's share of b and whose
	// clear bytes at b are kept on the rank's data host (its clear
	// holder's store pinned at b, or the owner's retained snapshot when it
	// runs on its data host); -1 for none. 0 in other modes.
	Base int64
	// Durable is the rank's durable tier (persist.go), nil without one
	// or before the rank opened its store.
	Durable *DurableProgress
}
