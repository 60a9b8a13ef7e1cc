package keeper

// Diff mode under erasure coding: the log-only holders (Placement.Logs).
// A log-only holder keeps an owner's differentials after H with no base
// (diffstore.Log in ownerReplica.log), so that with the clear copy's
// holder they are on M hosts other than the owner's.
//
// On the links (PROTOCOL.md "Erasure coding and diff mode"):
//
//	logBegin  kind 5 to a log-only holder: table = the replicated regions
//	          (sizes; CRC32Cs unused); optDesc, then the epoch of the
//	          placement the owner last resumed under (8 bytes, 0: none),
//	          and nothing else (length = 48): "the owner sends step+1
//	          next, of that placement's trajectory". A log of
//	          that layout that holds every step from its anchor through
//	          step is kept: what it holds after step goes, nothing before
//	          (ack). Any other (none here, another layout, a log that
//	          lacks a step up to step, or one anchored after it) is made
//	          anew, anchored at step, and the answer is failGap with
//	          step+1: the log holds nothing up to step, and the owner
//	          counts none of its acknowledgements before
//	diff      kind 6, as to a clear copy's holder: acknowledged once the
//	          log holds it, so every step from its anchor on; a gap is
//	          answered with the step the log takes next (failGap)
//
// A logBegin never drops a step the log still needs: a restored or
// rebased owner forgets its holders and anchors at the step it resumed
// from, above H, and the records (H, that step] on its surviving log
// holders are what a recovery at H replays. Truncation through H is
// sweepLog's alone.
//
// The log is reserved against half the host's memory as a store is
// (replicaStore.account counts its bytes), truncated through H when H
// moves (sweepLog), and on a restart after G, but for the steps the
// owner committed and sent in the new restart generation already
// (restartDiff's cut, restartLog).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// logBeginSize is a logBegin's length: optDesc and the owner's epoch.
const logBeginSize = optDescSize + 8

// sendLogBegin anchors log-only holder k's log of the rank at step,
// declaring the rank's regions and optimizer layout, and epoch, the
// placement the rank last resumed under (ecBase.resumedEpoch).
func (r *replicator) sendLogBegin(ctx context.Context, hdr linkHdr, k holderKey, step int64, epoch uint64) error {
	s := r.s
	s.mu.Lock()
	if s.opt == nil {
		s.mu.Unlock()
		return errors.New("the rank declared no optimizer")
	}
	var t []tableEntry
	opt := -1
	for _, i := range s.repl {
		if s.regions[i].Name == s.opt.Region {
			opt = len(t)
		}
		t = append(t, tableEntry{name: s.regions[i].Name, size: s.regions[i].Size})
	}
	o := *s.opt
	s.mu.Unlock()
	hdr.kind, hdr.step = kindBase, step
	b := frameHead(hdr, t, logBeginSize, nil)
	b = appendOptDesc(b, opt, &o)
	b = binary.BigEndian.AppendUint64(b, epoch)
	return s.h.links.call(ctx, k.host, hdr, net.Buffers{b})
}

// planLogLocked plans log-only holder k's part of a round into act (a
// is what it acknowledged, n its Next if known): true if it has one. A
// log-only holder takes differentials only: from the step it asked for
// (its Next), else after what it acknowledged; sent and not
// acknowledged: again from the first it lacks. One with no log that
// follows (unknown, or it said so) gets a logBegin; so does one that
// lacks steps older than the queue (they are lost to it: its log is made
// anew, after a backoff). r.mu is held.
func (r *replicator) planLogLocked(act *diffAct, a, n int64, known bool) bool {
	act.logEpoch = r.ecb.resumedEpoch
	if !known || n < 0 {
		act.logBegin, act.logAt = true, r.logAnchorLocked(a)
		return true
	}
	from := n
	if from > r.wantS {
		if a >= r.wantS {
			return false
		}
		from = a + 1
	}
	if act.d = r.diffAt(from); act.d != nil {
		act.d.rec.retain()
		return true
	}
	if len(r.dq) == 0 || from > r.dq[0].step {
		return false
	}
	// It lacks steps the queue no longer has.
	act.logBegin, act.lost, act.logAt = true, true, r.logAnchorLocked(a)
	return true
}

// logAnchorLocked returns the step a log-only holder that acknowledged
// a is anchored at: after what it acknowledged, H (it keeps nothing
// older) and the step the ranks resumed from, and never before the
// queue's first step less one (the owner cannot send older steps). The
// holder keeps a log that runs through that step (logBegin). r.mu is
// held.
func (r *replicator) logAnchorLocked(a int64) int64 {
	at := max(a, r.s.h.H(), r.logFloorLocked())
	if len(r.dq) > 0 {
		at = max(at, r.dq[0].step-1)
	}
	return at
}

