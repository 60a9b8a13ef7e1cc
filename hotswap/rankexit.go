package hotswap

import (
	"fmt"
	"syscall"
)

// A rank's exit (RankExited): collected into a failure in the failure
// window, then every rank restarted in place, or the job stopped; and the
// job stopped by a signal (onSignal) or an abort (whose exit the window
// waits for when the abort was told before it: abort.go).

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
		f.signaled == m.pending.signaled && m.pending.rank == m.blamed && r != m.blamed,
		// Of two aborts, the one told first: the others follow from it
		// (MPICH aborts on the fatal error a dead peer causes), and
		// their exits may come before its own (abort.go).
		f.abort && m.pending.abort && m.toldFirst(r, m.pending.rank):
		f.at = m.pending.at
		m.pending = f
	}
	if m.nEnded == len(m.rankHost) {
		m.decide()
	} else if _, wait := m.abortExitDue(); m.now >= m.pendingAt && !wait {
		// The window passed while it waited for this exit (an aborting
		// rank's, or the last of them).
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
	clear(m.abortWaits)
	m.restoreBad = -1
	m.nEnded, m.nFailed = 0, 0
	for r := range m.genStep {
		m.genStep[r] = -1
	}
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
