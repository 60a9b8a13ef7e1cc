package keeper

// Tests of the pacing of a diff-mode base's parity shares (sharePace):
// the shares of one base go over the refresh's window within the budget
// of each step, and a base superseded, a restart or a host lost while
// they go breaks none of the invariants.

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// paceEvery is the base period of the pacing tests: σ = min(8/2, 8) = 4.
const paceEvery = 8

// paceRead is a block of a shard the encoder began to read, and the
// rank's newest committed step then.
type paceRead struct {
	off       int64
	committed int64
}

// pacedJob is an ecDiffRecJob under 2+1 with two spares whose shards are
// cut into chunks of 1 KiB, run until base paceEvery is committed and its
// shares wait at the pacing (or, unpaced, went), with every block the
// encoders read since recorded by rank.
type pacedJob struct {
	*ecDiffRecJob
	mu    sync.Mutex
	reads map[int][]paceRead
	// clear are the bytes of base paceEvery's refresh each rank wrote
	// to its clear copy's holder (chunks, or the base whole), each with
	// the rank's newest committed step then, in the order written.
	clear map[int][]paceRead
}

func newPacedJob(t *testing.T) *pacedJob {
	t.Helper()
	chunk, idle := ecChunkSize, paceIdleMin
	ecChunkSize = 1 << 10
	paceIdleMin = time.Hour // only commits count: the budgets are exact
	t.Cleanup(func() { ecChunkSize, paceIdleMin = chunk, idle })
	pj := &pacedJob{reads: map[int][]paceRead{}, clear: map[int][]paceRead{}}
	armed := false
	testHookECBlock = func(s *service, off int64, read bool) {
		if read {
			return
		}
		s.mu.Lock()
		c := s.committed
		s.mu.Unlock()
		pj.mu.Lock()
		if armed {
			pj.reads[s.rank] = append(pj.reads[s.rank], paceRead{off: off, committed: c})
		}
		pj.mu.Unlock()
	}
	t.Cleanup(func() { testHookECBlock = nil })
	testHookLinkFrame = func(h linkHdr, bufs net.Buffers) net.Buffers {
		var n int64
		switch {
		case h.step != paceEvery:
		case h.kind == kindBaseChunk && len(bufs) > 1:
			n = int64(len(bufs[1]))
		case h.kind == kindBase:
			for _, b := range bufs[1:] {
				n += int64(len(b))
			}
		}
		if n == 0 {
			return bufs
		}
		pj.mu.Lock()
		on := armed
		pj.mu.Unlock()
		if !on {
			return bufs
		}
		s := pj.c.hosts[pj.hostOf[h.owner]].svc(h.owner)
		s.mu.Lock()
		c := s.committed
		s.mu.Unlock()
		pj.mu.Lock()
		pj.clear[h.owner] = append(pj.clear[h.owner], paceRead{off: n, committed: c})
		pj.mu.Unlock()
		return bufs
	}
	t.Cleanup(func() { testHookLinkFrame = nil })
	pj.ecDiffRecJob = newECDiffRecJob(t, 2, 1, paceEvery, 2)
	pj.run(0, paceEvery-1)
	// Base 0 coded everywhere and H 0 known: the gate of base 8 is open.
	pj.waitH(0)
	pj.mu.Lock()
	armed = true
	pj.mu.Unlock()
	pj.stepAll(paceEvery)
	pj.quiet(paceEvery)
	return pj
}

// stepAll runs step s on every rank side by side, publishing G and H
// meanwhile.
func (pj *pacedJob) stepAll(s int64) {
	pj.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				pj.publish()
			}
		}
	})
	errs := make([]error, len(pj.rs))
	var steps sync.WaitGroup
	for i, dr := range pj.rs {
		steps.Go(func() { errs[i] = dr.step(ctx, s) })
	}
	steps.Wait()
	close(done)
	wg.Wait()
	pj.publish()
	for i, err := range errs {
		if err != nil {
			pj.t.Fatalf("rank %d step %d: %v", i, s, err)
		}
	}
}

// rep returns rank r's replicator.
func (pj *pacedJob) rep(r int) *replicator {
	return &pj.c.hosts[pj.hostOf[r]].svc(r).rep
}

