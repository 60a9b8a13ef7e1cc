package keeper

import (
	"slices"
	"sync"
	"sync/atomic"
)

// The owner's large per-step buffers in diff mode — each step's encoded
// record (the size of the gradient) and each base refresh's snapshot
// (the size of the replicated regions) — are reused rather than
// allocated afresh: a fresh buffer is zeroed by Go, which faults every
// page in (the runtime returns freed pages to the OS under the agent's
// soft memory limit), and that is most of the cost of a copy.
//
// A buffer is reused only once nothing can read it any more. Each one is
// owned by a shared value (an ownerDiff, a refresh) whose reference count
// says who may still read it: the replicator's queue (or current
// refresh) holds one reference, each send in flight one more
// (planDiffLocked takes it under the replicator's lock, the round gives
// it back when every holder's send returned: linkPool.do returns only
// after its write ended). The last release puts the buffer in its pool;
// until then no pool can hand it out.

// bufPool keeps up to max buffers that nothing reads any more, for the
// next user to write over. It is safe for concurrent use; the zero value
// keeps nothing (max 0).
type bufPool struct {
	max  int
	mu   sync.Mutex
	free [][]byte // capacity > 0, most recently put last
	hits int64    // gets that returned a buffer
}

// testPoisonBuffers, set by tests, has bufPool.put overwrite every byte
// of a buffer it takes back: a reader still using it would see the
// poison instead of its data.
var testPoisonBuffers atomic.Bool

const poisonByte = 0xdb

// get returns a buffer of length 0 and capacity at least n that nothing
// else uses (the most recently put of those, whose pages are the most
// likely to be cached), or nil if the pool has none.
func (p *bufPool) get(n int) []byte {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if b := p.free[i]; cap(b) >= n {
			p.free = slices.Delete(p.free, i, i+1) // clears the slot it frees
			p.hits++
			return b[:0]
		}
	}
	return nil
}

// put takes back b, which nothing reads or writes any more: it keeps it
// if it has room (else the oldest buffer it keeps goes to the garbage
// collector).
func (p *bufPool) put(b []byte) {
	if p == nil || cap(b) == 0 || p.max <= 0 {
		return
	}
	if testPoisonBuffers.Load() {
		b = b[:cap(b)]
		for i := range b {
			b[i] = poisonByte
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) >= p.max {
		p.free = slices.Delete(p.free, 0, 1)
	}
	p.free = append(p.free, b[:0])
}

// stats returns how many buffers p keeps and how many gets it served
// (tests).
func (p *bufPool) stats() (kept int, hits int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free), p.hits
}

// refBuf is a buffer shared by the readers that hold a reference to it;
// the last release puts it in its pool. It counts from own on: a refBuf
// never owned (as in tests that build an ownerDiff by hand) must not be
// retained or released.
type refBuf struct {
	refs atomic.Int64
	pool *bufPool
	buf  []byte // the whole buffer (the data is a prefix of it)
}

// own starts the count at one reference (the creator's) for buf, which
// goes back to pool at the last release.
func (rb *refBuf) own(pool *bufPool, buf []byte) {
	rb.pool, rb.buf = pool, buf
	rb.refs.Store(1)
}

// retain adds a reference: the caller already holds one, or holds the
// lock under which the holder of one hands it out.
func (rb *refBuf) retain() {
	if rb.refs.Add(1) <= 1 {
		panic("rank: retain of a released buffer")
	}
}

// release drops a reference; the last one gives the buffer back to its
// pool. The caller must not read the buffer afterwards.
func (rb *refBuf) release() {
	switch n := rb.refs.Add(-1); {
	case n == 0:
		buf := rb.buf
		rb.buf = nil
		rb.pool.put(buf)
	case n < 0:
		panic("rank: release of a buffer without a reference")
	}
}
