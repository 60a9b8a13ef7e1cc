package hotswap

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// hostLost acts on the loss of host h (why; first evidence at detected):
// hot-swap its ranks onto a spare or a host with free slots, or stop.
func (m *Machine) hostLost(h int, why string, detected time.Duration, class FailureClass, agent bool) {
	if !m.alive[h] {
		return
	}
	defer m.failed(Failed{Host: h, Name: m.names[h], Rank: -1, Class: class, Agent: agent, Why: why, Detected: detected})()
	m.alive[h], m.suspected[h] = false, -1
	m.setFaulty(h, nil)
	name := m.names[h]
	m.emit(Fence{Host: h, Name: name})
	if m.spare[h] {
		m.spare[h] = false
		m.report("spare host %s lost (%s); %d spares left", name, why, m.spares())
		return
	}
	ranks := m.hostRanks[h]
	if len(ranks) == 0 {
		m.report("host %s lost (%s); it ran no rank", name, why)
		return
	}
	m.noteLost(h)
	m.forget(h)
	if m.stopped {
		m.report("host %s lost (%s)", name, why)
		return
	}
	if m.nEnded == len(m.rankHost) && m.nFailed == 0 {
		m.report("host %s lost (%s) after every rank ended", name, why)
		return
	}
	if m.pending == nil && !slices.ContainsFunc(ranks, func(r int) bool { return !m.ended[r] }) {
		// Its ranks ended well: the job goes on without them. Should a
		// restart need them, they must have a host: replace it now if
		// something can, else a restart is refused (deadWithRanks).
		if _, _, err := m.replacement(h, ranks); err != "" {
			m.report("host %s lost (%s) after its ranks ended; nothing can replace it (%s), so the ranks cannot be restarted", name, why, err)
			return
		}
	}
	// Rank failures collected in the window are the loss's doing.
	m.pending = nil
	m.splice(awaitingLoss{h, fmt.Sprintf("host %s lost: %s", name, why), detected}, false)
}

// forget marks the memory of lost host h gone: its ranks' own slots and
// the copies (under EC the parity rows and, in diff mode, the logs and
// retained snapshots) it held.
func (m *Machine) forget(h int) {
	for _, x := range m.hostRanks[h] {
		m.localOK[x] = false
		if m.heldBy != nil {
			for _, o := range m.heldBy[x] {
				m.setCopy(o, slices.Index(m.holders[o], x), false)
			}
		}
	}
	if m.ec != nil {
		m.ecHostLost(h)
	}
}

// moveLoses says why moving the ranks of host h, still alive, to host
// with would lose state that memory cannot restore, as splice would find
// once h is lost: a moved rank with no valid copy elsewhere (recoverable),
// or a restore plan for every rank that fails (a rank of an earlier loss
// restoring from a copy on h, or no data-parallel peer left with a rank's
// parameters). It is "" when nothing would be lost. It works on a copy
// of the state: m is unchanged.
func (m *Machine) moveLoses(h, with int) string {
	c := m.scratch()
	moved := c.hostRanks[h]
	c.alive[h] = false
	c.forget(h)
	if err := c.recoverable(moved); err != "" {
		return err
	}
	for _, r := range moved {
		c.rankHost[r] = with
	}
	_, err := c.plan()
	return err
}

// scratch returns a copy of m whose loss bookkeeping (liveness, own
// slots, copies, shares, logs, placement) can change without changing
// m's: what moveLoses and the functions it calls write. The rest is
// shared, and must only be read.
func (m *Machine) scratch() *Machine {
	c := *m
	c.out = nil
	c.alive = slices.Clone(m.alive)
	c.localOK = slices.Clone(m.localOK)
	c.rankHost = slices.Clone(m.rankHost)
	c.missing = slices.Clone(m.missing)
	c.copyOK = cloneRows(m.copyOK)
	if m.ec != nil {
		e := *m.ec
		e.share = cloneRows(m.ec.share)
		c.ec = &e
	}
	c.logOK = cloneRows(m.logOK)
	c.retained = slices.Clone(m.retained)
	return &c
}

// awaitingLoss is a lost host whose ranks wait for a replacement.
type awaitingLoss struct {
	host     int
	cause    string
	detected time.Duration
}

