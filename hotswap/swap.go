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

// replacement chooses the host that takes over the ranks of lost host h:
// a registered idle spare with room, preferring one outside the failure
// domains of the ranks' replica holders, else (free-slots) a surviving
// host with room where every rank can keep its replicas on other hosts.
// Under EC the domains avoided are those of the surviving hosts of h's
// groups, and a free-slots host outside h's groups is preferred (inside,
// it holds two places, and the group survives one loss less).
func (m *Machine) replacement(h int, moved []int) (int, bool, string) {
	avoid := map[string]bool{}
	inGroup := map[int]bool{}
	if m.ec != nil {
		for _, g := range m.ec.groups {
			if !slices.Contains(g.Hosts, h) {
				continue
			}
			for _, x := range g.Hosts {
				inGroup[x] = true
				if d := m.domain[x]; d != "" && x != h && m.alive[x] {
					avoid[d] = true
				}
			}
		}
	} else if m.holders != nil {
		for _, r := range moved {
			for _, x := range m.holders[r] {
				if d := m.domain[m.rankHost[x]]; d != "" {
					avoid[d] = true
				}
			}
		}
	}
	best, bestOut := -1, false
	for s := range m.spare {
		if !m.spare[s] || !m.healthy(s) || !m.cfg.fits(s, 0, len(moved)) {
			continue
		}
		out := m.domain[s] == "" || !avoid[m.domain[s]]
		if best < 0 || out && !bestOut {
			best, bestOut = s, out
		}
	}
	if best >= 0 {
		return best, true, ""
	}
	noSpare := "no spare host is left"
	if n := m.spares(); n > 0 {
		noSpare = fmt.Sprintf("no healthy registered spare has %d free slots", len(moved))
	}
	if m.cfg.OnNoSpare == OnNoSpareAbort {
		return -1, false, noSpare + " (--on-no-spare abort)"
	}
	room, fit, bestApart := false, false, false
	var faulty []int // hosts with room but a GPU fault kept (onGPU)
	for s := range m.alive {
		if s == h || m.spare[s] || !m.cfg.fits(s, len(m.hostRanks[s]), len(moved)) {
			continue
		}
		if !m.healthy(s) {
			if m.alive[s] && m.faulty[s] != nil {
				faulty = append(faulty, s)
			}
			continue
		}
		room = true
		if !m.canHold(s, h, moved) {
			continue
		}
		out := m.domain[s] == "" || !avoid[m.domain[s]]
		apart := !inGroup[s]
		if !fit || apart && !bestApart || apart == bestApart && out && !bestOut {
			best, bestOut, bestApart, fit = s, out, apart, true
		}
	}
	switch {
	case fit:
		return best, false, ""
	case room:
		return -1, false, noSpare + fmt.Sprintf("; the hosts with %d free slots could not keep every rank's replicas on another host", len(moved))
	}
	if len(faulty) > 0 {
		return -1, false, noSpare + fmt.Sprintf(" and no surviving host has %d free slots but %s, whose GPU failed", len(moved), m.hostList(faulty))
	}
	return -1, false, noSpare + fmt.Sprintf(" and no surviving host has %d free slots", len(moved))
}

// canHold reports whether, with moved (from lost host h) on host s, every
// moved rank and every owner on s whose holder moves there can have its
// copies on hosts other than its own.
func (m *Machine) canHold(s, h int, moved []int) bool {
	if m.holders == nil || m.ec != nil {
		return true // under EC the clear copies follow the data hosts (ecSplice)
	}
	need := func(r int) bool {
		k := len(m.holders[r])
		return k == 0 || m.peerHosts(r, s, h, k) >= k
	}
	for _, r := range moved {
		if !need(r) {
			return false
		}
		for _, o := range m.heldBy[r] {
			if m.rankHost[o] == s && !need(o) {
				return false
			}
		}
	}
	return true
}

// peerHosts counts, up to k, the distinct live hosts other than s and h
// that rank r's data-parallel peers run on (peers on h count as on s).
func (m *Machine) peerHosts(r, s, h, k int) int {
	m.stampN++
	if m.stampN == 0 { // wrapped: old stamps could match
		clear(m.stamp)
		m.stampN = 1
	}
	n := 0
	m.eachPeer(r, func(p int) bool {
		ph := m.rankHost[p]
		if ph == h {
			ph = s
		}
		if ph != s && m.alive[ph] && m.stamp[ph] != m.stampN {
			m.stamp[ph] = m.stampN
			n++
		}
		return n < k
	})
	return n
}

// eachPeer calls f for rank r's data-parallel peers in ring order from r
// (same TP/PP coordinate), until f returns false.
func (m *Machine) eachPeer(r int, f func(p int) bool) {
	c := m.layout.Coord(r)
	for i := 1; i < m.layout.DP; i++ {
		c2 := c
		c2.DP = (c.DP + i) % m.layout.DP
		if !f(m.layout.Rank(c2)) {
			return
		}
	}
}

// fixHolders re-places the holders that now share a host with their owner
// or another holder of it, for the moved ranks and the owners whose
// holders moved. A re-placed copy is invalid until re-sent. It returns
// how many were re-placed.
func (m *Machine) fixHolders(moved []int) int {
	if m.holders == nil || m.ec != nil {
		return 0
	}
	n := 0
	for _, r := range moved {
		n += m.fixOwner(r)
		for _, o := range slices.Clone(m.heldBy[r]) {
			n += m.fixOwner(o)
		}
	}
	return n
}