// quiet waits until every rank's shares of base paceEvery either wait
// at the pacing or are all in (coded): the rank committed c, the newest.
func (pj *pacedJob) quiet(c int64) {
	pj.t.Helper()
	pj.c.waitFor(fmt.Sprintf("every rank's shares of base %d wait at the pacing or are in, at step %d", paceEvery, c), func() bool {
		for r := range pj.hostOf {
			x := pj.rep(r)
			x.mu.Lock()
			in := x.ecb.base() >= paceEvery || x.ref != nil && x.ref.step == paceEvery && x.ref.rows
			// Waits for a chunk past what step c allows: the encoder
			// read what c allowed, and no more.
			waits := x.ecb.shares != nil && x.ecb.shares.pace != nil && x.ecb.shares.pace.waiting() > pj.allowed(r, c)
			x.mu.Unlock()
			if !in && !waits {
				return false
			}
		}
		return true
	})
}

// budget is the shard bytes rank r's base is allowed per step: its
// replicated regions over σ, rounded up (refresh.budget).
func (pj *pacedJob) budget(r int) int64 {
	s := pj.c.hosts[pj.hostOf[r]].svc(r)
	s.mu.Lock()
	var total int64
	for _, i := range s.repl {
		total += int64(s.regions[i].Size)
	}
	s.mu.Unlock()
	sigma := s.h.cfg.Diff.refreshSteps()
	return (total + sigma - 1) / sigma
}

// allowed is the shard's bytes of rank r's base paceEvery that may be
// encoded once step c is committed, if not all.
func (pj *pacedJob) allowed(r int, c int64) int64 {
	return pj.budget(r) * (c - paceEvery + 1)
}

// checkBudget fails the test if an encoder began a block of base
// paceEvery's shard past what the pacing allows at the step the rank had
// committed then, and returns the steps at which blocks were read.
func (pj *pacedJob) checkBudget() map[int64]bool {
	pj.t.Helper()
	sigma := int64(paceEvery / 2)
	at := map[int64]bool{}
	pj.mu.Lock()
	defer pj.mu.Unlock()
	for r, reads := range pj.reads {
		budget := pj.budget(r)
		for _, rd := range reads {
			at[rd.committed] = true
			i := rd.committed - paceEvery + 1
			if i < sigma && rd.off >= budget*i {
				pj.t.Errorf("rank %d read its shard at %d for base %d's shares with step %d committed: past what %d steps of %d bytes allow (%d)", r, rd.off, paceEvery, rd.committed, i, budget, budget*i)
				break
			}
		}
	}
	return at
}

// checkClear fails the test if a rank wrote more of base paceEvery's
// refresh to its clear copy's holder than the pacing allows at the step
// it had committed then (the shares' budget: (i+1)·budget by step
// paceEvery+i), and returns the bytes each rank wrote.
func (pj *pacedJob) checkClear() map[int]int64 {
	pj.t.Helper()
	sigma := int64(paceEvery / 2)
	sent := map[int]int64{}
	pj.mu.Lock()
	defer pj.mu.Unlock()
	for r, ws := range pj.clear {
		budget := pj.budget(r)
		for _, w := range ws {
			sent[r] += w.off
			i := w.committed - paceEvery + 1
			if i < sigma && sent[r] > budget*i {
				pj.t.Errorf("rank %d wrote %d bytes of base %d's refresh to its clear copy with step %d committed: past what %d steps of %d bytes allow (%d)", r, sent[r], paceEvery, w.committed, i, budget, budget*i)
				break
			}
		}
	}
	return sent
}

