package comm

// Framing: the 16-byte header every message and collective starts with
// (see dataplane.go).

import (
	"encoding/binary"
	"fmt"
)

const headerSize = 16

// Frame kinds: a point-to-point message, or a collective.
const (
	kindMsg = 1 + iota
	kindBarrier
	kindBroadcast
	kindAllreduce
	kindAllgather
)

var kindNames = [...]string{kindMsg: "message", kindBarrier: "Barrier", kindBroadcast: "Broadcast", kindAllreduce: "Allreduce", kindAllgather: "Allgather"}

func kindName(k byte) string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind %d", k)
}

// header starts every frame: kind(1) sub(1) reserved(2) seq(4) n(8), big-endian.
type header struct {
	kind, sub byte
	seq       uint32
	n         uint64
}

func (h header) put(b []byte) {
	b = b[:headerSize]
	b[0], b[1], b[2], b[3] = h.kind, h.sub, 0, 0
	binary.BigEndian.PutUint32(b[4:], h.seq)
	binary.BigEndian.PutUint64(b[8:], h.n)
}

func parseHeader(b []byte) header {
	b = b[:headerSize]
	return header{kind: b[0], sub: b[1], seq: binary.BigEndian.Uint32(b[4:]), n: binary.BigEndian.Uint64(b[8:])}
}