// splice moves the ranks of lost host l.host to a replacement and starts
// the recovery epoch, or stops the job. When nothing healthy can take
// them but a suspected host could, the decision waits (l joins
// m.awaiting) until its probe settles the suspicion: a host that lost a
// peer reports it, so the survivors of a loss are often suspected with
// the lost host, and answer their probes within milliseconds. retry says
// l was waiting already.
func (m *Machine) splice(l awaitingLoss, retry bool) {
	h, cause, detected := l.host, l.cause, l.detected
	name := m.names[h]
	moved := slices.Clone(m.hostRanks[h])
	// A roll-back to disk under way takes this loss's ranks too.
	rollback, why := m.rb != nil, ""
	if err := m.recoverable(moved); err != "" && !rollback {
		if !m.canRollback() {
			m.abort(ExitFailure, "%s; unrecoverable: %s; stopping the job", cause, err)
			return
		}
		rollback, why = true, err
	}
	with, isSpare, err := m.replacement(h, moved)
	if err != "" {
		if s := m.suspectedCandidates(h, moved); len(s) > 0 {
			if !retry {
				m.report("%s; waiting for the suspected %s to answer before choosing where ranks %s go", cause, m.hostList(s), ints(moved))
			}
			m.awaiting = append(m.awaiting, l)
			return
		}
		m.abort(ExitFailure, "%s; %s; stopping the job", cause, err)
		return
	}
	if retry && m.pending != nil && !m.pending.abort {
		// Rank failures collected while the splice waited are the
		// loss's doing, as hostLost treats those before it; an
		// MPI_Abort still stops the job (decide).
		m.pending = nil
	}
	m.hostRanks[h] = nil
	for _, r := range moved {
		m.rankHost[r] = with
		if m.ended[r] {
			m.ended[r] = false
			m.nEnded--
		}
	}
	m.hostRanks[with] = append(m.hostRanks[with], moved...)
	if isSpare {
		m.spare[with] = false
	}
	// The plan reads the copies as they are; holders re-placed after it
	// hold nothing yet (the old holder still serves the restore).
	var sources []Source
	if !rollback {
		var perr string
		sources, perr = m.plan()
		if perr != "" && !m.canRollback() {
			m.abort(ExitFailure, "%s; unrecoverable: %s; stopping the job", cause, perr)
			return
		}
		// (A rank of an earlier loss restoring from a copy on h, say,
		// or no data-parallel peer left with a rank's parameters.)
		rollback, why = perr != "", perr
	}
	if rollback {
		m.fixHolders(moved)
		if m.ec != nil {
			// The replacement takes the lost host's places; it holds
			// nothing yet, nor does any row or clear copy of T.
			m.ecSplice(h, with, moved, isSpare)
		}
		if gone := m.deadWithRanks(); gone != "" {
			m.abort(ExitFailure, "%s; cannot restart the ranks: %s; stopping the job", cause, gone)
			return
		}
		m.beginRollback(l, with, isSpare, moved, why)
		return
	}
	// Under EC the clear copies stay on the data hosts: the replacement
	// takes the lost host's places (ecSplice, below, once the plan is
	// checked against the copies as they are).
	replaced := m.fixHolders(moved)
	restart := m.cfg.Recovery == RecoveryRestart || m.nFailed > 0
	if gone := m.deadWithRanks(); restart && gone != "" {
		m.abort(ExitFailure, "%s; cannot restart the ranks: %s; stopping the job", cause, gone)
		return
	}
	if v := m.violation(sources); v != "" {
		m.abort(ExitFailure, "%s; the new epoch would break invariant %s; stopping the job", cause, v)
		return
	}
	if m.ec != nil {
		replaced = m.ecSplice(h, with, moved, isSpare)
	}
	if restart {
		m.gen++
		m.resetEnded()
	}
	m.beginEpoch(cause, detected, m.now)
	how := "spare"
	if !isSpare {
		how = "host with free slots"
	}
	msg := fmt.Sprintf("%s; moving ranks %s to %s %s (epoch %d), %s", cause, ints(moved), how, m.names[with], m.epoch, m.from())
	switch {
	case replaced > 0 && m.ec != nil:
		msg += fmt.Sprintf("; %d clear-copy holders moved with the data hosts", replaced)
	case replaced > 0:
		msg += fmt.Sprintf("; %d replica holders re-placed", replaced)
	}
	m.report("%s", msg)
	m.emit(Splice{Epoch: m.epoch, Lost: h, With: with, LostName: name, WithName: m.names[with], Ranks: moved, Spare: isSpare})
	if restart {
		m.emit(Restart{Gen: m.gen, Epoch: m.epoch, G: m.g})
	}
	m.publish(sources)
	if m.under > 0 {
		owners := make([]int, 0, m.under)
		for o, n := range m.missing {
			if n > 0 {
				owners = append(owners, o)
			}
		}
		// The copies are re-sent whether or not the ranks protect state
		// yet (the driver tracks them from this action); only a job
		// that protects state hears of it.
		if m.protecting {
			m.announced = true
			if m.ec != nil {
				m.report("under-protected: %d optimizer shards lost their clear copy or a parity share (ec:%d+%d) until it is re-sent; %s", len(owners), m.ec.k, m.ec.m, m.ecReport())
			} else {
				m.report("under-protected: %d optimizer shards lost a copy (of %d) until it is re-sent", len(owners), m.k())
			}
		}
		m.emit(UnderProtected{Epoch: m.epoch, Owners: owners})
	} else if m.ec != nil && m.protecting {
		// Nothing to re-send, but a host may hold two places now.
		if r := m.ecReport(); r != "" {
			m.report("%s", r)
		}
	}
}

