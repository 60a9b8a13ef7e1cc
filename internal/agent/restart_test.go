package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/gpu"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/topology"
	"github.com/nats-io/nats.go"
)

// fakeLauncher is the launcher's side of one in-process agent's job: a
// real control plane and rendezvous, with the test sending the controls
// and tables and reading the agent's events.
type fakeLauncher struct {
	t        *testing.T
	ctx      context.Context
	l        *control.Control
	subj     wire.Subjects
	rv       *control.Rendezvous
	events   chan *wire.Event
	agentErr chan error
}

// startFakeLauncher runs an agent for host 0 of job, which has ranks, each
// running prog args; with, when not nil, changes the agent's Config.
func startFakeLauncher(t *testing.T, job string, ranks []int, with func(*Config), prog string, args ...string) *fakeLauncher {
	t.Helper()
	return startFakeLauncherSpec(t, job, ranks, with, nil, prog, args...)
}

// startFakeLauncherSpec is startFakeLauncher with spec, when not nil,
// changing the job's spec.
func startFakeLauncherSpec(t *testing.T, job string, ranks []int, with func(*Config), spec func(*wire.JobSpec), prog string, args ...string) *fakeLauncher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	l, creds, dial := testControlPlane(t, ctx, job)
	f := &fakeLauncher{t: t, ctx: ctx, l: l, subj: wire.JobSubjects(job), events: make(chan *wire.Event, 1024), agentErr: make(chan error, 1)}
	sub, err := l.Subscribe(f.subj.ForHost(0).Events, func(m *nats.Msg) {
		if e, err := wire.DecodeEvent(m.Data); err == nil {
			f.events <- e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	js := &wire.JobSpec{
		Prog: prog, Args: args, Dir: t.TempDir(),
		KillGrace: time.Second, HeartbeatInterval: time.Second, StdinRank: wire.NoStdin,
	}
	if spec != nil {
		spec(js)
	}
	f.rv, err = control.StartRendezvous(l.Conn, job, 0, []control.RendezvousHost{{Name: "h0", Ranks: ranks}}, js, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.rv.Close)
	cfg := Config{Job: job, Host: 0, Name: "h0", Creds: creds, Dial: dial, Addr: "127.0.0.1", Logger: testLogger(t)}
	if with != nil {
		with(&cfg)
	}
	go func() { f.agentErr <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		f.send(&wire.Control{Op: wire.OpExit})
		select {
		case <-f.agentErr:
		case <-time.After(30 * time.Second):
			t.Error("the agent did not exit")
		}
	})
	return f
}

func (f *fakeLauncher) send(c *wire.Control) {
	f.t.Helper()
	if err := f.l.Publish(f.subj.Control, wire.Marshal(c)); err != nil {
		f.t.Fatal(err)
	}
	if err := f.l.Flush(); err != nil {
		f.t.Fatal(err)
	}
}

// next returns the agent's next event.
func (f *fakeLauncher) next(what string) *wire.Event {
	f.t.Helper()
	select {
	case e := <-f.events:
		return e
	case err := <-f.agentErr:
		f.t.Fatalf("the agent ended (%v) while the test waited for %s", err, what)
	case <-f.ctx.Done():
		f.t.Fatalf("no %s", what)
	}
	return nil
}

// TestStopDuringRestart: a stop reaches the agent after a restart killed
// the ranks and before the restart's table is here. The launcher waits for
// the end of every rank of the new generation: each must be reported (as
// never started) before the agent says it is done.
func TestStopDuringRestart(t *testing.T) {
	f := startFakeLauncher(t, "stoprestart", []int{0, 1}, nil, "sleep", "3600")
	for started := 0; started < 2; {
		if e := f.next("the ranks' start"); e.Kind == wire.EventStarted {
			started++
		}
	}
	f.send(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: -1})
	for ended := 0; ended < 2; {
		e := f.next("the end of generation 0's ranks")
		if e.Kind == wire.EventExited && e.Gen == 0 {
			ended++
		}
	}
	f.send(&wire.Control{Op: wire.OpStop, Signal: int(syscall.SIGTERM), Grace: time.Second})
	// The launcher publishes the restart's table right after the restart;
	// here it comes after the stop.
	if f.rv.Advance(1) == nil {
		t.Fatal("could not publish the restart's table")
	}
	ended := map[int]bool{}
	for {
		e := f.next("the agent's end")
		switch e.Kind {
		case wire.EventStarted:
			t.Errorf("rank %d of generation %d started while the job stops", e.Rank, e.Gen)
		case wire.EventExited:
			if e.Gen != 1 || !e.Stopped {
				t.Errorf("end of rank %d: generation %d, stopped %v; want generation 1, stopped", e.Rank, e.Gen, e.Stopped)
			}
			ended[e.Rank] = true
		case wire.EventAgentDone:
			if len(ended) != 2 {
				t.Fatalf("the agent is done, but reported the end of %d of generation 1's 2 ranks (%v)", len(ended), ended)
			}
			return
		}
	}
}

