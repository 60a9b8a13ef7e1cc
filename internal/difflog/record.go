// Package difflog is the differential log of gorun --protect-mode diff on
// disk (issue 17; TierCheck §3.2, ../shared/papers/002): the format of
// one step's differential as a record of a durable batch
// (durable.AppendBatch), and the Writer that appends a rank's records in
// batches of --diff-batch consecutive steps off the training path.
//
// A record is self-describing: besides the differential itself (the
// encoded gradient, the step's Adam hyper-parameters, the bytes of the
// replicated regions other than the optimizer's, and the owner's seal,
// exactly as a replica holder gets them: internal/diffstore.Diff), it
// carries the owner's optimizer layout and every replicated region's name,
// size and committed CRC32C at the step. A recovery from disk
// (internal/cascade) can thus replay a base read back from the durable tier
// without any rank running, and check that what it rebuilt is, bit for
// bit, what the owner committed.
//
// # The record
//
// Integers are little-endian; R is the number of replicated regions.
//
//	offset      size  field
//	0           4     magic "GRDF"
//	4           1     format version (1)
//	5           1     R, 1 to 16
//	6           1     index of the optimizer's region in the table, below R
//	7           1     zero
//	8           8     step, 0 to 2^53-1
//	16          8     N, the optimizer's elements, 1 to 2^31
//	24          8     byte offset of the master weights W in the optimizer's region
//	32          8     byte offset of the first moment M
//	40          8     byte offset of the second moment V
//	48          20    hyper-parameters: LR, Beta1, Beta2, Eps, WeightDecay (float32 bits)
//	68          4     zero
//	72          8     T, Adam's step count, 1 to 2^53-1
//	80          4     the owner's seal: diffstore.Diff.Sum
//	84          4     zero
//	88          8     length G of the gradient record
//	96          48·R  table, in the owner's order: name (32 bytes, zero-padded),
//	                  size (8), CRC32C committed at the step (4), zero (4)
//	96+48R      4     CRC32C of bytes [0, 96+48R) followed by the other regions' bytes
//	100+48R     4     zero
//	104+48R     G     the gradient: an encoded replay.Record of the step, one tensor of N elements
//	...               the bytes of every region but the optimizer's, in table order
//	...               zeros up to a multiple of 8 (0 to 7 bytes)
//
// and nothing after. The gradient record starts at a multiple of 8 and
// the record's length is one, so that in a batch whose records start
// 8-byte aligned every gradient decodes in place (replay.DecodeRecord).
// W, M and V are N·4 bytes each, 4-aligned, inside the optimizer's region
// and disjoint. The gradient record has its own CRC32C (replay's), so no
// byte of the record is unchecked: Decode verifies both, and the layout,
// before returning anything.
package difflog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// Version is the record format's version.
const Version = 1

// Limits of a record.
const (
	MaxRegions    = 16
	MaxRegionSize = 1 << 40
	MaxN          = 1 << 31
	MaxStep       = 1<<53 - 1
	// MaxLen bounds a record's length: a durable batch's record length
	// is a uint32 (durable.AppendBatch), and a record's is a multiple of 8.
	MaxLen   = math.MaxUint32 &^ 7
	nameLen  = 32
	hdrLen   = 96
	entryLen = 48
)

var magic = [4]byte{'G', 'R', 'D', 'F'}

// ErrBadRecord is wrapped by every error of Decode (and Encode's about
// a record that could not be decoded back).
var ErrBadRecord = errors.New("difflog: malformed record")

// Region is one of the owner's replicated regions, with the CRC32C it
// committed at the record's step.
type Region struct {
	Name string
	Size int64
	Sum  uint32
}

// Record is one step's differential as the log keeps it.
type Record struct {
	// Diff is the differential, as the owner sealed it: Step, Hyper, the
	// gradient (Record), the bytes of the regions other than the
	// optimizer's (Other, by name) and Sum.
	Diff diffstore.Diff
	// Optimizer is where W, M and V live in the optimizer's region.
	Optimizer diffstore.Optimizer
	// Regions are the owner's replicated regions, in its order, with
	// their CRC32Cs committed at Diff.Step; Optimizer.Region is one of them.
	Regions []Region
}

// le is the records' byte order.
var le = binary.LittleEndian

