package keeper

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// TestECDiffRestartKeepsLogs: after an in-place restart from G (no
// host lost), H is still the old base until every rank codes the new
// anchor G. Recovery of a lost rank then decodes at the old H and replays
// (H, G]: those records must still be on M hosts other than the rank's.
func TestECDiffRestartKeepsLogs(t *testing.T) {
	const every = 3 // bases 0, 3, 6; G 7 with H 6
	var block atomic.Bool
	release := make(chan struct{})
	setECCommitHook(t, func(h linkHdr, e ecHdr) {
		if block.Load() && h.step >= 7 {
			<-release // the new anchor's rows stay incomplete: H stays 6
		}
	})
	dj := newECDiffJob(t, 2, 2, 1, every, nil)
	t.Cleanup(func() {
		if block.Swap(false) {
			close(release)
		}
	})
	stop := dj.stoppable(nil)
	for s := int64(0); s <= 7; s++ {
		dj.step(context.Background(), s)
	}
	dj.j.c.waitFor("G 7 and H 6", func() bool {
		dj.mu.Lock()
		defer dj.mu.Unlock()
		return dj.g == 7 && dj.hb == 6
	})
	stop()
	dj.mu.Lock()
	dj.checkRecoverable() // holds before the restart
	dj.mu.Unlock()

	block.Store(true)
	for _, h := range dj.j.c.hosts {
		if err := h.Restart(h.Gen()+1, 7); err != nil {
			t.Fatal(err)
		}
	}
	for i, old := range dj.rs {
		dr, err := newDiffRank(t, dj.j.c.hosts[dj.j.c.hostOf[old.r]], old.r, 7, old.states)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(dr.close)
		res, err := dr.restore(context.Background())
		if err != nil || res.Step != 7 {
			t.Fatalf("rank %d: restore: %+v, %v", dr.r, res, err)
		}
		dj.rs[i] = dr
	}
	// Every owner has contacted its log-only holders again (logBegin).
	dj.j.c.waitFor("every owner re-anchored its log-only holders", func() bool {
		for r := range dj.rs {
			s := dj.j.c.hosts[dj.j.c.hostOf[r]].svc(r)
			s.rep.mu.Lock()
			ts := s.h.place().logTargets(r)
			ok := true
			for _, k := range ts {
				if n, known := s.rep.dnext[k]; !known || n < 0 {
					ok = false
				}
			}
			s.rep.mu.Unlock()
			if !ok {
				return false
			}
		}
		return true
	})
	for i, h := range dj.j.c.hosts {
		if h.H() != 6 {
			t.Fatalf("host %d: H %d, want 6 (the new anchor is not coded)", i, h.H())
		}
	}
	// Every rank's records (6, 7] on M hosts other than its own.
	for r := range dj.rs {
		var on []int
		for h, host := range dj.j.c.hosts {
			if h != dj.j.c.hostOf[r] && recordsAt(host, r, 6, 7) {
				on = append(on, h)
			}
		}
		if len(on) < dj.j.m {
			t.Errorf("rank %d (host %d, clear copy's holder %v, log holders %v): its records (H 6, G 7] are on hosts %v only, want %d hosts", r, dj.j.c.hostOf[r], dj.j.holders[r], dj.logs[r], on, dj.j.m)
		}
	}
	dj.mu.Lock()
	defer dj.mu.Unlock()
	dj.g, dj.hb = 7, 6 // the launcher's G at the restart, and H
	dj.checkRecoverable()
}

