package keeper

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/protect"
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
	locked := true
	unlock := func() {
		if locked {
			locked = false
			leaving.reqMu.Unlock()
		}
	}
	defer unlock() // before the cluster closes, if the test fails
	seq := c.hosts[0].place().seq
	done := make(chan error, 1)
	go func() {
		done <- c.hosts[0].SetPlacement(Placement{Ranks: []int{0}, HostOf: []int{0, 1, 1}, Holders: [][]int{{2}, {0}, {0}}})
	}()
	c.waitFor("the new placement", func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
			return c.hosts[0].place().seq != seq
		}
	})
	_, ps := c.hosts[0].Progress()
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Rank == 0 && p.Replicated >= 1 {
			t.Errorf("rank 0's Replicated under the new placement says %d; its new holder (rank 2) acknowledged nothing", p.Replicated)
		}
	}
}

// TestSlotReadDuringLeave: a rank's slot read for another rank's restore
// (params from a data-parallel peer on the same host) while a new
// placement moves the peer away: the peer's service must not unmap its
// slots while the copy reads them. Host 0 runs ranks 0 and 1, host 1
// rank 2; rank 0 restores from another host (its own slot is lost) and
// copies params from rank 1's slot, and the placement that moves rank 1
// to host 1 comes in the middle of the copy.
func TestSlotReadDuringLeave(t *testing.T) {
	peers := func(int) []int { return []int{1, 0, 2} }
	holders := [][]int{{2}, {2}, {0}}
	c := newCluster(t, [][]int{{0, 1}, {2}}, holders, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[0], 1), newSessRank(t, c.hosts[1], 2)}
	protectReplicated(c, rs, 2) // G = 1
	// Rank 0's own slot loses step 1: it restores it from rank 2's host
	// and rank 1's slot.
	s0 := c.hosts[0].svc(0)
	s0.mu.Lock()
	if err := s0.slots.Clear(); err != nil {
		t.Fatal(err)
	}
	s0.mu.Unlock()

	peer := c.hosts[0].svc(1)
	placed := make(chan error, 1)
	var once sync.Once
	testHookSlotRead = func(s *service) {
		if s != peer {
			return
		}
		once.Do(func() {
			go func() {
				placed <- c.hosts[0].SetPlacement(Placement{Ranks: []int{0}, HostOf: []int{0, 1, 1}, Holders: [][]int{{2}, {0}, {0}}})
			}()
			// Wait until the leaving service has unmapped its slots (the
			// defect), or is held up by this reader.
			deadline := time.After(10 * time.Second)
			for {
				if closeHeldUp(s) {
					return
				}
				s.mu.Lock()
				unmapped := s.slots == nil
				s.mu.Unlock()
				if unmapped {
					t.Error("rank 1's slots were unmapped while a reader held their views")
					return
				}
				select {
				case <-deadline:
					t.Error("rank 1's service neither closed nor waited for the reader")
					return
				case <-time.After(time.Millisecond):
				}
			}
		})
	}
	t.Cleanup(func() { testHookSlotRead = nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := rs[0].restore(ctx)
	if err := <-placed; err != nil {
		t.Fatal(err)
	}
	checkRestored(t, rs[0], res, 1, 2)
}

// closeHeldUp reports whether s's close waits for a reader of its slots.
// A reader holds mapMu's read lock: a try fails only while close waits
// for the write lock.
func closeHeldUp(s *service) bool {
	if s.mapMu.TryRLock() {
		s.mapMu.RUnlock()
		return false
	}
	return true
}

// TestFirstPlacementSame: the first SetPlacement, from the epoch table of
// the placement the Keeper was made with (the agent's first table), changes
// nothing: no new placement (stages waiting go on waiting), the holders'
// acknowledgements are kept.
func TestFirstPlacementSame(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, func(int) []int { return []int{0, 1} })
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2)
	if err := c.hosts[0].SetPlacement(Placement{Ranks: []int{0}, HostOf: []int{0, 1}, Holders: [][]int{{1}, {0}}}); err != nil {
		t.Fatal(err)
	}
	if seq := c.hosts[0].place().seq; seq != 0 {
		t.Errorf("the Keeper's own placement given again made placement %d", seq)
	}
	if p := c.progress(0); p.Replicated != 1 {
		t.Errorf("rank 0's Replicated after its placement was given again: %d, want 1", p.Replicated)
	}
}

