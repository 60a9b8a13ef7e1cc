package wire

import ()

// EventKind says what an Event reports.
type EventKind string

// Event kinds.
const (
	EventStarted    EventKind = "started"     // a rank's process started
	EventExited     EventKind = "exited"      // a rank's process ended
	EventAgentError EventKind = "agent-error" // the agent cannot go on
	EventAgentDone  EventKind = "agent-done"  // every rank of the agent has ended
	EventGPU        EventKind = "gpu"         // a GPU health event (GPU set)
	// EventEpoch: the agent has epoch Epoch's table.
	EventEpoch EventKind = "epoch"
	// EventReplFailed: replication from this host to host Peer failed
	// (Msg says why).
	EventReplFailed EventKind = "repl-failed"
	// EventPeerLost: rank Rank lost its links to ranks Peers (a
	// comm.PeerLostError).
	EventPeerLost EventKind = "peer-lost"
	// EventAbort: rank Rank, of generation Gen, called MPI_Abort (a PMI
	// abort) with exit code Code and message Msg; the agent is about to
	// kill it. Sent, and flushed to the server, before the kill, so that
	// the launcher has it before any failure the rank's death causes in
	// its peers (whose reports come after it on every connection). The
	// rank's own EventExited (Abort set) follows once it is reaped.
	EventAbort EventKind = "abort"
)

// MaxPeers bounds the peers an EventPeerLost names.
const MaxPeers = 1024

// MaxGPUs bounds a GPU index in a message.
const MaxGPUs = 1024

// GPU classes of a GPUReport, as package gpu names them.
const (
	GPUTransient = "transient"
	GPUPermanent = "permanent"
	GPUUnknown   = "unknown"
)

// GPUReport is the GPU part of an EventGPU: which device, what happened,
// its classification, and the ranks bound to the device. Msg describes it.
type GPUReport struct {
	Index int    `json:"i"`
	UUID  string `json:"uuid"`
	Kind  string `json:"kind"` // "xid", "ecc-double-bit", ...
	XID   uint64 `json:"xid,omitempty"`
	Class string `json:"class"`
	Ranks []int  `json:"ranks,omitempty"`
}

// Event is a report from an agent.
type Event struct {
	Kind EventKind `json:"k"`
	Host int       `json:"h"`
	Rank int       `json:"r"`
	Pid  int       `json:"pid,omitempty"`
	// Code is the exit status, or -1 when the process was ended by Signal.
	Code   int `json:"code"`
	Signal int `json:"sig,omitempty"`
	// Stopped is set when the rank ended after gorun asked it to stop, so its
	// exit is not a failure of its own.
	Stopped bool `json:"stopped,omitempty"`
	// Gen is the restart generation of the rank process (0: the first).
	Gen uint64 `json:"gen,omitempty"`
	// Abort: the rank called MPI_Abort (PMI abort) with exit code Code.
	Abort bool       `json:"abort,omitempty"`
	Msg   string     `json:"msg,omitempty"`
	GPU   *GPUReport `json:"gpu,omitempty"`   // EventGPU only
	Epoch uint64     `json:"epoch,omitempty"` // EventEpoch only
	Peer  int        `json:"peer,omitempty"`  // EventReplFailed only: a host
	Peers []int      `json:"peers,omitempty"` // EventPeerLost only: ranks
	// Corrupt: EventExited only, the rank's restore failed and the copies
	// of its state that holder ranks sent it failed their CRC32C
	// (rank.CopiesCorruptError): the launcher counts them lost.
	Corrupt *CorruptCopies `json:"corrupt,omitempty"`
}

// CorruptCopies are the replica holders whose copies of a rank's state at
// Step failed their CRC32C in the rank's restore.
type CorruptCopies struct {
	Step    int64 `json:"step"`
	Holders []int `json:"holders"`
}

// check validates c, the copies of rank's state.
func (c *CorruptCopies) check(rank int) error {
	if c.Step < 0 || len(c.Holders) == 0 || len(c.Holders) > MaxPeers {
		return malformed("event: rank %d's corrupt copies of step %d at %d holders", rank, c.Step, len(c.Holders))
	}
	for _, x := range c.Holders {
		if x < 0 || x >= MaxWorld || x == rank {
			return malformed("event: rank %d's corrupt copy at holder rank %d", rank, x)
		}
	}
	return nil
}

