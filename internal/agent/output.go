package agent

import (
	"sync"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// flushSize is the frame size past which output is sent at once.
const flushSize = 256 << 10

// batcher gathers output records of all local ranks into frames and sends
// a frame when it is full or when its oldest record is delay old, so a
// chatty job costs few messages and a quiet one sees its lines promptly.
type batcher struct {
	nc      *nats.Conn
	subject string
	delay   time.Duration

	mu     sync.Mutex // guards the fields below
	frame  *wire.OutputFrame
	timer  *time.Timer
	closed bool
}

func newBatcher(nc *nats.Conn, subject string, host int, delay time.Duration) *batcher {
	b := &batcher{nc: nc, subject: subject, delay: delay, frame: wire.NewOutputFrame(host)}
	b.timer = time.AfterFunc(time.Hour, b.Flush)
	b.timer.Stop()
	return b
}

// Add queues data (whole lines; newline appended when addNewline is set).
func (b *batcher) Add(rank int, s wire.Stream, data []byte, addNewline bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
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
	case b.frame.Len() >= flushSize || b.delay == 0:
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
	if b.frame.Empty() {
		return
	}
	_ = b.nc.Publish(b.subject, b.frame.Bytes())
	b.frame.Reset(b.frame.Host())
}

// Close flushes and stops the batcher.
func (b *batcher) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	b.timer.Stop()
	b.closed = true
}
