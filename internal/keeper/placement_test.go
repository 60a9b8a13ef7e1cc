package keeper

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/protect"
)

// checkRestored checks that sr's slot holds rank sr.r's state at step.
func checkRestored(t *testing.T, sr *sessRank, res *protect.Restorable, step int64, tier int) {
	t.Helper()
	if res.Err != "" || res.Step != step || res.Tier != tier {
		t.Fatalf("rank %d restored %+v, want step %d from tier %d", sr.r, res, step, tier)
	}
	want := propState(sr.r, step)
	for i, reg := range propRegions {
		if !bytes.Equal(sr.views[res.Slot][i], want[reg.Name]) {
			t.Errorf("rank %d: region %s of step %d restored with other bytes", sr.r, reg.Name, step)
		}
	}
}

// heldSteps returns the steps host h holds of owner's replicas (nil:
// none).
func heldSteps(h *Keeper, owner int) []int64 {
	h.store.mu.Lock()
	o := h.store.owners[owner]
	h.store.mu.Unlock()
	if o == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []int64
	for _, b := range o.bufs {
		if b.step >= 0 {
			out = append(out, b.step)
		}
	}
	slices.Sort(out)
	return out
}

// slotFiles returns the names of rank r's files in dir.
func slotFiles(t *testing.T, dir string, r int) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "gorun-testjob.r"+string(rune('0'+r))+".*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSetPlacementSpare: hot-swap with a spare. Hosts 0 and 1 run ranks
// 0 and 1, each holding the other's replicas; host 2 is a spare (a Keeper
// with no ranks). Host 1 is lost at G = 1: the new placement moves rank 1
// to the spare, which restores step 1 from its Source (the copy on rank
// 0's host, params from rank 0's slot); rank 0's holder (rank 1) is on a
// new host now, which holds nothing: rank 0's Replicated must not say 1
// before the spare has rank 0's step 1.
func TestSetPlacementSpare(t *testing.T) {
	peers := func(int) []int { return []int{0, 1} }
	holders := [][]int{{1}, {0}}
	c := newCluster(t, [][]int{{0}, {1}, {}}, holders, peers)
	if _, ps := c.hosts[2].Progress(); len(ps) != 0 || c.hosts[2].Session(1) != nil {
		t.Fatalf("the spare has ranks: %+v", ps)
	}
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2) // G = 1

	// Host 1 is lost. The spare gets no address for now: rank 0 cannot
	// replicate to its holder's new host.
	addrs := []string{c.hosts[0].cfg.Listener.Addr().String(), "", c.hosts[2].cfg.Listener.Addr().String()}
	c.hosts[1].Close()
	c.hosts[0].SetAddrs([]string{addrs[0], "", ""})
	c.hosts[2].SetAddrs(addrs)
	c.place([]int{0, 2}, []int{0, 2}, holders, map[int]Source{1: {Opt: 0, Params: 0}})
	for _, h := range []int{0, 2} {
		if err := c.hosts[h].Restart(1, 1); err != nil {
			t.Fatal(err)
		}
	}
	if c.hosts[2].Session(1) == nil {
		t.Fatal("the spare has no session for rank 1 after SetPlacement")
	}
	r0 := newSessRank(t, c.hosts[0], 0)
	checkRestored(t, r0, r0.restore(context.Background()), 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r1 := newSessRank(t, c.hosts[2], 1)
	checkRestored(t, r1, r1.restore(ctx), 1, 2)
	if p := c.progress(1); p.Committed != 1 || p.Restores != 1 {
		t.Errorf("rank 1 on the spare after its restore: %+v", p)
	}
	// Rank 1's holder (rank 0) had step 1 before: asked, it says so.
	c.waitFor("rank 1's Replicated to say 1", func() bool { return c.progress(1).Replicated == 1 })

	// Rank 0's holder has nothing yet, and cannot be reached.
	if p := c.progress(0); p.Replicated >= 1 {
		t.Fatalf("rank 0's Replicated says %d while its only holder (rank 1, on the spare) has nothing", p.Replicated)
	}
	if got := heldSteps(c.hosts[2], 0); got != nil {
		t.Fatalf("the spare holds rank 0's steps %v", got)
	}
	c.hosts[0].SetAddrs(addrs)
	c.waitFor("rank 0's step 1 at the spare", func() bool { return c.progress(0).Replicated == 1 })
	if got := heldSteps(c.hosts[2], 0); !slices.Contains(got, 1) {
		t.Fatalf("rank 0's Replicated says 1, but the spare holds steps %v", got)
	}
	// The job goes on.
	protectFrom(c, []*sessRank{r0, r1}, 2, 4)
}

