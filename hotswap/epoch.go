package hotswap

import (
	"fmt"
	"slices"
	"time"

	"github.com/gorun/gorun/topology"
)

// Recovery epochs: beginning one, publishing its table and restore plan,
// the stages reported of it (onRecovery); and the copies of the optimizer
// shards made valid again (onReplicated, setCopy), which end the
// under-protection a loss began.

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
