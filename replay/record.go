package replay

// The record format of the differential stream.
//
// A record is one step's compressed gradients. Following ECCheck §III-C
// (serialization-free encoding), the metadata — a fixed header and one
// fixed-size descriptor per tensor — is kept apart from the tensors' raw
// bytes, which are stored as the machine holds them (little-endian) at
// 8-byte-aligned offsets from the record's start, so that a decoder can
// use them in place (unsafe.Slice over the record's bytes) instead of
// parsing them. All integers are little-endian; every reserved and
// padding byte is zero; the layout is canonical (one encoding per record),
// so decoding and re-encoding give back the same bytes.
//
//	offset  size  field
//	0       4     magic "GRDF"
//	4       1     version (1)
//	5       3     reserved
//	8       8     step
//	16      4     tensor count N
//	20      4     reserved
//	24      8     record length L in bytes, CRC included (a multiple of 8)
//	32      48·N  descriptors, one per tensor (below)
//	...           payloads, in tensor order, each starting at the first
//	              multiple of 8 at or after the end of the previous one
//	              (the first after the descriptors); zeros in between
//	L-4     4     CRC32C (Castagnoli) of bytes [0, L-4); zeros between the
//	              last payload and it, L being the smallest multiple of 8
//	              that leaves room for it (so records concatenated in a
//	              stream stay 8-byte aligned)
//
// A descriptor:
//
//	offset  size  field
//	0       4     tensor id
//	4       1     codec (1 Raw, 2 Int8, 3 TopK)
//	5       3     reserved
//	8       8     len: elements of the dense tensor
//	16      8     param: Int8 the block size (>= 1), TopK the chunk count, Raw 0
//	24      8     count: Raw len, Int8 the block count ceil(len/block), TopK the entries kept
//	32      8     payload offset from the record's start
//	40      8     payload length in bytes
//
// Payloads (sections padded with zeros to a multiple of 8 where marked):
//
//	Raw   len × float32
//	Int8  blocks × float32 scale (padded), then len × int8
//	TopK  chunks × (base uint64, entries uint64), then entries × int32
//	      index (padded), then entries × uint16 fp16 value; the chunks have
//	      ascending bases, the first 0, each spanning at most math.MaxInt32
//	      elements up to the next base (or len); indices are relative to
//	      their chunk's base, ascending within it
//
// Decoding checks everything above before using it — lengths against the
// record's size first, so that no length field can make it allocate or
// overflow — plus the contents: Int8 scales >= +0 with 127·scale finite,
// TopK chunks and indices as described. It views the payloads in place
// when the record's bytes start at an 8-byte-aligned address (as from
// make or os.ReadFile, or a stream of such records) and copies the record
// into an aligned buffer first otherwise.
//
// Byte order: the in-place views need a little-endian machine (amd64 and
// arm64, which gorun targets). On a big-endian one the encoder converts
// every element and the decoder copies the payloads into converted
// slices: the format is the same everywhere, only slower there.

import (
	"encoding"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/gorun/gorun/internal/crc32c"
)

// Record is one step's differential: the compressed gradients of that
// step.
type Record struct {
	Step    uint64
	Tensors []*Tensor
}

// ErrBadRecord is wrapped by every error DecodeRecord returns.
var ErrBadRecord = errors.New("replay: malformed record")

var _ encoding.BinaryAppender = (*Record)(nil)

const (
	recordMagic      = "GRDF"
	recordVersion    = 1
	recordHeaderSize = 32
	descriptorSize   = 48
	crcSize          = 4
	minRecordSize    = recordHeaderSize + 8 // align8(header + CRC)
	topkChunkSize    = 16
)

