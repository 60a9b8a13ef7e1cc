package keeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// holderOf returns host h's replica of owner (nil if none).
func holderOf(h *Keeper, owner int) *ownerReplica {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	return h.store.owners[owner]
}

// storeBytes returns the bytes host h's replicas have reserved.
func storeBytes(h *Keeper) uint64 {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	return h.store.bytes
}

// stepAll runs step s on every rank of rs side by side.
func stepAll(t *testing.T, ctx context.Context, rs []*diffRank, s int64) {
	t.Helper()
	var wg sync.WaitGroup
	for _, dr := range rs {
		wg.Go(func() {
			if err := dr.step(ctx, s); err != nil && ctx.Err() == nil {
				t.Errorf("rank %d: %v", dr.r, err)
			}
		})
	}
	wg.Wait()
}

// TestDiffLogBoundedDuringRefresh: the review's run (--diff-fold 4
// --base-every 40), the ranks stepping in lockstep: while a base refresh
// is in flight, the holder's log of the owner stays within Fold+1
// differentials with the lossless codec (its folds pass the refresh: the
// log held 19 when they stopped at it), and within 2×Fold+1 with a lossy
// one (its folds stop at the refresh, which is paced over Fold steps).
// Once every holder has the refresh, the owner lets go of its snapshot.
func TestDiffLogBoundedDuringRefresh(t *testing.T) {
	const fold, every, steps = 4, 40, 100
	for _, tt := range []struct {
		name  string
		codec replay.Options
		bound int
	}{
		{"lossless", replay.Options{}, fold + 1},
		{"int8", replay.Options{Threshold: math.MaxInt}, 2*fold + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			peers := func(int) []int { return []int{0, 1} }
			c := newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, func(cfg *Config) {
				diffMod(fold, every)(cfg)
				cfg.Diff.Codec = tt.codec
			})
			rs := startDiffRanks(t, c, 2, 21)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			longest, inFlight := 0, 0
			for s := int64(0); s <= steps && !t.Failed(); s++ {
				stepAll(t, ctx, rs, s)
				c.waitFor(fmt.Sprintf("G = %d", s), func() bool { return t.Failed() || c.publishG() >= s })
				o := holderOf(c.hosts[1], 0)
				// The fold runs on the holder's fold goroutine: give it
				// the time it needs (a log that does not shrink fails).
				var n int
				var refresh bool
				c.waitFor(fmt.Sprintf("rank 0's log at its holder within %d differentials after step %d", tt.bound, s), func() bool {
					o.mu.Lock()
					n, refresh = o.cur.Stats().LogLen, o.bw != nil
					o.mu.Unlock()
					return n <= tt.bound
				})
				longest = max(longest, n)
				if refresh {
					inFlight++
				}
			}
			if inFlight < fold/2 {
				t.Errorf("a refresh was in flight at %d steps: the run did not test the bound", inFlight)
			}
			o := holderOf(c.hosts[1], 0)
			o.mu.Lock()
			st := o.cur.Stats()
			o.mu.Unlock()
			t.Logf("longest log %d (bound %d), a refresh in flight at %d of %d steps; holder's store %+v", longest, tt.bound, inFlight, steps+1, st)
			if st.Refreshes+st.RefreshesSuperseded < 2 {
				t.Errorf("no refresh reached the holder: %+v", st)
			}
			// A lossy log's drift is measured at the refreshes (what -v
			// prints); a lossless one never drifts.
			d, drifted := c.hosts[1].FoldStats().Drifts[0]
			switch lossy := tt.codec != (replay.Options{}); {
			case !lossy && drifted:
				t.Errorf("a lossless log reported a drift: %+v", d)
			case lossy && (!drifted || d.Step < every || d.Steps < 1 || !(d.MaxAbs > 0) || !(d.RelRMS > 0)):
				t.Errorf("rank 0's drift at its holder: %+v (measured: %v), want one at a refresh", d, drifted)
			}
			r := &c.hosts[0].svc(0).rep
			c.waitFor("the owner to let go of its refresh snapshot", func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return r.ref == nil
			})
		})
	}
}

