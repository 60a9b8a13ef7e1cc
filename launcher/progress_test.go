package launcher

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/wire"
)

func TestProgressG(t *testing.T) {
	// Ranks 0,1 on host 0; 2,3 on host 1.
	var published []int64
	p := newProgress([][]int{{0, 1}, {2, 3}}, []int{0, 0, 1, 1}, func(g *wire.GlobalStep) { published = append(published, g.G) })
	rp := func(r int, c, rep int64) wire.RankProgress {
		return wire.RankProgress{Rank: r, Committed: c, Replicated: rep}
	}
	steps := []struct {
		u    wire.UpProgress
		err  bool
		want int64
	}{
		{wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 3, 3), rp(1, 3, 2)}}, false, -1}, // host 1 not in yet
		{wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{rp(2, 4, 4), rp(3, 4, 4)}}, false, 2},
		{wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(1, 4, 4)}}, false, 3},         // partial report
		{wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{rp(0, 9, 9)}}, true, 3},          // not its rank
		{wire.UpProgress{Host: 2, Ranks: nil}, true, 3},                                       // no such host
		{wire.UpProgress{Host: 0, Gen: 1, Ranks: []wire.RankProgress{rp(0, 9, 9)}}, false, 3}, // another generation
		{wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 5, 5), rp(1, 5, 5)}}, false, 4},
	}
	for i, s := range steps {
		err := p.handle(&s.u)
		if (err != nil) != s.err {
			t.Fatalf("step %d: err %v, want error %v", i, err, s.err)
		}
		if g := p.G(); g != s.want {
			t.Fatalf("step %d: G = %d, want %d", i, g, s.want)
		}
	}
	if len(published) != 3 || published[0] != 2 || published[1] != 3 || published[2] != 4 {
		t.Fatalf("published %v, want [2 3 4]", published)
	}
	// A restart keeps G; reports of the new generation start from it.
	if g := p.restart(1); g != 4 {
		t.Fatalf("restart returned %d", g)
	}
	if err := p.handle(&wire.UpProgress{Host: 0, Gen: 0, Ranks: []wire.RankProgress{rp(0, 9, 9), rp(1, 9, 9)}}); err != nil || p.G() != 4 {
		t.Fatalf("an old generation's report moved G to %d (%v)", p.G(), err)
	}
	p.handle(&wire.UpProgress{Host: 0, Gen: 1, Ranks: []wire.RankProgress{rp(0, 5, 5), rp(1, 5, 5)}})
	if p.G() != 4 {
		t.Fatalf("G = %d with host 1 still at 4", p.G())
	}
	p.handle(&wire.UpProgress{Host: 1, Gen: 1, Ranks: []wire.RankProgress{rp(2, 5, 5), rp(3, 6, 5)}})
	if p.G() != 5 {
		t.Fatalf("G = %d, want 5", p.G())
	}
}

