package keeper

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/protect"
)

// ---- Bugs the property test found -----------------------------------------

// sessRank is a rank speaking to its service through a Session.
type sessRank struct {
	t     *testing.T
	r     int
	sess  *Session
	views [2][][]byte
}

func newSessRank(t *testing.T, h *Keeper, r int) *sessRank {
	t.Helper()
	sr := &sessRank{t: t, r: r, sess: h.Session(r)}
	_, ans, err := sr.sess.Handle(context.Background(), protect.TypeProtectHello, propHello)
	if err != nil || ans.(*protect.ProtectWelcome).Err != "" {
		t.Fatalf("rank %d: ProtectHello: %+v, %v", r, ans, err)
	}
	views, unmap, err := mapRegionFiles(ans.(*protect.ProtectWelcome).Regions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unmap)
	sr.views = views
	return sr
}

// protect stages, writes and commits step, and returns its slot.
func (sr *sessRank) protect(step int64) int {
	sr.t.Helper()
	req := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err := sr.sess.Handle(context.Background(), protect.TypeStage, req)
	if err != nil || ans.(*protect.Staged).Err != "" {
		sr.t.Fatalf("rank %d: Stage(%d): %+v, %v", sr.r, step, ans, err)
	}
	st := propState(sr.r, step)
	for i, reg := range propRegions {
		copy(sr.views[ans.(*protect.Staged).Slot][i], st[reg.Name])
	}
	slot := ans.(*protect.Staged).Slot
	_, ans, err = sr.sess.Handle(context.Background(), protect.TypeCommit, req)
	if err != nil || ans.(*protect.Committed).Err != "" {
		sr.t.Fatalf("rank %d: Commit(%d): %+v, %v", sr.r, step, ans, err)
	}
	return slot
}

// protectFill stages, fills with b and commits step, and returns its
// slot.
func (sr *sessRank) protectFill(step int64, b byte) int {
	sr.t.Helper()
	req := fmt.Appendf(nil, `{"step":%d}`, step)
	_, ans, err := sr.sess.Handle(context.Background(), protect.TypeStage, req)
	if err != nil || ans.(*protect.Staged).Err != "" {
		sr.t.Fatalf("rank %d: Stage(%d): %+v, %v", sr.r, step, ans, err)
	}
	slot := ans.(*protect.Staged).Slot
	for _, v := range sr.views[slot] {
		for i := range v {
			v[i] = b
		}
	}
	_, ans, err = sr.sess.Handle(context.Background(), protect.TypeCommit, req)
	if err != nil || ans.(*protect.Committed).Err != "" {
		sr.t.Fatalf("rank %d: Commit(%d): %+v, %v", sr.r, step, ans, err)
	}
	return slot
}

func (sr *sessRank) restore(ctx context.Context) *protect.Restorable {
	sr.t.Helper()
	_, ans, err := sr.sess.Handle(ctx, protect.TypeRestore, []byte(`{}`))
	if err != nil {
		sr.t.Fatalf("rank %d: Restore: %v", sr.r, err)
	}
	return ans.(*protect.Restorable)
}

