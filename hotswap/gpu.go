package hotswap

import (
	"fmt"
	"time"
)

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