// TestProgressH: in diff mode under erasure coding the launcher's H is
// the minimum of the ranks' coded bases, never above G and always a base
// every rank coded (a minimum above G keeps the H before: G itself is
// not a coded base); GlobalStep carries it, published whenever G or H
// advances; a restart and a splice keep it; the table shows it beside G.
// Outside the mode H is 0.
func TestProgressH(t *testing.T) {
	type gh struct{ g, h int64 }
	var published []gh
	p := newProgress([][]int{{0, 1}, {2, 3}, nil}, []int{0, 0, 1, 1}, func(g *wire.GlobalStep) { published = append(published, gh{g.G, g.H}) })
	p.trackH()
	rp := func(r int, c, rep, base int64) wire.RankProgress {
		return wire.RankProgress{Rank: r, Committed: c, Replicated: rep, Base: base}
	}
	steps := []struct {
		u    wire.UpProgress
		want gh
	}{
		{wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 3, 3, -1), rp(1, 3, 2, -1)}}, gh{-1, -1}},
		{wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{rp(2, 4, 4, -1), rp(3, 4, 4, -1)}}, gh{2, -1}}, // G alone
		{wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 9, 9, 8), rp(1, 9, 9, 8)}}, gh{4, -1}},
		// A base past G (the wire refuses Base > Replicated; progress
		// holds whatever it is given): H stays, not G's 4, no base.
		{wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{rp(2, 9, 4, 8), rp(3, 9, 4, 8)}}, gh{4, -1}},
		{wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{rp(2, 9, 9, 8), rp(3, 9, 9, 8)}}, gh{9, 8}},
		{wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{rp(2, 17, 16, 16), rp(3, 17, 16, 16)}}, gh{9, 8}}, // host 0 holds both back
		{wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 17, 9, 16), rp(1, 17, 9, 16)}}, gh{9, 8}},   // bases past G: H stays at 8, not 9
		{wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 17, 16, 16), rp(1, 17, 16, 16)}}, gh{16, 16}},
	}
	for i, s := range steps {
		if err := p.handle(&s.u); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if g, h := p.G(), p.H(); g != s.want.g || h != s.want.h {
			t.Fatalf("step %d: G, H = %d, %d; want %d, %d", i, g, h, s.want.g, s.want.h)
		}
	}
	want := []gh{{2, -1}, {4, -1}, {9, 8}, {16, 16}}
	if fmt.Sprint(published) != fmt.Sprint(want) {
		t.Fatalf("published %v, want %v", published, want)
	}
	for _, x := range published {
		if x.h > x.g {
			t.Fatalf("published H %d above G %d", x.h, x.g)
		}
	}
	// H alone advances: published.
	q := newProgress([][]int{{0}, {1}}, []int{0, 1}, func(g *wire.GlobalStep) { published = append(published, gh{g.G, g.H}) })
	q.trackH()
	published = nil
	q.handle(&wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 8, 8, -1)}})
	q.handle(&wire.UpProgress{Host: 1, Ranks: []wire.RankProgress{rp(1, 8, 8, 0)}})
	q.handle(&wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 8, 8, 0)}})
	if fmt.Sprint(published) != fmt.Sprint([]gh{{8, -1}, {8, 0}}) {
		t.Fatalf("published %v, want [{8 -1} {8 0}]", published)
	}
	// A restart and a splice keep H; the new generation's bases raise it.
	p.restart(1)
	if p.H() != 16 {
		t.Fatalf("H = %d after a restart, want 16", p.H())
	}
	p.move([]int{2, 3}, 1, 2)
	p.handle(&wire.UpProgress{Host: 0, Gen: 1, Ranks: []wire.RankProgress{rp(0, 25, 24, 24), rp(1, 25, 24, 24)}})
	if p.H() != 16 {
		t.Fatalf("H = %d with ranks 2, 3 not reported on their new host", p.H())
	}
	p.handle(&wire.UpProgress{Host: 2, Gen: 1, Ranks: []wire.RankProgress{rp(2, 25, 24, 24), rp(3, 25, 24, 24)}})
	if p.G() != 24 || p.H() != 24 {
		t.Fatalf("G, H = %d, %d; want 24, 24", p.G(), p.H())
	}
	if tab := p.table(ModeDiff, DiffOptions{Fold: 8, BaseEvery: 8, Codec: "raw"}); !strings.Contains(tab, "G = 24 (the step every rank can resume from), H = 24") ||
		!strings.Contains(tab, "coded base") {
		t.Fatalf("the table does not show H and the ranks' bases:\n%s", tab)
	}
	// Outside the mode, no H.
	var plain []int64
	r := newProgress([][]int{{0}}, []int{0}, func(g *wire.GlobalStep) { plain = append(plain, g.H) })
	r.handle(&wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{rp(0, 3, 3, 0)}})
	if r.H() != 0 || fmt.Sprint(plain) != "[0]" || strings.Contains(r.table(ModeFull, DiffOptions{}), "H =") {
		t.Fatalf("H outside diff mode under EC: %d, published %v", r.H(), plain)
	}
}

