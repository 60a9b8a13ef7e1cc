package wire

import (
	"encoding/binary"
)

// Stream identifies which output stream of a rank a line came from.
type Stream uint8

// Output streams.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

// MaxLine is the longest line an agent forwards in one piece; longer lines
// are split (whole lines are kept together up to this length).
const MaxLine = 64 << 10

// outputMagic starts every output frame; the second byte is the format version.
var outputMagic = [2]byte{'O', 1}

// OutputRecord is a run of whole lines (each ending in '\n') from one stream
// of one rank.
type OutputRecord struct {
	Rank   int
	Stream Stream
	Data   []byte
}

// OutputFrame batches output records of one agent. Its encoding carries
// the bytes as they are, without escaping:
//
//	'O' 1 uvarint(host) { uvarint(rank) byte(stream) uvarint(len) bytes }*
type OutputFrame struct {
	buf  []byte
	hdr  int // length of the header
	host int
}

// NewOutputFrame starts a frame for host.
func NewOutputFrame(host int) *OutputFrame {
	f := &OutputFrame{}
	f.Reset(host)
	return f
}

// Reset empties f and starts a frame for host.
func (f *OutputFrame) Reset(host int) {
	f.host = host
	f.buf = append(f.buf[:0], outputMagic[:]...)
	f.buf = binary.AppendUvarint(f.buf, uint64(host))
	f.hdr = len(f.buf)
}

// Add appends a record.
func (f *OutputFrame) Add(rank int, s Stream, data []byte) {
	f.buf = binary.AppendUvarint(f.buf, uint64(rank))
	f.buf = append(f.buf, byte(s))
	f.buf = binary.AppendUvarint(f.buf, uint64(len(data)))
	f.buf = append(f.buf, data...)
}

// Host is the host index of f.
func (f *OutputFrame) Host() int { return f.host }

// Empty reports whether f holds no records.
func (f *OutputFrame) Empty() bool { return len(f.buf) == f.hdr }

// Len is the encoded size of f.
func (f *OutputFrame) Len() int { return len(f.buf) }

// Bytes returns the encoding of f; it is valid until the next Add or Reset.
func (f *OutputFrame) Bytes() []byte { return f.buf }

// DecodeOutputFrame decodes a frame, calling fn for every record in order.
// Record data aliases b. Ranks must be below world.
func DecodeOutputFrame(b []byte, world int, fn func(host int, r OutputRecord)) error {
	if world < 1 || world > MaxWorld {
		return malformed("output frame: world size %d out of range", world)
	}
	if len(b) < 2 || b[0] != outputMagic[0] {
		return malformed("output frame: bad magic")
	}
	if b[1] != outputMagic[1] {
		return malformed("output frame: version %d, want %d", b[1], outputMagic[1])
	}
	b = b[2:]
	host, n := binary.Uvarint(b)
	if n <= 0 || host >= MaxHosts {
		return malformed("output frame: bad host index")
	}
	b = b[n:]
	var recs []OutputRecord
	for len(b) > 0 {
		rank, n := binary.Uvarint(b)
		if n <= 0 || rank >= uint64(world) {
			return malformed("output frame: bad rank")
		}
		b = b[n:]
		if len(b) < 1 {
			return malformed("output frame: truncated record")
		}
		s := Stream(b[0])
		if s != Stdout && s != Stderr {
			return malformed("output frame: bad stream %d", b[0])
		}
		b = b[1:]
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return malformed("output frame: bad record length")
		}
		b = b[n:]
		recs = append(recs, OutputRecord{Rank: int(rank), Stream: s, Data: b[:l:l]})
		b = b[l:]
	}
	// Records are delivered only once the whole frame is known to be valid.
	for _, r := range recs {
		fn(int(host), r)
	}
	return nil
}

// Output flow control. An agent may have at most OutputWindow bytes of
// output frames (their encoded length) sent that the launcher has not
// acknowledged; a rank whose output cannot be sent waits in write(), as
// with any pipe. The launcher acknowledges a frame once everything in it
// is written to its destination (or dropped, once that is broken), with
// an OutputAck carrying the cumulative count of the host's frame bytes
// written so far, on OutputAck(host). Acks are coalesced: one is sent
// when at least OutputAckEvery bytes more are written, which always comes
// before an agent blocked on a full window has nothing left to wait for.
//
// So the launcher holds at most about OutputWindow plus one frame of
// output per host (1,000 hosts: about 1.3 GB at the most, when every one
// of them is held back by a stalled reader at once).
const (
	OutputWindow   = 1 << 20
	OutputAckEvery = OutputWindow / 4
)

// OutputAck acknowledges output to the agent of Host: Bytes is the
// cumulative length of the host's output frames the launcher has written.
type OutputAck struct {
	Host  int    `json:"h"`
	Bytes uint64 `json:"b"`
}

// DecodeOutputAck decodes and validates an OutputAck.
func DecodeOutputAck(b []byte) (*OutputAck, error) {
	var a OutputAck
	if err := decode(b, &a, "output ack"); err != nil {
		return nil, err
	}
	if a.Host < 0 || a.Host >= MaxHosts {
		return nil, malformed("output ack: host %d out of range", a.Host)
	}
	return &a, nil
}

// OutputDone is an agent's end marker for its output: every rank of
// generation Gen has ended and all their output is sent, in output frames
// of Bytes bytes in all (counted from the job's start, as OutputAck).
// It is sent on the host's OutputDone subject, after those frames.
type OutputDone struct {
	Host  int    `json:"h"`
	Gen   uint64 `json:"gen"`
	Bytes uint64 `json:"b"`
}

// DecodeOutputDone decodes and validates an OutputDone.
func DecodeOutputDone(b []byte) (*OutputDone, error) {
	var d OutputDone
	if err := decode(b, &d, "output done"); err != nil {
		return nil, err
	}
	if d.Host < 0 || d.Host >= MaxHosts {
		return nil, malformed("output done: host %d out of range", d.Host)
	}
	return &d, nil
}
