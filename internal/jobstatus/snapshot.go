// Package jobstatus is what `gorun status` shows of a running job: the
// Snapshot the launcher fills and serves on its control plane, its JSON
// form (the field names below are the documented interface for scripts),
// the table a person reads (Render), and the per-user registry through
// which `gorun status` finds the running jobs without being told their id
// (registry.go).
//
// # Trust
//
// A snapshot is served only to the holder of the job's status credential
// (a NATS nkey of its own, which may publish the status request and
// nothing else; see ctlserver.StatusUser), which the registry entry holds
// in a file only the job's user can read. A snapshot carries no secret.
package jobstatus

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Version is the version of the snapshot's JSON form (Snapshot.Version).
// Fields may be added within a version; a client ignores the ones it
// does not know. A field's meaning or type never changes within a
// version: a change that would is a new version, and gorun status warns
// when a job's snapshot is newer than it knows (CheckVersion), as gorun
// report refuses a newer events file (events.CheckSchema). Version 1 is
// the form of the first release that has gorun status; what changed
// while it was being written counts as no version.
const Version = 1

// ErrVersion is CheckVersion's error.
var ErrVersion = errors.New("jobstatus: snapshot version")

// CheckVersion checks that s is of a version this package knows: an
// error wrapping ErrVersion if it is newer than Version, or has none (not
// a gorun snapshot).
func CheckVersion(s *Snapshot) error {
	switch {
	case s.Version <= 0:
		return fmt.Errorf("%w: the snapshot has no version", ErrVersion)
	case s.Version > Version:
		return fmt.Errorf("%w %d is newer than this gorun reads (%d): fields may be missing or mean something else; use a newer gorun", ErrVersion, s.Version, Version)
	}
	return nil
}

// Host states.
const (
	HostRunning = "running" // runs ranks
	HostLost    = "lost"    // lost (fenced); its ranks moved
	HostSpare   = "spare"   // an idle spare, waiting to replace a lost host
	HostFree    = "free"    // no rank and not a spare (a used-up host)
	// A spare whose agent has not registered yet, or that is suspected
	// (it missed heartbeats and was asked for one): not counted among
	// the spares left.
	HostStarting  = "starting"
	HostSuspected = "suspected"
)

// Snapshot is a job as its launcher sees it at one moment.
type Snapshot struct {
	Version int       `json:"version"`
	Job     string    `json:"job"`
	PID     int       `json:"pid"` // the launcher's
	Prog    string    `json:"prog"`
	Args    []string  `json:"args,omitempty"`
	Start   time.Time `json:"start"`
	Now     time.Time `json:"now"` // when the snapshot was taken
	// State is "starting" (before the first epoch table), "running",
	// "recovering" (a recovery epoch under way) or "stopping".
	State string `json:"state"`
	NP    int    `json:"np"`
	Epoch uint64 `json:"epoch"`
	Gen   uint64 `json:"gen"` // restart generation
	// G is the globally recoverable step (-1: none yet).
	G int64 `json:"g"`
	// D is the durable tier's watermark, the newest step committed on
	// disk by every rank; absent without a durable tier or before its
	// first commit.
	D *int64 `json:"d,omitempty"`
	// Redundancy is the redundancy in place ("replicas:K", K the fewest
	// other hosts' copies any rank has, 0 when none could be placed; or
	// "ec:K+M"), as the events file's launch record says it; Protect (the
	// protect mode, "full" or "diff") and Recovery ("in-place" or
	// "restart") are the job's configuration.
	Redundancy string `json:"redundancy"`
	Protect    string `json:"protect"`
	Recovery   string `json:"recovery"`
	// MetricsURL is the launcher's Prometheus endpoint (--metrics), or "".
	MetricsURL string `json:"metrics_url,omitempty"`
	Hosts      []Host `json:"hosts"`
	// Spares are the idle spares left, by name.
	Spares []string `json:"spares"`
	// Failures are the recent failures, oldest first (at most
	// MaxFailures).
	Failures []Failure `json:"failures"`
	// Ranks is every rank's row, by rank; present only when asked for
	// (--ranks, --json).
	Ranks []Rank `json:"ranks,omitempty"`
}