// TestECDiffParityLagsH: a parity host that learns H late (here:
// never past the first base) must not evict the row of the H the launcher
// published. The owners send b_{k+1} once their own host knows H >= b_k;
// the parity host's victim rule uses its own, older H.
func TestECDiffParityLagsH(t *testing.T) {
	const every = 3
	dj := newECDiffJob(t, 2, 1, 2, every, nil)
	lag := dj.j.groups[0].Parity[0]
	dj.stoppable(func(i int, hb int64) int64 {
		if i == lag {
			return min(hb, 0)
		}
		return hb
	})
	for s := int64(0); s <= 7; s++ {
		dj.step(context.Background(), s)
		func() {
			dj.mu.Lock()
			defer dj.mu.Unlock()
			for k, r := range dj.j.c.hosts[lag].parity.all() {
				r.mu.Lock()
				t.Logf("after step %d (G %d, H %d; lagging host's H %d): row %+v bufs: step %d complete %v, step %d complete %v", s, dj.g, dj.hb, dj.j.c.hosts[lag].H(), k, r.bufs[0].step, r.bufs[0].complete(), r.bufs[1].step, r.bufs[1].complete())
				r.mu.Unlock()
			}
			dj.checkRecoverable()
		}()
	}
	// The rank on the lagging host cannot send base 6 (its gate waits for
	// H >= 3 there), so H stays 3; the others' shares of 6 reach the rows.
	dj.j.c.waitFor("H 3 and G 7", func() bool {
		dj.mu.Lock()
		defer dj.mu.Unlock()
		return dj.hb == 3 && dj.g >= 6
	})
	time.Sleep(200 * time.Millisecond) // let the other owners' shares of 6 arrive (not a sync: the check below must hold at any time)
	dj.mu.Lock()
	defer dj.mu.Unlock()
	dj.checkRecoverable()
}

// TestECDiffLogReanchoredAfterDamage: a log-only holder refuses one
// differential twice as damaged; the owner then forgets what it takes
// next and sends logBegin at max(acknowledged, H, floor), which truncates
// the holder's log through the step it acknowledged, above H, while the
// owner keeps counting its acknowledgements: G passes steps whose records
// (H, G] that holder no longer has.
func TestECDiffLogReanchoredAfterDamage(t *testing.T) {
	const every = 3
	var owner, holder atomic.Int64
	owner.Store(-1)
	var damaged atomic.Int32
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		if h.kind == kindDiff && int64(h.owner) == owner.Load() && int64(h.holder) == holder.Load() && h.step == 5 && len(bufs) > 1 && len(bufs[1]) > 0 && damaged.Add(1) <= 2 {
			d := slices.Clone(bufs[1])
			d[len(d)/2] ^= 0xff
			out := slices.Clone(bufs)
			out[1] = d
			return out
		}
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	dj := newECDiffJob(t, 2, 1, 2, every, nil)
	for r, ls := range dj.logs {
		if len(ls) > 0 {
			owner.Store(int64(r))
			holder.Store(int64(ls[0]))
			break
		}
	}
	stop := dj.stoppable(nil)
	defer stop()
	for s := int64(0); s <= 5; s++ {
		dj.step(context.Background(), s)
	}
	dj.j.c.waitFor("G 5", func() bool { dj.mu.Lock(); defer dj.mu.Unlock(); return dj.g >= 5 })
	stop()
	dj.mu.Lock()
	g, hb := dj.g, dj.hb
	dj.mu.Unlock()
	if damaged.Load() < 2 {
		t.Fatalf("the differential was damaged %d times", damaged.Load())
	}
	r := int(owner.Load())
	var on []int
	for h, host := range dj.j.c.hosts {
		if h != dj.j.c.hostOf[r] && recordsAt(host, r, hb, g) {
			on = append(on, h)
		}
	}
	if len(on) < dj.j.m {
		o := copyOf(dj.j.c.hosts[dj.j.c.hostOf[int(holder.Load())]], r)
		o.mu.Lock()
		f, l, ok := o.log.Range()
		o.mu.Unlock()
		t.Errorf("G %d, H %d: rank %d's records (H, G] are on hosts %v (want %d); its log holder rank %d holds steps %d..%d (%v)", g, hb, r, on, dj.j.m, holder.Load(), f, l, ok)
	}
}

