package hotswap

import (
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/gorun/gorun/topology"
)

// Exit codes of the machine's own making; a rank's failure gives the
// rank's status, a signal 128 + its number.
const (
	ExitFailure = 1   // a host or agent failed, or recovery was impossible
	ExitTimeout = 124 // a rank hung (HangTimeout), as timeout(1)

	// CrashLoopFailures is how many rank failures in a row, with no
	// progress before any of them, are a crash loop that stops the job
	// whichever ranks were blamed (the same rank twice in a row is one at
	// once).
	CrashLoopFailures = 3
)

// Machine is the job's failure state machine. Create it with [New]; it is
// not safe for concurrent use.
type Machine struct {
	cfg    Config
	names  []string
	domain []string // a host's failure domain: its rack, else its switch
	layout topology.Layout

	now      time.Duration
	epoch    uint64
	gen      uint64
	restarts int
	g        int64 // the globally recoverable step; -1: none yet
	disk     int64 // the durable tier's commit record step (Config.Durable); -1: none yet

	// rb is the roll-back to the durable tier waiting for the ranks'
	// reach on disk (rollback.go), or nil; lostHosts the hosts lost
	// since the last recovery ended, for its report.
	rb        *rollback
	lostHosts []int

	// Ranks.
	rankHost  []int
	hostRanks [][]int
	holders   [][]int  // holders[r]: ranks keeping copies of r's optimizer shard
	copyOK    [][]bool // copyOK[r][i]: holders[r][i]'s copy is valid
	heldBy    [][]int  // heldBy[x]: the owners x holds a copy for
	missing   []int    // missing[r]: r's invalid copies (and under EC its shares not in)
	// corrupt[r] says which of r's copies a restore found failing their
	// CRC32C (CopiesCorrupt), for the reports; "" once r has every copy
	// again.
	corrupt []string
	// corruptStep[r] is the newest step a copy of r's shard was marked
	// corrupt at, or -1: a Replicated for r counts only once G passed it
	// (the re-sent copy is of a later step; the corrupt one may still sit
	// at its holder until then).
	corruptStep []int64
	// restoreBad is the rank whose restore in this generation found
	// copies failing their CRC32C (and marked them) and which then
	// failed, or -1: the generation's failure is part of the recovery
	// that ran the restore, not a new one (rankFailed).
	restoreBad int
	// corruptSeen[r]: the CopiesCorrupt reported with r's exit, which
	// follows it; acted on only if that exit is a failure of this
	// generation (onRankExited).
	corruptSeen []*CopiesCorrupt
	// abortWaits[r]: rank r's MPI_Abort in this generation, told by a
	// RankAborted before its exit, which the window's decision waits for
	// (abort.go).
	abortWaits map[int]abortWait
	under      int      // owners with a missing copy or share
	ec         *ecState // the erasure code (Config.EC), or nil
	// Diff mode under EC (ecdiff.go): logs[r] are rank r's log-only
	// holders, logOK[r][i] whether logs[r][i]'s copy is valid, and
	// retained[r] whether r's own retained base snapshot is (a rank that
	// runs on its data host); nil otherwise.
	logs     [][]int
	logOK    [][]bool
	retained []bool
	localOK  []bool  // the rank's own slot holds its state
	lastStep []int64 // last committed step reported (or published as G); -1: none
	// genStep is the step a rank last reported in the current
	// generation, -1: none (hang detection names the rank furthest
	// behind: lastStep keeps the highest ever, from before a restart).
	genStep  []int64
	lastProg []time.Duration
	ended    []bool // in the current generation
	nEnded   int
	nFailed  int // ranks that ended with a failure in this generation

	// Hosts.
	alive      []bool
	registered []bool
	spare      []bool // an idle spare
	lastSeen   []time.Duration
	suspected  []time.Duration // -1: not suspected
	suspectWhy []string
	agentGone  []bool // lost because its agent exited
	// faulty[h]: the permanent GPU fault host h stays with (moving its
	// ranks would have lost their state, or nothing could take them),
	// decided again when that may have changed (gpuRetry); nil: none.
	faulty  []*gpuFault
	nFaulty int // hosts with faulty set

	pending   *rankFailure
	pendingAt time.Duration
	awaiting  []awaitingLoss // lost hosts whose replacement waits for a suspicion to settle
	// protecting: the ranks protect their state (a progress report or a
	// G came): only then is a lost copy worth reporting.
	protecting bool
	announced  bool // under-protection was reported, and not its end

	// NextDeadline's answer, kept while valid: no later than the true
	// earliest deadline (a Tick that comes early finds nothing due and
	// the answer is worked out again), so that the frequent events, which
	// only postpone deadlines, cost O(1) and not O(hosts + ranks).
	next              time.Duration
	nextOK, nextValid bool

	rec          *recovery
	runningSince time.Duration // hang detection counts from here

	stopping   bool
	interrupts int
	killed     bool
	code       int // the exit code once the job stops
	stopped    bool

	blamed              int // the rank blamed for the last restart; -1: none
	blamedG, blamedStep int64
	// A crash loop whichever rank is blamed: the rank failures decided in
	// a row with no progress (no rank's step, nor G, advanced) before
	// each, and the last failure of each rank among them.
	progressed bool
	stuck      []*rankFailure
	stamp      []uint32 // per host, for counting distinct hosts
	stampN     uint32
	out        []Action
}