// hostLE says whether this machine is little-endian: payloads can then
// be copied and viewed as they are. A variable so that tests can run the
// converting paths too.
var hostLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// AppendBinary appends the record's encoding to b (encoding.BinaryAppender).
// It fails only on tensors that are nil or not consistent (not made by
// Compress, CompressInto or DecodeRecord, or modified since).
func (r *Record) AppendBinary(b []byte) ([]byte, error) {
	if r == nil {
		return b, errors.New("replay: AppendBinary of a nil *Record")
	}
	if uint64(len(r.Tensors)) > math.MaxUint32 {
		return b, fmt.Errorf("replay: a record holds at most %d tensors, not %d", uint32(math.MaxUint32), len(r.Tensors))
	}
	end := recordHeaderSize + descriptorSize*len(r.Tensors)
	for i, t := range r.Tensors {
		if t == nil {
			return b, fmt.Errorf("replay: AppendBinary: tensor %d is nil", i)
		}
		if err := t.encodable(); err != nil {
			return b, fmt.Errorf("replay: AppendBinary: tensor %d (id %d): %w", i, t.ID, err)
		}
		end = align8(end) + t.PayloadBytes()
	}
	total := align8(end + crcSize)
	start := len(b)
	b = slices.Grow(b, total)[:start+total]
	rec := b[start:]

	putRecordHeader(rec, r.Step, len(r.Tensors), total)
	off := recordHeaderSize + descriptorSize*len(r.Tensors)
	for i, t := range r.Tensors {
		poff := align8(off)
		clear(rec[off:poff])
		plen := t.PayloadBytes()
		param, count := t.descFields()
		putDescriptor(rec, i, t.ID, t.Codec, t.Len, param, count, poff, plen)
		t.putPayload(rec[poff : poff+plen])
		off = poff + plen
	}
	clear(rec[off : total-crcSize])
	le.PutUint32(rec[total-crcSize:], crc32c.Checksum(rec[:total-crcSize]))
	return b, nil
}

var le = binary.LittleEndian

// putRecordHeader writes the header of a record of nt tensors and total
// bytes at the start of rec.
func putRecordHeader(rec []byte, step uint64, nt, total int) {
	h := rec[:recordHeaderSize]
	copy(h, recordMagic)
	h[4], h[5], h[6], h[7] = recordVersion, 0, 0, 0
	le.PutUint64(h[8:], step)
	le.PutUint32(h[16:], uint32(nt))
	le.PutUint32(h[20:], 0)
	le.PutUint64(h[24:], uint64(total))
}

// putDescriptor writes the descriptor of tensor i of rec.
func putDescriptor(rec []byte, i int, id uint32, c Codec, n int, param, count uint64, poff, plen int) {
	d := rec[recordHeaderSize+descriptorSize*i:][:descriptorSize]
	le.PutUint32(d[0:], id)
	d[4], d[5], d[6], d[7] = byte(c), 0, 0, 0
	le.PutUint64(d[8:], uint64(n))
	le.PutUint64(d[16:], param)
	le.PutUint64(d[24:], count)
	le.PutUint64(d[32:], uint64(poff))
	le.PutUint64(d[40:], uint64(plen))
}

// encodable checks that t's fields fit together, as AppendBinary needs.
func (t *Tensor) encodable() error {
	if t.Len < 0 {
		return fmt.Errorf("Len %d", t.Len)
	}
	switch t.Codec {
	case Raw:
		if len(t.raw) != t.Len {
			return fmt.Errorf("raw tensor of Len %d holds %d values", t.Len, len(t.raw))
		}
	case Int8:
		if t.blockSize < 1 || t.blockSize > maxBlockSize {
			return fmt.Errorf("int8 block size %d", t.blockSize)
		}
		if len(t.q) != t.Len || len(t.scales) != ceilDiv(t.Len, t.blockSize) {
			return fmt.Errorf("int8 tensor of Len %d holds %d values and %d scales", t.Len, len(t.q), len(t.scales))
		}
	case TopK:
		if len(t.idx) != len(t.vals) {
			return fmt.Errorf("topk tensor holds %d indices and %d values", len(t.idx), len(t.vals))
		}
		if (t.Len == 0) != (len(t.chunks) == 0) {
			return fmt.Errorf("topk tensor of Len %d has %d chunks", t.Len, len(t.chunks))
		}
		next := 0
		for i, c := range t.chunks {
			end := t.Len
			if i+1 < len(t.chunks) {
				end = t.chunks[i+1].base
			}
			if (i == 0) != (c.base == 0) || c.base >= end || end-c.base > math.MaxInt32 || c.start != next || c.count < 0 || c.count > end-c.base {
				return fmt.Errorf("topk chunk %d of %d is not consistent", i, len(t.chunks))
			}
			next += c.count
		}
		if next != len(t.idx) {
			return fmt.Errorf("topk chunks hold %d entries, the tensor %d", next, len(t.idx))
		}
	default:
		return fmt.Errorf("unknown codec %v", t.Codec)
	}
	return nil
}

