package launcher

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// outputFlow is the launcher's side of output flow control
// (wire.OutputWindow): per host, the bytes of output frames received and
// written, the acknowledgements sent, and the host's end marker
// (wire.OutputDone).
//
// A frame counts as written once every record in it is written to its
// destination and flushed (or dropped, once that destination is broken),
// by the lanes, which then call wrote; acks are coalesced (one per
// wire.OutputAckEvery bytes written, at the most one per lane batch), so
// a thousand chatty hosts cost a few acks per window each, not one per
// frame. An agent sends at most a window of frames that are not
// acknowledged, so what the launcher holds of a host's output is bounded
// by the window and a frame: hosts × (OutputWindow + a frame) in all.
//
// Safe for concurrent use: received and ended are called by the
// control-plane handler, wrote by the lanes, complete by the job's loop.
type outputFlow struct {
	every uint64
	send  func(host int, bytes uint64) // publishes an OutputAck (outside mu)

	mu      sync.Mutex // guards the fields below
	hosts   []hostFlow
	changed chan struct{} // closed, and replaced, when an end marker arrives
}

type hostFlow struct {
	recv    uint64 // frame bytes received
	written uint64 // frame bytes written (or dropped)
	acked   uint64 // what the last OutputAck said
	done    bool   // an end marker has come
	doneGen uint64 // the newest generation an end marker was for
}

func newOutputFlow(hosts int, every uint64, send func(host int, bytes uint64)) *outputFlow {
	return &outputFlow{every: max(every, 1), send: send, hosts: make([]hostFlow, hosts), changed: make(chan struct{})}
}

// received counts a frame of n bytes from host.
func (f *outputFlow) received(host int, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hosts[host].recv += uint64(n)
}

// wrote counts n bytes of host's frames as written, and sends an ack when
// enough has been written since the last.
func (f *outputFlow) wrote(host int, n uint64) {
	f.mu.Lock()
	h := &f.hosts[host]
	h.written += n
	ack, send := h.written, h.written-h.acked >= f.every
	if send {
		h.acked = ack
	}
	f.mu.Unlock()
	if send && f.send != nil {
		f.send(host, ack)
	}
}

// ended records host's end marker for generation gen, sent after frames
// of bytes bytes in all; an error says some of them never arrived.
func (f *outputFlow) ended(host int, gen, bytes uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := &f.hosts[host]
	if !h.done || gen > h.doneGen {
		h.done, h.doneGen = true, gen
	}
	close(f.changed)
	f.changed = make(chan struct{})
	if bytes != h.recv {
		return fmt.Errorf("the host sent %d bytes of output frames, %d arrived", bytes, h.recv)
	}
	return nil
}

// complete reports whether host's output of generation gen has all
// arrived (its end marker has).
func (f *outputFlow) complete(host int, gen uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := &f.hosts[host]
	return h.done && h.doneGen >= gen
}

// changes returns a channel closed at the next end marker.
func (f *outputFlow) changes() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// frameTok follows a frame through the lanes it was posted to: the last
// lane to write and flush its part counts it as written.
type frameTok struct {
	host  int
	n     uint64
	parts atomic.Int32
}

// settle counts the frames whose parts a lane has just written and
// flushed; it runs on that lane, after its flush.
func (f *outputFlow) settle(toks []*frameTok) {
	for _, t := range toks {
		if t.parts.Add(-1) == 0 {
			f.wrote(t.host, t.n)
		}
	}
}
