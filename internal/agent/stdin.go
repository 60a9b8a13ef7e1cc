package agent

import (
	"errors"
	"io"
	"sync"

	"github.com/nats-io/nats.go"
)

// The launcher's standard input goes to one rank (mpirun's --stdin, rank 0
// by default). The launcher sends it a chunk at a time to the agent of
// that rank's host and waits for each chunk's answer, so a rank that does
// not read holds the launcher's reading, not its memory.
//
// Across restarts in place the rank is a new process with a new pipe each
// generation; stdinRelay carries the stream over:
//   - a chunk whose write fails because the old generation's reader died
//     (EPIPE) waits for the next generation's pipe and is written there,
//     or is refused once no generation will come (the agent is done);
//   - the end of the launcher's stdin, once seen, is given to every later
//     generation at once (its pipe is closed), so that a restarted reader
//     does not wait for input that will never come.
//
// What the old generation read, or what sat unread in its pipe, is gone
// with it: stdin is a stream, not a replayable file. A chunk partly
// written to the old pipe when it broke is written again whole.

// errStdinClosed reports that no rank will read stdin on this host again.
var errStdinClosed = errors.New("the agent has stopped")

// stdinRelay owns the write end of the stdin pipe of the local rank that
// reads the launcher's stdin, across generations. Its methods are safe
// for concurrent use: the agent's loop sets the pipe, the stdin
// subscription's goroutine writes.
type stdinRelay struct {
	mu      sync.Mutex
	w       io.WriteCloser // the current generation's pipe, or nil
	eof     bool           // the launcher's stdin ended
	done    bool           // no generation will come: the agent is done
	changed chan struct{}  // closed (and replaced) when w or done changes
}

func newStdinRelay() *stdinRelay { return &stdinRelay{changed: make(chan struct{})} }

// set makes w the pipe of the generation now starting (nil: none reads
// stdin here), closing the previous generation's. After the end of stdin,
// w is closed at once.
func (s *stdinRelay) set(w io.WriteCloser) {
	s.mu.Lock()
	old := s.w
	s.w = w
	if s.eof && w != nil {
		w.Close()
	}
	s.signalLocked()
	s.mu.Unlock()
	if old != nil && old != w {
		old.Close()
	}
}

// close ends the relay: a waiting write is refused, and the pipe closed.
func (s *stdinRelay) close() {
	s.mu.Lock()
	w := s.w
	s.w, s.done = nil, true
	s.signalLocked()
	s.mu.Unlock()
	if w != nil {
		w.Close()
	}
}

func (s *stdinRelay) signalLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// current returns the pipe to write to, whether the relay is done, and
// the channel closed at the next change.
func (s *stdinRelay) current() (io.WriteCloser, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w, s.done, s.changed
}

// write passes one chunk of the launcher's stdin on; an empty chunk is its
// end. It blocks while the rank does not read, and across a restart of
// the rank (see the comment at the top of this file). ok is false when no
// rank reads stdin here.
func (s *stdinRelay) write(b []byte) (ok bool, err error) {
	if len(b) == 0 {
		s.mu.Lock()
		s.eof = true
		w := s.w
		s.mu.Unlock()
		if w == nil {
			return false, nil
		}
		return true, w.Close()
	}
	w, done, changed := s.current()
	if w == nil && !done {
		return false, nil
	}
	for {
		if done {
			return true, errStdinClosed
		}
		if _, err := w.Write(b); err == nil {
			return true, nil
		}
		// The reader is gone: wait for the next generation's pipe, or the
		// agent's end.
		for {
			<-changed
			next, d, c := s.current()
			done, changed = d, c
			if done || next != nil && next != w {
				w = next
				break
			}
		}
	}
}

// onStdin writes the launcher's stdin into the pipe of the rank that
// reads it, answering once the bytes are in (or that the pipe is closed).
// It runs on the subscription's goroutine; a rank that does not read
// blocks it, and so the launcher, which waits for the answer.
func (a *agent) onStdin(m *nats.Msg) {
	answer := func(s string) { _ = m.Respond([]byte(s)) }
	select {
	case <-a.stdinReady:
	case <-a.done:
		answer("closed: the agent has stopped")
		return
	}
	ok, err := a.stdin.write(m.Data)
	switch {
	case !ok:
		answer("closed: no rank here reads stdin")
	case err != nil:
		answer("closed: " + err.Error())
	default:
		answer("")
	}
}