// TestECDiffLogHolderRestartsLate: agents restart on their own
// (internal/agent/restart.go: no barrier between hosts). An owner whose
// host restarted first commits G+1 and its log-only holder, on a host
// that has not restarted yet, takes and acknowledges it; then that host
// restarts: restartLog truncates the log after G, dropping the new
// generation's step the owner counts as held (the clear copies' stores
// keep the steps of the new generation: restartDiff's sumGen).
func TestECDiffLogHolderRestartsLate(t *testing.T) {
	const every = 3
	dj := newECDiffJob(t, 2, 2, 1, every, nil)
	stop := dj.stoppable(nil)
	for s := int64(0); s <= 7; s++ {
		dj.step(context.Background(), s)
	}
	dj.j.c.waitFor("G 7 and H 6", func() bool { dj.mu.Lock(); defer dj.mu.Unlock(); return dj.g == 7 && dj.hb == 6 })
	stop()
	owner := -1
	for r, ls := range dj.logs {
		if len(dj.j.holders[r]) == 0 && len(ls) > 0 {
			owner = r
			break
		}
	}
	late := dj.j.c.hostOf[dj.logs[owner][0]]
	gen := dj.j.c.hosts[0].Gen() + 1
	restart := func(hs ...int) {
		for _, h := range hs {
			if err := dj.j.c.hosts[h].Restart(gen, 7); err != nil {
				t.Fatal(err)
			}
		}
		for r, old := range dj.rs {
			if !slices.Contains(hs, dj.j.c.hostOf[r]) {
				continue
			}
			dr, err := newDiffRank(t, dj.j.c.hosts[dj.j.c.hostOf[r]], r, 7, old.states)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(dr.close)
			if res, err := dr.restore(context.Background()); err != nil || res.Step != 7 {
				t.Fatalf("rank %d: restore: %+v, %v", r, res, err)
			}
			dj.rs[r] = dr
		}
	}
	var first []int
	for h := range dj.j.c.hosts {
		if h != late {
			first = append(first, h)
		}
	}
	restart(first...)
	if err := dj.rs[owner].step(context.Background(), 8); err != nil {
		t.Fatal(err)
	}
	holder := holderKey{rank: dj.logs[owner][0], host: late, log: true}
	s0 := dj.j.c.hosts[dj.j.c.hostOf[owner]].svc(owner)
	dj.j.c.waitFor("the late host's log holder acknowledged step 8", func() bool {
		s0.rep.mu.Lock()
		defer s0.rep.mu.Unlock()
		return s0.rep.acked[holder] >= 8
	})
	restart(late)
	o := copyOf(dj.j.c.hosts[late], owner)
	o.mu.Lock()
	f, l, ok := o.log.Range()
	o.mu.Unlock()
	s0.rep.mu.Lock()
	a := s0.rep.acked[holder]
	s0.rep.mu.Unlock()
	if !ok || l < a {
		t.Errorf("rank %d's log-only holder rank %d (host %d) holds steps %d..%d (%v); the owner counts it as holding %d", owner, holder.rank, late, f, l, ok, a)
	}
	// The job goes on: every rank steps 8 (the owner did) to 11.
	stop = dj.stoppable(nil)
	defer stop()
	for s := int64(8); s <= 11; s++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs := make([]error, len(dj.rs))
		var wg sync.WaitGroup
		for i, dr := range dj.rs {
			if s == 8 && i == owner {
				continue
			}
			wg.Go(func() { errs[i] = dr.step(ctx, s) })
		}
		wg.Wait()
		cancel()
		for i, err := range errs {
			if err != nil {
				dj.mu.Lock()
				g, hb := dj.g, dj.hb
				dj.mu.Unlock()
				t.Fatalf("rank %d step %d (G %d, H %d): %v", i, s, g, hb, err)
			}
		}
	}
}