// TestSetPlacementRankLeaves: a rank leaves a host: its service is
// closed, its slot files removed, its session refused; the other rank of
// the host goes on.
func TestSetPlacementRankLeaves(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	holders := [][]int{{2}, {2}, {0}}
	c := newCluster(t, [][]int{{0, 1}, {2}, {}}, holders, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[0], 1), newSessRank(t, c.hosts[1], 2)}
	protectReplicated(c, rs, 2)
	if len(slotFiles(t, c.dirs[0], 1)) == 0 {
		t.Fatal("rank 1 has no slot files")
	}
	c.place([]int{0, 1, 2}, []int{0, 2, 1}, holders, nil)

	if got := slotFiles(t, c.dirs[0], 1); len(got) != 0 {
		t.Errorf("rank 1's files stay on the host it left: %v", got)
	}
	if len(slotFiles(t, c.dirs[0], 0)) == 0 {
		t.Error("rank 0's files went with rank 1's")
	}
	_, ps := c.hosts[0].Progress()
	if len(ps) != 1 || ps[0].Rank != 0 {
		t.Errorf("host 0 reports %+v, want rank 0 alone", ps)
	}
	if c.hosts[0].Session(1) != nil {
		t.Error("host 0 opens sessions of rank 1, which left it")
	}
	_, _, err := rs[1].sess.Handle(context.Background(), protect.TypeStage, []byte(`{"step":2}`))
	if !errors.Is(err, errLeft) {
		t.Errorf("a session of the rank that left: Stage answered %v, want %v", err, errLeft)
	}
	// Rank 0 goes on (its holder is unchanged).
	rs[0].protect(2)
	c.waitFor("rank 0's step 2", func() bool { return c.progress(0).Replicated == 2 })
}