// logBeginTo sends act's logBegin and returns the outcome: the holder
// takes act.logAt+1 next; reanchored if its log holds nothing up to
// act.logAt (the owner forgets what it acknowledged).
func (r *replicator) logBeginTo(ctx context.Context, hdr linkHdr, act diffAct, linkFailed func(error)) diffRes {
	res := diffRes{acked: noStep, base: noStep}
	err := r.sendLogBegin(ctx, hdr, act.k, act.logAt, act.logEpoch)
	var re *remoteError
	switch {
	case err == nil:
	case errors.As(err, &re) && re.why == failGap && re.next == act.logAt+1:
		res.reanchored = true
	default:
		res.err = fmt.Errorf("log begin at step %d to rank %d: %w", act.logAt, act.k.rank, err)
		linkFailed(err)
		return res
	}
	res.next, res.setNext = act.logAt+1, true
	if act.lost {
		res.err = fmt.Errorf("%w: rank %d's log-only holder rank %d on host %d lacked differentials older than the owner's queue; its log was anchored again at step %d", errLogLost, r.s.rank, act.k.rank, act.k.host, act.logAt)
	}
	return res
}

// errLogLost: a log-only holder lacked differentials the owner no longer
// has; its log was made anew (a round's failure: the loop backs off).
var errLogLost = errors.New("a log-only holder lost differentials")