// Host is one host of the job.
type Host struct {
	Name  string `json:"name"`
	Addr  string `json:"addr,omitempty"`
	State string `json:"state"` // HostRunning, HostLost, HostSpare, HostFree, HostStarting, HostSuspected
	// Ranks are the host's ranks now, in compact form ("0-3,8").
	Ranks  string `json:"ranks"`
	NRanks int    `json:"nranks"`
	// The minimum and maximum over the host's ranks of each tier's newest
	// step (-1: none); absent for a host without ranks.
	Committed  *Range `json:"committed,omitempty"`
	Replicated *Range `json:"replicated,omitempty"`
	Durable    *Range `json:"durable,omitempty"`
}

// Range is a minimum and a maximum.
type Range struct {
	Min int64 `json:"min"`
	Max int64 `json:"max"`
}

// Rank is one rank's row.
type Rank struct {
	Rank int    `json:"rank"`
	Host string `json:"host"`
	// Newest step committed in the rank's own slot, replicated at all
	// its holders, and on disk (its newest durable marker; -1: none, or
	// no durable tier).
	Committed  int64 `json:"committed"`
	Replicated int64 `json:"replicated"`
	Durable    int64 `json:"durable"`
	// WaitSeconds is the rank's total wait at the overwrite rule in this
	// generation.
	WaitSeconds float64 `json:"wait_seconds"`
}

// MaxFailures bounds the failures a snapshot carries: the newest.
const MaxFailures = 32

// Failure is one failure the recovery state machine decided on (package
// hotswap's Failed: one per incident; the ranks a lost host takes with
// it are that failure, not more), what it decided, and how the job got
// over it. The events file's failure record of it has the same class,
// decision, epoch and reason (msg there, why here), and
// gorun_failures_total counts it under the same class and decision.
type Failure struct {
	// Epoch is the recovery epoch the decision started or joined (the
	// events file's timeline of it has the same); 0 for none: decision
	// none or abort, and wait until the replacement is chosen (the
	// splice's epoch then).
	Epoch uint64 `json:"epoch"`
	// At is when the failure was first seen (a suspected host's
	// suspicion, the first rank failure of a failure window); its
	// recovery epoch's detection.
	At time.Time `json:"at"`
	// Class is the machine's classification: "host-loss" (the host's
	// agent exited or failed, its heartbeats stopped, or a suspicion of
	// it was not cleared in time), "rank-exit" (a rank ended badly on its
	// own: an exit status, a signal, MPI_Abort), "hang" (a rank made no
	// progress for --hang-timeout) or "gpu-permanent" (a GPU fault that
	// takes its host).
	Class string `json:"class"`
	// Decision is what the machine did: "splice" (the host's ranks moved
	// to a spare or a host with free slots), "restart" (every rank
	// restarted in place), "rollback" (to the durable tier), "wait" (for
	// a suspected host to answer before choosing the replacement; With
	// and Epoch are filled in once the splice follows), "abort" (the job
	// stops) or "none" (nothing to recover: a spare or a host without
	// ranks, the job stopping or done, a GPU fault nothing can replace
	// the host for).
	Decision string `json:"decision"`
	// Why is the failure in the machine's words ("no heartbeat for 3s",
	// "rank 1 on host a (pid 12) exited with code 3").
	Why string `json:"why"`
	// Cause is the recovery epoch's cause as its timeline gives it once
	// the epoch ended ("host h2 lost: no heartbeat for 3s"); "" before,
	// and without an epoch.
	Cause string `json:"cause"`
	// Host is the failed host (for a rank's failure, the rank's host);
	// Rank the failed rank, or -1 for the host as a whole.
	Host string `json:"host,omitempty"`
	Rank int    `json:"rank"`
	// With is where a lost host's ranks went, Ranks the ranks moved,
	// Spare whether With was a spare (a splice; absent otherwise).
	With  string `json:"with,omitempty"`
	Ranks string `json:"ranks,omitempty"`
	Spare bool   `json:"spare,omitempty"`
	// RecoverySeconds is the time from the epoch's detection to every
	// rank resumed; absent while the recovery is under way, if it never
	// resumed, and without an epoch.
	RecoverySeconds *float64 `json:"recovery_seconds,omitempty"`
	// Done: nothing more will come of the failure: its epoch ended
	// (resumed, or superseded by a later failure), there was nothing to
	// recover (decision none), or the job stops (decision abort, or a
	// later failure's: a wait or a recovery under way then ends with it).
	Done       bool `json:"done"`
	Superseded bool `json:"superseded,omitempty"`
}

// Compact writes ranks (ascending) as ranges: "0-3,8,10-11".
func Compact(ranks []int) string {
	var b strings.Builder
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ranks[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(ranks[j]))
		}
		i = j + 1
	}
	return b.String()
}
