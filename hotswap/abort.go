package hotswap

import (
	"fmt"
	"time"
)

// An MPI_Abort, told before the rank's end (RankAborted): the failure
// window's decision waits for the rank's exit.
//
// An aborting rank is killed by its agent, and its peers then fail (their
// connections to it break). The rank's own RankExited comes only once it
// is reaped and its output drained, which may be after the failure
// window its peers' exits opened: decided then, the job would end with a
// peer's code, not the abort's (TestMPIMultiHost's abort across hosts
// did, now and then). Its agent therefore tells of the abort before it
// kills the rank, so that no peer's failure can be reported before the
// notice, and the window's decision waits for the rank's exit, at most
// abortExitWait after the notice. The exit then counts as it always did
// inside the window: the precedence of failures is unchanged (a signaled
// one, an abort among them, takes the place of one that is not).
//
// The notice itself is no failure, and takes no failure's place: an
// MPICH rank aborts on a fatal error, such as a crashed peer, and that
// abort must not take the place of the crash (a job with restarts left
// would stop instead of restarting).

// abortExitWait bounds the wait for an aborting rank's exit: its agent
// kills it at once and reports its end within the output drain's bound
// (a second); a lost agent makes the host lost, which moves the rank.
const abortExitWait = 3 * time.Second

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

// abortWait is a told abort whose rank's exit the window's decision
// waits for: the rank's host when it was told, until when, and the
// order it was told in (seq, from 1).
type abortWait struct {
	host  int
	until time.Duration
	seq   int
}

// onRankAborted notes the abort of a rank of the current generation, on
// its current host, that has not ended.
func (m *Machine) onRankAborted(e RankAborted) {
	r := e.Rank
	if !m.rank(r) || e.Gen != m.gen || e.Host != m.rankHost[r] || m.ended[r] {
		return // of an earlier generation, a host it left, or its exit came first
	}
	m.contact(e.Host)
	if w, ok := m.abortWaits[r]; ok && w.host == e.Host {
		return // told again: the first notice's place and bound stand
	}
	if m.abortWaits == nil {
		m.abortWaits = map[int]abortWait{}
	}
	m.abortWaits[r] = abortWait{host: e.Host, until: m.now + abortExitWait, seq: len(m.abortWaits) + 1}
}

// toldFirst reports whether rank r's abort, on its current host, was
// told before rank q's (or q's was not told at all).
func (m *Machine) toldFirst(r, q int) bool {
	wr, ok := m.abortWaits[r]
	if !ok || wr.host != m.rankHost[r] {
		return false
	}
	wq, ok := m.abortWaits[q]
	return !ok || wq.host != m.rankHost[q] || wr.seq < wq.seq
}

// abortWaiting reports whether rank r's told abort is awaited: its
// exit will come (its agent killed it), so it is not hung.
func (m *Machine) abortWaiting(r int) bool {
	w, ok := m.abortWaits[r]
	return ok && !m.ended[r] && m.rankHost[r] == w.host && m.now < w.until
}

// abortExitDue reports whether the window's decision waits for the exit
// of an aborting rank, and until when at the latest: a told abort whose
// rank has not ended, still on the host it aborted on, within its bound.
func (m *Machine) abortExitDue() (time.Duration, bool) {
	var until time.Duration
	due := false
	for r, w := range m.abortWaits {
		if m.abortWaiting(r) {
			until, due = max(until, w.until), true
		}
	}
	return until, due
}
