package keeper

// The parity store: the parity rows of erasure coding a host keeps
// (ec.go), and the EC request kinds of the replication links.
//
// Protocol (the link's request = header table [ecHdr [data]]; replica.go's
// header has the formats, PROTOCOL.md "Erasure coding" the rules):
//
//   - ecChunk: bytes [off, off+length) of owner's share of parity row of
//     stripe of group, for step (gen, ecHdr.epoch), owner being member x
//     of the stripe and its shard n bytes long; ecHdr.crc is the CRC32C
//     of the bytes. The holder checks the CRC, then XORs the bytes into
//     the row, unless they are in already: a resend is acknowledged
//     without being XORed twice if its CRC32C is that of the chunks of
//     the share that came for those bytes, and refused (failShare) if
//     not. Answer: ack, or fail (failCRC: damaged on the way; failShare;
//     failNoRoom: the row's buffer does not fit in this host's memory for
//     replicas).
//   - ecCommit: the owner's table (its replicated regions' names, sizes
//     and committed CRC32Cs) and the CRC32C of its whole share (ecHdr.crc).
//     The holder checks that every byte of the share came and that their
//     CRC32C is that one, then counts the member in. Its ack is the one
//     the owner's Replicated counts. A mismatch is refused (failCRC) and
//     changes nothing.
//   - ecHas: is owner's share of step, with exactly that table, in? Ack if
//     so.
//   - ecGet: bytes [off, off+n) of a complete row (every member in, of one
//     step, generation and label), answered with the members' tables.
//   - getRange: bytes [off, off+n) of owner's shard at step from its slot
//     here or from its clear copy (a replica) here, with its table.
//
// Trust: every field of a request is checked before use; a malformed
// request (out of range, lengths that do not add up) closes the link, a
// well-formed one this host cannot serve is refused with a reason and
// the link stays usable.
//
// Which shares may be mixed. A row buffer holds one step of one restart
// generation and one label: the epoch of the placement in which its
// shares' steps were committed (Placement.Epoch of the owner's session).
// A step after the placement's G (Placement.G) committed under an older
// placement belongs to a trajectory the ranks abandoned when they rolled
// back to G in place (same generation, other bytes, maybe other CRC32Cs):
// a share with a newer label empties the buffer first, one with an older
// label is refused (failStale), and ecHas acknowledges only a share of
// the same label, so that no member is ever told its share is in while
// a newer commit of another member may still empty the row. Steps up to
// G are final: their shares are the same whatever their label.
//
// Nothing else ever takes a member's share out of a row once it is in
// (acknowledged): the row is the XOR of the shares, and a share can only
// be taken out with its bytes, which the holder does not keep (that would
// take K times the row's memory) and the owner no longer has. So a member
// whose share in the row turns out to be of other bytes than the ones it
// sends now (a resent chunk whose CRC32C is not that of the chunk that
// came: an earlier encoding read bytes that were not the commit's, or a
// faulty peer) is *refused* for that step and label (failShare: chunks,
// commit), and only it; the row of that step never completes under that
// label, and the owner's rank fails (replicator.ecSend), so that the job
// rolls back to G and commits the step again under a newer label or
// generation, which empties the buffer. A commit whose CRC32C is not that
// of the chunks that came is refused and changes nothing.

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/gorun/gorun/protect"
)

const (
	kindECChunk  = 10
	kindECCommit = 11
	kindECHas    = 12
	kindECGet    = 13
	kindGetRange = 14

	// Why a parity host refused (a fail answer's reserved word).
	failShare  = 8 // the row holds other bytes of the member's share of the step
	failNoRoom = 9 // the row's buffer does not fit in the memory replicas may take here

	ecHdrSize = 48
	// maxECRange bounds the bytes of one ecChunk, ecGet or getRange.
	maxECRange = 64 << 20
	// maxShard bounds a shard's length (all its regions).
	maxShard = protect.MaxRegions * protect.MaxRegionSize
	// maxStripes bounds group and stripe indices on the wire.
	maxStripes = 1 << 24
)

// ecHdr is the sub-header of the EC request kinds:
//
//	ecHdr = group(4) stripe(4) row(2) member(2) crc(4) off(8) n(8) epoch(8) h(8)
//
// h is, in an ecChunk or ecCommit of diff mode under EC, the H the
// owner's host knows (-1: none yet): a parity host that learns H later
// than the owner's host takes the larger of its own and h when it picks
// the buffer a new base's share goes to (bufFor), so that the row of the
// H the owner went by stays. Other kinds and modes send -1, and the
// parity host ignores it there.
type ecHdr struct {
	group, stripe, row, member int
	crc                        uint32
	off, n                     int64
	epoch                      uint64
	hb                         int64
}

