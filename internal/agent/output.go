package agent

import (
	"bytes"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// flushSize is the frame size past which output is sent at once.
const flushSize = 256 << 10

// drainTimeout bounds how long the output of a rank that has ended is
// still read: a process it left behind (outside its process group, which
// is killed with it) may hold its pipes open. Time the output spends held
// back by flow control does not count: only the rank's own writes are
// read after its end, to the last byte, however slow the reader of
// gorun's output.
const drainTimeout = time.Second

// Output flow control (wire.OutputWindow). Protocol: the batcher sends
// the output of every local rank in frames on the host's Output subject
// and counts their bytes (sent); the launcher acknowledges, on
// OutputAck(host), the cumulative count it has written (acked). While
// sent-acked is OutputWindow or more, no stream takes more output: the
// goroutine reading a rank's pipe waits, the pipe fills, and the rank
// waits in write(). That is the only thing the window holds back: exit
// reports, heartbeats and events never wait for it (a rank's exit is
// reported as soon as its output is read to the end or held back, see
// rankOutput.settled).
//
// Trust: acks come from the launcher only (the control-plane server lets
// no host publish on OutputAck). A count beyond what was sent is clamped.
//
// Order: a rank's stream is read by one goroutine, which adds its output
// in order; the stream of a restarted rank (a new generation) takes
// output only once the previous generation's stream of the same rank has
// been read to the end and added, so nothing overtakes.
//
// End: once every rank of a generation has ended (endGen) and all their
// streams (and those of earlier generations) are at their end, the
// batcher sends what it holds and then a wire.OutputDone, which tells the
// launcher the host's output of that generation is complete.

// batcher gathers output records of all local ranks into frames and sends
// a frame when it is full or when its oldest record is delay old, so a
// chatty job costs few messages and a quiet one sees its lines promptly.
type batcher struct {
	nc      *nats.Conn
	subject string // output frames
	done    string // OutputDone
	host    int
	delay   time.Duration
	window  uint64

	mu      sync.Mutex // guards the fields below
	room    *sync.Cond // signalled when acked grows or the batcher closes
	frame   *wire.OutputFrame
	timer   *time.Timer
	closed  bool
	sent    uint64 // bytes of frames sent
	acked   uint64 // bytes of frames the launcher has written
	streams map[streamKey]*outStream
	open    map[uint64]int  // streams not at their end, by generation
	ending  map[uint64]bool // generations whose ranks all ended, OutputDone not sent
}

type streamKey struct {
	rank   int
	stream wire.Stream
}

// newBatcher returns a batcher sending host's frames on subject and its
// OutputDone on done.
func newBatcher(nc *nats.Conn, subject, done string, host int, delay time.Duration) *batcher {
	b := &batcher{nc: nc, subject: subject, done: done, host: host, delay: delay, window: wire.OutputWindow,
		frame: wire.NewOutputFrame(host), streams: map[streamKey]*outStream{}, open: map[uint64]int{}, ending: map[uint64]bool{}}
	b.room = sync.NewCond(&b.mu)
	b.timer = time.AfterFunc(time.Hour, b.Flush)
	b.timer.Stop()
	return b
}

// Add queues data (whole lines; newline appended when addNewline is set).
// It does not wait for the window: streams do (outStream.add).
func (b *batcher) Add(rank int, s wire.Stream, data []byte, addNewline bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addLocked(rank, s, data, addNewline)
}

func (b *batcher) addLocked(rank int, s wire.Stream, data []byte, addNewline bool) {
	if b.closed {
		return
	}
	wasEmpty := b.frame.Empty()
	if addNewline {
		b.frame.Add(rank, s, append(data[:len(data):len(data)], '\n'))
	} else {
		b.frame.Add(rank, s, data)
	}
	switch {
	case b.frame.Len() >= flushSize || b.delay == 0 || b.sent-b.acked+uint64(b.frame.Len()) >= b.window:
		// A frame that would fill the window goes at once: the launcher
		// can write, and acknowledge, only what it has.
		b.flushLocked()
	case wasEmpty:
		b.timer.Reset(b.delay)
	}
}

// Flush sends whatever is queued.
func (b *batcher) Flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

func (b *batcher) flushLocked() {
	if b.frame.Empty() || b.closed {
		return
	}
	_ = b.nc.Publish(b.subject, b.frame.Bytes())
	b.sent += uint64(b.frame.Len())
	b.frame.Reset(b.frame.Host())
}

// onAck takes the launcher's OutputAck.
func (b *batcher) onAck(m *nats.Msg) {
	a, err := wire.DecodeOutputAck(m.Data)
	if err != nil || a.Host != b.host {
		return
	}
	b.ack(a.Bytes)
}

// ack records that the launcher has written n bytes of frames in all.
func (b *batcher) ack(n uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, b.sent)
	if n > b.acked {
		b.acked = n
		b.room.Broadcast()
	}
}

