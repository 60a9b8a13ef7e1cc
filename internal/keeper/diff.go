package keeper

// Differential protection (Config.Mode ModeDiff, gorun --protect-mode
// diff; TierCheck §3.2-§3.3). The owner's replicator sends each holder
// a base once (the committed slot's replicated regions at a step b, as
// full mode sends a step), then every committed step's differential in
// order: the step's gradient as a replay record, its Adam
// hyper-parameters, and the bytes of the replicated regions other than
// the optimizer's. The holder keeps them in a diffstore.Store and
// rebuilds any step of its range by a fused replay; every
// DiffConfig.BaseEvery steps the owner sends a fresh base in chunks paced
// over the next steps, after each step's differential, so that they never
// delay one.
//
// The frames (replica.go's header and table, then):
//
//	base       kind 5: table = the replicated regions with the owner's CRC32Cs at step;
//	           optDesc data (length = 40 + the regions' bytes)
//	diff       kind 6: table = the replicated regions with the owner's CRC32Cs at step;
//	           diffDesc record other (length = 48 + the record's + the other regions' bytes,
//	           the others in table order, the optimizer's left out)
//	baseChunk  kind 7: table = one region (its whole size, CRC 0); offset(8) bytes
//	           (length = 8 + the bytes), of the refresh at step
//	baseCommit kind 8: table = the replicated regions with the CRC32Cs of the refresh at step
//	optDesc    = optimizer's table index(4) reserved(4) N(8) W(8) M(8) V(8)
//	diffDesc   = optimizer's table index(4) diffstore sum(4) T(8) record length(8)
//	             lr beta1 beta2 eps weight_decay (float32 bits, 4 each) reserved(4)
//
// A holder acknowledges a differential only when its store can restore
// the step (diffstore.Store.Held): then, as in full mode, the owner counts
// it (acked → Replicated → G). It refuses a differential that does not
// verify (fail, why failCRC: the owner sends it again, then a base), that
// does not follow what it holds (failGap, with the step it takes next in
// the answer's gen field, -1 if it needs a base: the owner resends from
// there or sends a base), and answers failPending for one it took whose
// step it cannot restore yet. Every restore from the store is checked
// against the owner's committed CRC32Cs of the step, which every frame
// carries: a replay that differs is an error, never served.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

const (
	kindBase       = 5
	kindDiff       = 6
	kindBaseChunk  = 7
	kindBaseCommit = 8

	// Why a diff-mode holder refused (a fail answer's reserved word).
	failGap     = 3 // the differential does not follow what the holder has: gen = its Next (-1: send a base)
	failPending = 4 // the differential was taken, its step is not restorable yet
	// failDiverged: the holder's replay of the owner's differentials up to
	// step gen differs from the owner's commit (ErrReplayDiffers): the
	// owner's rank fails.
	failDiverged = 7

	// needBase in replicator.dnext: the holder cannot take the
	// differentials that follow what it holds (they do not follow, or it
	// has no base): it gets a base, without being asked kindHas first.
	needBase = -2
	// needProbe in replicator.dnext (diff mode under EC, the clear copy's
	// holder): where the holder stands is not known (it got a base whole,
	// or said it does not hold the step it was asked about): it is sent
	// the differential after what it acknowledged, else the oldest queued
	// one, and its answer (an acknowledgement, or a gap with the step it
	// takes next) says.
	needProbe = -3

	optDescSize  = 40
	diffDescSize = 48
	// maxBaseChunk is the most bytes one base refresh frame carries.
	maxBaseChunk = 4 << 20
	// maxRecordSlack bounds a differential's record beyond its optimizer
	// region's size (headers, descriptors, codec overhead), before the
	// holder's store says more (maxRecordLen).
	maxRecordSlack = 1 << 20
	// recordHeaderSlack bounds a record of one tensor beyond its payload:
	// its header, descriptor, padding and CRC (about a hundred bytes).
	recordHeaderSlack = 4 << 10
)

var (
	// errHolderGap: the holder lacks the steps before a differential.
	errHolderGap = errors.New("the holder lacks the steps before this differential")
	// errDiffPending: the holder took a differential whose step it
	// cannot restore yet.
	errDiffPending = errors.New("the holder took the differential but cannot restore its step yet")
)