// replaceHost fails host h of c and restarts the job from step g in
// generation gen, with a fresh host (empty slot directory) in h's place.
func replaceHost(t *testing.T, c *cluster, h int, ranks []int, peers func(int) []int, gen uint64, g int64) {
	t.Helper()
	c.hosts[h].Close()
	for i, o := range c.hosts {
		if i != h {
			if err := o.Restart(gen, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.startHost(h, ranks, peers, t.TempDir())
	addrs := make([]string, len(c.hosts))
	for i, o := range c.hosts {
		addrs[i] = o.cfg.Listener.Addr().String()
	}
	for _, o := range c.hosts {
		o.SetAddrs(addrs)
	}
	if err := c.hosts[h].Restart(gen, g); err != nil {
		t.Fatal(err)
	}
}

// TestTier2RestoreWhilePeerWaits: a rank restoring from other hosts
// (Tier-2) fetches params from a data-parallel peer's slot (getSlot →
// service.readSlot, under the peer service's reqMu) while that peer's
// Stage waits at the overwrite rule, which ends only once the restoring
// rank has protected a step: the wait must not hold reqMu. That is what
// happens after a host is replaced: the survivors restore from their own
// slots at once and stage G+1 and G+2 (which waits) while the new host's
// ranks still fetch their state. (The property test found this hang; it
// was fixed meanwhile, in "a stage's wait at the rule holds no lock".)
func TestTier2RestoreWhilePeerWaits(t *testing.T) {
	holders := [][]int{{1}, {0}}
	peers := func(int) []int { return []int{0, 1} }
	c := newCluster(t, [][]int{{0}, {1}}, holders, peers)
	r0, r1 := newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)
	for s := range int64(2) {
		r0.protect(s)
		r1.protect(s)
	}
	c.waitFor("replication of step 1", func() bool { return c.progress(0).Replicated == 1 && c.progress(1).Replicated == 1 })
	if g := c.publishG(); g != 1 {
		t.Fatalf("G = %d", g)
	}
	// Host 0 fails; the job restarts from G = 1 with a new host 0.
	replaceHost(t, c, 0, []int{0}, peers, 1, 1)
	// Rank 1 restores at once, protects step 2 and stages step 3, which
	// waits for G ≥ 2.
	r1 = newSessRank(t, c.hosts[1], 1)
	if res := r1.restore(context.Background()); res.Step != 1 || res.Tier != 1 {
		t.Fatalf("rank 1 restored %+v", res)
	}
	r1.protect(2)
	stageCtx, stopStage := context.WithCancel(context.Background())
	staged := make(chan struct{})
	go func() {
		defer close(staged)
		r1.sess.Handle(stageCtx, protect.TypeStage, []byte(`{"step":3}`))
	}()
	defer func() { stopStage(); <-staged }()
	c.waitFor("rank 1's stage to wait", func() bool { return c.hosts[1].waiters.Load() == 1 })
	// Rank 0 restores on the new host: replicas from rank 1's host,
	// params from rank 1's slot.
	r0 = newSessRank(t, c.hosts[0], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res := r0.restore(ctx)
	if res.Err != "" || res.Step != 1 || res.Tier != 2 {
		t.Fatalf("rank 0's Tier-2 restore of step 1 while rank 1 waits at the overwrite rule: %+v", res)
	}
}

// TestBugConcurrentTier2RestoreDeadlock: two ranks of one host, each the
// other's data-parallel peer, restoring from other hosts at once
// deadlock. service.restoreRemote runs under the rank's reqMu and s.mu,
// and takes params from the first peer that has them, trying a peer on
// the same host directly (copySlot → readSlot, which takes that peer's
// reqMu): rank 0 holds its own reqMu and waits for rank 1's, rank 1 holds
// its own and waits for rank 0's. No context ends it, and Keeper.Close then
// hangs too (service.close waits for s.mu). The agent serves every rank's
// socket in its own goroutine, so the restarted ranks of a replaced host
// restore at once.
func TestBugConcurrentTier2RestoreDeadlock(t *testing.T) {
	holders := [][]int{{2}, {3}, {0}, {1}}
	peers := func(int) []int { return []int{0, 1, 2, 3} }
	// The cluster is closed only if there was no deadlock: with one, its
	// Close would hang.
	tb := &heldCleanups{T: t}
	c := newCluster(tb, [][]int{{0, 1}, {2, 3}}, holders, peers)
	rs := make([]*sessRank, 4)
	for r := range rs {
		rs[r] = newSessRank(t, c.hosts[r/2], r)
	}
	protectReplicated(c, rs, 2)
	replaceHost(t, c, 0, []int{0, 1}, peers, 1, 1)
	r0, r1 := newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[0], 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan *protect.Restorable, 2)
	for _, sr := range []*sessRank{r0, r1} {
		go func() {
			_, ans, _ := sr.sess.Handle(ctx, protect.TypeRestore, []byte(`{}`))
			res, _ := ans.(*protect.Restorable)
			done <- res
		}()
	}
	for range 2 {
		select {
		case res := <-done:
			if res == nil || res.Err != "" || res.Step != 1 || res.Tier != 2 {
				t.Errorf("concurrent Tier-2 restore: %+v", res)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("two ranks of the new host restoring at once: deadlocked (the cluster is left running)")
		}
	}
	tb.run()
}

// heldCleanups holds the cleanups registered through it until run.
type heldCleanups struct {
	*testing.T
	fns []func()
}

func (h *heldCleanups) Cleanup(f func()) { h.fns = append(h.fns, f) }

func (h *heldCleanups) run() {
	for i := len(h.fns) - 1; i >= 0; i-- {
		h.fns[i]()
	}
	h.fns = nil
}

// TestBugReplicasLostWithReplacedHost: after a restart with a replaced
// host, the replicas the lost host held for the surviving ranks were not
// made again, yet Keeper.Restart left each survivor's Replicated at G
// (truncate: min(replicated, committed)), which says that G is at every
// holder. A second failure (one host at a time) of a survivor whose
// holder was on the replaced host, once the launcher saw every rank
// replicated again, lost step G for its ranks: their own slots went with
// it and the new holder had nothing. Found by TestPropertyGRecoverable
// when it still waited only for G to pass the restart's (e.g. seed 4, k=1). Replicated now counts
// a holder only from the step it acknowledged in the generation: the
// survivors ask their holders, and send G to the new host's.
func TestBugReplicasLostWithReplacedHost(t *testing.T) {
	// Ranks 0, 1, 2 on hosts 0, 1, 2; rank r's replica on rank r+1's host.
	holders := [][]int{{1}, {2}, {0}}
	peers := func(int) []int { return []int{0, 1, 2} }
	c := newCluster(t, [][]int{{0}, {1}, {2}}, holders, peers)
	rs := make([]*sessRank, 3)
	for r := range rs {
		rs[r] = newSessRank(t, c.hosts[r], r)
	}
	protectReplicated(c, rs, 2)
	// Host 1 fails; every rank restores step 1 (rank 1 from rank 2's
	// host, and params from rank 0).
	replaceHost(t, c, 1, []int{1}, peers, 1, 1)
	for r := range rs {
		rs[r] = newSessRank(t, c.hosts[r], r)
		if res := rs[r].restore(context.Background()); res.Err != "" || res.Step != 1 {
			t.Fatalf("rank %d restored %+v", r, res)
		}
	}
	// Once every rank says step 1 is replicated (as the launcher sees
	// it), it is: rank 0's holder, rank 1 on the new host 1, has it.
	c.waitFor("every rank's Replicated to say 1", func() bool {
		for r := range rs {
			if c.progress(r).Replicated != 1 {
				return false
			}
		}
		return true
	})
	if got := heldSteps(c.hosts[1], 0); !slices.Contains(got, 1) {
		t.Fatalf("rank 0's Replicated says 1, but its holder's new host holds its steps %v", got)
	}
	// Now host 0 fails (one failure): rank 0's step 1 must come from its
	// holder, rank 1 on the new host 1.
	replaceHost(t, c, 0, []int{0}, peers, 2, 1)
	r0 := newSessRank(t, c.hosts[0], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if res := r0.restore(ctx); res.Err != "" || res.Step != 1 || res.Tier != 2 {
		t.Fatalf("rank 0 cannot restore G = 1 after its host failed: %+v", res)
	}
}

// TestBugReplicaSkipsStep: the replicator sends the newest committed step
// and skips older ones ("a step committed while an older one is still
// being sent supersedes it"). The overwrite rule keeps that harmless
// after the first two steps, but steps 0 and 1 (and the two first after a
// restart from scratch) are committed without waiting for G: when step 0
// is not sent before step 1 is committed (a slow or failed first link,
// or just the replicator's goroutine starting late), the holders get only
// step 1, while Replicated = 1 counts step 0 as replicated too. With
// another rank still at Replicated = 0, G = 0, and a failure of the
// first rank's host loses its step 0: its holder never had it.
func TestBugReplicaSkipsStep(t *testing.T) {
	holders := [][]int{{1}, {0}}
	peers := func(int) []int { return []int{0, 1} }
	c := newCluster(t, [][]int{{0}, {1}}, holders, peers)
	addrs := []string{c.hosts[0].cfg.Listener.Addr().String(), c.hosts[1].cfg.Listener.Addr().String()}
	// Rank 0's first link fails (no address for host 1 yet)...
	c.hosts[0].SetAddrs([]string{addrs[0], ""})
	r0, r1 := newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)
	r0.protect(0)
	r0.protect(1) // no wait: a slot was empty
	// ... and comes back.
	c.hosts[0].SetAddrs(addrs)
	c.waitFor("rank 0's replication", func() bool { return c.progress(0).Replicated == 1 })
	r1.protect(0)
	c.waitFor("rank 1's replication", func() bool { return c.progress(1).Replicated == 0 })
	if g := c.publishG(); g != 0 {
		t.Fatalf("G = %d", g)
	}
	// Host 0 fails: rank 0 must restore step 0 from its holder.
	replaceHost(t, c, 0, []int{0}, peers, 1, 0)
	r0 = newSessRank(t, c.hosts[0], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if res := r0.restore(ctx); res.Err != "" || res.Step != 0 || res.Tier != 2 {
		t.Fatalf("rank 0 cannot restore G = 0 after its host failed: %+v", res)
	}
}

// TestBugLinkPoolCloseRace: Keeper.Close (linkPool.close → link.peekConn)
// reads link.conn without the link's lock when a request holds it, while
// that request's linkPool.do writes link.conn (l.conn = nil after the
// failure Close causes): a data race, which -race reports whenever a host
// closes with a replication in flight (a failing host, or an agent
// stopping mid-step). Fails only under -race.
func TestBugLinkPoolCloseRace(t *testing.T) {
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	auth := comm.LinkAuth{Job: "testjob", Key: secret.LinkKey(), Purpose: "replica"}
	// A holder host that accepts links and reads requests but never
	// answers, so that puts stay in flight.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan struct{}, 1)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if _, err := comm.AcceptLink(conn, auth, 1, 2); err != nil {
					return
				}
				conn.SetDeadline(time.Time{})
				var b [1]byte
				if _, err := conn.Read(b[:]); err == nil {
					got <- struct{}{}
				}
				io.Copy(io.Discard, conn)
			}()
		}
	}()
	// The window is narrow (Close cancels the request's context before
	// it closes the links): try many times.
	for range 1000 {
		h, err := New(Config{Job: "testjob", LinkKey: secret.LinkKey(), Host: 0, Hosts: 2, Ranks: []int{0}, Dir: t.TempDir(),
			Holders: [][]int{{1}, {0}}, HostOf: func(r int) int { return r }})
		if err != nil {
			t.Fatal(err)
		}
		h.SetAddrs([]string{"", ln.Addr().String()})
		newSessRank(t, h, 0).protect(0)
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("no put arrived")
		}
		h.Close()
	}
}

// protectReplicated has every rank of rs protect steps 0 to n-1, waits
// until the holders have step n-1 of every rank, and publishes G = n-1.
func protectReplicated(c *cluster, rs []*sessRank, n int64) {
	c.t.Helper()
	for s := range n {
		for _, sr := range rs {
			sr.protect(s)
		}
	}
	c.waitFor(fmt.Sprintf("replication of step %d", n-1), func() bool {
		for r := range rs {
			if c.progress(r).Replicated != n-1 {
				return false
			}
		}
		return true
	})
	c.publishG()
}