// spliceAwaiting retries the lost hosts waiting for suspicions to settle.
func (m *Machine) spliceAwaiting() {
	waiting := m.awaiting
	m.awaiting = nil
	for _, l := range waiting {
		if m.stopped {
			return
		}
		if len(m.hostRanks[l.host]) > 0 {
			m.splice(l, true)
		}
	}
}

// suspectedCandidates are the hosts other than h that could take the
// ranks moved from h once their suspicion is lifted: registered, alive,
// heartbeats on time, with room (a spare, or under free-slots any host).
func (m *Machine) suspectedCandidates(h int, moved []int) []int {
	var out []int
	for s := range m.alive {
		if s == h || !m.alive[s] || !m.registered[s] || m.suspected[s] < 0 || m.overdue(s) {
			continue
		}
		if m.spare[s] && m.cfg.fits(s, 0, len(moved)) ||
			!m.spare[s] && m.cfg.OnNoSpare != OnNoSpareAbort && m.cfg.fits(s, len(m.hostRanks[s]), len(moved)) {
			out = append(out, s)
		}
	}
	return out
}

// hostList names hosts for a report: "host a" or "hosts a, b".
func (m *Machine) hostList(hs []int) string {
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = m.names[h]
	}
	if len(hs) == 1 {
		return "host " + names[0]
	}
	return "hosts " + strings.Join(names, ", ")
}

// recoverable says why one of the ranks of a lost host has no valid copy
// of its optimizer shard on a live host (I3), or "".
func (m *Machine) recoverable(ranks []int) string {
	if m.g < 0 {
		return "" // nothing protected yet: the ranks start over
	}
	for _, r := range ranks {
		if m.ec != nil {
			// A clear copy, else a decode of its stripe.
			if m.copyHolder(r) >= 0 {
				continue
			}
			if ok, why := m.decodable(r); !ok {
				return why
			}
			continue
		}
		if m.holders == nil {
			return fmt.Sprintf("rank %d's optimizer shard has no copy in memory (no replicas) (I3)", r)
		}
		ok := false
		for i, x := range m.holders[r] {
			if m.copyOK[r][i] && m.alive[m.rankHost[x]] {
				ok = true
				break
			}
		}
		if !ok {
			return m.noValidCopy(r)
		}
	}
	return ""
}

// noValidCopy says that rank r's optimizer shard has no valid copy at a
// live holder, and why, when a restore found copies corrupt.
func (m *Machine) noValidCopy(r int) string {
	why := ""
	if m.corrupt[r] != "" {
		why = "; " + m.corrupt[r]
	}
	return fmt.Sprintf("rank %d's optimizer shard has no valid copy left in memory (holders %s%s) (I3)", r, ints(m.holders[r]), why)
}

func (m *Machine) spares() int {
	n := 0
	for h, s := range m.spare {
		if s && m.alive[h] {
			n++
		}
	}
	return n
}
