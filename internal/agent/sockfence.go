package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// The rank sockets' fences and epochs: a rank enters this host's part of
// a job-wide fence over its socket (fence), which goes up to the launcher
// once every local rank is in and comes back merged (fenceDone); a new
// epoch, a restart, or a rank's end fails the fences it leaves
// incomplete (setEpoch, restart, rankEnded). socket.go serves the
// sockets themselves.

// hostFence gathers this host's ranks in one fence.
type hostFence struct {
	kv     map[string]string
	n      int
	in     map[int]bool // the local ranks that entered
	err    string
	done   chan struct{} // closed when result is set
	result *wire.Fence
}

// fence enters rank, a rank of restart generation gen, into its next
// fence and waits for the whole job's.
func (s *rankSockets) fence(gen uint64, rank int, f *wire.Fence) (*wire.Fence, error) {
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock()
		return nil, fmt.Errorf("fence of a rank of restart generation %d, epoch %d is generation %d's", gen, s.epoch, s.gen)
	}
	if f.Epoch < s.epoch {
		// The rank entered it before it read the push of the new epoch
		// (already on its way): the fence fails as those in progress did.
		cur := s.epoch
		s.mu.Unlock()
		return &wire.Fence{Epoch: f.Epoch, Seq: f.Seq, Err: fmt.Sprintf("the epoch changed to %d", cur)}, nil
	}
	if f.Epoch != s.epoch {
		s.mu.Unlock()
		return nil, fmt.Errorf("fence of epoch %d, the current one is %d", f.Epoch, s.epoch)
	}
	if want := s.nextSeq[rank]; f.Seq != want {
		s.mu.Unlock()
		return nil, fmt.Errorf("fence %d, expected %d", f.Seq, want)
	}
	if r, ok := s.endedRank(); ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("rank %d ended without entering this fence", r)
	}
	s.nextSeq[rank]++
	hf := s.fences[f.Seq]
	if hf == nil {
		hf = &hostFence{kv: map[string]string{}, in: map[int]bool{}, done: make(chan struct{})}
		s.fences[f.Seq] = hf
	}
	hf.in[rank] = true
	for k, v := range f.KV {
		if _, dup := hf.kv[k]; dup && hf.err == "" {
			hf.err = fmt.Sprintf("key %q set by two ranks", k)
		}
		hf.kv[k] = v
	}
	hf.n++
	var up []byte
	if hf.n == s.local {
		up = wire.Marshal(&wire.UpFence{Host: s.host, Epoch: s.epoch, Seq: f.Seq, KV: hf.kv})
	}
	s.mu.Unlock()
	if up != nil {
		if err := s.nc.Publish(s.subj.UpFence, up); err != nil {
			// Every local rank of this fence waits on it: fail it for all.
			s.mu.Lock()
			if s.fences[f.Seq] == hf && hf.result == nil {
				delete(s.fences, f.Seq)
				hf.err = fmt.Sprintf("fence: sending this host's part to the launcher: %v", err)
				close(hf.done)
			}
			s.mu.Unlock()
			return nil, fmt.Errorf("fence: %w", err)
		}
	}
	select {
	case <-hf.done:
	case <-s.stop:
		return nil, errors.New("fence: the agent is stopping")
	}
	if hf.result == nil { // failed by setEpoch
		return &wire.Fence{Epoch: f.Epoch, Seq: f.Seq, Err: hf.err}, nil
	}
	if hf.err != "" {
		return &wire.Fence{Epoch: s.epoch, Seq: f.Seq, Err: hf.err}, nil
	}
	return hf.result, nil
}

// setEpoch moves to a new epoch: fences of the old one fail, and every
// welcomed connection is told the new table.
func (s *rankSockets) setEpoch(t *wire.EpochTable, local int) {
	push := &wire.Welcome{Version: wire.SockVersion, Job: s.job, Epoch: t.Epoch, DataKey: s.dataKey, Table: t.Encode(),
		MasterAddr: t.MasterAddr, MasterPort: t.MasterPort}
	s.mu.Lock()
	if t.Epoch <= s.epoch {
		s.mu.Unlock()
		return
	}
	s.table, s.epoch, s.world, s.local = push.Table, t.Epoch, t.World, local
	s.masterAddr, s.masterPort = t.MasterAddr, t.MasterPort
	if s.restartGen != 0 && t.Epoch >= s.restartEpoch {
		s.gen, s.restartGen, s.restartEpoch = s.restartGen, 0, 0
	}
	conns := make([]*rankConn, 0, len(s.conns))
	for _, ss := range s.conns {
		conns = append(conns, ss)
	}
	// Pushed under s.mu so that no welcome of the old epoch can follow.
	// Ranks of an older generation are not told: the epoch is not theirs.
	for _, ss := range conns {
		ss.mu.Lock()
		if ss.welcomed && ss.gen == s.gen {
			// A rank that does not read its socket must not hold the agent.
			ss.c.SetWriteDeadline(time.Now().Add(time.Second))
			if err := wire.WriteSock(ss.c, wire.SockEpoch, push); err != nil {
				s.log.Warn("cannot tell a rank of the new epoch", "err", err)
			}
			ss.c.SetWriteDeadline(time.Time{})
		}
		ss.mu.Unlock()
	}
	// The old epoch's fences fail after the push: a rank reads the new
	// epoch before its fence's failure, and knows why it failed.
	s.resetFences(fmt.Sprintf("the epoch changed to %d", t.Epoch))
	s.mu.Unlock()
}