// TestRestartBeforeStart: a restart reaches the agent before it started
// its ranks (its GPU discovery is slow). They must start once, in the
// restart's generation: the launcher ignores the ranks of older ones.
func TestRestartBeforeStart(t *testing.T) {
	release := make(chan struct{})
	var logs gortest.SyncBuffer
	f := startFakeLauncher(t, "restartfirst", []int{0, 1}, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), nil))
		c.discoverGPUs = func(ctx context.Context, a *agent) *hostGPUs {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return &hostGPUs{binds: map[int]gpu.Binding{}}
		}
	}, "sleep", "3600")
	select {
	case <-f.rv.Done(): // the first table is out
	case <-f.ctx.Done():
		t.Fatal("the agent did not register")
	}
	f.send(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: -1})
	if f.rv.Advance(1) == nil {
		t.Fatal("could not publish the restart's table")
	}
	for !strings.Contains(logs.String(), "restarting the ranks") {
		select {
		case <-f.ctx.Done():
			t.Fatalf("the agent did not take the restart\n%s", logs.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(release)
	for started := 0; started < 2; {
		e := f.next("the ranks' start")
		switch e.Kind {
		case wire.EventStarted:
			if e.Gen != 1 {
				t.Errorf("rank %d started in generation %d, want 1", e.Rank, e.Gen)
			}
			started++
		case wire.EventExited:
			t.Errorf("rank %d of generation %d ended: %s", e.Rank, e.Gen, e.Msg)
		}
	}
}

// testSockets is a host's rankSockets in epoch 0 without a control plane.
// It counts three local ranks, of which the tests run two: its fences
// never complete (nor are sent up), they are only entered.
func testSockets(t *testing.T) *rankSockets {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &rankSockets{
		ctx: ctx, cancel: cancel, job: "socktest", log: testLogger(t), stop: make(chan struct{}),
		local: 3, conns: map[net.Conn]*rankConn{}, nextSeq: map[int]int{}, fences: map[int]*hostFence{},
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.close(ctx)
	})
	return s
}

func twoRankTable(epoch uint64) *wire.EpochTable {
	return &wire.EpochTable{Version: wire.Version, Job: "socktest", Epoch: epoch, World: 2,
		Hosts: []wire.TableHost{{Name: "h0", Addr: "127.0.0.1", Ranks: wire.CompressRanks([]int{0, 1})}}}
}

// enter enters rank of generation gen into its next fence, which never
// completes: it returns the error of a
// fence refused at once, or nil once the rank waits in it.
func enter(t *testing.T, s *rankSockets, gen uint64, rank int) error {
	t.Helper()
	refused := make(chan error, 1)
	go func() {
		_, err := s.fenceNext(gen, rank, nil)
		refused <- err
	}()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		in := false
		for _, hf := range s.fences {
			in = in || hf.in[rank]
		}
		s.mu.Unlock()
		if in {
			return nil
		}
		select {
		case err := <-refused:
			if err == nil {
				t.Fatal("a fence that cannot complete completed")
			}
			return err
		case <-deadline:
			t.Fatal("the fence was neither entered nor refused")
		case <-time.After(time.Millisecond):
		}
	}
}

