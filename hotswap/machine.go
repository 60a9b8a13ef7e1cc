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
	under       int      // owners with a missing copy or share
	ec          *ecState // the erasure code (Config.EC), or nil
	// Diff mode under EC (ecdiff.go): logs[r] are rank r's log-only
	// holders, logOK[r][i] whether logs[r][i]'s copy is valid, and
	// retained[r] whether r's own retained base snapshot is (a rank that
	// runs on its data host); nil otherwise.
	logs     [][]int
	logOK    [][]bool
	retained []bool
	localOK  []bool  // the rank's own slot holds its state
	lastStep []int64 // last committed step reported; -1: none
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
// event at or after its end; the other deadlines (suspicion, heartbeat,
// hang) are checked on [Tick]. The returned slice is the caller's.
func (m *Machine) Step(now time.Duration, e Event) []Action {
	m.now = max(m.now, now)
	m.out = nil
	if m.pending != nil && m.now >= m.pendingAt {
		m.decide()
	}
	switch e := e.(type) {
	case RankExited:
		m.onRankExited(e)
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
		at(m.pendingAt)
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

func (m *Machine) onRankExited(e RankExited) {
	r := e.Rank
	if !m.rank(r) {
		return
	}
	cc := m.corruptSeen[r]
	m.corruptSeen[r] = nil
	if e.Gen != m.gen || e.Host != m.rankHost[r] {
		return // of an earlier generation, or of a host it left
	}
	m.contact(e.Host)
	if m.ended[r] {
		return
	}
	m.ended[r] = true
	m.nEnded++
	if m.nEnded == len(m.rankHost) {
		defer func() {
			if !m.stopped && m.nFailed == 0 {
				m.ranOnFaulty()
			}
		}()
	}
	if e.Stopped {
		return
	}
	status := e.Code
	if e.Signal > 0 {
		status = 128 + int(e.Signal)
	}
	if status == 0 && !e.Abort {
		return
	}
	// MPI_Abort(comm, 0) ends the job with status 0, as under Hydra.
	m.nFailed++
	if m.stopped {
		return
	}
	if cc != nil && m.markCorrupt(*cc) && m.restoreBad < 0 {
		m.restoreBad = r
	}
	// The launcher's wording since before hot-swap: users and scripts
	// match on it.
	why := fmt.Sprintf("exited with code %d", e.Code)
	switch {
	case e.Abort && e.Msg != "":
		why = e.Msg
	case e.Abort:
		why = fmt.Sprintf("called MPI_Abort with exit code %d", e.Code)
	case e.Signal > 0:
		why = "was killed by " + SignalName(e.Signal)
	case e.Msg != "":
		why += " (" + e.Msg + ")"
	}
	pid := ""
	if e.Pid > 0 {
		pid = fmt.Sprintf(" (pid %d)", e.Pid)
	}
	f := &rankFailure{rank: r, status: status, signaled: e.Signal > 0 || e.Abort, abort: e.Abort, code: e.Code, sig: e.Signal,
		what: fmt.Sprintf("rank %d on host %s%s %s", r, m.names[e.Host], pid, why), at: m.now}
	switch {
	case m.pending == nil:
		m.pending, m.pendingAt = f, m.now+m.cfg.FailWindow
	case f.signaled && !m.pending.signaled,
		// The rank blamed for the last restart, reported first, may
		// only have lost this one as a peer: blaming it would take a
		// failure of another rank for a crash loop.
		f.signaled == m.pending.signaled && m.pending.rank == m.blamed && r != m.blamed:
		f.at = m.pending.at
		m.pending = f
	}
	if m.nEnded == len(m.rankHost) {
		m.decide()
	}
}

// decide acts on the pending rank failure.
func (m *Machine) decide() {
	f := m.pending
	m.pending = nil
	if f == nil || m.stopped || (len(m.awaiting) > 0 || m.rb != nil) && !f.abort {
		// While a lost host waits for its replacement (or the job for
		// its roll-back to disk), rank failures are the loss's doing:
		// its splice restarts them. An MPI_Abort stops the job all the
		// same.
		return
	}
	m.rankFailed(f)
}

// rankFailed restarts the ranks in place after f, or stops the job.
func (m *Machine) rankFailed(f *rankFailure) {
	class := ClassRankExit
	if f.hang {
		class = ClassHang
	}
	defer m.failed(Failed{Host: m.rankHost[f.rank], Name: m.names[m.rankHost[f.rank]], Rank: f.rank, Class: class,
		Code: f.code, Signal: f.sig, Why: f.what, Detected: f.at})()
	if f.abort {
		m.abort(f.status, "%s; stopping the job", f.what)
		return
	}
	if m.restoreBad >= 0 && !f.hang {
		// A restore that found copies failing their CRC32C: part of
		// the recovery that ran it, re-planned without them.
		m.restoreAgain(f)
		return
	}
	r := f.rank
	if r == m.blamed && m.g == m.blamedG && m.lastStep[r] == m.blamedStep {
		m.abort(f.status, "%s, again with no progress since its last failure; stopping the job rather than restarting it in a loop", f.what)
		return
	}
	if m.progressed {
		m.stuck = m.stuck[:0]
	}
	m.progressed = false
	m.stuck = append(m.stuck, f)
	if len(m.stuck) >= CrashLoopFailures {
		// Which rank is blamed for each may alternate (a crashing rank's
		// peers fail with it, and may be reported first): the rank that
		// failed most often among them is the loop's.
		worst, n := f, 0
		for _, x := range m.stuck {
			c := 0
			for _, y := range m.stuck {
				if y.rank == x.rank {
					c++
				}
			}
			if c > n || c == n && x.rank == f.rank {
				worst, n = x, c
			}
		}
		m.abort(worst.status, "%s; the job failed %d times in a row without progress (rank %d %d of them); stopping the job rather than restarting it in a loop", worst.what, len(m.stuck), worst.rank, n)
		return
	}
	if m.cfg.MaxRestarts == 0 {
		m.abort(f.status, "%s; stopping the job", f.what)
		return
	}
	if m.restarts >= m.cfg.MaxRestarts {
		m.abort(f.status, "%s; no restart left (%d of %d used); stopping the job", f.what, m.restarts, m.cfg.MaxRestarts)
		return
	}
	if gone := m.deadWithRanks(); gone != "" {
		m.abort(f.status, "%s; cannot restart the ranks: %s; stopping the job", f.what, gone)
		return
	}
	sources, err := m.plan()
	if err != "" {
		m.abort(ExitFailure, "%s; cannot restart: %s", f.what, err)
		return
	}
	if v := m.violation(sources); v != "" {
		m.abort(ExitFailure, "%s; cannot restart: invariant %s", f.what, v)
		return
	}
	m.blamed, m.blamedG, m.blamedStep = r, m.g, m.lastStep[r]
	m.restarts++
	m.restartEvery(f, fmt.Sprintf("restarting every rank (restart %d of %d)", m.restarts, m.cfg.MaxRestarts), sources)
}

// restartEvery restarts every rank where it is after failure f, in a new
// generation and epoch, restoring from sources; how says why, in the
// report.
func (m *Machine) restartEvery(f *rankFailure, how string, sources []Source) {
	m.gen++
	m.resetEnded()
	m.beginEpoch(f.what, f.at, -1)
	m.report("%s; %s, %s", f.what, how, m.from())
	m.emit(Restart{Gen: m.gen, Epoch: m.epoch, G: m.g})
	m.publish(sources)
}

func (m *Machine) from() string {
	if m.g < 0 {
		return "from the start (no step is protected on every rank)"
	}
	return fmt.Sprintf("resuming from step %d", m.g)
}

func (m *Machine) resetEnded() {
	clear(m.ended)
	clear(m.corruptSeen)
	m.restoreBad = -1
	m.nEnded, m.nFailed = 0, 0
	for r := range m.genStep {
		m.genStep[r] = -1
	}
}

// beginEpoch starts the next recovery epoch, ending the one under way.
func (m *Machine) beginEpoch(cause string, detected, replaced time.Duration) {
	if m.rec != nil {
		m.rec.tl.Superseded = true
		m.emit(m.rec.tl)
	}
	m.epoch++
	m.rec = &recovery{tl: Timeline{Epoch: m.epoch, Cause: cause, Detected: detected, Classified: m.now,
		Replaced: replaced, Published: -1, Restored: -1, Resumed: -1}}
}

// publish emits the epoch's table and its restore plan.
func (m *Machine) publish(sources []Source) {
	p := PublishEpoch{Epoch: m.epoch, G: m.g, RankHost: slices.Clone(m.rankHost), names: m.names}
	if m.holders != nil {
		n := 0
		for _, hs := range m.holders {
			n += len(hs)
		}
		flat := make([]int, 0, n)
		p.Holders = make([][]int, len(m.holders))
		for r, hs := range m.holders {
			flat = append(flat, hs...)
			p.Holders[r] = flat[len(flat)-len(hs) : len(flat) : len(flat)]
		}
	}
	if m.ec != nil {
		p.EC = make([]topology.ECGroup, len(m.ec.groups))
		for i, g := range m.ec.groups {
			p.EC[i] = cloneGroup(g)
		}
	}
	if m.diffEC() {
		p.Logs = cloneRows(m.logs)
	}
	m.emit(p, RestorePlan{Epoch: m.epoch, G: m.g, Sources: sources, names: m.names})
}

// abort stops the job with code, once.
func (m *Machine) abort(code int, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if m.stopped {
		m.report("%s", msg)
		return
	}
	if len(m.awaiting) > 0 {
		var hs []int
		for _, l := range m.awaiting {
			hs = append(hs, l.host)
		}
		msg += fmt.Sprintf(" (%s, lost too, waited for a replacement)", m.hostList(hs))
		m.awaiting = nil
	}
	m.stopped, m.stopping, m.code = true, true, code
	m.pending = nil
	m.rb = nil
	m.emit(Abort{Code: code, Msg: msg}, StopRanks{Signal: syscall.SIGTERM, Grace: m.cfg.KillGrace})
}

func (m *Machine) onSignal(s syscall.Signal) {
	if s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
		m.emit(Forward{Signal: s})
		return
	}
	m.interrupts++
	if m.interrupts == 1 {
		left := len(m.rankHost) - m.nEnded
		if !m.stopped {
			m.stopped, m.code = true, 128+int(s)
		}
		m.stopping = true
		m.pending = nil
		m.report("%s; stopping %d ranks (again to kill at once)", SignalName(s), left)
		m.emit(StopRanks{Signal: s, Grace: m.cfg.KillGrace})
		return
	}
	if !m.killed {
		m.killed = true
		m.report("killing every rank")
		m.emit(KillAll{})
	}
}

// gpuFault is a permanent GPU fault a host stays with.
type gpuFault struct {
	e     GPUHealth
	at    time.Duration
	stays string // why it stays, as last decided (gpuStays)
}

func (m *Machine) onGPU(e GPUHealth) {
	if !m.host(e.Host) || !m.alive[e.Host] {
		return
	}
	if !e.replaces() {
		m.report("GPU %d on host %s: %s fault: %s; the host stays", e.GPU, m.names[e.Host], e.Class, e.Msg)
		return
	}
	if stays := m.gpuStays(e.Host); stays != "" {
		m.setFaulty(e.Host, &gpuFault{e: e, at: m.now, stays: stays})
		// (The caller has reported the fault itself, e.Msg.)
		m.failed(Failed{Host: e.Host, Name: m.names[e.Host], Rank: -1, Class: ClassGPUPermanent,
			Why: fmt.Sprintf("GPU %d %s fault: %s; the host stays, as %s", e.GPU, e.Class, e.Msg, stays), Detected: m.now})()
		m.report("host %s: GPU %d %s fault; it stays, as %s", m.names[e.Host], e.GPU, e.Class, stays)
		return
	}
	m.hostLost(e.Host, fmt.Sprintf("GPU %d %s fault: %s", e.GPU, e.Class, e.Msg), m.now, ClassGPUPermanent, false)
}

// gpuStays says why host h, with a permanent GPU fault, stays rather than
// being replaced, or "". The host still runs: replacing it is worth a
// recovery, but not the job. With nothing to replace it, or when moving
// its ranks would lose their state (moveLoses, and no version on disk to
// roll back to), it stays; if the fault breaks its ranks, their failures
// decide.
func (m *Machine) gpuStays(h int) string {
	ranks := m.hostRanks[h]
	if len(ranks) == 0 || m.stopped {
		return ""
	}
	with, _, err := m.replacement(h, ranks)
	if err != "" {
		return "nothing can replace it (" + err + ")"
	}
	if m.rb == nil && !m.canRollback() {
		if lost := m.moveLoses(h, with); lost != "" {
			return "moving its ranks would lose their state (" + lost + ")"
		}
	}
	return ""
}

// gpuRetry decides again on the hosts that stayed with a permanent GPU
// fault, once no recovery, roll-back or rank failure is under way and no
// rank has ended: one that can go now is replaced (a new recovery; the
// others wait for its end).
func (m *Machine) gpuRetry() {
	for h, f := range m.faulty {
		if f == nil {
			continue
		}
		if m.stopped || m.rec != nil || m.rb != nil || m.pending != nil || len(m.awaiting) > 0 || m.nEnded > 0 {
			return
		}
		if !m.alive[h] {
			m.setFaulty(h, nil)
			continue
		}
		if s := m.gpuStays(h); s != "" {
			f.stays = s
			continue
		}
		m.setFaulty(h, nil)
		m.hostLost(h, fmt.Sprintf("GPU %d %s fault at %v: %s (the host stayed until its ranks could move)", f.e.GPU, f.e.Class, f.at.Round(time.Millisecond), f.e.Msg),
			m.now, ClassGPUPermanent, false)
	}
}

// setFaulty records the permanent GPU fault host h stays with, or none.
func (m *Machine) setFaulty(h int, f *gpuFault) {
	if (m.faulty[h] == nil) != (f == nil) {
		if f == nil {
			m.nFaulty--
		} else {
			m.nFaulty++
		}
	}
	m.faulty[h] = f
}

// ranOnFaulty reports, when every rank has ended, the hosts that ran to
// the end with a permanent GPU fault (nothing could replace them, or
// moving their ranks would have lost their state).
func (m *Machine) ranOnFaulty() {
	for h, f := range m.faulty {
		if f != nil && m.alive[h] {
			m.report("host %s ran to the job's end with GPU %d's permanent fault (at %v: %s), never replaced: it stayed, as %s; what ran on that GPU cannot be trusted",
				m.names[h], f.e.GPU, f.at.Round(time.Millisecond), f.e.Msg, f.stays)
		}
	}
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
		if p < 0 || m.ended[r] {
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

func (m *Machine) onReplicated(owner int) {
	if m.holders == nil || m.under == 0 {
		return
	}
	set := func(o int) {
		if s := m.corruptStep[o]; s >= 0 && m.g <= s {
			return // the copies re-sent are not past the corrupt one yet
		}
		for i, x := range m.holders[o] {
			if m.alive[m.rankHost[x]] {
				m.setCopy(o, i, true)
			}
		}
		if m.ec != nil {
			// Replicated counts every parity share too: each row whose
			// host is alive (a lost one's place is not filled yet) has it.
			p := m.ec.at[o]
			for j, ph := range m.ec.groups[p.group].Parity {
				if m.alive[ph] {
					m.setShare(o, j, true)
				}
			}
			if m.diffEC() {
				m.diffReplicated(o)
			}
		}
	}
	if owner < 0 {
		for o := range m.holders {
			if m.missing[o] > 0 {
				set(o)
			}
		}
	} else if m.rank(owner) {
		set(owner)
	}
	if m.under == 0 {
		if m.announced {
			m.announced = false
			if m.ec != nil {
				msg := fmt.Sprintf("every optimizer shard has its clear copy and parity shares (ec:%d+%d) again", m.ec.k, m.ec.m)
				if r := m.ecReport(); r != "" {
					msg += "; " + r
				}
				m.report("%s", msg)
			} else {
				m.report("every optimizer shard has its %d copies again", m.k())
			}
		}
		m.emit(Protected{})
	}
}

// k is the configured number of copies per shard.
func (m *Machine) k() int {
	if len(m.holders) == 0 {
		return 0
	}
	return len(m.holders[0])
}

// setCopy marks holder i's copy of o's shard valid or not.
func (m *Machine) setCopy(o, i int, ok bool) {
	if m.copyOK[o][i] == ok {
		return
	}
	m.copyOK[o][i] = ok
	if ok {
		m.missing[o]--
		if m.missing[o] == 0 {
			m.under--
			m.corrupt[o] = ""
			m.corruptStep[o] = -1
		}
	} else {
		m.missing[o]++
		if m.missing[o] == 1 {
			m.under++
		}
	}
}

func (m *Machine) onRecovery(e RecoveryReport) {
	if m.rec == nil || e.Epoch != m.epoch {
		return
	}
	tl := &m.rec.tl
	switch e.Stage {
	case StagePublished:
		if tl.Published < 0 {
			tl.Published = m.now
		}
	case StageRestored:
		m.restored()
	case StageResumed:
		if tl.Published < 0 {
			tl.Published = m.now
		}
		m.restored()
		tl.Resumed = m.now
		m.emit(*tl)
		m.rec = nil
		m.runningSince = m.now
	}
}

// restored records that every rank's state is restored: every live
// rank's own slot holds it again.
func (m *Machine) restored() {
	if m.rec.tl.Restored >= 0 {
		return
	}
	m.rec.tl.Restored = m.now
	for r, h := range m.rankHost {
		if m.alive[h] {
			m.localOK[r] = true
		}
	}
}

// deadWithRanks says which lost host still has ranks (they ended before
// it was lost, and nothing could replace it), whose ranks a restart
// could not start, or "".
func (m *Machine) deadWithRanks() string {
	for h, rs := range m.hostRanks {
		if len(rs) == 0 || m.alive[h] {
			continue
		}
		if m.agentGone[h] {
			return fmt.Sprintf("the agent on host %s has ended", m.names[h])
		}
		return fmt.Sprintf("host %s is lost", m.names[h])
	}
	return ""
}