// TestProgressRebaseH: in diff mode under erasure coding a new epoch or
// a move of ranks takes every rank's Base down to H, so H never rises to
// a step some rank did not code under the placement it stands for: a
// moved rank's last report (from its lost host) and a rank not yet
// reporting under the new epoch keep their old schedule's bases, and once
// the others code the new epoch's first base (41), the minimum would be
// such a base (40), which rank 3 never coded and rank 0's shard of which
// was lost with its host. Reports of the old epoch raise nothing.
// codedIn says when every rank coded under the new epoch.
func TestProgressRebaseH(t *testing.T) {
	rp := func(r int, c, rep, base int64) wire.RankProgress {
		return wire.RankProgress{Rank: r, Committed: c, Replicated: rep, Base: base}
	}
	for _, tc := range []struct {
		name string
		move bool // rank 0 moves from lost host 0 to spare 4
	}{{"splice", true}, {"new epoch in place", false}} {
		t.Run(tc.name, func(t *testing.T) {
			type gh struct{ g, h int64 }
			var published []gh
			p := newProgress([][]int{{0}, {1}, {2}, {3}, nil}, []int{0, 1, 2, 3}, func(g *wire.GlobalStep) { published = append(published, gh{g.G, g.H}) })
			p.trackH()
			p.setEpoch(1)
			for r, b := range []int64{40, 40, 40, 32} {
				if err := p.handle(&wire.UpProgress{Host: r, Epoch: 1, Ranks: []wire.RankProgress{rp(r, 42, 41, b)}}); err != nil {
					t.Fatal(err)
				}
			}
			if p.G() != 41 || p.H() != 32 || p.codedIn() != 32 {
				t.Fatalf("before: G, H, codedIn = %d, %d, %d; want 41, 32, 32", p.G(), p.H(), p.codedIn())
			}
			// The new epoch resumes from G0 = 41; the rank that lags
			// (rank 0 moved, or rank 2 in place) has not reported under it.
			late, lateHost := 2, 2
			if tc.move {
				p.move([]int{0}, 0, 4)
				late, lateHost = 0, 4
			}
			p.setEpoch(2)
			if p.codedIn() != -1 {
				t.Fatalf("codedIn = %d before any report of epoch 2", p.codedIn())
			}
			for r := range 4 {
				if r != late {
					p.handle(&wire.UpProgress{Host: r, Epoch: 2, Ranks: []wire.RankProgress{rp(r, 41, 41, -1)}})
				}
			}
			for r := range 4 {
				if r != late {
					p.handle(&wire.UpProgress{Host: r, Epoch: 2, Ranks: []wire.RankProgress{rp(r, 42, 42, 41)}})
				}
			}
			if h := p.H(); h != 32 {
				t.Fatalf("H = %d with rank %d not reported under epoch 2 (published %v); want 32, the old H, until it codes 41", h, late, published)
			}
			// A report of the old epoch raises nothing.
			p.handle(&wire.UpProgress{Host: lateHost, Epoch: 1, Ranks: []wire.RankProgress{rp(late, 42, 42, 41)}})
			if h, c := p.H(), p.codedIn(); h != 32 || c != -1 {
				t.Fatalf("H, codedIn = %d, %d after rank %d's report of epoch 1; want 32, -1", h, c, late)
			}
			p.handle(&wire.UpProgress{Host: lateHost, Epoch: 2, Ranks: []wire.RankProgress{rp(late, 42, 42, 41)}})
			if h, c := p.H(), p.codedIn(); h != 41 || c != 41 {
				t.Fatalf("H, codedIn = %d, %d once every rank coded 41 under epoch 2; want 41, 41", h, c)
			}
			for _, x := range published {
				if x.h != -1 && x.h != 32 && x.h != 41 {
					t.Fatalf("published H %d, not a base every rank coded (%v)", x.h, published)
				}
			}
		})
	}
}