// TestRestartSockets: once a restart is known, the ranks it kills (of
// generation 0) neither fail nor enter the fences of its epoch, whichever
// of the restart and its table the agent handles first.
func TestRestartSockets(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tableFirst bool
	}{
		{"restart first", false},
		{"table first", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSockets(t)
			if tc.tableFirst {
				s.setEpoch(twoRankTable(1), 3)
				s.rankEnded(0, 0) // taken for epoch 1's until the restart is known
				s.restart(1, 1)
			} else {
				s.restart(1, 1)
				s.rankEnded(0, 0) // in epoch 0: fails its fences there
				s.setEpoch(twoRankTable(1), 3)
			}
			s.rankEnded(1, 0) // in epoch 1: not its business
			if err := enter(t, s, 0, 1); err == nil {
				t.Error("a rank of generation 0 entered a fence of generation 1's epoch")
			}
			for r := range 2 {
				if err := enter(t, s, 1, r); err != nil {
					t.Errorf("rank %d of generation 1: %v", r, err)
				}
			}
		})
	}
}

// TestFenceOfAnOlderEpoch: a rank that enters a fence of the epoch it
// knows while the push of a newer one is on its way gets that fence
// failed, as one in progress is, and keeps its session: it did nothing
// wrong. A fence of an epoch the agent has not reached is a protocol
// error.
func TestFenceOfAnOlderEpoch(t *testing.T) {
	s := testSockets(t)
	s.setEpoch(twoRankTable(1), 2)
	res, err := s.fence(0, 0, &wire.Fence{Epoch: 0, Seq: 0})
	if err != nil {
		t.Fatalf("fence of epoch 0 in epoch 1: refused (%v), want a failed fence", err)
	}
	if res.Err == "" || !strings.Contains(res.Err, "epoch changed to 1") {
		t.Errorf("fence of epoch 0 in epoch 1: %+v, want it failed because the epoch changed to 1", res)
	}
	if _, err := s.fence(0, 0, &wire.Fence{Epoch: 2, Seq: 0}); err == nil {
		t.Error("fence of epoch 2 in epoch 1: accepted")
	}
}

// TestRestartProtectionRollBack: a restart's control with Disk (a
// roll-back to the durable tier) has the host roll back (keeper.Keeper.RollBack:
// in diff mode under EC, H back to -1); one without restarts it in place
// (keeper.Keeper.Restart: H kept). The host runs diff mode under EC 2+2, the
// first of four hosts, with H 4 published before the restart.
func TestRestartProtectionRollBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		disk  bool
		wantH int64
	}{
		{"restart in place", false, 4},
		{"roll-back to the durable tier", true, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &agent{cfg: Config{Job: "rbh", Host: 0}, log: testLogger(t)}
			hosts := make([]topology.Host, 4)
			var assign []topology.Assignment
			hostOf := make([]int, 4)
			for h := range hosts {
				hosts[h] = topology.Host{Name: fmt.Sprintf("h%d", h), Slots: 1}
				assign = append(assign, topology.Assignment{Rank: h, Host: h})
				hostOf[h] = h
			}
			groups, err := topology.PlanEC(hosts, assign, topology.ECOptions{K: 2, M: 2})
			if err != nil {
				t.Fatal(err)
			}
			h, err := keeper.New(keeper.Config{Job: "rbh", Host: 0, Hosts: 4, Ranks: []int{0}, HostOf: func(r int) int { return hostOf[r] },
				Log: a.log, Mode: protect.ModeDiff, Diff: keeper.DiffConfig{BaseEvery: 4}, EC: groups})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			a.prot = &protection{a: a, host: h}
			if err := h.SetPlacement(keeper.Placement{Ranks: []int{0}, HostOf: hostOf, EC: groups, Epoch: 1, G: 5, H: 4}); err != nil {
				t.Fatal(err)
			}
			h.SetG(0, 5)
			h.SetH(0, 4)
			if got := h.H(); got != 4 {
				t.Fatalf("H %d before the restart, want 4", got)
			}
			if err := a.restartProtection(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 2, G: 5, Disk: tc.disk}); err != nil {
				t.Fatal(err)
			}
			if got := h.H(); got != tc.wantH {
				t.Fatalf("Disk %v: H %d after the restart, want %d", tc.disk, got, tc.wantH)
			}
		})
	}
}
