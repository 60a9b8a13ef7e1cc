package keeper

// Replication between hosts (DEADPOOL §V-B). After a rank's step commits,
// its replicator sends the replicated regions of that slot to the rank's
// replica holders, over authenticated links from each local rank to each
// holder's host (dialed by the sending host, request and answer in turn),
// so that a host's ranks replicate side by side. The holder's host keeps two
// buffers per owner, the newest complete step and the one being received,
// checks every region's CRC32C against the owner's and acknowledges; the
// owner counts a step replicated once every holder acknowledged it.
//
// A link carries requests from the dialer and answers from the acceptor:
//
//	request  = header table [data]
//	answer   = header (table data | message)
//	header   = magic(1)=0xA7 kind(1) count(2) owner(4) holder(4) reserved(4) step(8) gen(8) length(8)
//	table    = count × (nameLen(1) name size(8) crc32c(4))
//
// big-endian. Kinds: put (the owner's regions, data follows), has (does
// the holder hold owner's step with exactly the table's regions and
// CRC32Cs, and do its bytes still match them? no data; acknowledged if
// so), get (a holder's replica of owner
// at step), getSlot (a rank's own slot regions at step, for params), and
// the answers ack, data, fail (length = the message's bytes; reserved =
// why, see failCRC). Everything read is bounds-checked before use; a
// malformed request closes the link.
//
// With erasure coding (Config.EC, ec.go) the links carry five more
// kinds: ecChunk, ecCommit, ecHas, ecGet and getRange (10 to 14), whose
// table is followed by a sub-header
//
//	ecHdr = group(4) stripe(4) row(2) member(2) crc(4) off(8) n(8) epoch(8)
//
// and, for ecChunk, its data: see ecstore.go and PROTOCOL.md ("Erasure
// coding").
//
// In diff mode (Config.Mode ModeDiff) the holder keeps a base and a
// differential log per owner instead of two buffers, and the links carry
// four more kinds (base, diff, baseChunk, baseCommit): see diff.go; it
// answers a get of an exact step with a pieces answer: see pieces.go.
//
// gen is the owner host's restart generation when it read the step from
// its slot. A holder refuses a put older than the newest generation it
// knows for that owner (its own, or one a put of the owner carried): a
// put of a step after G from before a restart, still queued on an old
// link, would otherwise replace the same step of the new generation, and
// its CRCs match its bytes, so a restore would take it.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
)

const (
	linkMagic   = 0xA7
	linkHdrSize = 40

	kindPut     = 1
	kindGet     = 2
	kindGetSlot = 3
	kindHas     = 4
	kindAck     = 0x81
	kindData    = 0x82
	kindFail    = 0x83

	maxFailMsg = 4096

	// Why a holder refused a request (the reserved word of a fail answer).
	failOther = 0
	failCRC   = 1 // a put's data did not match the owner's CRC32C
	failStale = 2 // a put's generation is older than one the holder knows
)

type linkHdr struct {
	kind   byte
	count  int
	owner  int
	holder int
	why    uint32 // of a fail answer: failOther, failCRC, failStale
	step   int64
	gen    uint64
	length uint64
}

func (h *linkHdr) put(b []byte) {
	b[0], b[1] = linkMagic, h.kind
	binary.BigEndian.PutUint16(b[2:], uint16(h.count))
	binary.BigEndian.PutUint32(b[4:], uint32(h.owner))
	binary.BigEndian.PutUint32(b[8:], uint32(h.holder))
	binary.BigEndian.PutUint32(b[12:], h.why)
	binary.BigEndian.PutUint64(b[16:], uint64(h.step))
	binary.BigEndian.PutUint64(b[24:], h.gen)
	binary.BigEndian.PutUint64(b[32:], h.length)
}

func parseLinkHdr(b []byte) (linkHdr, error) {
	h := linkHdr{
		kind: b[1], count: int(binary.BigEndian.Uint16(b[2:])),
		owner: int(binary.BigEndian.Uint32(b[4:])), holder: int(binary.BigEndian.Uint32(b[8:])),
		why:  binary.BigEndian.Uint32(b[12:]),
		step: int64(binary.BigEndian.Uint64(b[16:])), gen: binary.BigEndian.Uint64(b[24:]),
		length: binary.BigEndian.Uint64(b[32:]),
	}
	switch {
	case b[0] != linkMagic:
		return h, errors.New("not a replication frame")
	case h.count > protect.MaxRegions:
		return h, fmt.Errorf("%d regions", h.count)
	case h.owner > 1<<30 || h.holder > 1<<30:
		return h, fmt.Errorf("rank %d or %d out of range", h.owner, h.holder)
	case h.step < noStep || h.step > protect.MaxStep:
		return h, fmt.Errorf("step %d out of range", h.step)
	}
	return h, nil
}

// tableEntry describes one region in a frame.
type tableEntry struct {
	name string
	size int64
	sum  uint32
}

func appendTable(b []byte, t []tableEntry) []byte {
	for _, e := range t {
		b = append(b, byte(len(e.name)))
		b = append(b, e.name...)
		b = binary.BigEndian.AppendUint64(b, uint64(e.size))
		b = binary.BigEndian.AppendUint32(b, e.sum)
	}
	return b
}