func (e *ecHdr) put(b []byte) {
	binary.BigEndian.PutUint32(b[0:], uint32(e.group))
	binary.BigEndian.PutUint32(b[4:], uint32(e.stripe))
	binary.BigEndian.PutUint16(b[8:], uint16(e.row))
	binary.BigEndian.PutUint16(b[10:], uint16(e.member))
	binary.BigEndian.PutUint32(b[12:], e.crc)
	binary.BigEndian.PutUint64(b[16:], uint64(e.off))
	binary.BigEndian.PutUint64(b[24:], uint64(e.n))
	binary.BigEndian.PutUint64(b[32:], e.epoch)
	binary.BigEndian.PutUint64(b[40:], uint64(e.hb))
}

// parseECHdr decodes an ecHdr, checking its ranges: group and stripe below
// maxStripes, row and member below ckpt.MaxShards, off and n in [0,
// maxShard] with off+n ≤ maxShard, h at least -1.
func parseECHdr(b []byte) (ecHdr, error) {
	e := ecHdr{
		group: int(binary.BigEndian.Uint32(b[0:])), stripe: int(binary.BigEndian.Uint32(b[4:])),
		row: int(binary.BigEndian.Uint16(b[8:])), member: int(binary.BigEndian.Uint16(b[10:])),
		crc: binary.BigEndian.Uint32(b[12:]),
		off: int64(binary.BigEndian.Uint64(b[16:])), n: int64(binary.BigEndian.Uint64(b[24:])),
		epoch: binary.BigEndian.Uint64(b[32:]), hb: int64(binary.BigEndian.Uint64(b[40:])),
	}
	switch {
	case e.group >= maxStripes || e.stripe >= maxStripes:
		return e, fmt.Errorf("group %d stripe %d out of range", e.group, e.stripe)
	case e.row >= 256 || e.member >= 256:
		return e, fmt.Errorf("row %d member %d out of range", e.row, e.member)
	case e.off < 0 || e.n < 0 || e.off > maxShard || e.n > maxShard-e.off:
		return e, fmt.Errorf("range of %d bytes at %d out of range", e.n, e.off)
	case e.hb < noStep:
		return e, fmt.Errorf("H %d out of range", e.hb)
	}
	return e, nil
}

func readECHdr(r io.Reader) (ecHdr, error) {
	var b [ecHdrSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return ecHdr{}, err
	}
	return parseECHdr(b[:])
}

// ecMember is one member's share in a complete parity row: its rank,
// the restart generation and label (Placement.Epoch) it was committed
// in, its shard's length and its table (regions, sizes, committed
// CRC32Cs: the shard is the regions concatenated in this order).
type ecMember struct {
	rank   int
	gen    uint64
	epoch  uint64
	length int64
	table  []tableEntry
}

func appendMembers(b []byte, ms []ecMember) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(ms)))
	for _, m := range ms {
		b = binary.BigEndian.AppendUint32(b, uint32(m.rank))
		b = binary.BigEndian.AppendUint64(b, m.gen)
		b = binary.BigEndian.AppendUint64(b, m.epoch)
		b = binary.BigEndian.AppendUint64(b, uint64(m.length))
		b = append(b, byte(len(m.table)))
		b = appendTable(b, m.table)
	}
	return b
}

// readMembers reads the members of an ecGet answer: 1 to 255 of them,
// each with a table whose sizes add up to its length.
func readMembers(r io.Reader) ([]ecMember, error) {
	var nb [2]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(nb[:]))
	if n < 1 || n >= 256 {
		return nil, fmt.Errorf("%d members", n)
	}
	ms := make([]ecMember, n)
	var mb [29]byte
	for i := range ms {
		if _, err := io.ReadFull(r, mb[:]); err != nil {
			return nil, err
		}
		m := ecMember{rank: int(binary.BigEndian.Uint32(mb[0:])), gen: binary.BigEndian.Uint64(mb[4:]),
			epoch: binary.BigEndian.Uint64(mb[12:]), length: int64(binary.BigEndian.Uint64(mb[20:]))}
		if m.rank > 1<<30 || m.length < 0 || m.length > maxShard {
			return nil, fmt.Errorf("member rank %d of %d bytes out of range", m.rank, m.length)
		}
		t, err := readTable(r, int(mb[28]))
		if err != nil {
			return nil, err
		}
		if tableBytes(t) != uint64(m.length) {
			return nil, fmt.Errorf("member rank %d: regions of %d bytes for a shard of %d", m.rank, tableBytes(t), m.length)
		}
		m.table = t
		ms[i] = m
	}
	return ms, nil
}
