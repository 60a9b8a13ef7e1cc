package keeper

// getLog (diff mode under erasure coding; PROTOCOL.md "Erasure coding
// and diff mode"): a restorer asks a host for an owner's differentials
// of the steps (from, from+count], to replay them onto the owner's base
// at from, which it decoded from the owner's stripe.
//
//	getLog  kind 16: owner = the log's owner, holder = a rank of the host
//	        asked, step = from, gen = the restorer's restart generation;
//	        no table; ecHdr (n = count, 1 to maxLogCount; epoch and h =
//	        the epoch and G of the restorer's placement, Placement.Epoch
//	        and G; off = 1 + the step the restorer's restart generation
//	        resumed from, 0 if none; the rest unread); no data
//
// The label (gen, resumed, epoch, G) says which trajectory the restore
// is of, as a share's label does (ecstore.go). Host and restorer may be
// a restart or a placement apart (each takes them when its agent does):
// the steps up to the step the newer of the two resumed from are final,
// the ones after it may be of the trajectory it abandoned (the older
// side's copy may hold them; or the older side is stale). So the host
// asked refuses with failStale (this source cannot serve; the restorer
// tries the next) a step after the step the newer restart generation
// resumed from, when they are in different ones, or after the newer
// placement's G, when they took different ones; and a step received in
// a newer generation than the restorer's after the step this host knows
// that generation resumed from (none: every such step).
// (A host two placements behind, E0 against E2, could hold steps up to
// G2 that E1 abandoned if G1 < G2; but G passes a placement's G only
// once the ranks resumed under it, every host with ranks having taken
// it.) Within a generation, an in-place recovery rolls back to the new
// placement's G: a log the owner has not anchored again since
// (logBegin) is fenced at the least G of the placements taken since it
// was (ownerReplica.logFence, fenceLog; not a placement the owner had
// resumed under when it anchored the log: logBegin carries its epoch),
// and no step after the fence is
// served from it: the owner of a host that was lost never anchors its
// logs again, and its log-only holders of an earlier placement may keep
// the steps of the trajectory abandoned.
//
// The answer is count frames, one per step from+1 to from+count in
// order, each in the layout of the differential request (kind 6) that
// brought the step to the holder, as a data answer:
//
//	header (kind data, step = the step, count and length as kind 6's)
//	table  (the owner's regions with the CRC32Cs it committed at the step)
//	diffDesc record other
//
// The record carries its own CRC32C and the diffDesc the owner's seal
// (diffstore.Diff.Sum) over the step, hyper-parameters and other regions:
// the restorer checks both (diffstore.Store.Append), and the state it
// replays at the last step against that frame's table, so that a
// record damaged on the way or at the holder, or a log of another
// trajectory, is refused and never restored. The host answers from
// whatever copy of the owner's log it keeps: a log-only holder's
// diffstore.Log, else a clear copy's store (its differentials after its
// base), whichever holds every step asked; it answers a failure (no
// frame) if none does, or if it lacks the committed CRC32Cs of a step:
// never a partial log.
//
// Trust: the request's fields are checked (a malformed one closes the
// link); the answer's every length is checked against the owner's layout
// before anything of its size is allocated, and a frame that does not
// fit closes the link.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/gorun/gorun/internal/diffstore"
)

const (
	kindGetLog = 16
	// maxLogCount bounds the steps of one getLog (the logs are at most B
	// + σ + 2 steps long: PROTOCOL.md).
	maxLogCount = 1 << 20
)

// errNoLog: the host asked keeps no copy of the owner's log holding
// every step asked (a refusal, the link kept).
var errNoLog = errors.New("no log of the steps asked")

