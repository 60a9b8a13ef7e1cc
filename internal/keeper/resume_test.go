package keeper

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// paramsAt is a diffRank's params region at step (regionsAt's).
func paramsAt(step int64) []byte {
	p := make([]byte, 2048)
	for i := range p {
		p[i] = byte(step*5 + int64(i))
	}
	return p
}

// saveAll writes every region of rank dr at step as its durable version
// of step (the agents' durable bases are of the whole committed slot).
func saveAll(t *testing.T, dir string, dr *diffRank, step int64) {
	t.Helper()
	var regions []durable.Region
	var src [][]byte
	var sums []uint32
	want := dr.want(step)
	for _, g := range dr.regions {
		regions = append(regions, durable.Region{Name: g.Name, Size: g.Size})
		b := want[g.Name]
		if g.Name == "params" {
			b = paramsAt(step)
		}
		src = append(src, b)
		sums = append(sums, crc32c.Checksum(b))
	}
	s, err := durable.Open(dir, dr.r, regions, durable.Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Save(context.Background(), step, src, sums, nil); err != nil {
		t.Fatal(err)
	}
}

func durableRegions(rs []protect.Region) []durable.Region {
	out := make([]durable.Region, len(rs))
	for i, g := range rs {
		out[i] = durable.Region{Name: g.Name, Size: g.Size}
	}
	return out
}

// diskCluster is the cluster of TestResumeFromDisk and
// TestReloadAfterRollback: two hosts, a rank each, replicas on the other
// host, in mode, the differential log to dir in batches of 4.
func diskCluster(t *testing.T, dir string, mode protect.ProtectMode) *cluster {
	t.Helper()
	peers := func(int) []int { return []int{0, 1} }
	mod := func(c *Config) {
		diffLogMod(dir, 4)(c)
		c.Mode = mode
	}
	return newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, peers, mod)
}

// runToDisk runs the job both tests start from on a diskCluster, the
// ranks of the regions given: steps 0 to 5, every rank's base at step 5
// saved and committed, then steps 6 to 13.
func runToDisk(t *testing.T, dir string, mode protect.ProtectMode, regions []protect.Region) (*cluster, []*diffRank) {
	t.Helper()
	a := diskCluster(t, dir, mode)
	rs := startDiffRanksOf(t, a, 2, 51, regions)
	runSteps(t, a, rs, 0, 5)
	for _, dr := range rs {
		saveAll(t, dir, dr, 5)
	}
	if err := durable.Commit(dir, 5); err != nil {
		t.Fatal(err)
	}
	runSteps(t, a, rs, 6, 13)
	return a, rs
}