// Size returns the length of r's encoding. r must be valid (Encode
// checks it).
func (r *Record) Size() int {
	n := hdrLen + entryLen*len(r.Regions) + 8 + len(r.Diff.Record)
	for _, g := range r.Regions {
		if g.Name != r.Optimizer.Region {
			n += int(g.Size)
		}
	}
	return (n + 7) &^ 7
}

// Encode appends r's encoding to b. It checks r first, as Decode would
// check its encoding (the gradient record's own bytes excepted: Decode
// decodes them, Encode only bounds them), and fails, appending nothing,
// on a record Decode would refuse.
func Encode(b []byte, r *Record) ([]byte, error) {
	opt, err := checkLayout(r)
	if err != nil {
		return b, err
	}
	start := len(b)
	hdr := make([]byte, hdrLen)
	copy(hdr, magic[:])
	hdr[4] = Version
	hdr[5] = byte(len(r.Regions))
	hdr[6] = byte(opt)
	le.PutUint64(hdr[8:], uint64(r.Diff.Step))
	le.PutUint64(hdr[16:], uint64(r.Optimizer.N))
	le.PutUint64(hdr[24:], uint64(r.Optimizer.WOff))
	le.PutUint64(hdr[32:], uint64(r.Optimizer.MOff))
	le.PutUint64(hdr[40:], uint64(r.Optimizer.VOff))
	h := r.Diff.Hyper
	for i, f := range []float32{h.LR, h.Beta1, h.Beta2, h.Eps, h.WeightDecay} {
		le.PutUint32(hdr[48+4*i:], math.Float32bits(f))
	}
	le.PutUint64(hdr[72:], uint64(int64(h.T)))
	le.PutUint32(hdr[80:], r.Diff.Sum)
	le.PutUint64(hdr[88:], uint64(len(r.Diff.Record)))
	b = append(b, hdr...)
	for _, g := range r.Regions {
		var e [entryLen]byte
		copy(e[:nameLen], g.Name)
		le.PutUint64(e[nameLen:], uint64(g.Size))
		le.PutUint32(e[nameLen+8:], g.Sum)
		b = append(b, e[:]...)
	}
	crc := crc32c.Checksum(b[start:])
	for i, g := range r.Regions {
		if i != opt {
			crc = crc32c.Update(crc, r.Diff.Other[g.Name])
		}
	}
	b = le.AppendUint32(b, crc)
	b = le.AppendUint32(b, 0)
	b = append(b, r.Diff.Record...)
	for i, g := range r.Regions {
		if i != opt {
			b = append(b, r.Diff.Other[g.Name]...)
		}
	}
	for (len(b)-start)%8 != 0 {
		b = append(b, 0)
	}
	return b, nil
}

// checkLayout checks everything of r but the gradient record's bytes,
// and returns the optimizer region's index.
func checkLayout(r *Record) (int, error) {
	bad := func(format string, args ...any) (int, error) {
		return 0, fmt.Errorf("%w: %s", ErrBadRecord, fmt.Sprintf(format, args...))
	}
	d := &r.Diff
	if d.Step < 0 || d.Step > MaxStep {
		return bad("step %d out of range", d.Step)
	}
	if err := d.Hyper.Validate(); err != nil {
		return bad("step %d: %v", d.Step, err)
	}
	if int64(d.Hyper.T) > MaxStep {
		return bad("Adam step count %d out of range", d.Hyper.T)
	}
	if len(r.Regions) < 1 || len(r.Regions) > MaxRegions {
		return bad("%d regions, want 1 to %d", len(r.Regions), MaxRegions)
	}
	opt := -1
	others := 0
	for i, g := range r.Regions {
		if !ckpt.ValidRegionName(g.Name) {
			return bad("region name %q", g.Name)
		}
		if g.Size < 0 || g.Size > MaxRegionSize {
			return bad("region %q: size %d out of range", g.Name, g.Size)
		}
		for _, h := range r.Regions[:i] {
			if h.Name == g.Name {
				return bad("region %q twice", g.Name)
			}
		}
		if g.Name == r.Optimizer.Region {
			opt = i
			continue
		}
		o, ok := d.Other[g.Name]
		if !ok || int64(len(o)) != g.Size {
			return bad("region %q: %d bytes of its %d", g.Name, len(o), g.Size)
		}
		others++
	}
	if opt < 0 {
		return bad("the optimizer's region %q is not in the table", r.Optimizer.Region)
	}
	if len(d.Other) != others {
		return bad("%d other regions' bytes for %d other regions", len(d.Other), others)
	}
	if err := checkOptimizer(r.Optimizer, r.Regions[opt].Size); err != nil {
		return bad("%v", err)
	}
	if len(d.Record) == 0 || int64(len(d.Record)) > MaxLen {
		return bad("a gradient record of %d bytes", len(d.Record))
	}
	if n := r.Size(); int64(n) > MaxLen {
		return bad("%d bytes, more than a durable batch's record may hold (%d)", n, int64(MaxLen))
	}
	return opt, nil
}