// descFields returns the descriptor's param and count of t.
func (t *Tensor) descFields() (param, count uint64) {
	switch t.Codec {
	case Raw:
		return 0, uint64(t.Len)
	case Int8:
		return uint64(t.blockSize), uint64(len(t.scales))
	default:
		return uint64(len(t.chunks)), uint64(len(t.idx))
	}
}

// putPayload writes t's payload, every byte of p (len(p) == t.PayloadBytes()).
func (t *Tensor) putPayload(p []byte) {
	switch t.Codec {
	case Raw:
		putElems(p, t.raw)
	case Int8:
		n := putElems(p, t.scales)
		pad := align8(n)
		clear(p[n:pad])
		putElems(p[pad:], t.q)
	case TopK:
		for i, c := range t.chunks {
			le.PutUint64(p[topkChunkSize*i:], uint64(c.base))
			le.PutUint64(p[topkChunkSize*i+8:], uint64(c.count))
		}
		p = p[topkChunkSize*len(t.chunks):]
		n := putElems(p, t.idx)
		pad := align8(n)
		clear(p[n:pad])
		putElems(p[pad:], t.vals)
	}
}

// elem is the element types of the payloads.
type elem interface {
	float32 | int32 | uint16 | int8
}

// asBytes views s's memory as bytes.
func asBytes[T elem | uint64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}

// putElems writes s little-endian at the start of p and returns the bytes
// written.
func putElems[T elem](p []byte, s []T) int {
	if hostLE {
		return copy(p, asBytes(s))
	}
	var z T
	switch size := unsafe.Sizeof(z); size {
	case 4:
		for i, v := range s {
			le.PutUint32(p[4*i:], *(*uint32)(unsafe.Pointer(&v)))
		}
	case 2:
		for i, v := range s {
			le.PutUint16(p[2*i:], *(*uint16)(unsafe.Pointer(&v)))
		}
	default:
		copy(p, asBytes(s))
	}
	return len(s) * int(unsafe.Sizeof(z))
}

// viewElems returns the n elements stored little-endian at the start of
// p: p's memory itself when the machine is little-endian and p is
// aligned for T (as DecodeRecord ensures), a converted copy otherwise.
func viewElems[T elem](p []byte, n int) []T {
	if n == 0 {
		return nil
	}
	size := int(unsafe.Sizeof(*new(T)))
	p = p[:n*size]
	if hostLE && uintptr(unsafe.Pointer(&p[0]))%uintptr(size) == 0 {
		return unsafe.Slice((*T)(unsafe.Pointer(&p[0])), n)
	}
	s := make([]T, n)
	switch size {
	case 4:
		for i := range s {
			*(*uint32)(unsafe.Pointer(&s[i])) = le.Uint32(p[4*i:])
		}
	case 2:
		for i := range s {
			*(*uint16)(unsafe.Pointer(&s[i])) = le.Uint16(p[2*i:])
		}
	default:
		copy(asBytes(s), p)
	}
	return s
}

// badRecord returns an error wrapping ErrBadRecord.
func badRecord(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadRecord}, args...)...)
}