// full reports whether the window is full.
func (b *batcher) fullLocked() bool { return b.sent-b.acked >= b.window }

// openStream starts the output stream (rank, s) of generation gen; its
// reader adds to it, then closes it at the pipe's end. The caller must
// open every stream of a generation before it may call endGen for it.
func (b *batcher) openStream(rank int, s wire.Stream, gen uint64, ro *rankOutput) *outStream {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := streamKey{rank, s}
	st := &outStream{b: b, key: k, gen: gen, ro: ro, prev: b.streams[k], ended: make(chan struct{})}
	b.streams[k] = st
	b.open[gen]++
	return st
}

// endGen records that every rank of generation gen has ended: the
// batcher sends OutputDone once their streams are at their end.
func (b *batcher) endGen(gen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ending[gen] = true
	b.sendDoneLocked()
}

// sendDoneLocked sends OutputDone for each ending generation none of
// whose streams, or those of earlier generations, is still open.
func (b *batcher) sendDoneLocked() {
	for gen := range b.ending {
		busy := false
		for g, n := range b.open {
			if g <= gen && n > 0 {
				busy = true
				break
			}
		}
		if busy {
			continue
		}
		delete(b.ending, gen)
		b.flushLocked()
		if !b.closed {
			_ = b.nc.Publish(b.done, wire.Marshal(&wire.OutputDone{Host: b.host, Gen: gen, Bytes: b.sent}))
		}
	}
}

// Close flushes and stops the batcher; streams waiting for the window
// drop their output from then on.
func (b *batcher) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	b.timer.Stop()
	b.closed = true
	b.room.Broadcast()
}

// outStream is one stream (stdout or stderr) of one rank process.
type outStream struct {
	b     *batcher
	key   streamKey
	gen   uint64
	ro    *rankOutput
	prev  *outStream    // the previous generation's stream of the rank, or nil
	ended chan struct{} // closed by close

	waitedPrev bool // owned by the reader
}

// add adds data once the stream may: after the previous generation's
// stream ended, and while the window has room. Meanwhile the rank is
// marked held back.
func (s *outStream) add(data []byte, addNewline bool) {
	s.waitPrev()
	b := s.b
	b.mu.Lock()
	if b.fullLocked() && !b.closed {
		s.ro.hold(true)
		for b.fullLocked() && !b.closed {
			b.room.Wait()
		}
		s.ro.hold(false)
	}
	b.addLocked(s.key.rank, s.key.stream, data, addNewline)
	b.mu.Unlock()
}

func (s *outStream) waitPrev() {
	if s.waitedPrev {
		return
	}
	s.waitedPrev = true
	if s.prev == nil {
		return
	}
	select {
	case <-s.prev.ended:
		s.prev = nil
		return
	default:
	}
	s.ro.hold(true)
	<-s.prev.ended // it ends: its rank has ended, and Close frees its waits
	s.ro.hold(false)
	s.prev = nil
}