// getLog answers a getLog whose header and table were read.
func (st *replicaStore) getLog(c net.Conn, h linkHdr, t []tableEntry) error {
	e, err := readECHdr(c)
	if err != nil {
		return err
	}
	if len(t) != 0 || h.length != 0 || e.n < 1 || e.n > maxLogCount || h.step < noStep {
		return fmt.Errorf("getLog of %d steps after step %d with %d regions and %d bytes", e.n, h.step, len(t), h.length)
	}
	from, to := h.step, h.step+e.n
	lb := logLabel{gen: h.gen, epoch: e.epoch, g: e.hb, resumed: e.off - 1}
	records, tables, opt, fwhy, why := st.logSource(h.owner, lb, from, to)
	if why != "" {
		return writeFail(c, h, fwhy, fmt.Sprintf("rank %d steps %d to %d: %s", h.owner, from+1, to, why))
	}
	return writeAnswer(c, nil, func(w io.Writer) error {
		sent := 0
		err := records(from, to, func(d diffstore.Diff) error {
			sent++
			return writeLogFrame(w, linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: d.Step, gen: h.gen}, tables[d.Step-from-1], opt, d)
		})
		if err != nil && sent == 0 {
			// Nothing sent yet (the log was cut meanwhile), so no
			// write deadline set either: a refusal, the link stays.
			return writeFail(c, h, failOther, fmt.Sprintf("rank %d steps %d to %d: %v", h.owner, from+1, to, err))
		}
		return err
	})
}

// logLabel is what a getLog restores under: the restorer's restart
// generation and the step it resumed from (-1: none), and the epoch and
// G of its placement (Placement.Epoch and G).
type logLabel struct {
	gen, epoch uint64
	g, resumed int64
}

// logSource finds the copy of owner's log here that holds every step of
// (from, to] of the trajectory of label lb with their committed tables:
// its Records, the tables of the steps in order, and the optimizer
// region's index in them; or why there is none (fwhy: failStale when
// this host or its copy is of another generation or placement than lb,
// else failOther).
func (st *replicaStore) logSource(owner int, lb logLabel, from, to int64) (records func(int64, int64, func(diffstore.Diff) error) error, tables [][]tableEntry, opt int, fwhy uint32, why string) {
	st.h.gmu.Lock()
	gen, resumed := st.h.gen, st.h.resumed
	st.h.gmu.Unlock()
	// final: the steps up to it are the same in the restore's generation
	// and this host's newer one (a step received or confirmed in a newer
	// one is the restore's only up to it).
	final := int64(noStep)
	if gen > lb.gen {
		final = resumed
	}
	switch {
	case gen > lb.gen && to > resumed:
		return nil, nil, 0, failStale, fmt.Sprintf("a restore of restart generation %d, this host is in generation %d, which resumed from step %d", lb.gen, gen, resumed)
	case gen < lb.gen && to > lb.resumed:
		return nil, nil, 0, failStale, fmt.Sprintf("a restore of restart generation %d, which resumed from step %d: this host is in generation %d yet", lb.gen, lb.resumed, gen)
	}
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil, nil, 0, failOther, "no copy of the rank here"
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	// Checked under o.mu: a placement taken meanwhile fences the log
	// (fenceLog) before it is read here.
	p := st.h.place()
	switch {
	case p.epoch > lb.epoch && to > p.g:
		return nil, nil, 0, failStale, fmt.Sprintf("a restore under placement epoch %d, this host has taken epoch %d's, which resumed from step %d", lb.epoch, p.epoch, p.g)
	case p.epoch < lb.epoch && to > lb.g:
		return nil, nil, 0, failStale, fmt.Sprintf("a restore under placement epoch %d, which resumed from step %d: this host has not taken it yet (epoch %d's)", lb.epoch, lb.g, p.epoch)
	}
	st.fenceLog(o)
	var optRegion string
	switch {
	case o.log != nil && o.log.Holds(from, to) && (!o.logFenced || to <= o.logFence):
		records, optRegion = o.log.Records, o.log.Optimizer().Region
	default:
		for _, ds := range []*diffstore.Store{o.cur, o.prev} {
			if ds == nil {
				continue
			}
			if first, last, ok := ds.Range(); ok && first <= from && to <= last {
				records, optRegion = ds.Records, ds.Optimizer().Region
				break
			}
		}
	}
	if records == nil {
		if o.log != nil && o.logFenced && o.log.Holds(from, to) {
			return nil, nil, 0, failStale, fmt.Sprintf("the log here was not anchored again since a placement resumed from step %d: its steps after it may be of an abandoned trajectory", o.logFence)
		}
		return nil, nil, 0, failOther, "not held here"
	}
	tables = make([][]tableEntry, 0, to-from)
	for s := from + 1; s <= to; s++ {
		t, ok := o.sums[s]
		if !ok {
			return nil, nil, 0, failOther, fmt.Sprintf("the committed CRC32Cs of step %d are not known here", s)
		}
		if g := o.sumGen[s]; g > lb.gen && s > final {
			return nil, nil, 0, failStale, fmt.Sprintf("step %d was received in restart generation %d, the restore is of generation %d", s, g, lb.gen)
		}
		tables = append(tables, slices.Clone(t))
	}
	opt = slices.IndexFunc(tables[0], func(e tableEntry) bool { return e.name == optRegion })
	if opt < 0 {
		return nil, nil, 0, failOther, fmt.Sprintf("no optimizer region %q in the committed table", optRegion)
	}
	return records, tables, opt, 0, ""
}