// TestDiffOversizedRefusedUnread: a differential frame whose sizes are not
// those of its owner's store at the holder (an other region larger than
// the owner's, a record longer than the codec makes of N elements, a
// region the owner does not have) is refused before any of its data is
// read or allocated: the holder closes the link at once (a holder that
// allocated would wait for the data, which never comes), reserves
// nothing, and goes on taking the owner's real differentials.
func TestDiffOversizedRefusedUnread(t *testing.T) {
	c, _ := twoHostDiff(t, 4, 100)
	rs := startDiffRanks(t, c, 2, 22)
	runSteps(t, c, rs, 0, 5)
	table := func(f func(t []tableEntry)) []tableEntry {
		t := make([]tableEntry, len(diffRegions))
		for i, r := range diffRegions {
			t[i] = tableEntry{name: r.Name, size: r.Size}
		}
		f(t)
		return t
	}
	rawRecord := maxRecordLen(diffN, replay.Options{Lossless: true})
	for _, tt := range []struct {
		name   string
		t      []tableEntry
		recLen uint64
	}{
		{"other region of 1 GiB", table(func(t []tableEntry) { t[1].size = 1 << 30 }), 4 * diffN},
		{"record longer than raw makes", table(func([]tableEntry) {}), rawRecord + 1},
		{"region the owner lacks", table(func(t []tableEntry) { t[2].name = "extra" }), 4 * diffN},
	} {
		t.Run(tt.name, func(t *testing.T) {
			others := tableBytes(tt.t) - uint64(tt.t[0].size)
			h := linkHdr{kind: kindDiff, owner: 0, holder: 1, step: 6, gen: c.hosts[0].Gen()}
			od := &ownerDiff{opt: 0, d: diffstore.Diff{Step: 6, Hyper: diffHyper(6)}}
			b := frameHead(h, tt.t, diffDescSize+tt.recLen+others, nil)
			at := len(b)
			b = appendDiffDesc(b, od)
			binary.BigEndian.PutUint64(b[at+16:], tt.recLen)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Only the header, table and descriptor: the data never comes.
			err := c.hosts[0].links.call(ctx, 1, h, net.Buffers{b})
			if ctx.Err() != nil {
				t.Fatalf("the holder waited for the data of a differential it cannot hold: %v", err)
			}
			var le *linkError
			if !errors.As(err, &le) {
				t.Fatalf("call: %v, want the link closed by the holder", err)
			}
			// A fold of the steps before may still move rank 0's bytes
			// (its spares) while the call runs: once settled, host 1
			// reserves exactly what rank 0's stores hold, nothing for the
			// refused differential.
			o := holderOf(c.hosts[1], 0)
			c.waitFor("host 1 reserving rank 0's bytes, nothing for the refused differential", func() bool {
				o.mu.Lock()
				held, mem := o.held, o.diffMem()
				o.mu.Unlock()
				return storeBytes(c.hosts[1]) == held && held == mem
			})
		})
	}
	runSteps(t, c, rs, 6, 10)
	checkTier2(t, c.hosts[0], c.hosts[1], 1, rs[0], c.publishG())
}

// TestDiffReserveAccounting: a holder's reservation is what its stores
// hold; a differential that would take the replicas past half the host's
// memory is refused before it is read (the owner retries), and leaves the
// reservation as it was; once memory frees up it is taken; and dropping
// the stores brings the reservation back to zero.
func TestDiffReserveAccounting(t *testing.T) {
	c, _ := twoHostDiff(t, 4, 100)
	rs := startDiffRanks(t, c, 2, 23)
	runSteps(t, c, rs, 0, 10)
	h1 := c.hosts[1]
	o := holderOf(h1, 0)
	// A record or answer still in flight when the steps return holds its
	// reservation a moment longer: wait until the count settles.
	var before uint64
	c.waitFor("host 1 reserving exactly rank 0's replica", func() bool {
		o.mu.Lock()
		held, mem := o.held, o.diffMem()
		o.mu.Unlock()
		before = storeBytes(h1)
		return before == held && held == mem && held != 0
	})

	// The replicas of other owners fill the host's half but for a few
	// bytes: rank 0's next differential does not fit.
	limit := physicalMemory() / 2
	if limit == 0 {
		t.Skip("the host's memory is unknown: no limit to reach")
	}
	pad := limit - before - 100
	h1.store.mu.Lock()
	h1.store.bytes += pad
	h1.store.mu.Unlock()
	rep := &c.hosts[0].svc(0).rep
	fails := rep.fails.Load()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stepAll(t, ctx, rs, 11)
	c.waitFor("rank 0's differential of step 11 refused", func() bool { return rep.fails.Load() > fails })
	// The refused record's reservation is released after the refusal is
	// answered, and a fold of the steps before may still move rank 0's
	// bytes (its spares): once settled, host 1 reserves exactly what rank
	// 0's stores hold, and the pad.
	c.waitFor("host 1 reserving rank 0's bytes and the pad, nothing for the refused differential", func() bool {
		o.mu.Lock()
		held, mem := o.held, o.diffMem()
		o.mu.Unlock()
		return storeBytes(h1) == held+pad && held == mem
	})
	if _, last, _ := o.cur.Range(); last >= 11 {
		t.Errorf("the holder holds step %d of a differential it refused", last)
	}
	h1.store.mu.Lock()
	h1.store.bytes -= pad
	h1.store.mu.Unlock()
	c.waitFor("G = 11", func() bool { return c.publishG() >= 11 })
	checkTier2(t, c.hosts[0], h1, 1, rs[0], 11)

	o.mu.Lock()
	h1.store.dropDiff(o)
	o.mu.Unlock()
	// checkTier2's get may return before the holder's handler has
	// given back the answer's reserve (its deferred release runs once
	// the answer is written, which the reader may have read by then).
	c.waitFor("host 1 reserving nothing with no store left", func() bool { return storeBytes(h1) == 0 })
}