// TestProgressRollbackH: in diff mode under erasure coding a roll-back
// to the durable tier at T takes H back to -1, whether the old H was past
// T or not: the old schedule's bases are abandoned, T is the new
// schedule's first base (b_0), and H rises again only from the new
// generation's reports, to T once every rank coded it. An epoch resuming
// from T gets no H (hAtMost), not the old schedule's.
func TestProgressRollbackH(t *testing.T) {
	rp := func(r int, c, rep, base int64) wire.RankProgress {
		return wire.RankProgress{Rank: r, Committed: c, Replicated: rep, Base: base}
	}
	for _, tc := range []struct {
		name string
		t    int64 // the roll-back's step; G was 17, H 16, the H before 8
	}{{"H past T", 10}, {"H at T", 16}, {"H below T", 17}} {
		t.Run(tc.name, func(t *testing.T) {
			type gh struct{ g, h int64 }
			var published []gh
			p := newProgress([][]int{{0, 1}, {2, 3}}, []int{0, 0, 1, 1}, func(g *wire.GlobalStep) { published = append(published, gh{g.G, g.H}) })
			p.trackH()
			for _, b := range []int64{8, 16} {
				for h := range 2 {
					p.handle(&wire.UpProgress{Host: h, Ranks: []wire.RankProgress{rp(2*h, 17, 17, b), rp(2*h+1, 17, 17, b)}})
				}
			}
			if p.G() != 17 || p.H() != 16 {
				t.Fatalf("before: G, H = %d, %d; want 17, 16", p.G(), p.H())
			}
			p.rollback(tc.t)
			p.restart(1)
			if g, h, eh := p.G(), p.H(), p.hAtMost(tc.t); g != tc.t || h != -1 || eh != -1 {
				t.Fatalf("after the roll-back to %d: G, H, the epoch's H = %d, %d, %d; want %d, -1, -1", tc.t, g, h, eh, tc.t)
			}
			if last := published[len(published)-1]; last != (gh{tc.t, -1}) {
				t.Fatalf("published %v after the roll-back, want {%d -1}", last, tc.t)
			}
			// Host 0 codes T; host 1 not yet: H stays -1.
			p.handle(&wire.UpProgress{Host: 0, Gen: 1, Ranks: []wire.RankProgress{rp(0, tc.t+1, tc.t+1, tc.t), rp(1, tc.t+1, tc.t+1, tc.t)}})
			p.handle(&wire.UpProgress{Host: 1, Gen: 1, Ranks: []wire.RankProgress{rp(2, tc.t+1, tc.t, -1), rp(3, tc.t+1, tc.t, -1)}})
			if h := p.H(); h != -1 {
				t.Fatalf("H = %d with ranks 2, 3 not coded at T = %d", h, tc.t)
			}
			p.handle(&wire.UpProgress{Host: 1, Gen: 1, Ranks: []wire.RankProgress{rp(2, tc.t+1, tc.t+1, tc.t), rp(3, tc.t+1, tc.t+1, tc.t)}})
			if g, h := p.G(), p.H(); g != tc.t+1 || h != tc.t {
				t.Fatalf("every rank coded T: G, H = %d, %d; want %d, %d", g, h, tc.t+1, tc.t)
			}
		})
	}
}

