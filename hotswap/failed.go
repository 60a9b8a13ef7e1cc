package hotswap

import (
	"fmt"
	"syscall"
	"time"
)

// FailureClass is what kind of failure the machine took a decision on
// ([Failed]).
type FailureClass string

// The failure classes.
const (
	// ClassHostLoss: a host was lost: its agent exited or failed, its
	// heartbeats stopped, or a suspicion of it was not cleared in time.
	ClassHostLoss FailureClass = "host-loss"
	// ClassRankExit: a rank ended badly on its own (an exit status, a
	// signal, MPI_Abort).
	ClassRankExit FailureClass = "rank-exit"
	// ClassHang: a rank made no progress for the hang timeout
	// (Config.HangTimeout); the machine stops it.
	ClassHang FailureClass = "hang"
	// ClassGPUPermanent: a GPU reported a fault that takes its host.
	ClassGPUPermanent FailureClass = "gpu-permanent"
)

// FailureClasses are the failure classes, in a fixed order (a bounded
// label set: a caller may make a series of each in advance).
func FailureClasses() []FailureClass {
	return []FailureClass{ClassHostLoss, ClassRankExit, ClassHang, ClassGPUPermanent}
}

// Decision is what the machine did about a failure ([Failed]).
type Decision string

// The decisions.
const (
	// DecisionSplice: the lost host's ranks move to a replacement (a
	// spare, or a host with free slots) in a new recovery epoch.
	DecisionSplice Decision = "splice"
	// DecisionRestart: every rank restarts in place in a new generation.
	DecisionRestart Decision = "restart"
	// DecisionRollback: the job rolls back to the durable tier.
	DecisionRollback Decision = "rollback"
	// DecisionWait: the lost host's ranks wait for a suspected host to
	// answer before their replacement is chosen (a Splice, or an Abort,
	// follows later).
	DecisionWait Decision = "wait"
	// DecisionAbort: the job stops.
	DecisionAbort Decision = "abort"
	// DecisionNone: nothing to recover: a spare or a host without ranks
	// was lost, the job was stopping or its ranks had ended, or a GPU
	// fault that nothing can replace its host for.
	DecisionNone Decision = "none"
)

// Decisions are the decisions, in a fixed order (a bounded label set).
func Decisions() []Decision {
	return []Decision{DecisionSplice, DecisionRestart, DecisionRollback, DecisionWait, DecisionAbort, DecisionNone}
}

// Failed: the machine took a decision on a failure: one per incident
// (rank failures collected in the failure window, and the rank failures a
// host loss causes, are the one failure it decided on). It comes before
// the decision's actions (Fence, Splice, Restart, Abort, ...).
type Failed struct {
	Host int
	Name string
	// Rank is the failed rank (ClassRankExit, ClassHang), or -1 for the
	// host as a whole.
	Rank  int
	Class FailureClass
	// Agent: a host loss because its agent exited or failed.
	Agent    bool
	Decision Decision
	// Epoch is the recovery epoch the decision started or joined; 0 for
	// none (DecisionAbort, DecisionNone, DecisionWait).
	Epoch uint64
	// Code and Signal are a rank's exit status and the signal that ended
	// it (ClassRankExit; Signal 0 when it exited).
	Code   int
	Signal syscall.Signal
	// Why says what failed and why, in words (the machine's reason:
	// "no heartbeat for 3s", "rank 1 on host a made no progress for ...").
	Why string
	// Detected is when the failure was first seen, on the machine's
	// clock: a suspected host's suspicion, the first rank failure of the
	// failure window, else when the decision was taken. The recovery
	// epoch the failure starts has the same Timeline.Detected.
	Detected time.Duration
}

func (Failed) action() {}

func (a Failed) String() string {
	s := fmt.Sprintf("failed host=%s", a.Name)
	if a.Rank >= 0 {
		s += fmt.Sprintf(" rank=%d", a.Rank)
	}
	s += " class=" + string(a.Class)
	if a.Agent {
		s += " (agent)"
	}
	s += " decision=" + string(a.Decision)
	if a.Epoch > 0 {
		s += fmt.Sprintf(" epoch=%d", a.Epoch)
	}
	return s + " why=" + fmt.Sprintf("%q", a.Why)
}

// failed emits f and returns the function that, called once the
// decision's actions follow it, fills in f's decision and epoch from
// them.
func (m *Machine) failed(f Failed) func() {
	i, epoch, awaiting := len(m.out), m.epoch, len(m.awaiting)
	m.emit(f)
	return func() {
		f := m.out[i].(Failed)
		f.Decision = DecisionNone
		rank := func(d Decision) int {
			return map[Decision]int{DecisionNone: 0, DecisionWait: 1, DecisionRestart: 2, DecisionSplice: 3, DecisionRollback: 4, DecisionAbort: 5}[d]
		}
		set := func(d Decision) {
			if rank(d) > rank(f.Decision) {
				f.Decision = d
			}
		}
		for _, a := range m.out[i+1:] {
			switch a.(type) {
			case Abort:
				set(DecisionAbort)
			case GatherReach, RollbackToDisk:
				set(DecisionRollback)
			case Restart:
				set(DecisionRestart)
			case Splice:
				set(DecisionSplice)
			}
		}
		if len(m.awaiting) > awaiting {
			set(DecisionWait)
		}
		switch {
		case f.Decision == DecisionAbort || f.Decision == DecisionNone || f.Decision == DecisionWait:
		case m.epoch > epoch || m.rec != nil:
			f.Epoch = m.epoch
		}
		m.out[i] = f
	}
}

// OpenTimeline returns the recovery epoch under way's timeline so far,
// Unfinished, and true; false when none is under way. A job that ends
// mid-recovery has one.
func (m *Machine) OpenTimeline() (Timeline, bool) {
	if m.rec == nil {
		return Timeline{}, false
	}
	t := m.rec.tl
	t.Unfinished = true
	return t, true
}