// TestECDiffRowKeepsOwnersH is the rule of a parity row's victim in diff
// mode under EC: a new base's share never evicts the complete row of the
// newer of the parity host's H and the H the share's owner went by
// (ecHdr.h), else the older complete row goes.
func TestECDiffRowKeepsOwnersH(t *testing.T) {
	for _, c := range []struct {
		name          string
		local, sent   int64 // the parity host's H, the owner's
		wantKept      int64 // the complete row that stays
		wantEvictedOf int64 // the step of the buffer the new share takes
	}{
		{"no H anywhere: the older goes", -1, -1, 3, 0},
		{"the host knows H 3", 3, -1, 3, 0},
		{"the host lags at H 0, the owner knows 3", 0, 3, 3, 0},
		{"the host knows 3, the owner lags at 0", 3, 0, 3, 0},
		{"both at H 0: it stays", 0, 0, 0, 3},
		{"the host at 0, the owner sends no H", 0, -1, 0, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := newECJobWith(t, 2, 1, 2, false, diffMod(8, 3))
			hostOf := slices.Clone(j.c.hostOf)
			hostRanks := make([][]int, len(j.c.hosts))
			for r, h := range hostOf {
				hostRanks[h] = append(hostRanks[h], r)
			}
			h := j.c.hosts[j.groups[0].Parity[0]]
			p := Placement{Ranks: hostRanks[j.groups[0].Parity[0]], HostOf: hostOf, Holders: j.holders, EC: j.groups, Epoch: 1, G: noStep, Logs: topology.ECLogHolders(j.groups, hostOf, hostRanks), H: noStep}
			if err := h.SetPlacement(p); err != nil {
				t.Fatal(err)
			}
			if !h.place().ecDiff() {
				t.Fatal("not diff mode under EC")
			}
			h.raiseH(c.local)
			r := &parityRow{bufs: [2]parityBuf{{step: noStep}, {step: noStep}}}
			for i, step := range []int64{0, 3} {
				b := &r.bufs[i]
				b.empty(2)
				b.step, b.gen, b.epoch = step, h.Gen(), 1
				for x := range b.mem {
					b.mem[x] = memberShare{rank: x, in: true}
				}
			}
			b, why, msg := h.parity.bufFor(r, 6, h.Gen(), 1, 2, true, c.sent)
			if b == nil {
				t.Fatalf("refused (%d): %s", why, msg)
			}
			evicted := int64(3)
			if b == &r.bufs[0] {
				evicted = 0
			}
			kept := r.bufs[0].step
			if b == &r.bufs[0] {
				kept = r.bufs[1].step
			}
			if evicted != c.wantEvictedOf || kept != c.wantKept {
				t.Errorf("host H %d, owner's H %d: the share of 6 took the buffer of %d, the row of %d stays; want %d taken, %d kept", c.local, c.sent, evicted, kept, c.wantEvictedOf, c.wantKept)
			}
		})
	}
}

// TestECHdrH: the owner's H goes on the wire with a share (ecHdr.h), -1
// (none) included; a smaller value is refused.
func TestECHdrH(t *testing.T) {
	for _, hb := range []int64{-1, 0, 7, 1 << 40} {
		var b [ecHdrSize]byte
		in := ecHdr{group: 1, stripe: 2, row: 1, member: 3, crc: 7, off: 64, n: 4096, epoch: 5, hb: hb}
		in.put(b[:])
		out, err := parseECHdr(b[:])
		if err != nil || out != in {
			t.Errorf("h %d: parsed %+v, %v", hb, out, err)
		}
	}
	var b [ecHdrSize]byte
	(&ecHdr{n: 1, hb: -2}).put(b[:])
	if _, err := parseECHdr(b[:]); err == nil {
		t.Error("h -2 accepted")
	}
}

// TestECDiffSamePlacementRaisesH: a table republished with the same
// layout (same ranks, hosts, holders, logs) and a newer H raises the
// host's H; an older one does not lower it.
func TestECDiffSamePlacementRaisesH(t *testing.T) {
	j := newECJobWith(t, 2, 1, 2, false, diffMod(8, 3))
	hostOf := slices.Clone(j.c.hostOf)
	hostRanks := make([][]int, len(j.c.hosts))
	for r, h := range hostOf {
		hostRanks[h] = append(hostRanks[h], r)
	}
	logs := topology.ECLogHolders(j.groups, hostOf, hostRanks)
	h := j.c.hosts[0]
	set := func(hb int64) {
		t.Helper()
		p := Placement{Ranks: hostRanks[0], HostOf: hostOf, Holders: j.holders, EC: j.groups, Epoch: 1, G: noStep, Logs: logs, H: hb}
		if err := h.SetPlacement(p); err != nil {
			t.Fatal(err)
		}
	}
	set(noStep)
	seq := h.place().seq
	for _, c := range []struct{ set, want int64 }{{3, 3}, {6, 6}, {3, 6}} {
		set(c.set)
		if got := h.H(); got != c.want {
			t.Errorf("the same layout republished with H %d: the host's H is %d, want %d", c.set, got, c.want)
		}
	}
	if h.place().seq != seq {
		t.Errorf("the same layout made a new placement (%d, was %d)", h.place().seq, seq)
	}
}
