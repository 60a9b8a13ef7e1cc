package hotswap

import (
	"fmt"
	"syscall"
)

// An Event is something the machine learns. The set is closed: only this
// package's types implement it.
type Event interface {
	event()
	String() string
}

// RankExited: a rank's process ended. Stopped means the launcher ended it
// (a stop, a restart); Abort that it called MPI_Abort.
type RankExited struct {
	Rank, Host int
	Pid        int    // the process's id, for reports (0: not known)
	Gen        uint64 // the generation the rank was started in
	Code       int
	Signal     syscall.Signal // > 0: killed by this signal
	Abort      bool
	Stopped    bool
	Msg        string
}

// AgentExited: a host's agent ended or could not be reached (the host is
// lost).
type AgentExited struct {
	Host int
	Why  string
}

// AgentRegistered: a host's agent registered; Spare says it offers itself
// as a spare (a host without ranks).
type AgentRegistered struct {
	Host  int
	Spare bool
}

// Heartbeat: a host's agent was heard from.
type Heartbeat struct{ Host int }

// ControlDropped: the control connection to a host's agent dropped. The
// host is suspected.
type ControlDropped struct{ Host int }

// ReplicationFailed: replication from host From to host To failed. To is
// suspected.
type ReplicationFailed struct{ From, To int }

// PeerLost: a rank reported a PeerLostError naming Peers. Their hosts are
// suspected.
type PeerLost struct {
	Rank  int
	Peers []int
}

// GPU fault classes, as package gpu classifies them. A permanent fault
// (uncorrectable memory errors, a GPU off the bus, NVLink or firmware
// failures: the device cannot be trusted until it is reset) replaces the
// host, as DEADPOOL's Table II treats device-level failures; the others
// are reported only (a transient fault's rank exits on its own, and that
// exit decides).
const (
	GPUPermanent = "permanent"
	GPUTransient = "transient"
	GPUUnknown   = "unknown"
)

// GPUHealth: a GPU health report from a host's agent.
type GPUHealth struct {
	Host, GPU int
	Class     string
	Msg       string
}

// replaces reports whether the fault's class requires replacing the host.
func (e GPUHealth) replaces() bool { return e.Class == GPUPermanent }

// CopiesCorrupt: rank Rank's restore of step Step failed, and the
// copies of its optimizer shard the holder ranks Holders sent it failed
// their CRC32C (rank.ErrCopyCRC: a byte of the copy changed in memory).
// It comes just before the rank's exit. When that exit is a failure of
// the current generation and Step is G, the machine marks those copies
// invalid, as a lost holder's (with an exit that is no failure, of
// another generation, or another step, the report is stale and
// ignored); the failure is then part of the recovery that ran the
// restore: restored from another valid copy, rolled back to the durable
// tier (Config.Durable) when none is left, or the job stops naming the
// rank and the cause.
type CopiesCorrupt struct {
	Rank    int
	Step    int64
	Holders []int
}

// Progress: rank Rank committed step Step (for hang detection and I4).
type Progress struct {
	Rank int
	Step int64
}

// Signal: the launcher received a signal.
type Signal struct{ Sig syscall.Signal }

// Tick: time passed; deadlines due by now fire.
type Tick struct{}

// GPublished: G, the globally recoverable step, is now at least G.
type GPublished struct{ G int64 }

// Replicated: every copy of Owner's optimizer shard is at its holders
// again (Owner < 0: every owner's). In diff mode under erasure coding
// (Config.Diff), only once H, the newest base every rank coded, reached
// the epoch's G: a replacement holds nothing below it (ecdiff.go).
type Replicated struct{ Owner int }

// Stage is a point a recovery epoch reaches.
type Stage int

const (
	StagePublished Stage = iota // every agent has the epoch's table
	StageRestored               // every rank's state is restored
	StageResumed                // the first step after the resume finished
)

func (s Stage) String() string {
	switch s {
	case StagePublished:
		return "published"
	case StageRestored:
		return "restored"
	case StageResumed:
		return "resumed"
	}
	return fmt.Sprintf("stage(%d)", int(s))
}

// RecoveryReport: recovery epoch Epoch reached Stage. Reports of other
// epochs are ignored.
type RecoveryReport struct {
	Epoch uint64
	Stage Stage
}

func (RankExited) event()        {}
func (AgentExited) event()       {}
func (AgentRegistered) event()   {}
func (Heartbeat) event()         {}
func (ControlDropped) event()    {}
func (ReplicationFailed) event() {}
func (PeerLost) event()          {}
func (GPUHealth) event()         {}
func (CopiesCorrupt) event()     {}
func (Progress) event()          {}
func (Signal) event()            {}
func (Tick) event()              {}
func (GPublished) event()        {}
func (Replicated) event()        {}
func (RecoveryReport) event()    {}

func (e RankExited) String() string {
	s := fmt.Sprintf("rank-exited rank=%d host=%d gen=%d code=%d", e.Rank, e.Host, e.Gen, e.Code)
	if e.Pid > 0 {
		s += fmt.Sprintf(" pid=%d", e.Pid)
	}
	if e.Signal > 0 {
		s += " signal=" + SignalName(e.Signal)
	}
	if e.Abort {
		s += " abort"
	}
	if e.Stopped {
		s += " stopped"
	}
	return s
}
func (e AgentExited) String() string {
	return fmt.Sprintf("agent-exited host=%d why=%q", e.Host, e.Why)
}
func (e AgentRegistered) String() string {
	return fmt.Sprintf("agent-registered host=%d spare=%t", e.Host, e.Spare)
}
func (e Heartbeat) String() string      { return fmt.Sprintf("heartbeat host=%d", e.Host) }
func (e ControlDropped) String() string { return fmt.Sprintf("control-dropped host=%d", e.Host) }
func (e ReplicationFailed) String() string {
	return fmt.Sprintf("replication-failed from=%d to=%d", e.From, e.To)
}
func (e PeerLost) String() string {
	return fmt.Sprintf("peer-lost rank=%d peers=%s", e.Rank, ints(e.Peers))
}
func (e GPUHealth) String() string {
	return fmt.Sprintf("gpu host=%d gpu=%d class=%s", e.Host, e.GPU, e.Class)
}
func (e CopiesCorrupt) String() string {
	return fmt.Sprintf("copies-corrupt rank=%d step=%d holders=%s", e.Rank, e.Step, ints(e.Holders))
}
func (e Progress) String() string   { return fmt.Sprintf("progress rank=%d step=%d", e.Rank, e.Step) }
func (e Signal) String() string     { return "signal " + SignalName(e.Sig) }
func (Tick) String() string         { return "tick" }
func (e GPublished) String() string { return fmt.Sprintf("g %d", e.G) }
func (e Replicated) String() string { return fmt.Sprintf("replicated owner=%d", e.Owner) }
func (e RecoveryReport) String() string {
	return fmt.Sprintf("recovery epoch=%d stage=%s", e.Epoch, e.Stage)
}
