package comm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// TestAgentConnCallContextEndsAsAnswerArrives: an agent connection call whose context
// ends just as the agent's answer arrives returns (with the answer or the
// context's error), and the agent connection then closes. The reader must not stay
// blocked handing the answer to a caller that left: call's cleanup waits
// for the reader. The agent here is simulated over net.Pipe; it answers
// each request and ends the caller's context around the answer, in both
// orders, many times, since which of the two the caller sees first is up
// to the scheduler.
func TestAgentConnCallContextEndsAsAnswerArrives(t *testing.T) {
	const tries = 60
	hung := 0
	for i := range tries {
		if err := callAsContextEnds(i%2 == 0); err != nil {
			hung++
			t.Errorf("try %d of %d (context ended %s the answer): %v", i+1, tries, map[bool]string{true: "before", false: "after"}[i%2 == 0], err)
			if hung == 3 {
				t.FailNow() // each hang leaves its goroutines behind
			}
		}
	}
}

// callAsContextEnds runs one agent connection call against a simulated agent that
// ends the call's context before (cancelFirst) or after it writes the
// answer. It returns an error if the call or the agent connection's close hangs,
// or the call returns something else than the answer or the context's
// error.
func callAsContextEnds(cancelFirst bool) error {
	const hang = 5 * time.Second
	rankEnd, agentEnd := net.Pipe()
	s := newAgentConn("", rankEnd)
	go s.read()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agentDone := make(chan struct{})
	go func() {
		defer close(agentDone)
		defer agentEnd.Close()
		typ, _, err := wire.ReadSock(agentEnd)
		if err != nil || typ != wire.SockFence {
			return
		}
		if cancelFirst {
			cancel()
		}
		// Fails when the caller closed the agent connection first: fine.
		_ = wire.WriteSock(agentEnd, wire.SockFenceDone, &wire.Fence{KV: map[string]string{"k": "v"}})
		cancel()
		// Hold the connection open: only the agent connection may end it.
		var b [1]byte
		_, _ = agentEnd.Read(b[:])
	}()

	errc := make(chan error, 1)
	var res wire.Fence
	go func() {
		errc <- s.call(ctx, wire.SockFence, &wire.Fence{KV: map[string]string{"k": "v"}}, wire.SockFenceDone, &res)
	}()
	select {
	case err := <-errc:
		switch {
		case err == nil && res.KV["k"] != "v":
			return fmt.Errorf("call returned the answer %+v", res)
		case err != nil && !errors.Is(err, context.Canceled):
			return fmt.Errorf("call = %w, want the answer or context.Canceled", err)
		}
	case <-time.After(hang):
		return errors.New("call did not return after its context ended: deadlocked with the agent connection's reader")
	}
	closed := make(chan struct{})
	go func() { s.close(); <-agentDone; close(closed) }()
	select {
	case <-closed:
	case <-time.After(hang):
		return errors.New("the agent connection did not close: its reader is stuck")
	}
	return nil
}
