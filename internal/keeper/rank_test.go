package keeper

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

var testRegions = []protect.Region{{Name: "optimizer", Size: 3 << 20}, {Name: "params", Size: 1 << 20}, {Name: "meta", Size: 100}}

// TestProtectLocal: stage and commit steps on one host without replicas;
// restore returns step G, intact.
func TestProtectLocal(t *testing.T) {
	c := newCluster(t, [][]int{{0}}, nil, nil)
	cl := c.connect(0, testRegions)
	ctx := context.Background()
	if r, err := cl.Restore(ctx); err != nil || r.Step != -1 {
		t.Fatalf("fresh Restore = %+v, %v; want step -1", r, err)
	}
	for s := range int64(5) {
		if err := cl.Stage(ctx, s, stateOf(0, s, testRegions)); err != nil {
			t.Fatal(err)
		}
		if err := cl.Wait(ctx); err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		c.publishG()
	}
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Committed != 4 || st.Replicated != 4 || st.G != 4 || st.Stages != 5 {
		t.Fatalf("status %+v", st)
	}
	cl.Close()
	// A restarted rank: the same regions, the state of step G.
	cl2 := c.connect(0, testRegions)
	r, err := cl2.Restore(ctx)
	if err != nil || r.Step != 4 || r.Tier != 1 {
		t.Fatalf("Restore = %+v, %v", r, err)
	}
	want := stateOf(0, 4, testRegions)
	for _, reg := range testRegions {
		if !bytes.Equal(r.Regions[reg.Name], joined(want[reg.Name])) {
			t.Fatalf("region %s differs after restore", reg.Name)
		}
	}
	if err := cl2.Stage(ctx, 5, stateOf(0, 5, testRegions)); err != nil {
		t.Fatal(err)
	}
	if err := cl2.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestOverwriteRule: staging step s waits until G ≥ s-1.
func TestOverwriteRule(t *testing.T) {
	c := newCluster(t, [][]int{{0}}, nil, nil)
	h := c.hosts[0]
	sess := h.Session(0)
	ctx := context.Background()
	call := func(typ byte, payload string) any {
		t.Helper()
		_, ans, err := sess.Handle(ctx, typ, []byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	call(protect.TypeProtectHello, `{"v":1,"regions":[{"name":"optimizer","size":64}]}`)
	for s := range 2 {
		if st := call(protect.TypeStage, `{"step":`+itoa(s)+`}`).(*protect.Staged); st.Err != "" {
			t.Fatal(st.Err)
		}
		if cm := call(protect.TypeCommit, `{"step":`+itoa(s)+`}`).(*protect.Committed); cm.Err != "" {
			t.Fatal(cm.Err)
		}
	}
	// Both slots hold committed steps (0 and 1): staging 2 overwrites 0,
	// which needs G ≥ 1.
	done := make(chan *protect.Staged, 1)
	go func() { done <- call(protect.TypeStage, `{"step":2}`).(*protect.Staged) }()
	h.SetG(0, 0)
	c.waitFor("the stage to wait", func() bool { return h.waiters.Load() == 1 })
	select {
	case st := <-done:
		t.Fatalf("Stage(2) went through with G = 0: %+v", st)
	default:
	}
	h.SetG(0, 1)
	select {
	case st := <-done:
		if st.Err != "" || st.Slot != 0 {
			t.Fatalf("Stage(2) = %+v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stage(2) still waiting with G = 1")
	}
	// A stage whose context ends stops waiting.
	call(protect.TypeCommit, `{"step":2}`)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		c.waitFor("the stage to wait", func() bool { return h.waiters.Load() == 1 })
		cancel()
	}()
	_, ans, err := sess.Handle(cctx, protect.TypeStage, []byte(`{"step":3}`))
	if err != nil || ans.(*protect.Staged).Err == "" {
		t.Fatalf("Stage(3) with a cancelled context = %+v, %v", ans, err)
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

// TestReplication: committed steps reach the holders, are acknowledged,
// and count as replicated; a rank on a new host restores from them
// (Tier-2), params from a data-parallel peer.
func TestReplication(t *testing.T) {
	// Ranks 0,1 on host 0, ranks 2,3 on host 1; one data-parallel group
	// of 4; each rank's replica on the other host.
	holders := [][]int{{2}, {3}, {0}, {1}}
	peers := func(int) []int { return []int{0, 1, 2, 3} }
	c := newCluster(t, [][]int{{0, 1}, {2, 3}}, holders, peers)
	ctx := context.Background()
	cls := make([]*protect.Client, 4)
	for r := range cls {
		cls[r] = c.connect(r, testRegions)
	}
	for s := range int64(4) {
		for r, cl := range cls {
			if err := cl.Stage(ctx, s, stateOf(r, s, testRegions)); err != nil {
				t.Fatal(err)
			}
		}
		for _, cl := range cls {
			if err := cl.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		c.waitFor("replication", func() bool {
			for r := range cls {
				if c.progress(r).Replicated < s {
					return false
				}
			}
			return true
		})
		if g := c.publishG(); g != s {
			t.Fatalf("G = %d after step %d", g, s)
		}
	}
	// Host 0 is lost; a new host 0 (empty slot directory) takes its
	// ranks, which restore step G = 3 from host 1.
	for _, cl := range cls[:2] {
		cl.Close()
	}
	c.hosts[0].Close()
	addr := c.hosts[0].cfg.Listener.Addr().String()
	_ = addr
	c.startHost(0, []int{0, 1}, peers, t.TempDir())
	addrs := []string{c.hosts[0].cfg.Listener.Addr().String(), c.hosts[1].cfg.Listener.Addr().String()}
	for _, h := range c.hosts {
		h.SetAddrs(addrs)
	}
	c.hosts[0].SetG(0, 3)
	for r := range 2 {
		cl := c.connect(r, testRegions)
		res, err := cl.Restore(context.Background())
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if res.Step != 3 || res.Tier != 2 {
			t.Fatalf("rank %d restored %+v", r, res)
		}
		want := stateOf(r, 3, testRegions)
		for _, reg := range testRegions {
			if !bytes.Equal(res.Regions[reg.Name], joined(want[reg.Name])) {
				t.Fatalf("rank %d region %s differs after a Tier-2 restore", r, reg.Name)
			}
		}
	}
}

// TestBadRequests: malformed requests are refused and the service keeps
// serving; well-formed impossible ones answer with err.
func TestBadRequests(t *testing.T) {
	c := newCluster(t, [][]int{{0}}, nil, nil)
	h := c.hosts[0]
	ctx := context.Background()
	malformed := []struct {
		typ byte
		b   string
	}{
		{protect.TypeStage, `{"step":1}`}, // before ProtectHello
		{protect.TypeProtectHello, `{"v":2,"regions":[{"name":"a","size":1}]}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[]}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[{"name":"A","size":1}]}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[{"name":"a","size":-1}]}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[{"name":"a","size":1099511627777}]}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[{"name":"a","size":1},{"name":"a","size":1}]}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[{"name":"hdr","size":1}]}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[{"name":"a","size":1}],"gradient":-3}`},
		{protect.TypeProtectHello, `{"v":1,"regions":[{"name":"a","size":1}],"x":1}`},
		{protect.TypeProtectHello, `[]`},
		{protect.TypeProtectHello, ``},
		{99, `{}`},
	}
	for _, m := range malformed {
		if _, _, err := h.Session(0).Handle(ctx, m.typ, []byte(m.b)); err == nil {
			t.Errorf("type %d %s accepted", m.typ, m.b)
		}
	}
	sess := h.Session(0)
	if _, ans, err := sess.Handle(ctx, protect.TypeProtectHello, []byte(`{"v":1,"regions":[{"name":"optimizer","size":8}]}`)); err != nil || ans.(*protect.ProtectWelcome).Err != "" {
		t.Fatalf("hello: %+v %v", ans, err)
	}
	for _, m := range []struct {
		typ byte
		b   string
	}{
		{protect.TypeStage, `{"step":-1}`},
		{protect.TypeStage, `{"step":9007199254740992}`},
		{protect.TypeStage, `{"step":1,"n":3}`},
		{protect.TypeGradient, `{"step":1,"n":-1}`},
		{protect.TypeRestore, `{"step":1}`},
	} {
		if _, _, err := sess.Handle(ctx, m.typ, []byte(m.b)); err == nil {
			t.Errorf("type %d %s accepted", m.typ, m.b)
		}
	}
	// Impossible, well-formed: an answer with err.
	for _, m := range []struct {
		typ byte
		b   string
	}{
		{protect.TypeCommit, `{"step":4}`},          // nothing staged
		{protect.TypeGradient, `{"step":1,"n":10}`}, // no gradient buffer
	} {
		_, ans, err := sess.Handle(ctx, m.typ, []byte(m.b))
		if err != nil {
			t.Fatalf("type %d: %v", m.typ, err)
		}
		if e := errField(ans); e == "" {
			t.Errorf("type %d %s: no err in %+v", m.typ, m.b, ans)
		}
	}
	// Other regions than before: refused with err.
	_, ans, err := h.Session(0).Handle(ctx, protect.TypeProtectHello, []byte(`{"v":1,"regions":[{"name":"optimizer","size":9}]}`))
	if err != nil || ans.(*protect.ProtectWelcome).Err == "" {
		t.Fatalf("hello with other regions: %+v %v", ans, err)
	}
	// Still serving.
	if _, ans, err := sess.Handle(ctx, protect.TypeStage, []byte(`{"step":0}`)); err != nil || ans.(*protect.Staged).Err != "" {
		t.Fatalf("stage after bad requests: %+v %v", ans, err)
	}
	if _, ans, err := sess.Handle(ctx, protect.TypeCommit, []byte(`{"step":0}`)); err != nil || ans.(*protect.Committed).Err != "" {
		t.Fatalf("commit after bad requests: %+v %v", ans, err)
	}
	// Steps must increase.
	if _, ans, _ := sess.Handle(ctx, protect.TypeStage, []byte(`{"step":0}`)); ans.(*protect.Staged).Err == "" {
		t.Fatal("staged step 0 twice")
	}
	_ = errors.New
}

func errField(a any) string {
	switch v := a.(type) {
	case *protect.Committed:
		return v.Err
	case *protect.GradientDone:
		return v.Err
	case *protect.Staged:
		return v.Err
	case *protect.Restorable:
		return v.Err
	}
	return ""
}

// TestWaitCancel: a trainer whose context ends while its staging waits at
// the overwrite rule gets its Wait back at once.
func TestWaitCancel(t *testing.T) {
	c := newCluster(t, [][]int{{0}}, nil, nil)
	cl := c.connect(0, testRegions)
	ctx := context.Background()
	for s := range int64(3) {
		if err := cl.Stage(ctx, s, stateOf(0, s, testRegions)); err != nil {
			t.Fatal(err)
		}
	}
	// Steps 0 and 1 are committed and G was never published: step 2
	// waits at the rule.
	c.waitFor("the stage to wait", func() bool { return c.hosts[0].waiters.Load() == 1 })
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := cl.Wait(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context = %v", err)
	}
	if err := cl.Stage(ctx, 3, stateOf(0, 3, testRegions)); err == nil {
		if err := cl.Wait(ctx); err == nil {
			t.Fatal("a cancelled client went on staging")
		}
	}
	// The service is unharmed: a new session restores step G once known.
	c.publishG()
	cl2 := c.connect(0, testRegions)
	r, err := cl2.Restore(ctx)
	if err != nil || r.Step != 1 {
		t.Fatalf("Restore = %+v, %v; want step 1", r, err)
	}
}

// TestRestoreWithoutG: before any step is recoverable everywhere, a
// restarted rank starts afresh, and can stage from step 0 again.
func TestRestoreWithoutG(t *testing.T) {
	c := newCluster(t, [][]int{{0}}, nil, nil)
	ctx := context.Background()
	cl, err := protect.Connect(ctx, testRegions, protect.Options{Socket: c.sockets[0], Gradient: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for s := range int64(2) {
		if err := cl.Stage(ctx, s, stateOf(0, s, testRegions)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	// A restart from scratch keeps the gradient buffer usable.
	if err := c.hosts[0].Restart(1, -1); err != nil {
		t.Fatal(err)
	}
	cl2, err := protect.Connect(ctx, testRegions, protect.Options{Socket: c.sockets[0], Gradient: 1024})
	if err != nil {
		t.Fatalf("reconnecting after a restart from scratch: %v", err)
	}
	defer cl2.Close()
	r, err := cl2.Restore(ctx)
	if err != nil || r.Step != -1 {
		t.Fatalf("Restore = %+v, %v; want step -1", r, err)
	}
	if err := cl2.Stage(ctx, 0, stateOf(0, 0, testRegions)); err != nil {
		t.Fatal(err)
	}
	if err := cl2.Wait(ctx); err != nil {
		t.Fatalf("staging step 0 again: %v", err)
	}
	if err := cl2.Gradient(ctx, 0, make([]float32, 1024), replay.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 1}); err != nil {
		t.Fatalf("gradient after a restart from scratch: %v", err)
	}
}

// TestSupersededSession: once a newer session of the rank said
// ProtectHello, an older one can neither stage nor commit.
func TestSupersededSession(t *testing.T) {
	c := newCluster(t, [][]int{{0}}, nil, nil)
	h := c.hosts[0]
	ctx := context.Background()
	hello := []byte(`{"v":1,"regions":[{"name":"optimizer","size":64}]}`)
	old := h.Session(0)
	if _, _, err := old.Handle(ctx, protect.TypeProtectHello, hello); err != nil {
		t.Fatal(err)
	}
	if _, ans, err := old.Handle(ctx, protect.TypeStage, []byte(`{"step":0}`)); err != nil || ans.(*protect.Staged).Err != "" {
		t.Fatalf("stage: %+v %v", ans, err)
	}
	// The process of old died; its successor says hello.
	if _, _, err := h.Session(0).Handle(ctx, protect.TypeProtectHello, hello); err != nil {
		t.Fatal(err)
	}
	if _, _, err := old.Handle(ctx, protect.TypeCommit, []byte(`{"step":0}`)); err == nil {
		t.Fatal("a superseded session committed")
	}
	if _, _, err := old.Handle(ctx, protect.TypeStage, []byte(`{"step":1}`)); err == nil {
		t.Fatal("a superseded session staged")
	}
	if _, ans, err := old.Handle(ctx, protect.TypeStatus, []byte(`{}`)); err != nil || ans.(*protect.Status).Committed != -1 {
		t.Fatalf("status of a superseded session: %+v %v", ans, err)
	}
}
