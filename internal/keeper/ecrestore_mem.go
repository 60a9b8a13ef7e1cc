package keeper

// The memory a restore holds while it runs (decodeAt, decodeReplay) is
// reserved against the host's replica-memory reserve, as the rows, the
// copies and the logs kept here are (replicaStore.reserve: half the
// host's memory): what does not fit is refused with errNoRoom, never
// allocated. That is:
//
//   - a decode's chunk buffers (ecdecode.go: two sets, one buffer of
//     the chunk's size per source read, at most every source but the
//     lost member's): decodeBufBytes;
//   - in diff mode under EC, the replay's store (a copy of the decoded
//     base) and the log's differentials, each reserved as its frame's
//     sizes are read, before it is allocated (getLog's admit).
//
// Each reservation is given back when the restore returns, whatever the
// outcome (success, a failing source, cancellation): memHold.release.
//
// The hosts that serve a restore reserve too: a getRange answer's buffer
// (getAnswerBuf), a diff-mode get's whole restored copy (getDiffWhole),
// and a parity row's array an ecGet answer still writes after a newer
// step took its buffer (detach). A refusal for want of room comes back as
// failNoRoom, which the restorer reads as errNoRoom: the decode that
// loses a source so fails with errNoRoom, not ErrUnrecoverable
// (decoder.unrecoverable), and is retried (retryNoRoom).

import (
	"errors"
	"fmt"
	"sync"
)

// errNoRoom: a restore's buffers, or a retained base snapshot
// (ecdiff_mem.go), would take the replica-memory reserve of this host
// past its limit (replicaStore.reserve).
var errNoRoom = errors.New("the host's replica-memory reserve has no room for the buffers")

// memHold is memory reserved against st's replica-memory reserve for
// one restore, given back by release.
type memHold struct {
	st *replicaStore
	mu sync.Mutex
	n  uint64 // reserved
}

func (st *replicaStore) newHold() *memHold { return &memHold{st: st} }

// grow reserves n more bytes for what, or fails with errNoRoom and
// reserves nothing.
func (m *memHold) grow(n uint64, what string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if testHookHold != nil {
		testHookHold(n)
	}
	if err := m.st.reserve(m.n+n, m.n); err != nil {
		return fmt.Errorf("%w: %s (%d bytes): %w", errNoRoom, what, n, err)
	}
	m.st.mu.Lock()
	m.st.restoring += n
	m.st.mu.Unlock()
	m.n += n
	return nil
}

// testHookHold, if set (by tests), is called with the bytes a restore
// is about to reserve.
var testHookHold func(n uint64)

// shrink gives n of the bytes reserved back.
func (m *memHold) shrink(n uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n = min(n, m.n)
	m.st.reserve(m.n-n, m.n) // a shrink never fails
	m.st.mu.Lock()
	m.st.restoring -= n
	m.st.mu.Unlock()
	m.n -= n
}

// release gives every byte reserved back.
func (m *memHold) release() { m.shrink(^uint64(0)) }