// TestReprotectedDiffEC: in diff mode under erasure coding the owners
// left under-protected by a splice are re-protected (hotswap.Replicated)
// together, once H reached the epoch's G and every rank coded its base
// there under the epoch's placement; not when one owner's base reached
// G (a decode restores H, which stays below G until the last rank codes
// it, and the spare holds nothing below G), nor on an H at G left from
// the old placement.
func TestReprotectedDiffEC(t *testing.T) {
	rp := func(r int, c, rep, base int64) wire.RankProgress {
		return wire.RankProgress{Rank: r, Committed: c, Replicated: rep, Base: base}
	}
	for _, tc := range []struct {
		name  string
		bases []int64 // before the loss; G is 41
	}{{"H below G", []int64{40, 40, 40, 32}}, {"H at G", []int64{41, 41, 41, 41}}} {
		t.Run(tc.name, func(t *testing.T) {
			j := &job{cfg: Config{ECK: 2, ECM: 2, ProtectMode: ModeDiff}, world: 4}
			j.prog = newProgress([][]int{{0}, {1}, {2}, {3}, nil}, []int{0, 1, 2, 3}, func(*wire.GlobalStep) {})
			j.prog.trackH()
			for r, b := range tc.bases {
				j.prog.handle(&wire.UpProgress{Host: r, Ranks: []wire.RankProgress{rp(r, 42, 41, b)}})
			}
			// Host 0 lost; rank 0 on the spare; its roles and those the
			// spare took of the others wait on G0 = 41.
			j.prog.move([]int{0}, 0, 4)
			j.epoch = 1
			j.prog.setEpoch(1)
			j.under = map[int]int64{0: 41, 2: 41}
			report := func(host, r int, base int64) []int {
				u := &wire.UpProgress{Host: host, Epoch: 1, Ranks: []wire.RankProgress{rp(r, 42, 42, base)}}
				if err := j.prog.handle(u); err != nil {
					t.Fatal(err)
				}
				return j.reprotected(u)
			}
			for r, host := range []int{4, 1, 2, 3} {
				if back := report(host, r, -1); len(back) > 0 {
					t.Fatalf("owners %v re-protected by rank %d's report of no base", back, r)
				}
			}
			for r, host := range []int{4, 1, 2} {
				if back := report(host, r, 41); len(back) > 0 {
					t.Fatalf("owners %v re-protected with rank 3 not coded at 41 (H %d)", back, j.prog.H())
				}
			}
			if back := report(3, 3, 41); fmt.Sprint(back) != "[0 2]" {
				t.Fatalf("re-protected %v once every rank coded 41; want [0 2]", back)
			}
		})
	}
}

// BenchmarkProgress: one step of a 10,240-rank job on 1,280 hosts (8 ranks
// each): every host reports its ranks' new step once, and G advances once
// the last one is in. Reported per host report.
func BenchmarkProgress(b *testing.B) {
	const hosts, per = 1280, 8
	hostRanks := make([][]int, hosts)
	rankHost := make([]int, hosts*per)
	for h := range hostRanks {
		for i := range per {
			r := h*per + i
			hostRanks[h] = append(hostRanks[h], r)
			rankHost[r] = h
		}
	}
	published := 0
	p := newProgress(hostRanks, rankHost, func(*wire.GlobalStep) { published++ })
	reports := make([]wire.UpProgress, hosts)
	for h := range reports {
		reports[h] = wire.UpProgress{Host: h, Ranks: make([]wire.RankProgress, per)}
	}
	b.ResetTimer()
	for step := range b.N {
		for h := range reports {
			for i := range per {
				reports[h].Ranks[i] = wire.RankProgress{Rank: h*per + i, Committed: int64(step), Replicated: int64(step)}
			}
			if err := p.handle(&reports[h]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	if published != b.N {
		b.Fatalf("G advanced %d times in %d steps", published, b.N)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*hosts), "ns/report")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/step")
}

// TestHolderRows: the table gets a row per rank with holders, in rank
// order, and none without replicas.
func TestHolderRows(t *testing.T) {
	holders := [][]int{{2, 4}, nil, {4}, {5}, {0}, {1}}
	got := holderRows(holders)
	want := "[{0 [2 4]} {2 [4]} {3 [5]} {4 [0]} {5 [1]}]"
	if fmt.Sprint(got) != want {
		t.Errorf("rows %v, want %s", got, want)
	}
	if rows := holderRows(nil); rows != nil {
		t.Errorf("rows without replicas: %v", rows)
	}
}

// TestProgressStaleEpoch: once an epoch that may change replica holders is
// published, a report its host took under the older placement does not
// raise Replicated (nor G): it may count a holder the rank lost.
func TestProgressStaleEpoch(t *testing.T) {
	p := newProgress([][]int{{0}, {1}}, []int{0, 1}, func(*wire.GlobalStep) {})
	rp := func(r int, rep int64) []wire.RankProgress {
		return []wire.RankProgress{{Rank: r, Committed: rep, Replicated: rep}}
	}
	for _, u := range []wire.UpProgress{{Host: 0, Ranks: rp(0, 4)}, {Host: 1, Ranks: rp(1, 4)}} {
		if err := p.handle(&u); err != nil {
			t.Fatal(err)
		}
	}
	if g := p.G(); g != 4 {
		t.Fatalf("G = %d, want 4", g)
	}
	p.setEpoch(1)
	for _, u := range []wire.UpProgress{{Host: 0, Ranks: rp(0, 6)}, {Host: 1, Ranks: rp(1, 6)}} {
		if err := p.handle(&u); err != nil {
			t.Fatal(err)
		}
	}
	if g := p.G(); g != 4 {
		t.Errorf("G = %d after reports of epoch 0's placement, want still 4", g)
	}
	for _, u := range []wire.UpProgress{{Host: 0, Epoch: 1, Ranks: rp(0, 7)}, {Host: 1, Epoch: 1, Ranks: rp(1, 7)}} {
		if err := p.handle(&u); err != nil {
			t.Fatal(err)
		}
	}
	if g := p.G(); g != 7 {
		t.Errorf("G = %d after reports of epoch 1's placement, want 7", g)
	}
}

// TestGlobalDurableAfterRollback: after a roll-back to the disk tier G
// goes back below the X published before; the GlobalStep published then
// still decodes (X at most G, D at most X), so the hosts take G.
func TestGlobalDurableAfterRollback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		g, d, x int64
		wantD   int64 // -2: omitted
		wantX   int64
	}{
		{"in order", 20, 12, 16, 12, 16},
		{"G back below X", 12, 12, 16, 12, 12},
		{"G back to T above D", 13, 12, 16, 12, 13},
		{"G before any step", -1, 12, 16, -2, -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, x := tc.d, tc.x
			p := &progress{g: tc.g, d: &d, x: &x}
			b := wire.Marshal(p.global())
			g, err := wire.DecodeGlobalStep(b)
			if err != nil {
				t.Fatalf("published %s, which does not decode: %v", b, err)
			}
			got := func(v *int64) int64 {
				if v == nil {
					return -2
				}
				return *v
			}
			if got(g.D) != tc.wantD || got(g.X) != tc.wantX {
				t.Errorf("D %d X %d, want %d %d", got(g.D), got(g.X), tc.wantD, tc.wantX)
			}
		})
	}
}

