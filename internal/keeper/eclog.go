package keeper

// getLog (diff mode under erasure coding; PROTOCOL.md "Erasure coding
// and diff mode"): a restorer asks a host for an owner's differentials
// of the steps (from, from+count], to replay them onto the owner's base
// at from, which it decoded from the owner's stripe.
//
//	getLog  kind 16: owner = the log's owner, holder = a rank of the host
//	        asked, step = from; no table; ecHdr (only n = count, 1 to
//	        maxLogCount, is read); no data
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
	records, tables, opt, why := st.logSource(h.owner, from, to)
	if why != "" {
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d steps %d to %d: %s", h.owner, from+1, to, why))
	}
	sent := 0
	err = records(from, to, func(d diffstore.Diff) error {
		sent++
		return writeLogFrame(c, linkHdr{kind: kindData, owner: h.owner, holder: h.holder, step: d.Step, gen: h.gen}, tables[d.Step-from-1], opt, d)
	})
	if err != nil && sent == 0 {
		// Nothing sent yet (the log was cut meanwhile): a refusal.
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d steps %d to %d: %v", h.owner, from+1, to, err))
	}
	return err
}

// logSource finds the copy of owner's log here that holds every step of
// (from, to] with their committed tables: its Records, the tables of
// the steps in order, and the optimizer region's index in them; or why
// there is none.
func (st *replicaStore) logSource(owner int, from, to int64) (records func(int64, int64, func(diffstore.Diff) error) error, tables [][]tableEntry, opt int, why string) {
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
	if o == nil {
		return nil, nil, 0, "no copy of the rank here"
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var optRegion string
	switch {
	case o.log != nil && o.log.Holds(from, to):
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
		return nil, nil, 0, "not held here"
	}
	tables = make([][]tableEntry, 0, to-from)
	for s := from + 1; s <= to; s++ {
		t, ok := o.sums[s]
		if !ok {
			return nil, nil, 0, fmt.Sprintf("the committed CRC32Cs of step %d are not known here", s)
		}
		tables = append(tables, slices.Clone(t))
	}
	opt = slices.IndexFunc(tables[0], func(e tableEntry) bool { return e.name == optRegion })
	if opt < 0 {
		return nil, nil, 0, fmt.Sprintf("no optimizer region %q in the committed table", optRegion)
	}
	return records, tables, opt, ""
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
	bufs := od.frame(h)
	_, err := bufs.WriteTo(w)
	return err
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
// allocated; a frame that does not fit closes the link. recv's first
// error is returned once the answer was read whole (the link stays
// usable); a refusal is a *remoteError wrapping errNoLog.
func (p *linkPool) getLog(ctx context.Context, host, holderRank, owner int, from, to int64, want []tableEntry, optRegion string, maxRec uint64, recv func(logFrame) error) error {
	if to <= from || to-from > maxLogCount {
		return fmt.Errorf("getLog of steps (%d, %d]", from, to)
	}
	opt := slices.IndexFunc(want, func(e tableEntry) bool { return e.name == optRegion })
	if opt < 0 {
		return fmt.Errorf("getLog: no optimizer region %q among the regions", optRegion)
	}
	h := linkHdr{kind: kindGetLog, owner: owner, holder: holderRank, step: from}
	var recvErr error
	err := p.do(ctx, host, -1-holderRank, func(c net.Conn) error {
		if err := writeEC(c, h, nil, ecHdr{n: to - from}, nil); err != nil {
			return err
		}
		for s := from + 1; s <= to; s++ {
			f, err := readLogFrame(c, owner, s, want, opt, maxRec)
			if err != nil {
				if re, ok := errors.AsType[*remoteError](err); ok && s == from+1 {
					return fmt.Errorf("%w: %w", errNoLog, re)
				}
				return err
			}
			if recvErr == nil {
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

// readLogFrame reads the frame of step of owner's getLog answer.
func readLogFrame(c io.Reader, owner int, step int64, want []tableEntry, opt int, maxRec uint64) (logFrame, error) {
	a, err := readAnswer(c)
	if err != nil {
		return logFrame{}, err
	}
	if a.kind != kindData || a.owner != owner || a.step != step {
		return logFrame{}, fmt.Errorf("getLog: unexpected answer kind %#x rank %d step %d, want the data of rank %d step %d", a.kind, a.owner, a.step, owner, step)
	}
	t, err := readTable(c, a.count)
	if err != nil {
		return logFrame{}, err
	}
	if !sameShape(t, want) {
		return logFrame{}, fmt.Errorf("getLog: rank %d step %d has regions %v, the owner's are %v", owner, step, t, want)
	}
	if a.length < diffDescSize {
		return logFrame{}, fmt.Errorf("getLog: rank %d step %d: a frame of %d bytes", owner, step, a.length)
	}
	var db [diffDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return logFrame{}, err
	}
	dd := parseDiffDesc(db[:])
	others := tableBytes(t) - uint64(t[opt].size)
	if dd.opt != opt || dd.recLen > maxRec || a.length != diffDescSize+dd.recLen+others {
		return logFrame{}, fmt.Errorf("getLog: rank %d step %d: %d bytes, a record of %d (at most %d) in region %d (want %d), other regions of %d",
			owner, step, a.length, dd.recLen, maxRec, dd.opt, opt, others)
	}
	d := diffstore.Diff{Step: step, Hyper: dd.hyper, Record: make([]byte, dd.recLen), Other: make(map[string][]byte, len(t)-1), Sum: dd.sum}
	if _, err := io.ReadFull(c, d.Record); err != nil {
		return logFrame{}, err
	}
	for i, e := range t {
		if i == opt {
			continue
		}
		b := make([]byte, e.size)
		if _, err := io.ReadFull(c, b); err != nil {
			return logFrame{}, err
		}
		d.Other[e.name] = b
	}
	return logFrame{table: t, d: d}, nil
}
