package keeper

import (
	"context"
	"testing"
)

// TestECDiffRestartCorruptSlots: diff mode under 2+1, the job restarted in
// place (issue 21's chaos run: make chaos SEED=2026 ONLY=32). The layout
// was first published with H -1 (no coded base yet); the ranks go on
// until H is a coded base below G; then every host restarts from G and
// gets the restart's epoch table, with the same layout and that H. A rank
// with no clear copy on another host whose own slots both fail their
// CRC32C restores G from its stripe: a decode at the new table's H and
// the replay of its log, bitwise. Before the fix the placement kept the
// first table's H and the restore failed with "no coded base at or
// before step G (H is -1)".
func TestECDiffRestartCorruptSlots(t *testing.T) {
	j := newECDiffRecJob(t, 2, 1, 5, 0)
	j.run(0, 7)
	g, hb := j.published()
	if hb < 0 || hb >= g {
		t.Fatalf("G %d, H %d: want a coded base below G", g, hb)
	}
	victim := -1
	for r := range j.hostOf {
		if len(j.holders[r]) == 0 {
			victim = r
			break
		}
	}
	if victim < 0 {
		t.Fatal("every rank has a clear copy's holder: none restores by decode")
	}

	// The restart in place: every host from G, then the new epoch's
	// table, the same layout with H (the launcher's hAtMost(G)).
	const gen = 1
	for h := range j.work {
		if err := j.c.hosts[h].Restart(gen, g); err != nil {
			t.Fatal(err)
		}
	}
	for h := range j.work {
		var mine []int
		for r, x := range j.hostOf {
			if x == h {
				mine = append(mine, r)
			}
		}
		p := Placement{Ranks: mine, HostOf: j.hostOf, Holders: j.holders, EC: j.groups, Epoch: 2, G: g, Logs: j.logs, H: hb}
		if err := j.c.hosts[h].SetPlacement(p); err != nil {
			t.Fatalf("host %d: %v", h, err)
		}
		if got := j.c.hosts[h].place().h; got != hb {
			t.Errorf("host %d: the restart's table published H %d, the placement decodes at %d", h, hb, got)
		}
	}

	// The victim's committed slots are damaged (through its read-write
	// views, as a stray write would), then it restarts.
	old := j.rs[victim]
	for slot := range old.views {
		old.views[slot][0][0] ^= 0xFF // optimizer
	}
	old.close()
	dr, err := newDiffRank(t, j.c.hosts[j.hostOf[victim]], victim, 11, old.states)
	if err != nil {
		t.Fatal(err)
	}
	defer dr.close()
	// restore checks the bytes against the committed state of the step.
	res, err := dr.restore(context.Background())
	switch {
	case err != nil:
		t.Fatalf("rank %d (G %d, H %d): %v", victim, g, hb, err)
	case res.Step != g || res.Tier != 2:
		t.Fatalf("rank %d restored %+v, want step %d from other hosts (tier 2)", victim, res, g)
	}
}