// testHookLinkFrame, if set (by tests), may replace a diff-mode request's
// bytes just before they are written (to damage them on the wire).
var testHookLinkFrame func(h linkHdr, bufs net.Buffers) net.Buffers

// testHookDropDiff, if set (by tests), says whether the owner's
// differential of step to holder is lost on the way: it is not sent, and
// the owner goes on as if it had been (a link that lost it).
var testHookDropDiff func(owner, holder int, step int64) bool

// ---- Frames -------------------------------------------------------------

// frameHead returns a request's header (with t's count and length) and
// table, followed by pre.
func frameHead(h linkHdr, t []tableEntry, length uint64, pre []byte) []byte {
	h.count, h.length = len(t), length
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45+len(pre))
	h.put(b)
	b = appendTable(b, t)
	return append(b, pre...)
}

// An optimizer descriptor (optDescSize bytes, in a base and a logBegin)
// names the optimizer's region by its index in the frame's table, then
// four reserved zero bytes, then the layout's N, W, M and V (protect.Optimizer).
func appendOptDesc(b []byte, idx int, o *protect.Optimizer) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(idx))
	b = binary.BigEndian.AppendUint32(b, 0)
	for _, v := range []int64{o.N, o.W, o.M, o.V} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// parseOptDesc reads an optimizer descriptor (appendOptDesc) of a frame
// whose table is t. The layout itself (N and the offsets within the
// region) is diffstore's to check (diffstore.New, NewLog).
func parseOptDesc(db []byte, t []tableEntry) (diffstore.Optimizer, error) {
	if len(db) < optDescSize {
		return diffstore.Optimizer{}, fmt.Errorf("optimizer descriptor of %d bytes, want %d", len(db), optDescSize)
	}
	idx := binary.BigEndian.Uint32(db)
	if idx >= uint32(len(t)) {
		return diffstore.Optimizer{}, fmt.Errorf("optimizer region %d of %d", idx, len(t))
	}
	if r := binary.BigEndian.Uint32(db[4:]); r != 0 {
		return diffstore.Optimizer{}, fmt.Errorf("optimizer descriptor: reserved bytes %#x, want 0", r)
	}
	u64 := func(i int) int64 { return int64(binary.BigEndian.Uint64(db[i:])) }
	return diffstore.Optimizer{Region: t[idx].name, N: u64(8), WOff: u64(16), MOff: u64(24), VOff: u64(32)}, nil
}

func appendDiffDesc(b []byte, od *ownerDiff) []byte {
	h := od.d.Hyper
	b = binary.BigEndian.AppendUint32(b, uint32(od.opt))
	b = binary.BigEndian.AppendUint32(b, od.d.Sum)
	b = binary.BigEndian.AppendUint64(b, uint64(int64(h.T)))
	b = binary.BigEndian.AppendUint64(b, uint64(len(od.d.Record)))
	for _, f := range []float32{h.LR, h.Beta1, h.Beta2, h.Eps, h.WeightDecay} {
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(f))
	}
	return binary.BigEndian.AppendUint32(b, 0)
}

// diffDesc is a differential frame's descriptor.
type diffDesc struct {
	opt    int
	sum    uint32
	hyper  replay.Hyper
	recLen uint64
}

func parseDiffDesc(b []byte) diffDesc {
	u32 := func(i int) uint32 { return binary.BigEndian.Uint32(b[i:]) }
	f32 := func(i int) float32 { return math.Float32frombits(u32(i)) }
	t := int64(binary.BigEndian.Uint64(b[8:]))
	if t < 0 || t > math.MaxInt32 {
		t = 0 // refused by Hyper.Validate
	}
	return diffDesc{
		opt: int(u32(0)), sum: u32(4), recLen: binary.BigEndian.Uint64(b[16:]),
		hyper: replay.Hyper{LR: f32(24), Beta1: f32(28), Beta2: f32(32), Eps: f32(36), WeightDecay: f32(40), T: int(t)},
	}
}

// call sends a diff-mode request (its bytes bufs) to host on the owner's
// link and waits for its acknowledgement.
func (p *linkPool) call(ctx context.Context, host int, h linkHdr, bufs net.Buffers) error {
	return p.do(ctx, host, h.owner, func(c net.Conn) error {
		if testHookLinkFrame != nil {
			bufs = testHookLinkFrame(h, bufs)
		}
		if _, err := bufs.WriteTo(c); err != nil {
			return err
		}
		return readAck(c, h)
	})
}
