package comm

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// TestPeerLostReportedToAgent: a Comm made under gorun (it has an agent connection
// with its agent) whose collective fails with a PeerLostError tells its
// agent which peer it lost (a PeerLost frame with the Comm's epoch), once
// per peer (a later collective that fails on it does not report it again); and the rank's call returns whether or not the agent reads
// its socket (the report never blocks the rank). The agent is simulated
// over net.Pipe, whose writes block until read: an agent that does not
// read holds the report, never the call.
func TestPeerLostReportedToAgent(t *testing.T) {
	for _, tc := range []struct {
		name       string
		agentReads bool
	}{
		{"agent reads", true},
		{"agent does not read", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n, epoch, victim = 2, 5, 1
			comms := newWorld(t, n, worldOpts{epoch: epoch, log: io.Discard})
			rankEnd, agentEnd := net.Pipe()
			t.Cleanup(func() { agentEnd.Close() })
			s := newAgentConn("", rankEnd)
			go s.read()
			comms[0].agent.Store(s) // Close closes it

			frames := make(chan wire.PeerLost, 16)
			if tc.agentReads {
				go func() {
					for {
						typ, b, err := wire.ReadSock(agentEnd)
						if err != nil {
							close(frames)
							return
						}
						var p wire.PeerLost
						if typ != wire.SockPeerLost || wire.DecodeSock(b, &p) != nil {
							t.Errorf("the rank sent message type %d: %q", typ, b)
							continue
						}
						frames <- p
					}
				}()
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			comms[victim].Close()
			err := within(t, 10*time.Second, func() error { return comms[0].Barrier(ctx) })
			if pl, ok := errors.AsType[*PeerLostError](err); !ok || pl.Rank != victim {
				t.Fatalf("Barrier after rank %d closed: %v, want a PeerLostError naming it", victim, err)
			}
			// The failure sticks: a second collective fails too, and does
			// not report the peer again.
			if err := within(t, 10*time.Second, func() error { return comms[0].Barrier(ctx) }); !errors.Is(err, ErrPeerLost) {
				t.Errorf("second Barrier: %v, want ErrPeerLost", err)
			}
			if !tc.agentReads {
				return
			}
			select {
			case p := <-frames:
				if p.Epoch != epoch || len(p.Peers) != 1 || p.Peers[0] != victim {
					t.Errorf("report %+v, want epoch %d, peers [%d]", p, epoch, victim)
				}
			case <-ctx.Done():
				t.Fatalf("the agent was not told of the loss of rank %d", victim)
			}
			// Nothing more: once per peer. Closing the Comm ends the
			// agent connection, and so the simulated agent's reads.
			comms[0].Close()
			for p := range frames {
				t.Errorf("a further report %+v", p)
			}
		})
	}
}
