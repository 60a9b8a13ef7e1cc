package keeper

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/gorun/gorun/protect"
)

// ---- The owner's side ----------------------------------------------------

// diffRefInfo is what a differential by reference carries instead of the
// record: the owner's slice of the reduced gradient and its CRC32C.
type diffRefInfo struct {
	red protect.Reduced
	n   int64
	sum uint32
}

// refFrame returns the request's bytes of od by reference for holder h.
func (od *ownerDiff) refFrame(h linkHdr) (net.Buffers, int64) {
	n := int64(diffDescSize + refDescSize)
	for i, e := range od.table {
		if i != od.opt {
			n += e.size
		}
	}
	b := frameHead(h, od.table, uint64(n), nil)
	at := len(b)
	b = appendDiffDesc(b, od)
	binary.BigEndian.PutUint64(b[at+16:], 0) // no record
	for _, v := range []int64{od.ref.red.N, od.ref.red.Off, od.ref.n} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	b = binary.BigEndian.AppendUint32(b, od.ref.sum)
	b = binary.BigEndian.AppendUint32(b, 0)
	bufs := net.Buffers{b}
	for i, e := range od.table {
		if i != od.opt && e.size > 0 {
			bufs = append(bufs, od.d.Other[e.name])
		}
	}
	return bufs, n
}

// ownerLocal is an owner's use of local sources: per holder, the first
// step it sends by reference again (after a failNoLocal), and its
// figures.
type ownerLocal struct {
	mu   sync.Mutex // guards seq, from and last
	seq  uint64     // the placement from and last belong to
	from map[holderKey]int64
	// last says, per holder, whether its newest differential taken went
	// by reference: the source it uses now.
	last map[holderKey]bool

	byRef atomic.Int64 // differentials the holders took from a local peer
	byNet atomic.Int64 // differentials sent with their record
}

// try reports whether the owner sends holder k its differential of step
// by reference: its host runs a data-parallel peer of the owner and no
// failNoLocal of the last localRetry steps says otherwise.
func (ol *ownerLocal) try(s *service, k holderKey, step int64) bool {
	p := s.h.place()
	ol.mu.Lock()
	if ol.seq != p.seq || ol.from == nil {
		ol.seq, ol.from, ol.last = p.seq, map[holderKey]int64{}, map[holderKey]bool{}
	}
	from, ok := ol.from[k]
	ol.mu.Unlock()
	if ok {
		return step >= from
	}
	if s.h.cfg.Peers == nil {
		return false
	}
	for _, x := range s.h.cfg.Peers(s.rank) {
		if x != s.rank && p.hostOf(x) == k.host {
			return true
		}
	}
	ol.mu.Lock()
	if ol.seq == p.seq {
		ol.from[k] = protect.MaxStep
	}
	ol.mu.Unlock()
	return false
}

// off makes the owner send holder k its differentials with the record
// until step from.
func (ol *ownerLocal) off(s *service, k holderKey, from int64) {
	p := s.h.place()
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.seq == p.seq && ol.from != nil {
		ol.from[k] = from
	}
}

// sendDiff sends holder k the differential od: by reference when k's
// host may take it from a local peer, with its record otherwise or when
// the holder has no local record. It returns the bytes sent.
func (r *replicator) sendDiff(ctx context.Context, k holderKey, hdr linkHdr, od *ownerDiff) (int64, error) {
	s := r.s
	var sent int64
	if od.ref != nil && s.local.try(s, k, od.step) {
		hdr.kind = kindDiffRef
		bufs, n := od.refFrame(hdr)
		err := s.h.links.call(ctx, k.host, hdr, bufs)
		sent += n
		var re *remoteError
		if !errors.As(err, &re) || re.why != failNoLocal && re.why != failNoPeer {
			if err == nil || errors.Is(err, errDiffPending) {
				s.local.byRef.Add(1)
				s.local.took(s, k, true)
			}
			return sent, err
		}
		from := od.step + localRetry
		switch {
		case re.why == failNoPeer:
			from = protect.MaxStep
		case re.next > od.step:
			from = min(re.next, od.step+localRetry)
		}
		s.local.off(s, k, from)
		s.h.log.Debug("differential sent with its record: no local record at the holder", "rank", s.rank, "holder", k.rank, "step", od.step, "by reference again from", from, "why", re.msg)
	}
	hdr.kind = kindDiff
	err := s.h.links.call(ctx, k.host, hdr, od.frame(hdr))
	sent += od.bytes
	if err == nil || errors.Is(err, errDiffPending) {
		s.local.byNet.Add(1)
		s.local.took(s, k, false)
	}
	return sent, err
}

// took records that holder k took its newest differential by reference
// (local) or with the record.
func (ol *ownerLocal) took(s *service, k holderKey, local bool) {
	p := s.h.place()
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.seq == p.seq && ol.last != nil {
		ol.last[k] = local
	}
}

// sources counts the holders of placement p whose newest differential
// went by reference (local) and with the record (net).
func (ol *ownerLocal) sources(p *placement, rank int) (local, net int) {
	ol.mu.Lock()
	defer ol.mu.Unlock()
	if ol.seq != p.seq {
		return 0, 0
	}
	for _, k := range p.targets(rank) {
		if l, ok := ol.last[k]; ok && l {
			local++
		} else if ok {
			net++
		}
	}
	return local, net
}