// TestReprotectedCorrupt: an owner left under-protected because its copy
// failed its CRC32C at step 13 (hotswap.UnderProtected with Corrupt) is
// re-protected only once it replicated a later step and G passed 13: a
// report that it has 13 again, or 14 while G is 13, does not count (the
// holder may still keep the corrupt copy of 13).
func TestReprotectedCorrupt(t *testing.T) {
	rp := func(r int, rep int64) wire.RankProgress {
		return wire.RankProgress{Rank: r, Committed: rep + 1, Replicated: rep, Base: -1}
	}
	j := &job{world: 2, log: slog.New(slog.DiscardHandler)}
	j.prog = newProgress([][]int{{0}, {1}}, []int{0, 1}, func(*wire.GlobalStep) {})
	j.do(hotswap.UnderProtected{Owners: []int{0}, Corrupt: true, Step: 13})
	for _, tc := range []struct {
		why  string
		host int
		rep  int64
		want bool
	}{
		{"owner at step 13, the corrupt one", 0, 13, false},
		{"rank 1 at 13", 1, 13, false},
		{"owner at step 14 with G still 13", 0, 14, false},
		{"G at 14", 1, 14, true},
	} {
		u := &wire.UpProgress{Host: tc.host, Ranks: []wire.RankProgress{rp(tc.host, tc.rep)}}
		if err := j.prog.handle(u); err != nil {
			t.Fatal(err)
		}
		// The owner's last report, as the host's update carries it.
		back := j.reprotected(&wire.UpProgress{Ranks: []wire.RankProgress{rp(0, j.prog.ranks[0].Replicated)}})
		if got := slices.Equal(back, []int{0}); got != tc.want {
			t.Fatalf("%s: re-protected %v (G %d); want owner 0 %t", tc.why, back, j.prog.G(), tc.want)
		}
	}
}
