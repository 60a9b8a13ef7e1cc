package keeper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
)

// ---- Clients ---------------------------------------------------------------

// writeEC writes an EC request: header, table, ecHdr and data.
func writeEC(w io.Writer, h linkHdr, t []tableEntry, e ecHdr, data []byte) error {
	h.count, h.length = len(t), uint64(len(data))
	b := make([]byte, linkHdrSize, linkHdrSize+len(t)*45+ecHdrSize)
	h.put(b)
	b = appendTable(b, t)
	var eb [ecHdrSize]byte
	e.put(eb[:])
	b = append(b, eb[:]...)
	bufs := net.Buffers{b}
	if len(data) > 0 {
		bufs = append(bufs, data)
	}
	_, err := bufs.WriteTo(w)
	return err
}

// ecAcked sends EC request h (on the link of rank h.owner to host) and
// waits for its acknowledgement.
func (p *linkPool) ecAcked(ctx context.Context, host int, h linkHdr, t []tableEntry, e ecHdr, data []byte) error {
	return p.ecAckedLane(ctx, host, 0, h, t, e, data)
}

// ecAckedLane is ecAcked on lane lane of the link (linkKey).
func (p *linkPool) ecAckedLane(ctx context.Context, host, lane int, h linkHdr, t []tableEntry, e ecHdr, data []byte) error {
	return p.doLane(ctx, host, h.owner, lane, func(c net.Conn) error {
		if err := writeEC(c, h, t, e, data); err != nil {
			return err
		}
		return readAck(c, h)
	})
}

// errNoRow: the holder has no complete parity row of the step asked for.
var errNoRow = errors.New("no complete parity row")

// ecGet reads bytes [off, off+len(dst)) of parity row row of stripe of
// group at step from host, whose rank holderRank holds it, into dst (zeros
// past the row's end), and returns the row's members: an error if the
// host has no complete row of that step (a refusal, the link kept). The
// bytes are the row's as held: the caller checks what it rebuilds from
// them against the members' tables. len(dst) ≤ 64 MiB.
func (p *linkPool) ecGet(ctx context.Context, host, holderRank int, group, stripe, row int, step int64, off int64, dst []byte) ([]ecMember, error) {
	if len(dst) > maxECRange {
		return nil, fmt.Errorf("ecGet of %d bytes: at most %d per request", len(dst), maxECRange)
	}
	h := linkHdr{kind: kindECGet, owner: holderRank, holder: holderRank, step: step}
	e := ecHdr{group: group, stripe: stripe, row: row, off: off, n: int64(len(dst)), hb: noStep}
	var ms []ecMember
	err := p.do(ctx, host, -1-holderRank, func(c net.Conn) error {
		if err := writeEC(c, h, nil, e, nil); err != nil {
			return err
		}
		a, err := readAnswer(c)
		if err != nil {
			return err
		}
		if a.kind != kindData || a.step != step || a.length != uint64(len(dst)) || a.count != 0 {
			return fmt.Errorf("unexpected answer kind %#x step %d of %d bytes", a.kind, a.step, a.length)
		}
		if ms, err = readMembers(c); err != nil {
			return err
		}
		_, err = io.ReadFull(c, dst)
		return err
	})
	if re, ok := errors.AsType[*remoteError](err); ok {
		return nil, fmt.Errorf("%w: %w", errNoRow, re)
	}
	return ms, err
}

// getRange reads bytes [off, off+len(dst)) of owner's shard at step
// (zeros past its end) from host into dst: from owner's own slot when
// holderRank is owner, else from the clear copy holder rank holderRank
// keeps. It returns owner's table (its regions, sizes and committed
// CRC32Cs, in shard order); the caller checks the bytes against it.
// len(dst) ≤ 64 MiB.
func (p *linkPool) getRange(ctx context.Context, host, holderRank, owner int, step, off int64, dst []byte) ([]tableEntry, error) {
	if len(dst) > maxECRange {
		return nil, fmt.Errorf("getRange of %d bytes: at most %d per request", len(dst), maxECRange)
	}
	h := linkHdr{kind: kindGetRange, owner: owner, holder: holderRank, step: step}
	e := ecHdr{off: off, n: int64(len(dst)), hb: noStep}
	var t []tableEntry
	err := p.do(ctx, host, -1-holderRank, func(c net.Conn) error {
		if err := writeEC(c, h, nil, e, nil); err != nil {
			return err
		}
		a, err := readAnswer(c)
		if err != nil {
			return err
		}
		if a.kind != kindData || a.step != step || a.length != uint64(len(dst)) {
			return fmt.Errorf("unexpected answer kind %#x step %d of %d bytes", a.kind, a.step, a.length)
		}
		if t, err = readTable(c, a.count); err != nil {
			return err
		}
		_, err = io.ReadFull(c, dst)
		return err
	})
	return t, err
}