// shardBytes returns rank r's replicated bytes (a base refresh's).
func (pj *pacedJob) shardBytes(r int) int64 {
	s := pj.c.hosts[pj.hostOf[r]].svc(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	var total int64
	for _, i := range s.repl {
		total += int64(s.regions[i].Size)
	}
	return total
}

// clearRanks returns the ranks that have a clear copy's holder (not on
// their own data host).
func (pj *pacedJob) clearRanks() []int {
	var rs []int
	for r := range pj.hostOf {
		if len(pj.c.hosts[pj.hostOf[r]].place().targets(r)) > 0 {
			rs = append(rs, r)
		}
	}
	return rs
}

// sharesIn returns the hosts whose parity rows hold a member's share of
// step committed (ecCommit), for any member.
func (pj *pacedJob) sharesIn(step int64) []int {
	var hosts []int
	for h, x := range pj.c.hosts[:pj.work] {
		for _, row := range x.parity.all() {
			row.mu.Lock()
			for i := range row.bufs {
				if b := &row.bufs[i]; b.step == step {
					for _, m := range b.mem {
						if m.in {
							hosts = append(hosts, h)
						}
					}
				}
			}
			row.mu.Unlock()
		}
	}
	return hosts
}

// TestECDiffSharesPaced: diff mode under 2+1, a base every 8 steps (σ
// 4), the ranks held after each step until their base's shares wait at
// the pacing. The shares of base 8 are read over steps 8 to 11, never
// past (i+1)·budget at step 8+i, and are in by step 11; a host lost
// while they go, a restart from 9 and one at 8 leave every rank
// recoverable bitwise from every set of lost hosts, and no row holds a
// share of a base given up (placements: ecpace_place_test.go). Before
// the pacing the encoders read the whole shard at step 8.
func TestECDiffSharesPaced(t *testing.T) {
	const b = paceEvery
	const sigma = paceEvery / 2
	for _, tc := range []struct {
		name string
		then func(t *testing.T, pj *pacedJob)
	}{
		{name: "spread over the window", then: func(t *testing.T, pj *pacedJob) {
			for c := int64(b + 1); c < b+sigma; c++ {
				pj.stepAll(c)
				pj.quiet(c)
			}
			at := pj.checkBudget()
			pj.checkClear()
			for c := int64(b); c < b+sigma; c++ {
				if !at[c] {
					t.Errorf("no block of base %d's shard read at step %d: want the shares spread over steps %d..%d (read at %v)", b, c, b, b+sigma-1, at)
				}
			}
			pj.c.waitFor(fmt.Sprintf("base %d coded by every rank", b), func() bool {
				for r := range pj.hostOf {
					if pj.c.progress(r).Base < b {
						return false
					}
				}
				return true
			})
			// Base b is coded: every clear copy holds it, sent once.
			sent := pj.checkClear()
			if len(pj.clearRanks()) == 0 {
				t.Fatal("no rank has a clear copy's holder")
			}
			for _, r := range pj.clearRanks() {
				if sent[r] != pj.shardBytes(r) {
					t.Errorf("rank %d wrote %d bytes of base %d's refresh to its clear copy, want its %d once", r, sent[r], b, pj.shardBytes(r))
				}
			}
			pj.run(b+sigma, 2*b+1)
			g, hb := pj.published()
			if hb < b {
				t.Fatalf("G %d, H %d: want H %d or later", g, hb, b)
			}
			pj.everySubset(g, hb)
		}},
		{name: "host lost mid-refresh", then: func(t *testing.T, pj *pacedJob) {
			pj.stepAll(b + 1)
			pj.quiet(b + 1)
			pj.waitG(b + 1)
			if at := pj.checkBudget(); !at[b] {
				t.Fatalf("no block read at step %d", b)
			}
			pj.checkClear()
			g, hb := pj.published()
			if hb != 0 {
				t.Fatalf("G %d, H %d: want H 0 while base %d's shares go", g, hb, b)
			}
			pj.everySubset(g, hb)
			if hs := pj.sharesIn(b); len(hs) > 0 {
				t.Fatalf("shares of base %d in on hosts %v before the window's end", b, hs)
			}
		}},
		{name: "restart mid-refresh", then: func(t *testing.T, pj *pacedJob) {
			pj.restartAt(b + 1)
		}},
		{name: "restart at the base: a new base 8 supersedes", then: func(t *testing.T, pj *pacedJob) {
			pj.restartAt(b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pj := newPacedJob(t)
			if at := pj.checkBudget(); !at[b] {
				t.Fatalf("no block of base %d's shard read at step %d (read at %v)", b, b, at)
			}
			pj.checkClear()
			pj.mu.Lock()
			for r := range pj.hostOf {
				if n := len(pj.reads[r]); n == 0 {
					t.Errorf("rank %d read nothing of base %d's shard", r, b)
				}
			}
			pj.mu.Unlock()
			tc.then(t, pj)
		})
	}
}

// restartAt restarts every host from g (b or b+1) while base b's shares
// wait at the pacing (G is past g), and every rank resumes from g in the
// new generation; then the job runs on. The paced send ends, its
// snapshot is let go, no row ever holds a share of base b of the old
// generation, and every rank is recoverable bitwise from every set of
// lost hosts at the new schedule's H (based at g: a restart at b codes b
// again, in the new generation).
func (pj *pacedJob) restartAt(g int64) {
	t := pj.t
	t.Helper()
	const b = paceEvery
	if g > b {
		pj.stepAll(g)
		pj.quiet(g)
	}
	pj.waitG(g)
	olds, runs := pj.pacedRuns(b)
	gen := pj.c.hosts[0].Gen() + 1
	for h := range pj.c.hosts {
		if err := pj.c.hosts[h].Restart(gen, g); err != nil {
			t.Fatal(err)
		}
	}
	pj.restoreAll(g)
	for r, sr := range runs {
		select {
		case <-sr.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("rank %d: base %d's paced share send goes on after the restart", r, b)
		}
	}
	pj.run(g+1, g+2*b+1)
	for r, ref := range olds {
		if n := ref.rb.refs.Load(); n != 0 {
			t.Errorf("rank %d: base %d's snapshot of the old generation keeps %d references", r, b, n)
		}
	}
	pg, hb := pj.published()
	if hb < g || (hb-g)%b != 0 {
		t.Fatalf("G %d, H %d: want H a base of the restart's schedule (%d + %d·n)", pg, hb, g, b)
	}
	for h, x := range pj.c.hosts[:pj.work] {
		for k, row := range x.parity.all() {
			row.mu.Lock()
			for i := range row.bufs {
				if bf := &row.bufs[i]; bf.step == b && bf.gen < gen {
					for _, m := range bf.mem {
						if m.in {
							t.Errorf("host %d row %+v: rank %d's share of base %d of generation %d is in", h, k, m.rank, b, bf.gen)
						}
					}
				}
			}
			row.mu.Unlock()
		}
	}
	pj.everySubset(pg, hb)
}

// TestSharePaceAllowed: what a base's pacing allows of a shard of 1000
// bytes paced over 4 steps (budget 250) from base 8: a budget per step
// committed from the base on, everything from step 11, each pause in the
// commits of twice the last step's time (at least paceIdleMin) one step
// more, and everything once lifted.
func TestSharePaceAllowed(t *testing.T) {
	t0 := time.Unix(1000, 0)
	step := 100 * time.Millisecond
	for _, tc := range []struct {
		name      string
		committed int64
		period    time.Duration
		after     time.Duration // since the last commit
		lifted    bool
		want      int64
	}{
		{name: "the base", committed: 8, period: step, want: 250},
		{name: "two steps on", committed: 10, period: step, want: 750},
		{name: "the window's last step", committed: 11, period: step, want: 1000},
		{name: "past it", committed: 30, period: step, want: 1000},
		{name: "a step's time paused", committed: 8, period: step, after: step, want: 250},
		{name: "twice a step's time paused", committed: 8, period: step, after: 2 * step, want: 500},
		{name: "five times", committed: 9, period: step, after: 5 * step, want: 1000},
		{name: "no step time known: paceIdleMin", committed: 8, after: paceIdleMin, want: 500},
		{name: "lifted", committed: 8, period: step, lifted: true, want: 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &sharePace{base: 8, budget: 250, total: 1000, steps: 4, committed: tc.committed, at: t0, period: tc.period, wake: make(chan struct{})}
			if tc.lifted {
				p.lift()
			}
			p.mu.Lock()
			got, next := p.allowedLocked(t0.Add(tc.after))
			p.mu.Unlock()
			if got != tc.want {
				t.Errorf("allowed %d bytes, want %d", got, tc.want)
			}
			if (next == 0) != (tc.want == p.total) {
				t.Errorf("next step in %v with %d of %d bytes allowed", next, got, p.total)
			}
		})
	}
}

// TestSharePaceWait: a wait for bytes past the allowance ends when a
// commit allows them, when the pacing is lifted, or with its context.
func TestSharePaceWait(t *testing.T) {
	idle := paceIdleMin
	paceIdleMin = time.Hour
	t.Cleanup(func() { paceIdleMin = idle })
	for _, tc := range []struct {
		name string
		then func(p *sharePace, cancel context.CancelFunc)
		err  bool
	}{
		{name: "a commit", then: func(p *sharePace, _ context.CancelFunc) { p.commit(9, time.Now(), time.Second) }},
		{name: "lifted", then: func(p *sharePace, _ context.CancelFunc) { p.lift() }},
		{name: "cancelled", then: func(_ *sharePace, cancel context.CancelFunc) { cancel() }, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &sharePace{base: 8, budget: 250, total: 1000, steps: 4, committed: 8, at: time.Now(), wake: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- p.wait(ctx, 500) }()
			for p.waiting() != 500 {
				select {
				case err := <-done:
					t.Fatalf("wait for 500 of 250 bytes allowed ended: %v", err)
				case <-time.After(time.Millisecond):
				}
			}
			tc.then(p, cancel)
			select {
			case err := <-done:
				if (err != nil) != tc.err {
					t.Fatalf("wait: %v, want an error: %v", err, tc.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the wait goes on")
			}
			if w := p.waiting(); w != 0 {
				t.Errorf("waiting %d after the wait ended", w)
			}
		})
	}
}