// DecodeEvent decodes and validates an Event. An event in the form the
// agents write goes through a hand-written fast path (decode_fast.go);
// any other input through encoding/json, with the same result.
func DecodeEvent(b []byte) (*Event, error) {
	e := new(Event)
	var ok bool
	if *e, ok = decodeEventFast(b); !ok {
		*e = Event{}
		if err := decode(b, e, "event"); err != nil {
			return nil, err
		}
	}
	return checkEvent(e)
}

// checkEvent returns e, just decoded, if it is valid. An empty list of
// peers or of GPU ranks becomes nil, as omitempty writes it, so that the
// event re-encodes and decodes to itself.
func checkEvent(e *Event) (*Event, error) {
	if len(e.Peers) == 0 {
		e.Peers = nil
	}
	if e.GPU != nil && len(e.GPU.Ranks) == 0 {
		e.GPU.Ranks = nil
	}
	if e.GPU != nil && e.Kind != EventGPU {
		return nil, malformed("event: a %s event with a GPU report", e.Kind)
	}
	if len(e.Peers) > 0 && e.Kind != EventPeerLost {
		return nil, malformed("event: a %s event naming peers", e.Kind)
	}
	if e.Corrupt != nil {
		if e.Kind != EventExited {
			return nil, malformed("event: a %s event with corrupt copies", e.Kind)
		}
		if err := e.Corrupt.check(e.Rank); err != nil {
			return nil, err
		}
	}
	switch e.Kind {
	case EventStarted, EventExited:
		if e.Rank < 0 {
			return nil, malformed("event: a %s event of rank %d", e.Kind, e.Rank)
		}
	case EventAbort:
		if e.Rank < 0 || e.Code < 0 || e.Code > 255 || e.Signal != 0 || e.Stopped {
			return nil, malformed("event: an abort of rank %d with code %d, signal %d, stopped %t", e.Rank, e.Code, e.Signal, e.Stopped)
		}
	case EventAgentError, EventAgentDone, EventEpoch:
	case EventReplFailed:
		if e.Peer < 0 || e.Peer >= MaxHosts || e.Peer == e.Host {
			return nil, malformed("event: replication to host %d failed, from host %d", e.Peer, e.Host)
		}
	case EventPeerLost:
		if e.Rank < 0 || len(e.Peers) == 0 || len(e.Peers) > MaxPeers {
			return nil, malformed("event: rank %d lost %d peers", e.Rank, len(e.Peers))
		}
		for _, p := range e.Peers {
			if p < 0 || p >= MaxWorld || p == e.Rank {
				return nil, malformed("event: rank %d lost peer %d", e.Rank, p)
			}
		}
	case EventGPU:
		if err := e.GPU.check(); err != nil {
			return nil, err
		}
	default:
		return nil, malformed("event: unknown kind %q", Truncate(string(e.Kind)))
	}
	if e.Host < 0 || e.Host >= MaxHosts || e.Rank < -1 || e.Rank >= MaxWorld {
		return nil, malformed("event: host %d rank %d out of range", e.Host, e.Rank)
	}
	if e.Signal < 0 || e.Signal > 128 {
		return nil, malformed("event: signal %d out of range", e.Signal)
	}
	if err := checkString("event message", e.Msg); err != nil {
		return nil, err
	}
	return e, nil
}

func (g *GPUReport) check() error {
	switch {
	case g == nil:
		return malformed("event: a gpu event without its report")
	case g.Index < 0 || g.Index >= MaxGPUs:
		return malformed("event: GPU index %d out of range", g.Index)
	case g.Class != GPUTransient && g.Class != GPUPermanent && g.Class != GPUUnknown:
		return malformed("event: GPU class %q", Truncate(g.Class))
	case len(g.Ranks) > MaxGPUs*8:
		return malformed("event: %d ranks on one GPU", len(g.Ranks))
	}
	for _, r := range g.Ranks {
		if r < 0 || r >= MaxWorld {
			return malformed("event: GPU rank %d out of range", r)
		}
	}
	if err := checkString("GPU UUID", g.UUID); err != nil {
		return err
	}
	return checkString("GPU event kind", g.Kind)
}

// ExitStatus is the status a shell would report for e: Code, or 128+Signal.
func (e *Event) ExitStatus() int {
	if e.Signal > 0 {
		return 128 + e.Signal
	}
	return e.Code
}