func readTable(r io.Reader, n int) ([]tableEntry, error) {
	if n < 0 || n > protect.MaxRegions {
		return nil, fmt.Errorf("%d regions", n)
	}
	t := make([]tableEntry, n)
	var nb [1]byte
	var rest [12]byte
	for i := range t {
		if _, err := io.ReadFull(r, nb[:]); err != nil {
			return nil, err
		}
		if nb[0] == 0 || int(nb[0]) > ckpt.MaxRegionName {
			return nil, fmt.Errorf("region name of %d bytes", nb[0])
		}
		name := make([]byte, nb[0])
		if _, err := io.ReadFull(r, name); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(r, rest[:]); err != nil {
			return nil, err
		}
		e := tableEntry{name: string(name), size: int64(binary.BigEndian.Uint64(rest[:])), sum: binary.BigEndian.Uint32(rest[8:])}
		if !ckpt.ValidRegionName(e.name) || e.size < 0 || e.size > protect.MaxRegionSize {
			return nil, fmt.Errorf("bad region %q of %d bytes", wire.Truncate(e.name), e.size)
		}
		for _, p := range t[:i] {
			if p.name == e.name {
				return nil, fmt.Errorf("region %q twice", e.name)
			}
		}
		t[i] = e
	}
	return t, nil
}

// tableBytes is the data that follows a table: its regions' sizes (0 for
// a request's table, whose sizes are 0).
func tableBytes(t []tableEntry) uint64 {
	var n uint64
	for _, e := range t {
		n += uint64(e.size)
	}
	return n
}

// writeFrame writes a header, a table and the data views; the header's
// count comes from the table, its length too when data follow (nil data:
// a table alone, of length 0).
func writeFrame(w io.Writer, h linkHdr, t []tableEntry, data [][]byte) error {
	h.count, h.length = len(t), 0
	if data != nil {
		h.length = tableBytes(t)
	}
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45)
	h.put(b)
	b = appendTable(b, t)
	bufs := net.Buffers{b}
	for _, d := range data {
		if len(d) > 0 {
			bufs = append(bufs, d)
		}
	}
	return writeBufs(w, bufs)
}

// writeBufs writes bufs to w: as net.Buffers does (one writev to a
// net.Conn), or, to a holder's answer (answerConn, writeAnswer), a writev
// per run under its deadlines: net.Buffers cannot writev through an
// io.Writer of ours, and would write the buffers one by one.
func writeBufs(w io.Writer, bufs net.Buffers) error {
	if a, ok := w.(answerConn); ok {
		return a.writeBuffers(bufs)
	}
	_, err := bufs.WriteTo(w)
	return err
}

func writeFail(w io.Writer, h linkHdr, why uint32, msg string) error {
	if len(msg) > maxFailMsg {
		msg = msg[:maxFailMsg]
	}
	h.kind, h.count, h.why, h.length = kindFail, 0, why, uint64(len(msg))
	b := make([]byte, linkHdrSize, linkHdrSize+len(msg))
	h.put(b)
	b = append(b, msg...)
	_, err := w.Write(b)
	return err
}

// refusePut drains a put's data, then refuses it: the link stays in
// step.
func refusePut(c io.ReadWriter, h linkHdr, why uint32, msg string) error {
	if _, err := io.CopyN(io.Discard, c, int64(h.length)); err != nil {
		return err
	}
	return writeFail(c, h, why, msg)
}

// writeAck acknowledges request h.
func writeAck(w io.Writer, h linkHdr) error {
	a := linkHdr{kind: kindAck, owner: h.owner, holder: h.holder, step: h.step, gen: h.gen}
	var ab [linkHdrSize]byte
	a.put(ab[:])
	_, err := w.Write(ab[:])
	return err
}

// bufBytes is the size of a buffer's data.
func bufBytes(data [][]byte) uint64 {
	var n uint64
	for _, d := range data {
		n += uint64(len(d))
	}
	return n
}

// readAck reads the answer to request h: nil if it is h's
// acknowledgement, the holder's refusal (a *remoteError), or an error
// for anything else.
func readAck(r io.Reader, h linkHdr) error {
	a, err := readAnswer(r)
	if err != nil {
		return err
	}
	if a.kind != kindAck || a.owner != h.owner || a.step != h.step || a.holder != h.holder {
		return fmt.Errorf("unexpected answer kind %#x for rank %d step %d", a.kind, a.owner, a.step)
	}
	return nil
}

// readAnswer reads an answer's header, and a fail's message as an error.
func readAnswer(r io.Reader) (linkHdr, error) {
	var hb [linkHdrSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return linkHdr{}, err
	}
	h, err := parseLinkHdr(hb[:])
	if err != nil {
		return h, err
	}
	if h.kind == kindFail {
		if h.length > maxFailMsg {
			return h, fmt.Errorf("failure message of %d bytes", h.length)
		}
		msg := make([]byte, h.length)
		if _, err := io.ReadFull(r, msg); err != nil {
			return h, err
		}
		e := &remoteError{why: h.why, msg: string(msg)}
		if h.why == failGap || h.why == failNoLocal || h.why == failDiverged {
			e.next = int64(h.gen)
		}
		return h, e
	}
	return h, nil
}

var (
	// errPutDamaged: a holder received data that does not match the
	// CRC32Cs the owner committed (see replicator.send).
	errPutDamaged = errors.New("the data received did not match the owner's CRC32C")
	// errPutStale: a holder refused a put from an older restart
	// generation than one it knows.
	errPutStale = errors.New("the put is from an older restart generation")
)

// remoteError is a request the other host refused; the link stays usable.
// It matches errPutDamaged, errPutStale, ... when the holder said why;
// errNoRoom when the holder's reserve had no room for the answer.
type remoteError struct {
	why  uint32
	msg  string
	next int64 // failGap: the step the holder takes next, -1 if it needs a base; failNoLocal: the step to try again from
}

func (e *remoteError) Error() string { return "refused by the holder: " + e.msg }

func (e *remoteError) Is(target error) bool {
	return e.why == failCRC && target == errPutDamaged || e.why == failStale && target == errPutStale ||
		e.why == failGap && target == errHolderGap || e.why == failPending && target == errDiffPending ||
		e.why == failBehindH && target == errBehindH || e.why == failNoRoom && target == errNoRoom
}