// TestStageAfterNewPlacement: a Stage that arrives after a new placement
// but before the rank restored in place must not wait at the overwrite
// rule for a G that may need the rank to restore first: it ends with the
// new-placement error, as a Stage already waiting does; after the rank
// restores, its Stages wait again.
func TestStageAfterNewPlacement(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, func(int) []int { return []int{0, 1} })
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2) // G = 1
	rs[0].protect(2)
	// A new placement (rank 1 restores from rank 0's copy).
	c.place([]int{0, 1}, []int{0, 1}, [][]int{{1}, {0}}, map[int]Source{1: {Opt: 0, Params: 0}})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, ans, err := rs[0].sess.Handle(ctx, protect.TypeStage, []byte(`{"step":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if sd := ans.(*protect.Staged); !strings.Contains(sd.Err, errNewPlacement.Error()) || !sd.NewPlacement {
		t.Fatalf("Stage(3) after the new placement: %+v, want %q and new_placement", sd, errNewPlacement)
	}
	// Restored in place, the rank's stages wait for G again.
	checkRestored(t, rs[0], rs[0].restore(ctx), 1, 1)
	rs[0].protect(2)
	wctx, wcancel := context.WithCancel(ctx)
	staged := make(chan *protect.Staged, 1)
	go func() {
		_, ans, _ := rs[0].sess.Handle(wctx, protect.TypeStage, []byte(`{"step":3}`))
		sd, _ := ans.(*protect.Staged)
		staged <- sd
	}()
	c.waitFor("rank 0's stage of step 3 to wait", func() bool { return c.hosts[0].waiters.Load() == 1 })
	wcancel()
	if sd := <-staged; sd == nil || strings.Contains(sd.Err, errNewPlacement.Error()) || sd.NewPlacement {
		t.Errorf("Stage(3) after the rank restored: %+v, want it to wait until cancelled", sd)
	}
}

// TestHelloAfterLeave: a ProtectHello that passed its session's checks
// before its rank left the host, and is served after the rank's service
// closed, must not create the rank's slot files again (nothing would
// remove them).
func TestHelloAfterLeave(t *testing.T) {
	c := newCluster(t, [][]int{{0, 1}, {2}}, nil, nil)
	newSessRank(t, c.hosts[0], 0)
	svc := c.hosts[0].svc(1)
	c.place([]int{0, 1}, []int{0, 1, 1}, nil, nil)
	var req protect.ProtectHello
	if err := decode(propHello, &req); err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.hello(&req); err == nil {
		t.Error("ProtectHello of a rank that left the host succeeded")
	}
	if got := slotFiles(t, c.dirs[0], 1); len(got) != 0 {
		t.Errorf("rank 1's files were created on the host it left: %v", got)
	}
}

// TestOldHolderServesUntilNewAcked: rank 0's holder changes from rank 1
// to rank 2, and rank 0's host is lost before rank 2's host acknowledged
// anything: step G (1) of rank 0 must still be somewhere, on rank 1's
// host, which no longer holds rank 0's replicas: the spare restores rank
// 0 from it. Once G passed that copy's newest step in the placement
// where rank 0's new holder acknowledged it, the copy goes.
func TestOldHolderServesUntilNewAcked(t *testing.T) {
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newCluster(t, [][]int{{0}, {1}, {2}, {}}, [][]int{{1}, {2}, {0}}, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1), newSessRank(t, c.hosts[2], 2)}
	protectReplicated(c, rs, 2) // G = 1
	addrs := make([]string, 4)
	for i, h := range c.hosts {
		addrs[i] = h.cfg.Listener.Addr().String()
	}
	c.hosts[0].SetAddrs([]string{addrs[0], addrs[1], "", addrs[3]}) // rank 0's new holder cannot be reached
	newHolders := [][]int{{2}, {2}, {0}}
	c.place([]int{0, 1, 2, 3}, []int{0, 1, 2}, newHolders, nil)
	if got := heldSteps(c.hosts[1], 0); !slices.Contains(got, 1) {
		t.Fatalf("rank 1's host dropped rank 0's step 1 (holds %v) before rank 0's new holder acknowledged it", got)
	}
	// Rank 0's host is lost: the spare (host 3) gets rank 0, restoring from
	// the copy on rank 1's host (the restore plan's Opt).
	c.hosts[0].Close()
	live := []int{1, 2, 3}
	hostOf := []int{3, 1, 2}
	c.place(live, hostOf, newHolders, map[int]Source{0: {Opt: 1, Params: 1}})
	for _, h := range live {
		if err := c.hosts[h].Restart(1, 1); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs[0] = newSessRank(t, c.hosts[3], 0)
	checkRestored(t, rs[0], rs[0].restore(ctx), 1, 2)
	for _, r := range []int{1, 2} {
		rs[r] = newSessRank(t, c.hosts[hostOf[r]], r)
		checkRestored(t, rs[r], rs[r].restore(ctx), 1, 1)
	}
	// The next placement no longer names the Source: the copy stays until
	// G passes it.
	c.place(live, hostOf, newHolders, nil)
	if got := heldSteps(c.hosts[1], 0); !slices.Contains(got, 1) {
		t.Fatalf("rank 1's host dropped rank 0's step 1 (holds %v) at G = 1", got)
	}
	protectFrom(c, rs, 2, 3)
	c.waitFor("G = 2", func() bool { return c.publishG() == 2 })
	if got := heldSteps(c.hosts[1], 0); got != nil {
		t.Errorf("rank 1's host keeps rank 0's steps %v after G passed them", got)
	}
}

// TestNoReplicationDuringRestore: while a rank restores from other hosts
// (its slot being rewritten), a new placement must not start its
// replication, which would read the slot being written.
func TestNoReplicationDuringRestore(t *testing.T) {
	peers := func(int) []int { return []int{1, 0, 2} }
	holders := [][]int{{2}, {2}, {0}}
	c := newCluster(t, [][]int{{0, 1}, {2}}, holders, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[0], 1), newSessRank(t, c.hosts[1], 2)}
	protectReplicated(c, rs, 2) // G = 1
	s0 := c.hosts[0].svc(0)
	s0.mu.Lock()
	if err := s0.slots.Clear(); err != nil {
		t.Fatal(err)
	}
	s0.mu.Unlock()
	peer := c.hosts[0].svc(1)
	var once sync.Once
	testHookSlotRead = func(s *service) {
		if s != peer {
			return
		}
		once.Do(func() {
			// Rank 0 is restoring: its slot is staged, being written.
			s0.rep.placed(c.hosts[0].place())
			s0.rep.mu.Lock()
			running := s0.rep.running
			s0.rep.mu.Unlock()
			if running {
				t.Error("a placement started rank 0's replication while it restores")
			}
		})
	}
	t.Cleanup(func() { testHookSlotRead = nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	checkRestored(t, rs[0], rs[0].restore(ctx), 1, 2)
	c.waitFor("rank 0's step 1 at its holder after the restore", func() bool { return c.progress(0).Replicated == 1 })
}