// checkOptimizer checks the optimizer layout against its region's size.
func checkOptimizer(o diffstore.Optimizer, size int64) error {
	if o.N < 1 || o.N > MaxN {
		return fmt.Errorf("optimizer of %d elements, want 1 to %d", o.N, int64(MaxN))
	}
	span := 4 * o.N
	offs := []int64{o.WOff, o.MOff, o.VOff}
	for i, off := range offs {
		if off < 0 || off%4 != 0 || off > size || span > size-off {
			return fmt.Errorf("optimizer array at %d (%d bytes) outside its region of %d bytes, or not 4-aligned", off, span, size)
		}
		for _, p := range offs[:i] {
			if off < p+span && p < off+span {
				return fmt.Errorf("optimizer arrays at %d and %d overlap", p, off)
			}
		}
	}
	return nil
}

// Decode decodes and checks a record that is all of b: its layout, every
// length against b's, its CRC32C, and its gradient record (decoded, its
// own CRC32C checked, one tensor of N elements of the record's step).
// Diff.Record and Diff.Other are views into b, which must not change
// afterwards. Decode never panics and allocates nothing in proportion to
// a length it has not checked against len(b). Every error wraps
// ErrBadRecord.
func Decode(b []byte) (*Record, error) {
	r, _, err := decode(b)
	return r, err
}

// DecodeTensor is Decode, also returning the gradient as decoded (a view
// into b when the gradient record is 8-byte aligned there; see
// replay.DecodeRecord).
func DecodeTensor(b []byte) (*Record, *replay.Tensor, error) {
	return decode(b)
}