// resetFences starts the fences of the current epoch afresh: every
// fence pending fails with why, and no rank has entered or left any.
// s.mu is held.
func (s *rankSockets) resetFences(why string) {
	s.nextSeq = map[int]int{}
	s.ended = nil
	for seq, hf := range s.fences {
		hf.err = why
		close(hf.done)
		delete(s.fences, seq)
	}
}

// restart records that the ranks restart in generation gen from epoch on
// (wire.OpRestart): from that epoch's table on, only gen's ranks take part
// in fences, and the ends of older ranks are not that epoch's business.
func (s *rankSockets) restart(gen, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen <= s.gen || gen <= s.restartGen {
		return
	}
	if epoch > s.epoch {
		s.restartGen, s.restartEpoch = gen, epoch
		return
	}
	// The table came first: what the old ranks did in this epoch (the
	// fences they entered, their ends) is undone.
	s.log.Warn("the restart's epoch table arrived before the restart", "generation", gen, "epoch", epoch)
	s.gen, s.restartGen, s.restartEpoch = gen, 0, 0
	s.resetFences(fmt.Sprintf("the ranks are restarting (generation %d)", gen))
}

// launched records that the ranks of generation gen are about to start:
// every connection open now is of an older rank, which has ended (or of
// what it left behind), and is closed; connections from now on are gen's.
func (s *rankSockets) launched(gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live = gen
	for c := range s.conns {
		c.Close()
	}
}

// liveGen returns the generation of the ranks started last.
func (s *rankSockets) liveGen() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

// endedRank returns a local rank that ended in this epoch, if any. s.mu
// is held.
func (s *rankSockets) endedRank() (int, bool) {
	for r := range s.ended {
		return r, true
	}
	return 0, false
}

// rankEnded records that a local rank of restart generation gen ended:
// the fences of this epoch it has not entered can never complete, so they
// fail now (ranks waiting in them, such as MPI ranks in a PMI barrier, are
// not left hanging), and so do later ones. The end of a rank of another
// generation than the epoch's (killed by a restart) changes nothing.
func (s *rankSockets) rankEnded(rank int, gen uint64) {
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock()
		return
	}
	if s.ended == nil {
		s.ended = map[int]bool{}
	}
	s.ended[rank] = true
	why := fmt.Sprintf("rank %d ended without entering this fence", rank)
	for seq, hf := range s.fences {
		if !hf.in[rank] && hf.result == nil {
			hf.err = why
			close(hf.done)
			delete(s.fences, seq)
		}
	}
	// Ranks on other hosts may wait for it in its next fence: fail that
	// one job-wide (nobody is hurt if nobody waits), unless a restart
	// has already left this epoch behind.
	var up []byte
	if s.restartGen == 0 {
		up = wire.Marshal(&wire.UpFence{Host: s.host, Epoch: s.epoch, Seq: s.nextSeq[rank], Err: why})
	}
	s.mu.Unlock()
	if s.nc != nil && up != nil {
		if err := s.nc.Publish(s.subj.UpFence, up); err != nil {
			s.log.Warn("cannot fail the fence a rank left", "rank", rank, "err", err)
		}
	}
}

// fenceDone delivers the launcher's merged fence to the waiting ranks.
func (s *rankSockets) fenceDone(m *nats.Msg) {
	f, err := wire.DecodeFence(m.Data, wire.MaxWorld)
	if err != nil {
		s.log.Warn("bad fence from the launcher", "err", err)
		return
	}
	s.mu.Lock()
	hf := s.fences[f.Seq]
	if f.Epoch == s.epoch && hf != nil && hf.result == nil {
		delete(s.fences, f.Seq)
		hf.result = f
		close(hf.done)
	}
	s.mu.Unlock()
}