// fenceLog brings o's log fence up to the current placement: a placement
// taken since the fence's (logSeq) resumes from its G, and a step of the
// log after it may be of the trajectory the ranks abandoned, until the
// owner anchors the log again (logBegin). The fence is the least G of
// the placements taken since the owner last anchored the log. Called on
// every placement change (sweepLog, from sweep) and before the log is
// read or anchored. o.mu is held.
//
// A placement no newer than the one the owner had resumed under when it
// last anchored the log (logEpoch, which its logBegin carries) fences
// nothing: the owner took it, and resumed from its G, before this host
// did, and every step it sent since is of its trajectory. (Without this
// a log the owner re-anchored under the new placement before this host
// took it would stay fenced for good: the owner has no reason to anchor
// it again, and G moves past the fence.)
func (st *replicaStore) fenceLog(o *ownerReplica) {
	p := st.h.place()
	if o.log == nil || o.logSeq == p.seq {
		return
	}
	if p.epoch <= o.logEpoch {
		o.logSeq = p.seq
		return
	}
	if !o.logFenced || p.g < o.logFence {
		o.logFence = p.g
	}
	o.logFenced, o.logSeq = true, p.seq
}

// writeLogFrame writes one frame of a getLog answer: d in the layout of
// a differential request, with header h and table t (d's other regions
// in t's order, the optimizer's, at index opt, left out).
func writeLogFrame(w io.Writer, h linkHdr, t []tableEntry, opt int, d diffstore.Diff) error {
	od := ownerDiff{step: d.Step, table: t, opt: opt, d: d}
	length := uint64(diffDescSize + len(d.Record))
	for i, e := range t {
		if i == opt {
			continue
		}
		b, ok := d.Other[e.name]
		if !ok || int64(len(b)) != e.size {
			return fmt.Errorf("rank %d step %d: region %q of the log does not fit the committed table", h.owner, d.Step, e.name)
		}
		length += uint64(e.size)
	}
	od.bytes = int64(length)
	return writeBufs(w, od.frame(h))
}

// logFrame is one step of a getLog answer, as read.
type logFrame struct {
	table []tableEntry // the owner's regions with their CRC32Cs committed at the step
	d     diffstore.Diff
}