func decode(b []byte) (*Record, *replay.Tensor, error) {
	bad := func(format string, args ...any) (*Record, *replay.Tensor, error) {
		return nil, nil, fmt.Errorf("%w: %s", ErrBadRecord, fmt.Sprintf(format, args...))
	}
	if len(b) < hdrLen {
		return bad("%d bytes, shorter than the header", len(b))
	}
	switch {
	case [4]byte(b[:4]) != magic:
		return bad("magic %q", b[:4])
	case b[4] != Version:
		return bad("format version %d, want %d", b[4], Version)
	case b[7] != 0 || le.Uint32(b[68:]) != 0 || le.Uint32(b[84:]) != 0:
		return bad("reserved header bytes not zero")
	}
	nr, opt := int(b[5]), int(b[6])
	if nr < 1 || nr > MaxRegions || opt >= nr {
		return bad("%d regions, optimizer at %d", nr, opt)
	}
	tableEnd := hdrLen + entryLen*nr
	if len(b) < tableEnd+8 {
		return bad("%d bytes, shorter than the header and table of %d regions", len(b), nr)
	}
	if le.Uint32(b[tableEnd+4:]) != 0 {
		return bad("reserved bytes after the table not zero")
	}
	r := &Record{Regions: make([]Region, nr)}
	var others int64
	for i := range r.Regions {
		e := b[hdrLen+entryLen*i:]
		name := e[:nameLen]
		n := 0
		for n < nameLen && name[n] != 0 {
			n++
		}
		for _, c := range name[n:] {
			if c != 0 {
				return bad("region %d: name not zero-padded", i)
			}
		}
		g := Region{Name: string(name[:n]), Size: int64(le.Uint64(e[nameLen:])), Sum: le.Uint32(e[nameLen+8:])}
		if le.Uint32(e[nameLen+12:]) != 0 {
			return bad("region %d: reserved bytes not zero", i)
		}
		if !ckpt.ValidRegionName(g.Name) {
			return bad("region %d: name %q", i, g.Name)
		}
		if uint64(g.Size) > MaxRegionSize {
			return bad("region %q: size %d out of range", g.Name, le.Uint64(e[nameLen:]))
		}
		for _, h := range r.Regions[:i] {
			if h.Name == g.Name {
				return bad("region %q twice", g.Name)
			}
		}
		if i != opt {
			others += g.Size
		}
		r.Regions[i] = g
	}
	glen := le.Uint64(b[88:])
	rest := uint64(len(b) - tableEnd - 8)
	if glen == 0 || glen > rest || uint64(others) > rest-glen || rest-glen-uint64(others) >= 8 {
		return bad("%d bytes after the table for a gradient of %d and other regions of %d bytes", rest, glen, others)
	}
	end := tableEnd + 8 + int(glen) + int(others)
	for _, c := range b[end:] {
		if c != 0 {
			return bad("padding not zero")
		}
	}
	if len(b)%8 != 0 {
		return bad("%d bytes, not a multiple of 8", len(b))
	}
	crc := crc32c.Checksum(b[:tableEnd])
	crc = crc32c.Update(crc, b[tableEnd+8+int(glen):end])
	if want := le.Uint32(b[tableEnd:]); crc != want {
		return bad("CRC32C %#08x, the record says %#08x", crc, want)
	}
	step := le.Uint64(b[8:])
	if step > MaxStep {
		return bad("step %d out of range", step)
	}
	d := &r.Diff
	d.Step = int64(step)
	h := &d.Hyper
	for i, f := range []*float32{&h.LR, &h.Beta1, &h.Beta2, &h.Eps, &h.WeightDecay} {
		*f = math.Float32frombits(le.Uint32(b[48+4*i:]))
	}
	t := le.Uint64(b[72:])
	if t < 1 || t > MaxStep {
		return bad("Adam step count %d out of range", t)
	}
	h.T = int(t)
	if err := h.Validate(); err != nil {
		return bad("step %d: %v", step, err)
	}
	d.Sum = le.Uint32(b[80:])
	r.Optimizer = diffstore.Optimizer{Region: r.Regions[opt].Name, N: int64(le.Uint64(b[16:])),
		WOff: int64(le.Uint64(b[24:])), MOff: int64(le.Uint64(b[32:])), VOff: int64(le.Uint64(b[40:]))}
	for _, v := range []uint64{le.Uint64(b[16:]), le.Uint64(b[24:]), le.Uint64(b[32:]), le.Uint64(b[40:])} {
		if v > MaxRegionSize {
			return bad("optimizer layout field %d out of range", v)
		}
	}
	if err := checkOptimizer(r.Optimizer, r.Regions[opt].Size); err != nil {
		return bad("%v", err)
	}
	off := tableEnd + 8
	d.Record = b[off : off+int(glen) : off+int(glen)]
	off += int(glen)
	d.Other = make(map[string][]byte, nr-1)
	for i, g := range r.Regions {
		if i == opt {
			continue
		}
		d.Other[g.Name] = b[off : off+int(g.Size) : off+int(g.Size)]
		off += int(g.Size)
	}
	rec, err := replay.DecodeRecord(d.Record)
	if err != nil {
		return bad("step %d: gradient: %v", step, err)
	}
	switch {
	case rec.Step != step:
		return bad("step %d: a gradient record of step %d", step, rec.Step)
	case len(rec.Tensors) != 1:
		return bad("step %d: a gradient record of %d tensors, want 1", step, len(rec.Tensors))
	case int64(rec.Tensors[0].Len) != r.Optimizer.N:
		return bad("step %d: a gradient of %d elements for an optimizer of %d", step, rec.Tensors[0].Len, r.Optimizer.N)
	}
	return r, rec.Tensors[0], nil
}

// Sealed reports whether r's seal (Diff.Sum) is the owner's over its
// step, hyper-parameters and other regions (diffstore.Diff.Seal).
func (r *Record) Sealed() bool {
	d := r.Diff
	d.Seal()
	return d.Sum == r.Diff.Sum
}