func (m *Machine) fixOwner(o int) int {
	n := 0
	hs := m.holders[o]
	for i, x := range hs {
		if !m.clash(o, i, m.rankHost[x]) {
			continue
		}
		y := -1
		m.eachPeer(o, func(p int) bool {
			if !slices.Contains(hs, p) && m.alive[m.rankHost[p]] && !m.clash(o, i, m.rankHost[p]) {
				y = p
				return false
			}
			return true
		})
		if y < 0 {
			continue // left in place: I3 or the plan reports it
		}
		m.setCopy(o, i, false)
		hs[i] = y
		m.heldBy[x] = slices.DeleteFunc(m.heldBy[x], func(v int) bool { return v == o })
		m.heldBy[y] = append(m.heldBy[y], o)
		n++
	}
	return n
}

// clash reports whether holder i of owner o may not be on host xh: it is
// o's host, or another holder's.
func (m *Machine) clash(o, i, xh int) bool {
	if xh == m.rankHost[o] {
		return true
	}
	for j, y := range m.holders[o] {
		if j != i && m.rankHost[y] == xh {
			return true
		}
	}
	return false
}

// plan says where every rank restores step G from: its own slot when it
// holds its state, else the optimizer shard from a valid copy at a live
// holder (under EC, a decode of its stripe when no copy survives) and
// the parameters from a live data-parallel peer. It returns why a rank
// cannot be restored from memory, if one cannot.
func (m *Machine) plan() ([]Source, string) {
	src := make([]Source, len(m.rankHost))
	for r, h := range m.rankHost {
		src[r] = Source{Rank: r, Local: true, OptRank: r, OptHost: h, ParamsRank: r, ParamsHost: h}
		if m.localOK[r] && m.alive[h] || m.g < 0 {
			continue
		}
		src[r].Local = false
		opt := m.copyHolder(r)
		if opt < 0 && m.ec != nil {
			ok, why := m.decodable(r)
			if !ok {
				return nil, why
			}
			src[r].Decode = true
		}
		if opt < 0 && !src[r].Decode {
			if m.holders == nil {
				return nil, fmt.Sprintf("rank %d's optimizer shard has no copy in memory (no replicas) (I3)", r)
			}
			return nil, m.noValidCopy(r)
		}
		par := -1
		m.eachPeer(r, func(p int) bool {
			if m.localOK[p] && m.alive[m.rankHost[p]] {
				par = p
				return false
			}
			return true
		})
		if par < 0 {
			return nil, fmt.Sprintf("no data-parallel peer of rank %d holds its parameters", r)
		}
		src[r].OptRank, src[r].OptHost = -1, -1
		if opt >= 0 {
			src[r].OptRank, src[r].OptHost = opt, m.rankHost[opt]
		}
		src[r].ParamsRank, src[r].ParamsHost = par, m.rankHost[par]
	}
	return src, ""
}

// violation checks invariants I1–I4 for the epoch about to be published,
// restored from sources, and says which one fails, or "".
func (m *Machine) violation(sources []Source) string {
	n := len(m.rankHost)
	// I1: every rank on one live host, no host over its room.
	load := make([]int, len(m.names))
	for r, h := range m.rankHost {
		if h < 0 || h >= len(m.names) || !m.alive[h] {
			return fmt.Sprintf("I1: rank %d is on a host that is not alive", r)
		}
		load[h]++
	}
	for h, l := range load {
		if room := m.cfg.room(h); room > 0 && l > room {
			return fmt.Sprintf("I1: host %s has %d ranks for %d slots", m.names[h], l, room)
		}
	}
	// I2: the host lists and the table agree: one owner per shard.
	seen := make([]bool, n)
	total := 0
	for h, rs := range m.hostRanks {
		for _, r := range rs {
			if r < 0 || r >= n || seen[r] || m.rankHost[r] != h {
				return fmt.Sprintf("I2: rank %d's shard has no single owner", r)
			}
			seen[r] = true
			total++
		}
	}
	if total != n {
		return fmt.Sprintf("I2: %d of %d shards have an owner", total, n)
	}
	// I3: every optimizer shard recoverable from memory: the plan's
	// sources are live and hold the state.
	if m.g >= 0 {
		for r, src := range sources {
			h := m.rankHost[r]
			switch {
			case src.Rank != r:
				return fmt.Sprintf("I3: rank %d has no restore source", r)
			case src.Local && (!m.localOK[r] || !m.alive[h]):
				return fmt.Sprintf("I3: rank %d's own slot does not hold its state", r)
			case src.Decode:
				if m.ec == nil {
					return fmt.Sprintf("I3: rank %d decodes without erasure coding", r)
				}
				if ok, why := m.decodable(r); !ok {
					return "I3: " + why
				}
				if !m.alive[src.ParamsHost] || m.rankHost[src.ParamsRank] != src.ParamsHost || !m.localOK[src.ParamsRank] {
					return fmt.Sprintf("I3: rank %d's parameters are not recoverable from memory", r)
				}
			case !src.Local && (!m.alive[src.OptHost] || m.rankHost[src.OptRank] != src.OptHost || !m.alive[src.ParamsHost] || !m.localOK[src.ParamsRank]):
				return fmt.Sprintf("I3: rank %d's optimizer shard is not recoverable from memory", r)
			}
		}
	}
	// I4: no rank resumes past what it committed.
	for r, s := range m.lastStep {
		if s >= 0 && m.g > s {
			return fmt.Sprintf("I4: resume step %d is past rank %d's committed step %d", m.g, r, s)
		}
	}
	return ""
}