// DecodeRecord decodes a record that is all of b. The tensors' payloads
// are views into b (which must not change afterwards) when b's address
// is 8-byte aligned — as from make, os.ReadFile, or a stream of records
// read into such a buffer — and into an aligned copy of b otherwise.
// Every error wraps ErrBadRecord and says what is wrong; DecodeRecord
// checks the whole record (checksum, layout, every length, every TopK
// index), never panics, and allocates nothing in proportion to a length
// field before checking it against len(b).
func DecodeRecord(b []byte) (*Record, error) {
	if len(b) < minRecordSize {
		return nil, badRecord("truncated: %d bytes, a record has at least %d", len(b), minRecordSize)
	}
	if string(b[:4]) != recordMagic {
		return nil, badRecord("bad magic %q, want %q", b[:4], recordMagic)
	}
	if b[4] != recordVersion {
		return nil, badRecord("unknown version %d (this decoder reads version %d)", b[4], recordVersion)
	}
	if b[5]|b[6]|b[7] != 0 || le.Uint32(b[20:]) != 0 {
		return nil, badRecord("reserved header bytes are not zero")
	}
	size := le.Uint64(b[24:])
	switch {
	case size > uint64(len(b)):
		return nil, badRecord("truncated: the header says %d bytes, there are %d", size, len(b))
	case size < uint64(len(b)):
		return nil, badRecord("%d trailing bytes after the record's %d", uint64(len(b))-size, size)
	case size%8 != 0:
		return nil, badRecord("length %d is not a multiple of 8", size)
	}
	L := len(b)
	if got, want := crc32c.Checksum(b[:L-crcSize]), le.Uint32(b[L-crcSize:]); got != want {
		return nil, badRecord("CRC mismatch: stored %#08x, computed %#08x", want, got)
	}
	step := le.Uint64(b[8:])
	nt := uint64(le.Uint32(b[16:]))
	if nt > uint64(L-minRecordSize)/descriptorSize {
		return nil, badRecord("%d tensors' descriptors do not fit in %d bytes", nt, L)
	}

	// The layout, from the descriptors alone.
	type layout struct {
		id           uint32
		codec        Codec
		n            int // len
		param, count int
		off, plen    int
	}
	descs := make([]layout, nt)
	end := recordHeaderSize + descriptorSize*int(nt)
	for i := range descs {
		d := b[recordHeaderSize+descriptorSize*i:][:descriptorSize]
		if d[5]|d[6]|d[7] != 0 {
			return nil, badRecord("tensor %d: reserved descriptor bytes are not zero", i)
		}
		lu, param, count := le.Uint64(d[8:]), le.Uint64(d[16:]), le.Uint64(d[24:])
		off, plen := le.Uint64(d[32:]), le.Uint64(d[40:])
		l := layout{id: le.Uint32(d[0:]), codec: Codec(d[4])}
		if lu > math.MaxInt64 || lu > uint64(math.MaxInt) {
			return nil, badRecord("tensor %d: len %d overflows", i, lu)
		}
		l.n = int(lu)
		// Bound every count by the record's size before any arithmetic,
		// so that nothing below overflows.
		var want int
		switch l.codec {
		case Raw:
			if param != 0 {
				return nil, badRecord("tensor %d: raw with param %d, want 0", i, param)
			}
			if count != lu {
				return nil, badRecord("tensor %d: raw with count %d, want len %d", i, count, lu)
			}
			if lu > uint64(L)/4 {
				return nil, badRecord("tensor %d: raw len %d does not fit in %d bytes", i, lu, L)
			}
			want = 4 * l.n
		case Int8:
			if param == 0 {
				return nil, badRecord("tensor %d: int8 block size 0", i)
			}
			if param > maxBlockSize {
				return nil, badRecord("tensor %d: int8 block size %d above the maximum %d", i, param, maxBlockSize)
			}
			if lu > uint64(L) {
				return nil, badRecord("tensor %d: int8 len %d does not fit in %d bytes", i, lu, L)
			}
			l.param = int(param)
			if nb := ceilDiv(l.n, l.param); count != uint64(nb) {
				return nil, badRecord("tensor %d: int8 with %d blocks, want ceil(%d/%d) = %d", i, count, lu, param, nb)
			}
			want = align8(4*int(count)) + l.n
		case TopK:
			if param > uint64(L)/topkChunkSize || count > uint64(L)/6 {
				return nil, badRecord("tensor %d: topk with %d chunks and %d entries does not fit in %d bytes", i, param, count, L)
			}
			if (lu == 0) != (param == 0) {
				return nil, badRecord("tensor %d: topk of len %d with %d chunks", i, lu, param)
			}
			l.param = int(param)
			want = topkChunkSize*l.param + align8(4*int(count)) + 2*int(count)
		default:
			return nil, badRecord("tensor %d: unknown codec %d", i, d[4])
		}
		l.count = int(count)
		if off != uint64(align8(end)) {
			return nil, badRecord("tensor %d: payload offset %d, want %d", i, off, align8(end))
		}
		if plen != uint64(want) {
			return nil, badRecord("tensor %d: payload length %d, want %d for %v of len %d", i, plen, want, l.codec, lu)
		}
		l.off, l.plen = int(off), want
		if l.plen > L-crcSize-l.off {
			return nil, badRecord("tensor %d: payload [%d, %d) runs past the checksum at %d", i, l.off, l.off+l.plen, L-crcSize)
		}
		if !allZero(b[end:l.off]) {
			return nil, badRecord("tensor %d: padding before the payload is not zero", i)
		}
		end = l.off + l.plen
		descs[i] = l
	}
	if want := align8(end + crcSize); L != want {
		return nil, badRecord("length %d, want %d for payloads ending at %d", L, want, end)
	}
	if !allZero(b[end : L-crcSize]) {
		return nil, badRecord("padding before the checksum is not zero")
	}

	// The payloads' contents, viewed in place if b is aligned.
	base := b
	if hostLE && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 != 0 {
		buf := make([]uint64, L/8)
		base = asBytes(buf)
		copy(base, b)
	}
	ts := make([]Tensor, nt)
	rec := &Record{Step: step, Tensors: make([]*Tensor, nt)}
	for i, l := range descs {
		t := &ts[i]
		*t = Tensor{ID: l.id, Codec: l.codec, Len: l.n, view: true}
		p := base[l.off : l.off+l.plen]
		var err error
		switch l.codec {
		case Raw:
			t.raw = viewElems[float32](p, l.n)
		case Int8:
			err = t.decodeInt8(p, l.param, l.count)
		case TopK:
			err = t.decodeTopK(p, l.param, l.count)
		}
		if err != nil {
			return nil, badRecord("tensor %d: %v", i, err)
		}
		rec.Tensors[i] = t
	}
	return rec, nil
}

