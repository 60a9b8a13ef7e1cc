package rank

import (
	"testing"
)

// TestReplicatedDuringPlacementSwitch: while SetPlacement closes a rank
// that leaves the host (it waits for that rank's request in flight), the
// new placement is already the one Progress reports under: an owner whose
// holder changed must not report the step its old holder acknowledged.
// Host 0 runs ranks 0 and 2, host 1 rank 1; rank 0 is held by rank 1. The
// new placement moves rank 2 to host 1 and makes it rank 0's holder.
func TestReplicatedDuringPlacementSwitch(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	holders := [][]int{{1}, {0}, {1}}
	c := newCluster(t, [][]int{{0, 2}, {1}}, holders, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[0], 2)}
	protectReplicated(c, rs, 2) // G = 1
	if p := c.progress(0); p.Replicated != 1 {
		t.Fatalf("rank 0 before the placement: %+v", p)
	}
	// Rank 2's request in flight: SetPlacement waits for it to close
	// rank 2's service.
	leaving := c.hosts[0].svc(2)
	leaving.reqMu.Lock()
	seq := c.hosts[0].place().seq
	done := make(chan error, 1)
	go func() {
		done <- c.hosts[0].SetPlacement(Placement{Ranks: []int{0}, HostOf: []int{0, 1, 1}, Holders: [][]int{{2}, {0}, {1}}})
	}()
	c.waitFor("the new placement", func() bool { return c.hosts[0].place().seq != seq })
	_, ps := c.hosts[0].Progress()
	leaving.reqMu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Rank == 0 && p.Replicated >= 1 {
			t.Errorf("rank 0's Replicated under the new placement says %d; its new holder (rank 2) acknowledged nothing", p.Replicated)
		}
	}
}
