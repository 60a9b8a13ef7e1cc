package hotswap

import "fmt"

// An MPI_Abort, told before the rank's end (RankAborted): the job's
// failure, whatever failures of its peers came before it.
//
// An aborting rank is killed by its agent, and its peers then fail (their
// connections to it break). The rank's own RankExited comes only once it
// is reaped and its output drained, which may be after the failure
// window its peers' exits opened: its code would lose to theirs. Its
// agent therefore reports the abort before it kills the rank, and the
// abort takes the place of any failure pending, even once the window has
// passed, as long as nothing was decided.

// RankAborted: rank Rank of generation Gen, on Host, called MPI_Abort
// with exit code Code (Msg: what it said, worded as RankExited's Msg of
// an abort); its agent is killing it. Its RankExited (Abort set) follows.
type RankAborted struct {
	Rank, Host int
	Pid        int // the process's id, for reports (0: not known)
	Gen        uint64
	Code       int
	Msg        string
}

func (RankAborted) event() {}

func (e RankAborted) String() string {
	s := fmt.Sprintf("rank-aborted rank=%d host=%d gen=%d code=%d", e.Rank, e.Host, e.Gen, e.Code)
	if e.Pid > 0 {
		s += fmt.Sprintf(" pid=%d", e.Pid)
	}
	return s
}

// abortNote is a rank's abort, told by a RankAborted: its failure, and
// the host it ran on (a rank moved by a splice in the same generation is
// another process).
type abortNote struct {
	f    *rankFailure
	host int
}

// current reports whether e is of a rank of the current generation, on
// its current host, not ended yet, whose abort has not been noted: one
// onRankAborted takes.
func (m *Machine) current(e RankAborted) bool {
	r := e.Rank
	if !m.rank(r) || e.Gen != m.gen || e.Host != m.rankHost[r] || m.ended[r] {
		return false
	}
	n, ok := m.aborted[r]
	return !ok || n.host != e.Host
}

// onRankAborted makes the abort the job's failure: it replaces the
// pending failure unless that is an earlier abort, and is decided on at
// once if the window has passed (Step did not decide before it).
func (m *Machine) onRankAborted(e RankAborted) {
	if !m.current(e) {
		return // of an earlier generation, a host it left, or its exit came first (and counted)
	}
	r := e.Rank
	m.contact(e.Host)
	// The wording of the rank's RankExited, which users match on.
	why := e.Msg
	if why == "" {
		why = fmt.Sprintf("called MPI_Abort with exit code %d", e.Code)
	}
	pid := ""
	if e.Pid > 0 {
		pid = fmt.Sprintf(" (pid %d)", e.Pid)
	}
	f := &rankFailure{rank: r, status: e.Code, signaled: true, abort: true, code: e.Code,
		what: fmt.Sprintf("rank %d on host %s%s %s", r, m.names[e.Host], pid, why), at: m.now}
	if m.aborted == nil {
		m.aborted = map[int]abortNote{}
	}
	m.aborted[r] = abortNote{f: f, host: e.Host}
	// Counted here, not again at its exit (onRankExited).
	m.nFailed++
	if m.stopped {
		return
	}
	switch {
	case m.pending == nil:
		m.pending, m.pendingAt = f, m.now+m.cfg.FailWindow
	case !m.pending.abort:
		// Its peers' failures, reported first, are its doing.
		f.at = m.pending.at
		m.pending = f
	}
	if m.now >= m.pendingAt {
		m.decide()
	}
}

// abortNoted returns the failure of rank r's abort on host, noted by
// onRankAborted in this generation, or nil.
func (m *Machine) abortNoted(r, host int) *rankFailure {
	if n, ok := m.aborted[r]; ok && n.host == host {
		return n.f
	}
	return nil
}
