package keeper

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"testing"
	"time"
)

// verifiedBaseJob runs an ecDiffRecJob under 2+1, a base every 8 steps,
// with H held at 0, until a rank's clear copy's holder (on another host)
// committed its refresh of base 8: verified, waiting for H, and counted
// coded by the rank (its Base, so H, may name it). It returns the job,
// the rank, its holder, and a read of the rank's shard at 8 on the
// holder's host (a decode's), which it checked.
func verifiedBaseJob(t *testing.T) (j *ecDiffRecJob, owner, holder int, readBase func() error) {
	t.Helper()
	const every = 8
	j = newECDiffRecJob(t, 2, 1, every, 2)
	owner, holder = -1, -1
	for r, hs := range j.holders {
		if len(hs) > 0 && j.hostOf[hs[0]] != j.hostOf[r] {
			owner, holder = r, hs[0]
			break
		}
	}
	if owner < 0 {
		t.Fatal("no rank has a clear copy's holder on another host")
	}
	j.run(0, every-1)
	j.waitH(0)
	j.mu.Lock()
	j.freezeH = true
	j.mu.Unlock()
	j.runUntil(every, 3*every, "the owner's base 8 coded", func() bool {
		return j.c.progress(owner).Base >= every
	})
	hk := j.c.hosts[j.hostOf[holder]]
	if hb := hk.H(); hb >= every {
		t.Fatalf("H %d on the holder's host, want it held below %d", hb, every)
	}
	readBase = func() error {
		_, err := hk.shardRange(owner, holder, every, 0, make([]byte, 64))
		return err
	}
	if err := readBase(); err != nil {
		t.Fatalf("rank %d's base %d on its clear copy's holder: %v", owner, every, err)
	}
	return j, owner, holder, readBase
}

// TestECDiffLateChunkKeepsBase: a chunk of base 8 that would begin a new
// refresh on the clear copy's holder once it committed the refresh (the
// frame of a round its owner cancelled, which the holder read after the
// owner's next round committed the refresh on another connection: a
// placement's restore does that) must not drop the verified base, which
// a decode at H 8 reads. Before the fix the holder began the new refresh
// over it (BeginBase aborts the refresh waiting) and answered "not held"
// (TestSharePacePlacements/at_the_base, 1 in about 40).
func TestECDiffLateChunkKeepsBase(t *testing.T) {
	const every = 8
	j, owner, holder, readBase := verifiedBaseJob(t)
	hk := j.c.hosts[j.hostOf[holder]]
	// The first bytes of the owner's first region, at offset 0, as
	// sendChunks frames them.
	o := hk.store.owner(owner)
	o.mu.Lock()
	region := o.cur.Regions()[0]
	o.mu.Unlock()
	n := min(region.Size, 64)
	oh := j.c.hosts[j.hostOf[owner]]
	hdr := linkHdr{kind: kindBaseChunk, owner: owner, holder: holder, step: every, gen: oh.Gen()}
	b := frameHead(hdr, []tableEntry{{name: region.Name, size: region.Size}}, uint64(8+n), nil)
	b = binary.BigEndian.AppendUint64(b, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answer := oh.links.call(ctx, j.hostOf[holder], hdr, net.Buffers{b, make([]byte, n)})
	if re, ok := errors.AsType[*remoteError](answer); answer != nil && (!ok || re.why != failStale) {
		t.Fatalf("the late chunk: %v, want it taken or refused as stale", answer)
	}
	if err := readBase(); err != nil {
		t.Fatalf("after a late chunk of base %d (answered %v), with rank %d's Base %d: its clear copy's holder: %v", every, answer, owner, j.c.progress(owner).Base, err)
	}
}

// TestECDiffBaseAgainKeepsBase: the same base 8 sent whole (kind 5: an
// owner that forgot where its refresh stood gets it so, after the
// chunk's refusal) to the holder that committed it, over a link that
// breaks midway, must not drop the verified base either. Before the fix
// the holder grafted it as a new refresh (BeginBase aborts the one
// waiting), which the broken link aborted in turn.
func TestECDiffBaseAgainKeepsBase(t *testing.T) {
	const every = 8
	j, owner, holder, readBase := verifiedBaseJob(t)
	hk := j.c.hosts[j.hostOf[holder]]
	o := hk.store.owner(owner)
	o.mu.Lock()
	tab := slices.Clone(o.sums[every])
	o.mu.Unlock()
	oh := j.c.hosts[j.hostOf[owner]]
	s := oh.svc(owner)
	s.mu.Lock()
	opt := *s.opt
	s.mu.Unlock()
	idx := slices.IndexFunc(tab, func(e tableEntry) bool { return e.name == opt.Region })
	total := tableBytes(tab)
	// The holder's side of the request (its header and table read, as
	// serve reads them), on a pipe that breaks after half the base's
	// bytes.
	hdr := linkHdr{kind: kindBase, owner: owner, holder: holder, step: every, gen: oh.Gen(), length: optDescSize + total}
	desc := appendOptDesc(nil, idx, &opt)
	c, peer := net.Pipe()
	defer c.Close()
	go func() {
		defer peer.Close()
		(&net.Buffers{desc, make([]byte, total/2)}).WriteTo(peer)
	}()
	if err := hk.store.base(c, hdr, tab); err == nil {
		t.Fatal("a base cut midway was taken")
	}
	if err := readBase(); err != nil {
		t.Fatalf("after base %d sent again whole and cut midway: its clear copy's holder: %v", every, err)
	}
}