// getLog asks host (whose rank holderRank is named in the request) for
// owner's differentials of the steps (from, to] and hands them to recv
// in order. The frames' sizes are checked against want (the owner's
// regions, names and sizes, in table order) and the optimizer region
// optRegion, whose records are at most maxRec bytes, before anything is
// allocated; a frame that does not fit closes the link. admit, if not
// nil, is asked for each frame's record and regions before they are
// allocated: a refusal is returned as recv's error would be, and the
// frames left are read and dropped, never allocated. The request
// carries lb, the restore's label: a host or copy of another generation
// or placement refuses (failStale). recv's first error is returned once
// the answer was read whole (the link stays usable); a refusal is a
// *remoteError wrapping errNoLog.
func (p *linkPool) getLog(ctx context.Context, host, holderRank, owner int, lb logLabel, from, to int64, want []tableEntry, optRegion string, maxRec uint64, admit func(uint64) error, recv func(logFrame) error) error {
	if to <= from || to-from > maxLogCount {
		return fmt.Errorf("getLog of steps (%d, %d]", from, to)
	}
	opt := slices.IndexFunc(want, func(e tableEntry) bool { return e.name == optRegion })
	if opt < 0 {
		return fmt.Errorf("getLog: no optimizer region %q among the regions", optRegion)
	}
	h := linkHdr{kind: kindGetLog, owner: owner, holder: holderRank, step: from, gen: lb.gen}
	var recvErr error
	err := p.do(ctx, host, -1-holderRank, func(c net.Conn) error {
		// off is bounded as a range is (parseECHdr): a step past that
		// bound is sent as the bound, which only refuses more.
		off := min(lb.resumed+1, maxShard-(to-from))
		if err := writeEC(c, h, nil, ecHdr{n: to - from, epoch: lb.epoch, hb: lb.g, off: off}, nil); err != nil {
			return err
		}
		for s := from + 1; s <= to; s++ {
			adm := admit
			if recvErr != nil { // the rest is dropped: nothing allocated
				adm = func(uint64) error { return recvErr }
			}
			f, refused, err := readLogFrame(c, owner, s, want, opt, maxRec, adm)
			if err != nil {
				if re, ok := errors.AsType[*remoteError](err); ok && s == from+1 {
					return fmt.Errorf("%w: %w", errNoLog, re)
				}
				return err
			}
			switch {
			case refused != nil:
				recvErr = cmp.Or(recvErr, refused)
			case recvErr == nil:
				recvErr = recv(f)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return recvErr
}

// readLogFrame reads the frame of step of owner's getLog answer. admit,
// if not nil, is asked for the bytes of the frame's record and regions
// once their sizes are checked, before they are allocated: its refusal
// is returned as refused, the bytes read and dropped (the link stays in
// step).
func readLogFrame(c io.Reader, owner int, step int64, want []tableEntry, opt int, maxRec uint64, admit func(uint64) error) (f logFrame, refused, err error) {
	a, err := readAnswer(c)
	if err != nil {
		return logFrame{}, nil, err
	}
	if a.kind != kindData || a.owner != owner || a.step != step {
		return logFrame{}, nil, fmt.Errorf("getLog: unexpected answer kind %#x rank %d step %d, want the data of rank %d step %d", a.kind, a.owner, a.step, owner, step)
	}
	t, err := readTable(c, a.count)
	if err != nil {
		return logFrame{}, nil, err
	}
	if !sameShape(t, want) {
		return logFrame{}, nil, fmt.Errorf("getLog: rank %d step %d has regions %v, the owner's are %v", owner, step, t, want)
	}
	if a.length < diffDescSize {
		return logFrame{}, nil, fmt.Errorf("getLog: rank %d step %d: a frame of %d bytes", owner, step, a.length)
	}
	var db [diffDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return logFrame{}, nil, err
	}
	dd := parseDiffDesc(db[:])
	others := tableBytes(t) - uint64(t[opt].size)
	if dd.opt != opt || dd.recLen > maxRec || a.length != diffDescSize+dd.recLen+others {
		return logFrame{}, nil, fmt.Errorf("getLog: rank %d step %d: %d bytes, a record of %d (at most %d) in region %d (want %d), other regions of %d",
			owner, step, a.length, dd.recLen, maxRec, dd.opt, opt, others)
	}
	if admit != nil {
		if refused := admit(dd.recLen + others); refused != nil {
			if err := drain(c, dd.recLen+others); err != nil {
				return logFrame{}, nil, err
			}
			return logFrame{}, refused, nil
		}
	}
	d := diffstore.Diff{Step: step, Hyper: dd.hyper, Record: make([]byte, dd.recLen), Other: make(map[string][]byte, len(t)-1), Sum: dd.sum}
	if _, err := io.ReadFull(c, d.Record); err != nil {
		return logFrame{}, nil, err
	}
	for i, e := range t {
		if i == opt {
			continue
		}
		b := make([]byte, e.size)
		if _, err := io.ReadFull(c, b); err != nil {
			return logFrame{}, nil, err
		}
		d.Other[e.name] = b
	}
	return logFrame{table: t, d: d}, nil, nil
}
