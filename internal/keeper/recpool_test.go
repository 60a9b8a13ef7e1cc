package keeper

import (
	"testing"
)

// TestRecPool: the pool keeps at most max buffers, gives one only for a
// record of its length (dropping those of another length on the way),
// and counts the bytes it holds.
func TestRecPool(t *testing.T) {
	for _, tc := range []struct {
		name      string
		max       int
		put       []int // lengths put, in order
		get       uint64
		wantGot   bool
		wantBytes uint64 // after the get
		wantLen   int
	}{
		{"empty", 3, nil, 8, false, 0, 0},
		{"same length", 3, []int{8, 8}, 8, true, 8, 1},
		{"bounded", 2, []int{8, 8, 8}, 8, true, 8, 1},
		{"another length dropped", 3, []int{8, 16}, 8, true, 0, 0},
		{"none of that length", 3, []int{16, 16}, 8, false, 0, 0},
		{"empty buffer not kept", 3, []int{0}, 0, false, 0, 0},
		{"max 0 keeps none", 0, []int{8}, 8, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := recPool{max: tc.max}
			for _, n := range tc.put {
				p.put(make([]byte, n))
			}
			b := p.get(tc.get)
			if got := b != nil; got != tc.wantGot || (got && uint64(len(b)) != tc.get) {
				t.Fatalf("get(%d) = %d bytes (nil: %v), want a buffer: %v", tc.get, len(b), b == nil, tc.wantGot)
			}
			if p.size() != tc.wantBytes || len(p.bufs) != tc.wantLen {
				t.Fatalf("after get: %d bytes in %d buffers, want %d in %d", p.size(), len(p.bufs), tc.wantBytes, tc.wantLen)
			}
		})
	}
	p := recPool{max: 4}
	p.put(make([]byte, 8))
	p.put(make([]byte, 24))
	if b := p.any(); len(b) != 24 || p.size() != 8 {
		t.Fatalf("any() = %d bytes, %d left; want 24, 8", len(b), p.size())
	}
	p.clear()
	if p.size() != 0 || p.any() != nil {
		t.Fatal("clear left buffers")
	}
}

// TestDiffHolderRecyclesRecords: on a holder whose folds run, the records
// they drop come back to the owner's pool (counted in its reservation),
// and the steps after keep restoring the owner's state bit for bit while
// their records are read into those buffers.
func TestDiffHolderRecyclesRecords(t *testing.T) {
	c, _ := twoHostDiff(t, 4, 100)
	rs := startDiffRanks(t, c, 2, 31)
	runSteps(t, c, rs, 0, 12)
	h1 := c.hosts[1]
	o := holderOf(h1, 0)
	c.waitFor("a fold of rank 0's log on host 1", func() bool { return o.recs.size() > 0 })
	runSteps(t, c, rs, 13, 30)
	checkTier2(t, c.hosts[0], h1, 1, rs[0], c.publishG())
	o.mu.Lock()
	held, mem, pooled := o.held, o.diffMem(), o.recs.size()
	o.mu.Unlock()
	if pooled == 0 || pooled > uint64(o.recs.max)*uint64(len(rs[0].w)*4+4096) {
		t.Errorf("rank 0's record pool on host 1 holds %d bytes", pooled)
	}
	if held != mem {
		t.Errorf("host 1 reserved %d bytes for rank 0, its stores and pool hold %d", held, mem)
	}
}

// TestDiffDroppedOwnerFoldEnds: a fold of an owner's store that ends
// after the placement dropped the owner (sweep: dropped, its stores
// gone, its reservation given back) reserves nothing for it, and its
// records do not go back to the dropped owner's pool. (The fold's
// account reserved the pool's buffers for an owner no longer kept:
// reserved memory no owner held, never given back.)
func TestDiffDroppedOwnerFoldEnds(t *testing.T) {
	c, _ := twoHostDiff(t, 1000, 1000) // no background folds, no refreshes
	rs := startDiffRanks(t, c, 2, 31)
	runSteps(t, c, rs, 0, 10)
	h1 := c.hosts[1]
	o := holderOf(h1, 0)
	// The fold goroutine takes the store ...
	o.mu.Lock()
	ds := o.cur
	_, last, ok := ds.Range()
	o.mu.Unlock()
	if !ok {
		t.Fatal("rank 0's holder has no range")
	}
	// ... the placement drops the owner meanwhile (as sweep does) ...
	o.mu.Lock()
	o.dropped = true
	h1.store.dropDiff(o)
	o.mu.Unlock()
	h1.store.mu.Lock()
	delete(h1.store.owners, 0)
	h1.store.mu.Unlock()
	// ... and the fold ends, accounted as foldLoop does.
	if err := ds.Fold(last, foldReplay); err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	h1.store.account(o)
	o.mu.Unlock()
	var held uint64
	h1.store.mu.Lock()
	for _, x := range h1.store.owners {
		held += x.held
	}
	reserved := h1.store.bytes
	h1.store.mu.Unlock()
	if reserved != held || o.recs.size() != 0 {
		t.Fatalf("host 1 reserves %d bytes, its owners hold %d; the dropped owner's pool keeps %d", reserved, held, o.recs.size())
	}
}