func allZero(p []byte) bool {
	for _, c := range p {
		if c != 0 {
			return false
		}
	}
	return true
}

func (t *Tensor) decodeInt8(p []byte, bs, nb int) error {
	t.blockSize = bs
	t.scales = viewElems[float32](p, nb)
	for j, s := range t.scales {
		if math.Float32bits(s) >= 0x7f800000 || 127*s > math.MaxFloat32 { // negative (-0 included), Inf, NaN, or too large
			return fmt.Errorf("int8 scale %d is %v (%#08x), want >= +0 and 127·scale finite", j, s, math.Float32bits(s))
		}
	}
	pad := align8(4 * nb)
	if !allZero(p[4*nb : pad]) {
		return errors.New("int8 padding after the scales is not zero")
	}
	t.q = viewElems[int8](p[pad:], t.Len)
	return nil
}

func (t *Tensor) decodeTopK(p []byte, nc, kept int) error {
	t.chunks = make([]topkChunk, nc) // nc <= len(b)/16, checked
	sum := 0
	for j := range t.chunks {
		e := p[topkChunkSize*j:]
		bu, cu := le.Uint64(e), le.Uint64(e[8:])
		switch {
		case j == 0 && bu != 0:
			return fmt.Errorf("topk chunk 0 has base %d, want 0", bu)
		case j > 0 && bu <= uint64(t.chunks[j-1].base):
			return fmt.Errorf("topk chunk %d has base %d, not above the previous chunk's %d", j, bu, t.chunks[j-1].base)
		case bu >= uint64(t.Len):
			return fmt.Errorf("topk chunk %d has base %d, past len %d", j, bu, t.Len)
		case j > 0 && uint64(t.chunks[j-1].base)+math.MaxInt32 < bu:
			return fmt.Errorf("topk chunk %d spans %d elements, more than int32 indices reach", j-1, bu-uint64(t.chunks[j-1].base))
		case cu > uint64(kept-sum):
			return fmt.Errorf("topk chunks hold more than the %d entries of the descriptor", kept)
		}
		t.chunks[j] = topkChunk{base: int(bu), start: sum, count: int(cu)}
		sum += int(cu)
	}
	if sum != kept {
		return fmt.Errorf("topk chunks hold %d entries, the descriptor %d", sum, kept)
	}
	if nc > 0 && t.Len-t.chunks[nc-1].base > math.MaxInt32 {
		return fmt.Errorf("topk chunk %d spans %d elements, more than int32 indices reach", nc-1, t.Len-t.chunks[nc-1].base)
	}
	p = p[topkChunkSize*nc:]
	t.idx = viewElems[int32](p, kept)
	pad := align8(4 * kept)
	if !allZero(p[4*kept : pad]) {
		return errors.New("topk padding after the indices is not zero")
	}
	t.vals = viewElems[uint16](p[pad:], kept)
	for j, c := range t.chunks {
		span := t.Len - c.base
		if j+1 < nc {
			span = t.chunks[j+1].base - c.base
		}
		prev := -1
		for k, x := range t.idx[c.start : c.start+c.count] {
			switch {
			case x < 0 || int(x) >= span:
				return fmt.Errorf("topk chunk %d: index %d (entry %d) outside the chunk's [0, %d)", j, x, k, span)
			case int(x) <= prev:
				return fmt.Errorf("topk chunk %d: indices not ascending (entry %d is %d after %d)", j, k, x, prev)
			}
			prev = int(x)
		}
	}
	return nil
}