// rankFailure is a rank's failure, collected in the failure window.
type rankFailure struct {
	rank     int
	status   int
	signaled bool
	abort    bool
	hang     bool
	code     int            // the exit code reported
	sig      syscall.Signal // the signal that ended it, or 0
	what     string
	at       time.Duration
}

// recovery is the recovery epoch under way.
type recovery struct {
	tl Timeline
}

// New returns a machine for the job c, at epoch 0, generation 0, every
// host alive and none registered yet, no G.
func New(c Config) (*Machine, error) {
	spare, err := c.validate()
	if err != nil {
		return nil, err
	}
	l, err := topology.NewLayout(c.World, max(c.TP, 1), max(c.PP, 1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	nh, n := len(c.Hosts), c.World
	m := &Machine{
		cfg:         c,
		layout:      l,
		g:           -1,
		disk:        -1,
		names:       make([]string, nh),
		domain:      make([]string, nh),
		rankHost:    slices.Clone(c.Assign),
		hostRanks:   make([][]int, nh),
		localOK:     make([]bool, n),
		lastStep:    make([]int64, n),
		genStep:     make([]int64, n),
		lastProg:    make([]time.Duration, n),
		ended:       make([]bool, n),
		restoreBad:  -1,
		corruptSeen: make([]*CopiesCorrupt, n),
		alive:       make([]bool, nh),
		registered:  make([]bool, nh),
		spare:       spare,
		lastSeen:    make([]time.Duration, nh),
		suspected:   make([]time.Duration, nh),
		suspectWhy:  make([]string, nh),
		agentGone:   make([]bool, nh),
		faulty:      make([]*gpuFault, nh),
		stamp:       make([]uint32, nh),
		blamed:      -1,
	}
	m.cfg.Hosts = slices.Clone(c.Hosts)
	m.cfg.Assign, m.cfg.Holders, m.cfg.EC, m.cfg.Logs = nil, nil, nil, nil
	for h, x := range c.Hosts {
		m.names[h] = x.Name
		m.domain[h] = x.Rack
		if m.domain[h] == "" {
			m.domain[h] = x.Switch
		}
		m.alive[h] = true
		m.suspected[h] = -1
	}
	for r, h := range m.rankHost {
		m.hostRanks[h] = append(m.hostRanks[h], r)
		m.localOK[r] = true
		m.lastStep[r] = -1
		m.genStep[r] = -1
		m.lastProg[r] = -1
	}
	if c.EC != nil {
		m.ec = newECState(c.EC, n, nh)
		if c.Holders == nil {
			c.Holders = m.ecHolders() // validate checked they are what it would be
		}
	}
	if c.EC != nil && c.Diff {
		m.initDiff(c)
	}
	if c.Holders != nil {
		m.holders = make([][]int, n)
		m.copyOK = make([][]bool, n)
		m.missing = make([]int, n)
		m.corrupt = make([]string, n)
		m.corruptStep = make([]int64, n)
		for r := range m.corruptStep {
			m.corruptStep[r] = -1
		}
		m.heldBy = make([][]int, n)
		for r, hs := range c.Holders {
			m.holders[r] = slices.Clone(hs)
			m.copyOK[r] = make([]bool, len(hs))
			for i, x := range hs {
				m.copyOK[r][i] = true
				m.heldBy[x] = append(m.heldBy[x], r)
			}
		}
	}
	return m, nil
}

// Epoch is the current epoch (0 until the first recovery).
func (m *Machine) Epoch() uint64 { return m.epoch }

// Gen is the current restart generation: a rank's exit reported with
// another generation is ignored.
func (m *Machine) Gen() uint64 { return m.gen }

// Stopped reports whether the job is stopping (an abort or a signal).
func (m *Machine) Stopped() bool { return m.stopped }

// ExitCode is the code the job exits with: 0 while nothing went wrong,
// else the first cause's (a rank's status, 1 for a host, 124 for a hang,
// 128+n for signal n).
func (m *Machine) ExitCode() int { return m.code }

// RankHost returns rank r's host in the current epoch.
func (m *Machine) RankHost(r int) int { return m.rankHost[r] }

// UnderProtected reports how many owners have fewer copies than
// configured.
func (m *Machine) UnderProtected() int { return m.under }

// Recovering reports whether a recovery epoch is under way.
func (m *Machine) Recovering() bool { return m.rec != nil }

// Step feeds the machine event e at time now (since the job's start; a
// time before the last one counts as the last one) and returns what the
// caller must do, in order. The pending failure window closes on any
// event at or after its end, unless it waits for a told abort's exit
// (abort.go); the other deadlines (suspicion, heartbeat,
// hang) are checked on [Tick]. The returned slice is the caller's.
func (m *Machine) Step(now time.Duration, e Event) []Action {
	m.now = max(m.now, now)
	m.out = nil
	if a, ok := e.(RankAborted); ok {
		// Before the window's decision, which it may make wait (a
		// notice that comes as the window ends).
		m.onRankAborted(a)
	}
	if m.pending != nil && m.now >= m.pendingAt {
		if _, wait := m.abortExitDue(); !wait {
			m.decide()
		}
	}
	switch e := e.(type) {
	case RankExited:
		m.onRankExited(e)
	case RankAborted:
		// (Taken above.)
	case AgentExited:
		if m.host(e.Host) {
			if m.alive[e.Host] {
				m.agentGone[e.Host] = true
			}
			m.hostLost(e.Host, "its agent exited: "+e.Why, m.now, ClassHostLoss, true)
		}
	case AgentRegistered:
		if m.host(e.Host) {
			m.registered[e.Host] = true
			if len(m.hostRanks[e.Host]) == 0 && (e.Spare || m.cfg.Hosts[e.Host].Spare) {
				m.alive[e.Host], m.spare[e.Host] = true, true
			}
			m.contact(e.Host)
		}
	case Heartbeat:
		if m.host(e.Host) {
			m.contact(e.Host)
		}
	case ControlDropped:
		m.suspect(e.Host, "its control connection dropped")
	case ReplicationFailed:
		if m.host(e.From) {
			m.suspect(e.To, "replication from "+m.names[e.From]+" to it failed")
		}
	case PeerLost:
		if m.rank(e.Rank) {
			for _, p := range e.Peers {
				if m.rank(p) && m.rankHost[p] != m.rankHost[e.Rank] {
					m.suspect(m.rankHost[p], fmt.Sprintf("rank %d lost its peer rank %d", e.Rank, p))
				}
			}
		}
	case GPUHealth:
		m.onGPU(e)
	case CopiesCorrupt:
		m.onCopiesCorrupt(e)
	case Progress:
		if m.rank(e.Rank) {
			if m.lastProg[e.Rank] < 0 {
				m.nextValid = false // the rank's first hang deadline
			}
			m.protecting = true
			m.lastProg[e.Rank] = m.now
			m.genStep[e.Rank] = e.Step
			if e.Step > m.lastStep[e.Rank] {
				m.lastStep[e.Rank] = e.Step
				m.progressed = true
			}
			m.contact(m.rankHost[e.Rank])
		}
	case Signal:
		m.onSignal(e.Sig)
	case Tick:
		m.onTick()
	case GPublished:
		m.protecting = true
		if e.G > m.g && m.rb == nil { // (a roll-back sets G itself)
			m.g = e.G
			m.progressed = true
			// Every rank committed G: the launcher may tell it before
			// the Progress events of the report that raised it, and a
			// failure window may end in between (I4 reads lastStep).
			for r := range m.lastStep {
				m.lastStep[r] = max(m.lastStep[r], e.G)
			}
		}
	case Replicated:
		m.onReplicated(e.Owner)
	case RecoveryReport:
		m.onRecovery(e)
	case DiskCommitted:
		m.disk = max(m.disk, e.Step)
	case DiskReach:
		m.onDiskReach(e)
	}
	if len(m.awaiting) > 0 && !m.stopped {
		m.spliceAwaiting()
	}
	if m.nFaulty > 0 {
		switch e.(type) {
		case DiskCommitted, Replicated, RecoveryReport, AgentRegistered:
			// A version on disk, copies re-sent, a recovery's end or a
			// spare may let a host kept with a faulty GPU go.
			if _, ok := e.(Replicated); !ok || m.under == 0 {
				m.gpuRetry()
			}
		}
	}
	switch e.(type) {
	case Heartbeat, Progress:
		// They only postpone deadlines, or end a suspicion's, unless
		// they led to an action (a splice that waited for the host).
		if len(m.out) > 0 {
			m.nextValid = false
		}
	default:
		m.nextValid = false
	}
	return m.out
}

// NextDeadline is when the next Tick is due: the earliest pending
// deadline (failure window, suspicion, heartbeat, hang), and false if
// there is none. It may be earlier than that (the Tick then finds
// nothing due), never later. After a heartbeat or a progress report it
// costs O(1).
func (m *Machine) NextDeadline() (time.Duration, bool) {
	if !m.nextValid || m.nextOK && m.next <= m.now {
		m.next, m.nextOK = m.deadline()
		m.nextValid = true
	}
	return m.next, m.nextOK
}

// deadline works out the earliest pending deadline, in O(hosts + ranks).
func (m *Machine) deadline() (time.Duration, bool) {
	var t time.Duration
	ok := false
	at := func(d time.Duration) {
		if !ok || d < t {
			t, ok = d, true
		}
	}
	if m.pending != nil {
		if u, wait := m.abortExitDue(); wait {
			at(max(m.pendingAt, u))
		} else {
			at(m.pendingAt)
		}
	}
	if m.stopped {
		return t, ok
	}
	for h := range m.alive {
		if !m.alive[h] {
			continue
		}
		if m.suspected[h] >= 0 {
			at(m.suspected[h] + m.cfg.SuspectTimeout)
		}
		if m.registered[h] {
			at(m.lastSeen[h] + m.cfg.HeartbeatTimeout)
		}
	}
	if m.cfg.HangTimeout > 0 && m.rec == nil && len(m.awaiting) == 0 {
		for r, p := range m.lastProg {
			if p >= 0 && !m.ended[r] {
				at(max(p, m.runningSince) + m.cfg.HangTimeout)
			}
		}
	}
	return t, ok
}

func (m *Machine) emit(a ...Action)               { m.out = append(m.out, a...) }
func (m *Machine) report(format string, a ...any) { m.emit(Report{Msg: fmt.Sprintf(format, a...)}) }
func (m *Machine) host(h int) bool                { return h >= 0 && h < len(m.names) }
func (m *Machine) rank(r int) bool                { return r >= 0 && r < len(m.rankHost) }

// overdue reports whether registered host h's heartbeats are late.
func (m *Machine) overdue(h int) bool {
	return m.registered[h] && m.now-m.lastSeen[h] > m.cfg.HeartbeatTimeout
}

// healthy reports whether host h may take ranks: alive, registered, not
// suspected, heartbeats on time, no permanent GPU fault kept.
func (m *Machine) healthy(h int) bool {
	return m.alive[h] && m.registered[h] && m.suspected[h] < 0 && !m.overdue(h) && m.faulty[h] == nil
}

// contact records that host h was heard from: it is not suspected.
func (m *Machine) contact(h int) {
	m.lastSeen[h] = m.now
	m.suspected[h] = -1
}

// suspect marks host h suspected (if alive and not already).
func (m *Machine) suspect(h int, why string) {
	if !m.host(h) || !m.alive[h] || m.suspected[h] >= 0 || m.stopped {
		return
	}
	m.suspected[h], m.suspectWhy[h] = m.now, why
	m.report("host %s suspected: %s; lost unless heard from within %v", m.names[h], why, m.cfg.SuspectTimeout)
	m.emit(Probe{Host: h, Name: m.names[h]})
}

func (m *Machine) onTick() {
	if m.stopped {
		return
	}
	// Every loss due is found before any is acted on, so that no host
	// overdue itself is chosen to replace another.
	type loss struct {
		h        int
		why      string
		detected time.Duration
	}
	var lost []loss
	for h := range m.alive {
		if !m.alive[h] {
			continue
		}
		if s := m.suspected[h]; s >= 0 && m.now-s >= m.cfg.SuspectTimeout && m.lastSeen[h] <= s {
			lost = append(lost, loss{h, fmt.Sprintf("suspected at %v (%s), not heard from for %v", s, m.suspectWhy[h], m.now-s), s})
		} else if m.overdue(h) {
			lost = append(lost, loss{h, fmt.Sprintf("no heartbeat for %v", m.now-m.lastSeen[h]), m.now})
		}
	}
	for _, l := range lost {
		if m.stopped {
			return
		}
		m.hostLost(l.h, l.why, l.detected, ClassHostLoss, false)
	}
	if m.cfg.HangTimeout <= 0 || m.rec != nil || len(m.awaiting) > 0 {
		return
	}
	// Of the ranks without progress for the hang timeout, the one that
	// reported the lowest step is named: a stopped rank's peers block in
	// its collective, having reported the same step or a later one; on
	// a tie, the one whose progress is oldest.
	hung, since, step := -1, time.Duration(0), int64(0)
	for r, p := range m.lastProg {
		if p < 0 || m.ended[r] || m.abortWaiting(r) {
			continue
		}
		p = max(p, m.runningSince)
		if m.now-p <= m.cfg.HangTimeout {
			continue
		}
		if s := m.genStep[r]; hung < 0 || s < step || s == step && p < since {
			hung, since, step = r, p, s
		}
	}
	if hung >= 0 {
		m.pending = nil
		m.rankFailed(&rankFailure{rank: hung, status: ExitTimeout, hang: true, code: ExitTimeout, at: m.now,
			what: fmt.Sprintf("rank %d on host %s made no progress for %v (hang timeout %v)", hung, m.names[m.rankHost[hung]], m.now-since, m.cfg.HangTimeout)})
	}
}
