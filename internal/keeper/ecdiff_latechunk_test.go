package keeper

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"
)

// TestECDiffLateChunkKeepsBase: diff mode under 2+1, a base every 8
// steps, H held at 0. Once a rank's clear copy's holder committed its
// refresh of base 8 (verified, waiting for H: the rank counts base 8
// coded, so H may name it), a chunk of base 8 that begins a new refresh
// there (the frame of a round its owner cancelled, which the holder read
// after the owner's next round committed the refresh: a placement's
// restore does that) must not drop the verified base: a decode at H 8
// reads exactly it. Before the fix the holder began the new refresh over
// it (BeginBase aborts the refresh waiting) and answered "not held"
// (TestSharePacePlacements/at_the_base, 1 in about 40).
func TestECDiffLateChunkKeepsBase(t *testing.T) {
	const every = 8
	j := newECDiffRecJob(t, 2, 1, every, 2)
	owner, holder := -1, -1
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
	j.c.waitFor("H 0", func() bool {
		j.publish()
		_, hb := j.published()
		return hb >= 0
	})
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
	readBase := func() error {
		dst := make([]byte, 64)
		_, err := hk.shardRange(owner, holder, every, 0, dst)
		return err
	}
	if err := readBase(); err != nil {
		t.Fatalf("before the late chunk: rank %d's base %d on its clear copy's holder: %v", owner, every, err)
	}

	// The late chunk: the first bytes of the owner's first region, at
	// offset 0, as sendChunks frames them.
	st := hk.store
	st.mu.Lock()
	o := st.owners[owner]
	st.mu.Unlock()
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