// TestSetPlacementHoldersChange: rank 0's holder changes from rank 1 to
// rank 2. Its Replicated counts the new holder only from the step it
// acknowledged: it falls back until rank 2's host has rank 0's newest
// step; the old holder's host keeps its copy (the only one of G until
// the new holder has it) until G passes it.
func TestSetPlacementHoldersChange(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newCluster(t, [][]int{{0}, {1}, {2}}, [][]int{{1}, {2}, {0}}, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
	protectReplicated(c, rs, 2)
	if got := heldSteps(c.hosts[1], 0); !slices.Contains(got, 1) {
		t.Fatalf("rank 1's host holds rank 0's steps %v", got)
	}
	addrs := make([]string, 3)
	for i, h := range c.hosts {
		addrs[i] = h.cfg.Listener.Addr().String()
	}
	c.hosts[0].SetAddrs([]string{addrs[0], addrs[1], ""}) // the new holder's host cannot be reached yet
	newHolders := [][]int{{2}, {2}, {0}}
	c.place([]int{0, 1, 2}, []int{0, 1, 2}, newHolders, nil)
	if p := c.progress(0); p.Replicated >= 1 {
		t.Fatalf("rank 0's Replicated says %d; its new holder has nothing", p.Replicated)
	}
	if got := heldSteps(c.hosts[1], 0); !slices.Contains(got, 1) {
		t.Errorf("rank 1's host dropped rank 0's step 1 (holds %v) before its new holder had it", got)
	}
	if p := c.progress(1); p.Replicated != 1 {
		t.Errorf("rank 1's holder did not change, yet its Replicated is %d", p.Replicated)
	}
	c.hosts[0].SetAddrs(addrs)
	c.waitFor("rank 0's step 1 at its new holder", func() bool { return c.progress(0).Replicated == 1 })
	if got := heldSteps(c.hosts[2], 0); !slices.Contains(got, 1) {
		t.Fatalf("rank 2's host holds rank 0's steps %v", got)
	}
	protectFrom(c, rs, 2, 4)
	if got := heldSteps(c.hosts[2], 0); !slices.Equal(got, []int64{2, 3}) {
		t.Errorf("rank 2's host holds rank 0's steps %v, want [2 3]", got)
	}
	if got := heldSteps(c.hosts[1], 0); got != nil {
		t.Errorf("rank 1's host keeps rank 0's steps %v after G passed them", got)
	}
}

// TestSetPlacementBad: inconsistent placements are refused and change
// nothing.
func TestSetPlacementBad(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, nil)
	for _, tc := range []struct {
		name string
		p    Placement
		want string
	}{
		{"rank on no host", Placement{Ranks: []int{0}, HostOf: []int{0, 2}}, "rank 1 on host 2 of 2"},
		{"rank of another host", Placement{Ranks: []int{0, 1}, HostOf: []int{0, 1}}, "rank 1 is on host 1"},
		{"rank missing", Placement{Ranks: nil, HostOf: []int{0, 1}}, "rank 0 is on this host 0 but not among"},
		{"rank twice", Placement{Ranks: []int{0, 0}, HostOf: []int{0, 1}}, "placed twice"},
		{"own holder", Placement{Ranks: []int{0}, HostOf: []int{0, 1}, Holders: [][]int{{0}, {0}}}, "rank 0 held by rank 0"},
		{"holder out of range", Placement{Ranks: []int{0}, HostOf: []int{0, 1}, Holders: [][]int{{5}, {0}}}, "rank 0 held by rank 5"},
		{"holder twice", Placement{Ranks: []int{0}, HostOf: []int{0, 1}, Holders: [][]int{{1, 1}, {0}}}, "rank 0 held twice by rank 1"},
		{"holder on the owner's host", Placement{Ranks: []int{0, 1}, HostOf: []int{0, 0}, Holders: [][]int{{1}, nil}}, "rank 0 held by rank 1 on its own host 0"},
		{"source out of range", Placement{Ranks: []int{0}, HostOf: []int{0, 1}, Sources: map[int]Source{0: {Opt: 1, Params: 9}}}, "restores from ranks 1 and 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.hosts[0].SetPlacement(tc.p)
			if !errors.Is(err, ErrPlacement) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("SetPlacement(%+v) = %v, want ErrPlacement saying %q", tc.p, err, tc.want)
			}
			if c.hosts[0].place().seq != 0 || c.hosts[0].Session(0) == nil {
				t.Error("a refused placement changed the host")
			}
		})
	}
}

