package agent

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// resumeDir writes a job of world ranks to a durable directory: each
// rank an owner of difflogtest, its base at base committed, and its
// differentials up to reach[r] on disk (none in full mode, reach[r] ==
// base). Ranks in noBase have no base.
func resumeDir(t *testing.T, base int64, reach []int64, noBase map[int]bool) (string, []*difflogtest.Owner) {
	t.Helper()
	dir := t.TempDir()
	m := &durable.Manifest{Job: "job1", World: len(reach), Protect: "diff", Codec: "raw", Every: 5, Command: "x"}
	var owners []*difflogtest.Owner
	for r := range reach {
		o := difflogtest.NewOwner(uint64(r), 700, 1, replay.Options{Lossless: true}, false)
		o.Advance(int(reach[r]))
		owners = append(owners, o)
		rs, _ := o.Layout()
		var regions []durable.Region
		for _, g := range rs {
			regions = append(regions, durable.Region{Name: g.Name, Size: g.Size})
		}
		m.Regions = append(m.Regions, regions)
		if !noBase[r] {
			s, err := durable.Open(dir, r, regions, durable.Options{ChunkSize: 4096})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Save(context.Background(), base, o.State(base), o.Sums(base), nil); err != nil {
				t.Fatal(err)
			}
			s.Close()
		}
		if reach[r] > base {
			var recs [][]byte
			for s := base + 1; s <= reach[r]; s++ {
				recs = append(recs, o.Encoded(s))
			}
			if err := durable.AppendBatch(dir, r, base+1, reach[r], recs); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := durable.CreateManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	if err := durable.Commit(dir, base); err != nil {
		t.Fatal(err)
	}
	return dir, owners
}

func TestResumeReach(t *testing.T) {
	dir, _ := resumeDir(t, 4, []int64{9, 12, 4}, map[int]bool{3: true})
	got := resumeReach(t.Context(), 1, dir, []int{0, 1, 2, 7})
	if got.Host != 1 || got.Base != 4 || got.Err != "" || len(got.Ranks) != 4 {
		t.Fatalf("%+v", got)
	}
	want := []int64{9, 12, 4, -1}
	for i, k := range got.Ranks {
		if k.To != want[i] {
			t.Errorf("rank %d reaches %d (%s %s), want %d", k.Rank, k.To, k.Stop, k.Err, want[i])
		}
	}
	if !strings.Contains(got.Ranks[3].Err, "has 3 ranks") {
		t.Errorf("rank 7: %q", got.Ranks[3].Err)
	}

	dir2, _ := resumeDir(t, 4, []int64{6, 6}, map[int]bool{1: true})
	got = resumeReach(t.Context(), 0, dir2, []int{0, 1})
	if got.Ranks[0].To != 6 || !strings.Contains(got.Ranks[1].Err, "no complete version of the committed step 4") {
		t.Errorf("rank 1 without a base: %+v", got.Ranks)
	}

	got = resumeReach(t.Context(), 0, t.TempDir(), []int{0})
	if !strings.Contains(got.Err, "no committed version") || len(got.Ranks) != 0 {
		t.Errorf("no commit record: %+v", got)
	}
}

func TestPreloadRanks(t *testing.T) {
	dir, _ := resumeDir(t, 3, []int64{10, 8}, nil)
	h, err := keeper.New(keeper.Config{Job: "resumetest", Host: 0, Hosts: 1, Ranks: []int{0, 1}, Dir: t.TempDir(),
		HostOf: func(int) int { return 0 }, Mode: protect.ModeDiff})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		h.Close()
		h.RemoveFiles()
	}()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	if err := preloadRanks(context.Background(), h, dir, 3, 8, []int{0, 1}, log); err != nil {
		t.Fatal(err)
	}
	_, ps := h.Progress()
	for _, p := range ps {
		if p.Committed != 8 {
			t.Errorf("rank %d: committed %d, want 8", p.Rank, p.Committed)
		}
	}
	h2, err := keeper.New(keeper.Config{Job: "resumetest2", Host: 0, Hosts: 1, Ranks: []int{0, 1}, Dir: t.TempDir(),
		HostOf: func(int) int { return 0 }, Mode: protect.ModeDiff})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		h2.Close()
		h2.RemoveFiles()
	}()
	err = preloadRanks(context.Background(), h2, dir, 3, 9, []int{0, 1}, log)
	if err == nil || !strings.Contains(err.Error(), "rank 1: resuming step 9") {
		t.Errorf("rank 1 past its reach: %v", err)
	}
}
