package agent

import (
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// TestPeerLostSock: a rank's peer-loss reports (wire.SockPeerLost) reach
// the launcher as EventPeerLost naming the rank, its epoch and the peers,
// each peer once per epoch; stale reports (another epoch) and bad ones
// (the rank itself, a rank outside the world, a payload that does not
// decode) are dropped without ending the session; and a report sent while
// the rank waits in a fence leaves that fence waiting.
func TestPeerLostSock(t *testing.T) {
	s := testSockets(t)
	events := make(chan *wire.Event, 16)
	s.report = func(e *wire.Event) { events <- e }
	s.host = 2
	s.world = 4
	s.epoch = 3
	s.table = (&wire.EpochTable{Version: wire.Version, Job: "socktest", Epoch: 3, World: 4,
		Hosts: []wire.TableHost{{Name: "h0", Addr: "127.0.0.1", Ranks: wire.CompressRanks([]int{0, 1, 2, 3})}}}).Encode()
	path := filepath.Join(t.TempDir(), "rank-1.sock")
	if err := s.listen(1, path); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	write := func(typ byte, v any) {
		t.Helper()
		if err := wire.WriteSock(c, typ, v); err != nil {
			t.Fatal(err)
		}
	}
	write(wire.SockHello, &wire.Hello{Version: wire.SockVersion})
	if typ, _, err := wire.ReadSock(c); err != nil || typ != wire.SockWelcome {
		t.Fatalf("hello answered with type %d, %v", typ, err)
	}
	// The rank waits in a fence (it cannot complete: the host counts
	// three local ranks) while it reports.
	write(wire.SockFence, &wire.Fence{Epoch: 3, Seq: 0, KV: map[string]string{"k": "v"}})
	next := func(what string) *wire.Event {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(30 * time.Second):
			t.Fatalf("no event for %s", what)
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		rep  any
		want []int // nil: no event
	}{
		{"first", &wire.PeerLost{Epoch: 3, Peers: []int{0}}, []int{0}},
		{"again", &wire.PeerLost{Epoch: 3, Peers: []int{0}}, nil},
		{"stale epoch", &wire.PeerLost{Epoch: 2, Peers: []int{2}}, nil},
		{"itself", &wire.PeerLost{Epoch: 3, Peers: []int{1}}, nil},
		{"outside the world", &wire.PeerLost{Epoch: 3, Peers: []int{4}}, nil},
		{"none", &wire.PeerLost{Epoch: 3}, nil},
		{"bad payload", map[string]int{"epoch": 3, "extra": 1}, nil},
		{"one new of two", &wire.PeerLost{Epoch: 3, Peers: []int{0, 2}}, []int{2}},
		{"last", &wire.PeerLost{Epoch: 3, Peers: []int{3}}, []int{3}},
	} {
		write(wire.SockPeerLost, tc.rep)
		if tc.want == nil {
			continue
		}
		// Frames are handled in order: an event for this report says
		// that those before it made none if none came before it.
		e := next(tc.name)
		if e.Kind != wire.EventPeerLost || e.Host != 2 || e.Rank != 1 || e.Epoch != 3 || !slices.Equal(e.Peers, tc.want) {
			t.Errorf("%s: event %+v, want peer-lost of rank 1 on host 2 in epoch 3, peers %v", tc.name, e, tc.want)
		}
		if _, err := wire.DecodeEvent(wire.Marshal(e)); err != nil {
			t.Errorf("%s: the event does not decode: %v", tc.name, err)
		}
	}
	// The session is alive and its fence still waits: a new epoch fails it.
	s.setEpoch(&wire.EpochTable{Version: wire.Version, Job: "socktest", Epoch: 4, World: 4,
		Hosts: []wire.TableHost{{Name: "h0", Addr: "127.0.0.1", Ranks: wire.CompressRanks([]int{0, 1, 2, 3})}}}, 3)
	for got := map[byte]bool{}; !got[wire.SockFenceDone]; {
		typ, b, err := wire.ReadSock(c)
		if err != nil {
			t.Fatalf("the session ended: %v", err)
		}
		if typ == wire.SockError {
			t.Fatalf("the agent refused: %s", b)
		}
		got[typ] = true
	}
	// In the new epoch the peer may be reported again.
	write(wire.SockPeerLost, &wire.PeerLost{Epoch: 4, Peers: []int{0}})
	if e := next("epoch 4"); e.Epoch != 4 || !slices.Equal(e.Peers, []int{0}) {
		t.Errorf("epoch 4: event %+v, want peers [0]", e)
	}
}
