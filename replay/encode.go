package replay

import (
	"fmt"
	"slices"

	"github.com/gorun/gorun/internal/crc32c"
)

// Encoder encodes records of one tensor straight from its dense values,
// for the per-step path: the bytes are exactly those of CompressInto
// followed by Record.AppendBinary, with less work. A Raw record is
// written in one pass over x: the payload is copied block by block into
// the caller's buffer and each block is added to the record's CRC32C
// right after it is copied, while it is still in cache, so that memory is
// read once and written once (AppendBinary after CompressInto copies x
// twice and reads it a third time for the CRC). Int8 and TopK compress x
// into the Encoder's own scratch tensor (reused from call to call) and
// encode it into the caller's buffer as AppendBinary does.
//
// The zero value is ready to use. An Encoder must not be used by two
// goroutines at once; it keeps no reference to x or to the buffers it
// writes.
type Encoder struct {
	t   Tensor     // Int8 and TopK: the compressed tensor, reused
	one [1]*Tensor // the record's tensor list, so that encoding allocates nothing
}

// encodeBlock is the bytes of a Raw payload copied before they are added
// to the CRC: small enough to stay in the L2 cache between the copy and
// the CRC, large enough that the CRC's per-call cost does not show.
const encodeBlock = 64 << 10

// AppendRecord appends to b the record of step holding one tensor with
// id id: x encoded with the codec opt chooses for its length (as
// CompressInto would), and returns the extended buffer. It grows b only
// if its capacity is too small: with a buffer of the record's size or
// more, it allocates nothing. On error (bad Options) b is returned
// unchanged.
func (e *Encoder) AppendRecord(b []byte, step uint64, id uint32, x []float32, opt Options) ([]byte, error) {
	p, err := opt.params()
	if err != nil {
		return b, err
	}
	if p.lossless {
		return appendRawRecord(b, step, id, x), nil
	}
	if err := CompressInto(&e.t, id, x, opt); err != nil {
		return b, err
	}
	e.one[0] = &e.t
	r := Record{Step: step, Tensors: e.one[:]}
	out, err := r.AppendBinary(b)
	if err != nil {
		// CompressInto made the tensor: it is always encodable.
		return b, fmt.Errorf("replay: AppendRecord: %w", err)
	}
	return out, nil
}

// appendRawRecord appends the record of step holding x, Raw, as tensor
// id: header and descriptor, then the payload copied from x a block at a
// time, each block added to the CRC32C as soon as it is written.
func appendRawRecord(b []byte, step uint64, id uint32, x []float32) []byte {
	const poff = recordHeaderSize + descriptorSize // a multiple of 8
	plen := 4 * len(x)
	end := poff + plen
	total := align8(end + crcSize)
	start := len(b)
	b = slices.Grow(b, total)[:start+total]
	rec := b[start:]
	putRecordHeader(rec, step, 1, total)
	putDescriptor(rec, 0, id, Raw, len(x), 0, uint64(len(x)), poff, plen)
	crc := crc32c.Update(0, rec[:poff])
	const perBlock = encodeBlock / 4
	for i := 0; i < len(x); i += perBlock {
		xs := x[i:min(i+perBlock, len(x))]
		dst := rec[poff+4*i:]
		n := putElems(dst, xs)
		crc = crc32c.Update(crc, dst[:n])
	}
	pad := rec[end : total-crcSize]
	clear(pad)
	crc = crc32c.Update(crc, pad)
	le.PutUint32(rec[total-crcSize:], crc)
	return b
}