// logBegin receives a logBegin (kind 5 of length logBeginSize to a
// log-only holder).
func (st *replicaStore) logBegin(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length != logBeginSize || h.step < noStep {
		return fmt.Errorf("log begin of %d bytes, step %d", h.length, h.step)
	}
	var db [logBeginSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return err
	}
	epoch := binary.BigEndian.Uint64(db[optDescSize:])
	opt, err := parseOptDesc(db[:], t)
	if err != nil {
		return fmt.Errorf("log begin: %w", err)
	}
	regions := make([]diffstore.Region, len(t))
	for i, e := range t {
		regions[i] = diffstore.Region{Name: e.name, Size: e.size}
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return writeFail(c, h, why, msg)
	}
	defer st.account(o)
	st.fenceLog(o)
	// A fenced log is kept only up to its fence (eclog.go): its steps
	// after it may be of an abandoned trajectory, and the owner's next
	// steps would follow them.
	if o.log != nil && slices.Equal(o.log.Regions(), regions) && o.log.Optimizer() == opt && logFollows(o.log, h.step) && (!o.logFenced || h.step <= o.logFence) {
		if err := o.log.Truncate(h.step); err == nil {
			o.logFenced, o.logEpoch = false, epoch
			return writeAck(c, h)
		}
	}
	l, err := diffstore.NewLog(regions, opt)
	if err != nil {
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o.recs.setMax(st.h.cfg.Diff.fold() + 2)
	l.SetRecycle(o.recs.put)
	l.TruncateThrough(h.step)
	if o.log != nil {
		st.h.log.Debug("a log-only holder's log cannot follow the owner's anchor: made anew", "rank", h.owner, "anchor", h.step, "next was", o.log.Next())
	}
	o.log, o.logSeq, o.logFenced, o.logEpoch = l, st.h.place().seq, false, epoch
	return writeGap(c, h, h.step+1, fmt.Sprintf("rank %d: the log here holds nothing up to step %d", h.owner, h.step))
}

// logFollows reports whether log l holds every step from its anchor
// through step (or is anchored at step), so that the owner's step+1 may
// follow it.
func logFollows(l *diffstore.Log, step int64) bool {
	next := l.Next()
	if next < 0 {
		return false // not anchored
	}
	after := next - 1 - int64(l.Len())
	return after <= step && step < next
}

// logDiff receives a differential of h.owner at h.step into its log, and
// acknowledges it once the log holds it. Nothing of its size is allocated
// before its sizes were checked against the log's layout and reserved.
func (st *replicaStore) logDiff(c net.Conn, h linkHdr, t []tableEntry) error {
	if h.length < diffDescSize || h.step < 0 {
		return fmt.Errorf("differential of %d bytes, step %d", h.length, h.step)
	}
	var db [diffDescSize]byte
	if _, err := io.ReadFull(c, db[:]); err != nil {
		return err
	}
	dd := parseDiffDesc(db[:])
	if dd.opt >= len(t) {
		return fmt.Errorf("differential: optimizer region %d of %d", dd.opt, len(t))
	}
	others := tableBytes(t) - uint64(t[dd.opt].size)
	if dd.recLen > uint64(t[dd.opt].size)+maxRecordSlack || h.length != diffDescSize+dd.recLen+others {
		return fmt.Errorf("differential of %d bytes: a record of %d and other regions of %d", h.length, dd.recLen, others)
	}
	refuse := func(answer func() error) error {
		if err := drain(c, dd.recLen+others); err != nil {
			return err
		}
		return answer()
	}
	o := st.owner(h.owner)
	o.mu.Lock()
	why, msg := st.checkOwner(o, h)
	l := o.log
	o.mu.Unlock()
	switch {
	case msg != "":
		return refuse(func() error { return writeFail(c, h, why, msg) })
	case l == nil:
		return refuse(func() error { return writeGap(c, h, noStep, fmt.Sprintf("no log of rank %d here", h.owner)) })
	}
	if bad := logFits(l, t, dd.opt, dd.recLen, st.h.cfg.Diff.codec()); bad != "" {
		return fmt.Errorf("rank %d step %d: %s", h.owner, h.step, bad)
	}
	n := dd.recLen + others
	if err := st.reserve(n, 0); err != nil {
		msg := fmt.Sprintf("differential of rank %d step %d: %d bytes: %v", h.owner, h.step, n, err)
		return refuse(func() error { return writeFail(c, h, failOther, msg) })
	}
	defer st.reserve(0, n)
	rec := o.recs.get(dd.recLen)
	if rec == nil {
		rec = make([]byte, dd.recLen)
	}
	d, err := readDiff(c, h, t, dd, rec)
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, msg := st.checkOwner(o, h); msg != "" {
		return writeFail(c, h, why, msg)
	}
	if o.log != l {
		return writeGap(c, h, noStep, fmt.Sprintf("rank %d: the log here was replaced", h.owner))
	}
	defer st.account(o)
	err = l.Append(d)
	if errors.Is(err, diffstore.ErrMismatch) {
		// A step held with another record: the owner went back (an
		// in-place restore) and took another way from there.
		if first, last, ok := l.Range(); ok && h.step <= last && h.step > first && l.Truncate(h.step-1) == nil {
			err = l.Append(d)
		}
	}
	switch {
	case errors.Is(err, diffstore.ErrGap):
		return writeGap(c, h, l.Next(), fmt.Sprintf("rank %d: %v", h.owner, err))
	case errors.Is(err, diffstore.ErrCorrupt):
		return writeFail(c, h, failCRC, fmt.Sprintf("rank %d: %v", h.owner, err))
	case errors.Is(err, diffstore.ErrMismatch):
		return writeGap(c, h, noStep, fmt.Sprintf("rank %d: %v", h.owner, err))
	case err != nil:
		return writeFail(c, h, failOther, fmt.Sprintf("rank %d: %v", h.owner, err))
	}
	o.setSums(h.step, h.gen, t)
	return writeAck(c, h)
}

// logFits says why a differential with table t (optimizer at opt, a
// record of recLen bytes) cannot be one of log l's owner, or "".
func logFits(l *diffstore.Log, t []tableEntry, opt int, recLen uint64, codec replay.Options) string {
	return layoutFits("log", l.Regions(), l.Optimizer(), t, opt, recLen, codec)
}

// sweepLog fences o's log at a new placement's G (fenceLog), and
// truncates it through H (nothing replays the steps up to H any more).
// o.mu is held.
//
// Not while o is of a newer restart generation than this host (its
// owner restarted first, and this host has not yet): this host's H is
// the old generation's, which a roll-back to the durable tier abandons
// (Keeper.RollBack) and which may be past the steps the owner sends now.
func (st *replicaStore) sweepLog(o *ownerReplica) {
	st.fenceLog(o) // a new placement: before H moves past what it fences
	if o.log == nil || o.gen > st.h.Gen() {
		return
	}
	if hb := st.h.H(); hb >= 0 {
		o.log.TruncateThrough(hb)
		st.account(o)
	}
}

// restartLog cuts o's log after step cut, which restartDiff computed:
// the restart's G, and after it the consecutive steps the owner
// committed and sent in the new restart generation already (agents
// restart on their own: an owner whose host restarted first may have
// sent G+1 before this host restarted, and counts it as held). A log
// anchored after cut goes (the owner anchors it again). o.mu is held.
func (st *replicaStore) restartLog(o *ownerReplica, cut int64) {
	if o.log == nil {
		return
	}
	if err := o.log.Truncate(cut); err != nil {
		o.log = nil
	}
	st.account(o)
}

// logNewest returns the newest step o's log holds, or -1. o.mu is held.
func (o *ownerReplica) logNewest() int64 {
	if o.log == nil {
		return noStep
	}
	if _, last, ok := o.log.Range(); ok {
		return last
	}
	return noStep
}

// logAfter reports whether o's log holds a differential after step h.
// o.mu is held.
func (st *replicaStore) logAfter(o *ownerReplica, h int64) bool {
	if o.log == nil {
		return false
	}
	_, last, ok := o.log.Range()
	return ok && last > h
}