// TestResumeFromDisk is gorun --resume at the level of the rank
// services: a job (two hosts, a rank each, replicas on the other host)
// protects steps 0 to 13, with a durable base of every rank at step 5
// committed and, in diff mode, its differentials on disk; the job ends,
// and a new one (fresh hosts, nothing in memory) resumes: T is the
// newest step every rank reaches on disk (cascade.Reach, Decide: 13 with
// the differentials, 5 without), each host preloads its rank's state at T
// into its slots (cascade.Load into the staged slot), G is T, and the
// ranks restore T from their own slots (Tier 1), bit for bit the state
// committed at T in the first job, then go on: their holders get T and
// G moves past it.
func TestResumeFromDisk(t *testing.T) {
	noParams := []protect.Region{diffRegions[0], diffRegions[2]}
	for _, tc := range []struct {
		name    string
		mode    protect.ProtectMode
		regions []protect.Region
		t       int64
	}{
		{"full", protect.ModeFull, diffRegions, 5},
		{"diff", protect.ModeDiff, noParams, 13},
		{"diff with params: the base only", protect.ModeDiff, diffRegions, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a, rs := runToDisk(t, dir, tc.mode, tc.regions)
			a.close() // the whole job ends (its writers append what they hold)

			// The new job: each rank's reach on disk, the global minimum.
			base, err := durable.ReadCommitted(dir)
			if err != nil {
				t.Fatal(err)
			}
			avail := make([]cascade.Avail, 2)
			for r := range avail {
				sp, stop := cascade.Reach(dir, r, durableRegions(tc.regions), base)
				t.Logf("rank %d reaches %+v on disk (%v)", r, sp, stop)
				avail[r].Disk = []cascade.Span{sp}
			}
			plan, err := cascade.Decide(avail)
			if err != nil || plan.T != tc.t || plan.Base != 5 {
				t.Fatalf("Decide: %+v, %v; want T %d from base 5", plan, err, tc.t)
			}
			b := diskCluster(t, dir, tc.mode)
			for r, h := range b.hosts {
				var adamT int
				err := h.Preload(r, tc.regions, plan.T, func(views [][]byte) (int, error) {
					l, err := cascade.Load(context.Background(), dir, r, durableRegions(tc.regions), base, plan.T, views, replay.ReplayOptions{})
					adamT = l.AdamT
					return l.AdamT, err
				})
				if err != nil {
					t.Fatal(err)
				}
				if tc.mode == protect.ModeDiff && plan.T > base && adamT != int(plan.T)+1 {
					t.Errorf("rank %d: Adam step %d at step %d, want %d", r, adamT, plan.T, plan.T+1)
				}
				h.SetG(0, plan.T)
			}
			var again []*diffRank
			for r, dr := range rs {
				nr, err := newDiffRankOf(t, b.hosts[r], r, 51, dr.states, tc.regions)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nr.close)
				res, err := nr.restore(context.Background()) // checks the bytes against the first job's commit
				if err != nil || res.Step != plan.T || res.Tier != 1 {
					t.Fatalf("rank %d: restore %+v, %v; want step %d from tier 1", r, res, err, plan.T)
				}
				if slices.Contains(tc.regions, diffRegions[1]) && !bytes.Equal(nr.views[res.Slot][1], paramsAt(plan.T)) {
					t.Errorf("rank %d: params differ from the first job's at step %d", r, plan.T)
				}
				again = append(again, nr)
			}
			runSteps(t, b, again, plan.T+1, plan.T+6)
		})
	}
}

// TestPreloadRegionsMismatch: a rank that declares other regions than
// those resumed is refused, saying why; so is a second Preload.
func TestPreloadRegionsMismatch(t *testing.T) {
	peers := func(int) []int { return []int{0} }
	c := newClusterWith(t, [][]int{{0}}, nil, peers, diffMod(8, 100))
	regions := []protect.Region{diffRegions[0], diffRegions[2]}
	if err := c.hosts[0].Preload(0, regions, 3, func([][]byte) (int, error) { return 4, nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.hosts[0].Preload(0, regions, 3, func([][]byte) (int, error) { return 4, nil }); !errors.Is(err, ErrPreloaded) {
		t.Errorf("second Preload: %v, want ErrPreloaded", err)
	}
	_, err := newDiffRankOf(t, c.hosts[0], 0, 1, nil, diffRegions)
	if err == nil || !strings.Contains(err.Error(), "resumed from the checkpoint directory") {
		t.Errorf("ProtectHello with params too: %v, want a refusal naming the resume", err)
	}
	if err := c.hosts[0].Preload(1, regions, 3, func([][]byte) (int, error) { return 4, nil }); err == nil {
		t.Error("Preload of a rank of another host accepted")
	}
	fillErr := errors.New("no base")
	c2 := newClusterWith(t, [][]int{{0}}, nil, peers, diffMod(8, 100))
	if err := c2.hosts[0].Preload(0, regions, 3, func([][]byte) (int, error) { return 0, fillErr }); !errors.Is(err, fillErr) {
		t.Errorf("Preload whose fill fails: %v", err)
	}
	dr, err := newDiffRankOf(t, c2.hosts[0], 0, 1, nil, diffRegions) // starts afresh: any regions
	if err != nil {
		t.Fatalf("after a failed Preload: %v", err)
	}
	dr.close()
}
