package keeper

import (
	"errors"

	"github.com/gorun/gorun/ckpt"
)

// truncate discards every step after g (a restart resumes from g), then
// has the holders asked what they hold (a restarted holder may have
// dropped steps, a replaced one holds nothing) and sent the newest step
// left if they lack it: Replicated says it only then.
func (s *service) truncate(g int64) error {
	s.persistTruncate(g)
	s.rep.reset()
	s.rep.forget() // before the slots change: no report pairs a new committed step with old acks
	err := s.truncateSlots(g)
	s.rep.truncateDiffs(g)
	s.resetDiffLog(g)
	s.mu.Lock()
	committed := s.committed
	s.mu.Unlock()
	s.rep.want(committed)
	return err
}

// truncateSlots discards every step after g. The replicator is reset.
func (s *service) truncateSlots(g int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staged = nil
	if s.corrupt != nil {
		// The corrupt step is after g (it was never replicated, so G
		// never reached it): discarded below.
		s.corrupt, s.failed = nil, make(chan struct{})
	}
	if s.slots == nil {
		return nil
	}
	if g >= 0 {
		if err := s.slots.Truncate(uint64(g)); err != nil {
			return err
		}
	}
	for i, st := range s.slotStep {
		if st > g || g < 0 {
			s.slotStep[i] = noStep
		}
	}
	if g < 0 {
		// A restart from scratch: forget every step.
		if err := s.slots.Clear(); err != nil {
			return err
		}
	}
	s.committed = max(s.slotStep[0], s.slotStep[1])
	// The rank resumes from g: the Gradients after it go, and the next
	// one's optimizer step follows g's.
	s.grads, s.lastGrad, s.lastT = nil, noStep, 0
	for i, st := range s.slotStep {
		if st >= 0 && st == s.committed {
			s.lastT = s.slotT[i]
		}
	}
	return nil
}

// removeFiles removes the files the service made (after close) whose
// names still lead to them, and returns the paths it left because
// another process made them since.
func (s *service) removeFiles() (left []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.owned) == 0 {
		return nil, nil
	}
	ran := false
	err = s.h.names(s.rank, func() error {
		ran = true
		var err error
		left, err = ckpt.RemoveOwned(s.owned)
		return err
	})
	if !ran {
		// The lock failed, or another agent held it for ckpt.NamesWait
		// (stopped inside Create, say): the files stay, for the job's
		// last agent here; a leftover is better than a hang.
		ckpt.Disown(s.owned)
	}
	s.owned = nil
	return left, err
}

// removeFilesLog is removeFiles, logging the files it left.
func (s *service) removeFilesLog() error {
	left, err := s.removeFiles()
	if len(left) > 0 {
		s.h.log.Info("left a rank's files another agent of the job made since (a spare that took the rank over)", "rank", s.rank, "files", left)
	}
	return err
}

// close stops the service: its requests in flight end (it waits for
// them, and for the readers of its slots) and its slots are unmapped.
// The files stay (removeFiles).
func (s *service) close() error {
	s.stop()
	s.rep.stop()
	s.closeDiffLog()
	perr := s.persistClose() // before the slots are unmapped: no save reads them then
	s.reqMu.Lock()
	defer s.reqMu.Unlock()
	s.mapMu.Lock() // no reader holds views of the slots
	defer s.mapMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.gradUnmap != nil {
		errs = append(errs, s.gradUnmap())
		s.gradUnmap, s.grad = nil, [2][]byte{}
	}
	if s.slots != nil {
		errs = append(errs, s.slots.Close())
		s.slots = nil
	}
	errs = append(errs, perr)
	return errors.Join(errs...)
}