// close marks the stream's end (after the previous generation's).
func (s *outStream) close() {
	s.waitPrev()
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	close(s.ended)
	if b.streams[s.key] == s {
		delete(b.streams, s.key)
	}
	b.open[s.gen]--
	if b.open[s.gen] == 0 {
		delete(b.open, s.gen)
	}
	b.sendDoneLocked()
}

// pumpBufStart is the size of a pump's first read buffer, which lives on
// the pump goroutine's stack. It moves to the heap and doubles, up to
// wire.MaxLine, each time a read fills it: a rank that writes little
// (most, at a launch of many) costs its pumps a page each, where a
// MaxLine buffer grew each pump's stack to 128 KiB (at -np 64, 16 MiB of
// fresh pages, their faults and two garbage collections on the launch's
// path); one that writes much reads as much per call as before after a
// few reads.
const pumpBufStart = 4 << 10

// pump forwards whole lines read from r. A line longer than wire.MaxLine
// is forwarded in pieces; a last line without a newline gets one. It
// returns at the pipe's end, or once the rank has ended and the pipe
// stayed open drainTimeout longer (rankOutput.deadline).
func (s *outStream) pump(r *os.File) {
	defer s.close()
	defer r.Close()
	buf := make([]byte, min(pumpBufStart, wire.MaxLine))
	have := 0
	for {
		if !s.ro.deadline(r) {
			break
		}
		n, err := r.Read(buf[have:])
		have += n
		if have == len(buf) && len(buf) < wire.MaxLine {
			bigger := make([]byte, min(2*len(buf), wire.MaxLine))
			copy(bigger, buf[:have])
			buf = bigger
		}
		if i := bytes.LastIndexByte(buf[:have], '\n'); i >= 0 {
			s.add(buf[:i+1], false)
			have = copy(buf, buf[i+1:have])
		} else if have == len(buf) {
			s.add(buf[:have], true)
			have = 0
		}
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
		}
	}
	if have > 0 {
		s.add(buf[:have], true)
	}
}

// rankOutput is the output side of one rank process: whether its output
// is held back (by the window or an earlier generation), and how long its
// pipes are still read after its end.
type rankOutput struct {
	mu       sync.Mutex    // guards the fields below
	held     int           // streams waiting to add their output
	heldCh   chan struct{} // closed when held becomes positive, then replaced
	ended    time.Time     // when the rank ended (zero while it runs)
	heldTime time.Duration // time held back since ended
	heldAt   time.Time     // when held became positive, after ended
	files    []*os.File    // the pipes being read
}

func newRankOutput() *rankOutput {
	return &rankOutput{heldCh: make(chan struct{})}
}

func (o *rankOutput) hold(on bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	if on {
		o.held++
		if o.held == 1 {
			close(o.heldCh)
			if !o.ended.IsZero() {
				o.heldAt = now
			}
		}
		return
	}
	o.held--
	if o.held == 0 {
		o.heldCh = make(chan struct{})
		if !o.heldAt.IsZero() {
			o.heldTime += now.Sub(o.heldAt)
			o.heldAt = time.Time{}
		}
	}
}

// rankEnded records the rank's end: its pipes are read for drainTimeout
// more (not counting time held back), then abandoned.
func (o *rankOutput) rankEnded(files ...*os.File) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	o.ended = now
	if o.held > 0 {
		o.heldAt = now
	}
	o.files = files
	for _, f := range files {
		_ = f.SetReadDeadline(now.Add(drainTimeout))
	}
}

// deadline sets r's read deadline before a read, once the rank has ended,
// and reports false when the time to read it is up.
func (o *rankOutput) deadline(r *os.File) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended.IsZero() {
		return true
	}
	now := time.Now()
	left := drainTimeout - (now.Sub(o.ended) - o.heldTime)
	if left <= 0 {
		return false
	}
	_ = r.SetReadDeadline(now.Add(left))
	return true
}

// settled returns a channel that is closed when the rank's exit may be
// reported although its pipes are not at their end yet: at once if its
// output is held back, else when it becomes so.
func (o *rankOutput) settled() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.heldCh
}