// TestRestoreFromSourceOnlyCopy: the restore plan names a Source whose
// host no longer holds the rank's replicas in the new placement, and is
// the only copy left: it keeps it while the rank restores from it, and
// drops it at the next placement. Ranks 0, 1, 2 on hosts 0, 1, 2, rank r
// held by rank r+1; host 3 is a spare. Host 1 is lost at G = 1: rank 1
// moves to the spare and its holder becomes rank 0 (whose host has
// nothing of it); its step 1 is on rank 2's host alone.
func TestRestoreFromSourceOnlyCopy(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newCluster(t, [][]int{{0}, {1}, {2}, {}}, [][]int{{1}, {2}, {0}}, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
	protectReplicated(c, rs, 2)
	c.hosts[1].Close()

	live := []int{0, 2, 3}
	hostOf := []int{0, 3, 2}
	holders := [][]int{{1}, {0}, {0}}
	c.place(live, hostOf, holders, map[int]Source{1: {Opt: 2, Params: 0}})
	for _, h := range live {
		if err := c.hosts[h].Restart(1, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := heldSteps(c.hosts[2], 1); !slices.Contains(got, 1) {
		t.Fatalf("rank 2's host, rank 1's Source, holds its steps %v", got)
	}
	if got := heldSteps(c.hosts[0], 1); slices.Contains(got, 1) {
		t.Fatalf("test setup: rank 0's host holds rank 1's steps %v", got)
	}
	r1 := newSessRank(t, c.hosts[3], 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	checkRestored(t, r1, r1.restore(ctx), 1, 2)
	// Rank 1's new holder gets step 1 from rank 1 itself.
	c.waitFor("rank 1's step 1 at its new holder", func() bool { return c.progress(1).Replicated == 1 })
	if got := heldSteps(c.hosts[0], 1); !slices.Contains(got, 1) {
		t.Fatalf("rank 1's Replicated says 1, but its holder's host holds %v", got)
	}

	// The next placement has no Source: the old copy stays until G passes
	// it.
	c.place(live, hostOf, holders, nil)
	if got := heldSteps(c.hosts[2], 1); !slices.Contains(got, 1) {
		t.Errorf("rank 2's host dropped rank 1's step 1 (holds %v) at G = 1", got)
	}
	rs[1] = r1
	for _, r := range []int{0, 2} {
		rs[r] = newSessRank(t, c.hosts[r], r)
		checkRestored(t, rs[r], rs[r].restore(ctx), 1, 1)
	}
	protectFrom(c, rs, 2, 3)
	if got := heldSteps(c.hosts[2], 1); got != nil {
		t.Errorf("rank 2's host keeps rank 1's steps %v after G passed them", got)
	}
	if got := heldSteps(c.hosts[0], 1); !slices.Contains(got, 1) {
		t.Errorf("rank 1's holder dropped its steps (now %v)", got)
	}
}

// TestRestoreSourceFirst: a rank with a Source restores from it before
// its holders. Rank 0's first holder's host (rank 1's) is made to hold a
// step 1 of other bytes (with their own CRC32Cs, so it would be taken):
// the restore must take the Source's copy (rank 2's host).
func TestRestoreSourceFirst(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newCluster(t, [][]int{{0}, {1}, {2}, {}}, [][]int{{1, 2}, {2, 0}, {0, 1}}, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
	protectReplicated(c, rs, 2)
	c.hosts[0].Close()
	// Rank 0 moves to the spare; its holders stay ranks 1 and 2; the
	// plan says: from rank 2's copy.
	live := []int{1, 2, 3}
	c.place(live, []int{3, 1, 2}, [][]int{{1, 2}, {2}, {1}}, map[int]Source{0: {Opt: 2, Params: 1}})
	for _, h := range live {
		if err := c.hosts[h].Restart(1, 1); err != nil {
			t.Fatal(err)
		}
	}
	var tab []tableEntry
	var data [][]byte
	for _, reg := range propRegions {
		if reg.Name != "params" {
			b := bytes.Repeat([]byte{0xEE}, int(reg.Size))
			tab = append(tab, tableEntry{name: reg.Name, size: reg.Size, sum: crc32.Checksum(b, castagnoli)})
			data = append(data, b)
		}
	}
	if err := rawPut(t, c, 2, linkHdr{kind: kindPut, owner: 0, holder: 1, step: 1, gen: 1}, tab, data); err != nil {
		t.Fatal(err)
	}
	r0 := newSessRank(t, c.hosts[3], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	checkRestored(t, r0, r0.restore(ctx), 1, 2)
}

// TestLinkFailed: replication to a holder's host that disappeared is
// reported to Config.LinkFailed once per host per placement, however
// often it is retried; a holder's host that refuses the replica (it does
// not hold the rank in its placement yet) is not reported.
func TestLinkFailed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lose    bool // host 1 goes away; else it refuses (its placement lags)
		reports int
	}{
		{"holder host gone", true, 1},
		{"holder host refuses", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holders := [][]int{{1}, {0}}
			c := newCluster(t, [][]int{{0}, {1}}, holders, func(int) []int { return []int{0, 1} })
			rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
			protectReplicated(c, rs, 2)
			if tc.lose {
				c.hosts[1].Close()
			} else {
				// Host 1's placement has rank 0 held by nobody.
				if err := c.hosts[1].SetPlacement(Placement{Ranks: []int{1}, HostOf: []int{0, 1}, Holders: [][]int{nil, {0}}}); err != nil {
					t.Fatal(err)
				}
			}
			rep := &c.hosts[0].svc(0).rep
			before := rep.fails.Load()
			rs[0].protect(2)
			c.waitFor("three failed replications of rank 0's step 2", func() bool { return rep.fails.Load() >= before+3 })
			reports := func() []linkFailure {
				var out []linkFailure
				for {
					select {
					case f := <-c.links:
						out = append(out, f)
					default:
						return out
					}
				}
			}
			got := reports()
			if len(got) != tc.reports {
				t.Fatalf("LinkFailed called %d times (%v), want %d", len(got), got, tc.reports)
			}
			for _, f := range got {
				if le, ok := errors.AsType[*linkError](f.err); f.from != 0 || f.to != 1 || !ok || le.host != 1 {
					t.Errorf("LinkFailed from host %d: host %d, %v; want from host 0: host 1, a link error", f.from, f.to, f.err)
				}
			}
			if p := c.progress(0); p.Replicated != 1 {
				t.Errorf("rank 0's step 2 counts as replicated: %+v", p)
			}
			// A new placement (the New's, with a restore plan): a
			// failure is reported again.
			if err := c.hosts[0].SetPlacement(Placement{Ranks: []int{0}, HostOf: []int{0, 1}, Holders: holders, Sources: map[int]Source{1: {Opt: 0, Params: 0}}}); err != nil {
				t.Fatal(err)
			}
			before = rep.fails.Load()
			c.waitFor("failed replications in the new placement", func() bool { return rep.fails.Load() >= before+2 })
			if got := reports(); len(got) != tc.reports {
				t.Errorf("in the next placement, LinkFailed called %d times (%v), want %d", len(got), got, tc.reports)
			}
		})
	}
}

// replicaRegions returns host h's copy of owner's step, by region, or
// nil.
func replicaRegions(h *Keeper, owner int, step int64) map[string][]byte {
	h.store.mu.Lock()
	o := h.store.owners[owner]
	h.store.mu.Unlock()
	if o == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.bufs {
		if b.step == step && len(b.data) == len(b.table) {
			out := map[string][]byte{}
			for i, e := range b.table {
				out[e.name] = bytes.Clone(b.data[i])
			}
			return out
		}
	}
	return nil
}

// TestInPlaceRestoreAgain: in-place recovery, in one restart generation.
// Ranks 0, 1, 2 on hosts 0, 1, 2 (rank r held by rank r+1), host 3 a
// spare; G = 1. The survivors have committed a step 2 (other bytes than
// they will compute again) and rank 0 waits at the overwrite rule to stage
// step 3 when host 1 is lost. The new placement moves rank 1 to the spare:
// rank 0's stage ends (it could wait for ever: G needs rank 1, whose
// training needs rank 0), the survivors restore step 1 again from their
// own slots on the same sessions (Progress.Restores counts both
// restores), rank 1 restores from its Source, and the job goes on: the
// holders end up with the steps as computed again, not the discarded ones.
func TestInPlaceRestoreAgain(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newCluster(t, [][]int{{0}, {1}, {2}, {}}, [][]int{{1}, {2}, {0}}, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
	for _, sr := range rs {
		if res := sr.restore(context.Background()); res.Err != "" || res.Step != noStep {
			t.Fatalf("rank %d's first restore: %+v", sr.r, res)
		}
	}
	protectReplicated(c, rs, 2) // G = 1
	for _, r := range []int{0, 2} {
		rs[r].protectFill(2, 0x5A)
	}
	c.waitFor("the survivors' step 2 at their holders", func() bool {
		return c.progress(0).Replicated == 2 && c.progress(2).Replicated == 2
	})
	staged := make(chan *protect.Staged, 1)
	go func() {
		_, ans, err := rs[0].sess.Handle(context.Background(), protect.TypeStage, []byte(`{"step":3}`))
		if err != nil {
			t.Errorf("rank 0's Stage(3): %v", err)
		}
		sd, _ := ans.(*protect.Staged)
		staged <- sd
	}()
	c.waitFor("rank 0's stage of step 3 to wait", func() bool { return c.hosts[0].waiters.Load() == 1 })

	c.hosts[1].Close()
	live := []int{0, 2, 3}
	holders := [][]int{{1}, {2}, {0}}
	c.place(live, []int{0, 3, 2}, holders, map[int]Source{1: {Opt: 2, Params: 0}})
	select {
	case sd := <-staged:
		if sd == nil || !strings.Contains(sd.Err, errNewPlacement.Error()) || !sd.NewPlacement {
			t.Fatalf("rank 0's waiting Stage(3) after the new placement: %+v, want %q and new_placement", sd, errNewPlacement)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0's Stage(3) still waits after the new placement")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, r := range []int{0, 2} {
		checkRestored(t, rs[r], rs[r].restore(ctx), 1, 1)
		if p := c.progress(r); p.Committed != 1 || p.Restores != 2 {
			t.Errorf("rank %d after restoring again in place: %+v, want committed 1, 2 restores", r, p)
		}
	}
	rs[1] = newSessRank(t, c.hosts[3], 1)
	checkRestored(t, rs[1], rs[1].restore(ctx), 1, 2)
	if p := c.progress(1); p.Restores != 1 {
		t.Errorf("rank 1 on the spare: %+v, want 1 restore", p)
	}
	protectFrom(c, rs, 2, 4)
	for r, holder := range []int{3, 2, 0} { // rank r's holder's host
		for _, step := range []int64{2, 3} {
			got, want := replicaRegions(c.hosts[holder], r, step), propState(r, step)
			for _, reg := range propRegions {
				if reg.Name != "params" && !bytes.Equal(got[reg.Name], want[reg.Name]) {
					t.Errorf("rank %d's step %d at host %d: region %s is not the step computed again", r, step, holder, reg.Name)
				}
			}
		}
	}

	// A restart begins a generation: no restore served in it yet.
	for _, h := range live {
		if err := c.hosts[h].Restart(1, 3); err != nil {
			t.Fatal(err)
		}
	}
	for r := range rs {
		if p := c.progress(r); p.Restores != 0 {
			t.Errorf("rank %d after a restart: %d restores", r, p.Restores)
		}
	}
}

// TestSetPlacementSame: a placement equal to the current one (an epoch
// table republished) changes nothing: a stage waiting at the overwrite
// rule goes on waiting.
func TestSetPlacementSame(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, nil)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2)
	rs[0].protect(2)
	p := Placement{Ranks: []int{0}, HostOf: []int{0, 1}, Holders: [][]int{{1}, {0}}}
	if err := c.hosts[0].SetPlacement(p); err != nil {
		t.Fatal(err)
	}
	seq := c.hosts[0].place().seq
	ctx, cancel := context.WithCancel(context.Background())
	staged := make(chan *protect.Staged, 1)
	go func() {
		_, ans, _ := rs[0].sess.Handle(ctx, protect.TypeStage, []byte(`{"step":3}`))
		sd, _ := ans.(*protect.Staged)
		staged <- sd
	}()
	c.waitFor("rank 0's stage of step 3 to wait", func() bool { return c.hosts[0].waiters.Load() == 1 })
	if err := c.hosts[0].SetPlacement(p); err != nil {
		t.Fatal(err)
	}
	if got := c.hosts[0].place().seq; got != seq {
		t.Errorf("the same placement again made placement %d, was %d", got, seq)
	}
	rs[1].protect(2)
	c.waitFor("step 2 replicated", func() bool { return c.progress(0).Replicated == 2 && c.progress(1).Replicated == 2 })
	c.publishG()
	select {
	case sd := <-staged:
		if sd == nil || sd.Err != "" {
			t.Errorf("rank 0's Stage(3): %+v", sd)
		}
	case <-time.After(10 * time.Second):
		t.Error("rank 0's Stage(3) still waits with G = 2")
	}
	cancel()
}
