package launcher

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/jobstatus"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
	"github.com/nats-io/nats.go"
)

// TestStatusLive: a running job registers, answers gorun status's query
// through its control plane (hosts, ranks, state), with every rank's row
// when asked, to several clients at once; at its end the entry and the
// registry directory are gone.
func TestStatusLive(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "reg")
	stop := filepath.Join(t.TempDir(), "stop")
	r := startRun(t, 3, `echo ready; while [ ! -e `+stop+` ]; do sleep 0.02; done`, func(c *Config) { c.Registry = reg })
	r.waitLines(regexp.MustCompile(`ready`), 3)
	e := waitRegistered(t, reg)
	if e.PID != os.Getpid() || e.URL == "" || e.Seed == "" || e.Prog != "sh" {
		t.Fatalf("entry %+v", e)
	}
	fi, err := os.Stat(filepath.Join(reg, e.Job+".json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("entry file: %v, %v", fi, err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			s, err := jobstatus.Query(ctx, e, i%2 == 0)
			if err != nil {
				t.Errorf("query %d: %v", i, err)
				return
			}
			if s.Job != e.Job || s.NP != 3 || s.State != "running" || len(s.Hosts) != 1 || s.Hosts[0].Ranks != "0-2" ||
				s.Hosts[0].State != jobstatus.HostRunning || s.G != -1 || s.Prog != "sh" || s.Recovery != "restart" {
				t.Errorf("query %d: snapshot %+v", i, s)
			}
			if want := 0; i%2 == 0 {
				want = 3
				if len(s.Ranks) != want || s.Ranks[2].Rank != 2 || s.Ranks[2].Host != "localhost" {
					t.Errorf("query %d: ranks %+v", i, s.Ranks)
				}
			} else if len(s.Ranks) != want {
				t.Errorf("query %d: %d rank rows unasked", i, len(s.Ranks))
			}
		})
	}
	wg.Wait()
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.wait()
	if r.code != 0 {
		t.Fatalf("exit code %d", r.code)
	}
	if _, err := os.Stat(reg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the registry directory stays after the job: %v", err)
	}
}

// TestStatusNotRegistered: without Config.Registry the job registers
// nowhere and its control plane does not listen (no remote host).
func TestStatusNotRegistered(t *testing.T) {
	r := startRun(t, 1, `true`, func(c *Config) {
		c.running = func(j *job) {
			if j.status != nil || j.srv.URL() != "" {
				t.Errorf("status service without a registry (url %q)", j.srv.URL())
			}
		}
	})
	r.wait()
}

func writeStop(path string) error { return os.WriteFile(path, nil, 0o600) }

// TestStatusSignalRemovesEntry: a job stopped by a signal removes its
// registry entry too.
func TestStatusSignalRemovesEntry(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "reg")
	r := startRun(t, 2, `echo ready; exec sleep 60`, func(c *Config) { c.Registry = reg })
	r.waitLines(regexp.MustCompile(`ready`), 2)
	waitRegistered(t, reg)
	r.signals <- syscall.SIGTERM
	<-r.done
	if _, err := os.Stat(reg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the registry directory stays after SIGTERM: %v", err)
	}
}

// TestStatusFailures: the snapshot's failures are the machine's Failed
// actions, one each, with their class, decision, reason and epoch (none
// for a lost spare, an abort, a wait); a splice fills in where its host's
// ranks went (a waiting loss gets its epoch then), its epoch's timeline
// the cause, the recovery time or that it was superseded; an abort ends
// every failure (a wait, a recovery under way); at most MaxFailures are
// kept, the newest.
func TestStatusFailures(t *testing.T) {
	j := metricsJob(t)
	j.status = &statusState{}
	j.t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := time.Second
	for _, a := range []hotswap.Action{
		hotswap.Failed{Host: 0, Name: "a", Rank: -1, Class: hotswap.ClassHostLoss, Decision: hotswap.DecisionSplice, Epoch: 1, Why: "no heartbeat for 3s", Detected: 2 * s},
		hotswap.Fence{Host: 0, Name: "a"},
		hotswap.Splice{Epoch: 1, Lost: 0, With: 2, LostName: "a", WithName: "s", Ranks: []int{1, 0}, Spare: true},
		hotswap.Restart{Gen: 1, Epoch: 1, G: 3},
		hotswap.Timeline{Epoch: 1, Cause: "host a lost: no heartbeat for 3s", Detected: 2 * s, Resumed: 3 * s},
		hotswap.Failed{Host: 1, Name: "b", Rank: 3, Class: hotswap.ClassRankExit, Decision: hotswap.DecisionRestart, Epoch: 2, Code: 3, Why: "rank 3 exited with code 3", Detected: 4 * s},
		hotswap.Restart{Gen: 2, Epoch: 2, G: 3},
		hotswap.Failed{Host: 1, Name: "b", Rank: 2, Class: hotswap.ClassHang, Decision: hotswap.DecisionRestart, Epoch: 3, Why: "rank 2 made no progress", Detected: 5 * s},
		hotswap.Timeline{Epoch: 2, Cause: "rank 3 exited with code 3", Detected: 4 * s, Resumed: -1, Superseded: true},
		hotswap.Restart{Gen: 3, Epoch: 3, G: 3},
		hotswap.Failed{Host: 3, Name: "t", Rank: -1, Class: hotswap.ClassHostLoss, Agent: true, Decision: hotswap.DecisionNone, Why: "its agent exited: gone", Detected: 6 * s},
		hotswap.Failed{Host: 1, Name: "b", Rank: -1, Class: hotswap.ClassGPUPermanent, Decision: hotswap.DecisionWait, Why: "GPU 0 permanent fault", Detected: 7 * s},
		hotswap.Splice{Epoch: 4, Lost: 1, With: 0, LostName: "b", WithName: "a", Ranks: []int{2, 3}},
		hotswap.Failed{Host: 0, Name: "a", Rank: -1, Class: hotswap.ClassHostLoss, Decision: hotswap.DecisionWait, Why: "no heartbeat for 3s", Detected: 8 * s},
		hotswap.Failed{Host: 2, Name: "s", Rank: 0, Class: hotswap.ClassRankExit, Decision: hotswap.DecisionAbort, Why: "rank 0 called MPI_Abort", Detected: 9 * s},
	} {
		j.statusAction(a)
	}
	if f := j.status.failures; len(f) != 7 || f[2].Done || f[4].Done || f[5].Done || !f[6].Done {
		t.Fatalf("before the abort: %+v; want the hang's recovery and the waits not done, the abort done", f)
	}
	j.statusAction(hotswap.Abort{Code: 1, Msg: "rank 0 called MPI_Abort; stopping the job"})
	type row struct {
		epoch                   uint64
		at                      time.Duration
		class, decision, why    string
		host                    string
		rank                    int
		with, ranks             string
		spare, done, superseded bool
		recovery                float64 // -1: none
		cause                   string
	}
	want := []row{
		{1, 2 * s, "host-loss", "splice", "no heartbeat for 3s", "a", -1, "s", "0-1", true, true, false, 1, "host a lost: no heartbeat for 3s"},
		{2, 4 * s, "rank-exit", "restart", "rank 3 exited with code 3", "b", 3, "", "", false, true, true, -1, "rank 3 exited with code 3"},
		{3, 5 * s, "hang", "restart", "rank 2 made no progress", "b", 2, "", "", false, true, false, -1, ""},
		{0, 6 * s, "host-loss", "none", "its agent exited: gone", "t", -1, "", "", false, true, false, -1, ""},
		{4, 7 * s, "gpu-permanent", "wait", "GPU 0 permanent fault", "b", -1, "a", "2-3", false, true, false, -1, ""},
		{0, 8 * s, "host-loss", "wait", "no heartbeat for 3s", "a", -1, "", "", false, true, false, -1, ""},
		{0, 9 * s, "rank-exit", "abort", "rank 0 called MPI_Abort", "s", 0, "", "", false, true, false, -1, ""},
	}
	f := j.status.failures
	if len(f) != len(want) {
		t.Fatalf("failures %+v, want %d", f, len(want))
	}
	for i, w := range want {
		rec := -1.0
		if f[i].RecoverySeconds != nil {
			rec = *f[i].RecoverySeconds
		}
		got := row{f[i].Epoch, f[i].At.Sub(j.t0), f[i].Class, f[i].Decision, f[i].Why, f[i].Host, f[i].Rank, f[i].With, f[i].Ranks,
			f[i].Spare, f[i].Done, f[i].Superseded, rec, f[i].Cause}
		if got != w {
			t.Errorf("failure %d:\n got %+v\nwant %+v", i, got, w)
		}
	}
	for e := range uint64(2 * jobstatus.MaxFailures) {
		j.statusAction(hotswap.Failed{Host: 0, Name: "a", Rank: 0, Class: hotswap.ClassRankExit, Decision: hotswap.DecisionRestart, Epoch: 10 + e})
	}
	if n, last := len(j.status.failures), j.status.failures[len(j.status.failures)-1].Epoch; n != jobstatus.MaxFailures || last != 10+2*jobstatus.MaxFailures-1 {
		t.Errorf("%d failures kept, the last of epoch %d", n, last)
	}
}

// TestStatusTwoLossesInOneStep: two hosts lost in one step of the
// machine (both heartbeats time out in one tick) are two host losses,
// oldest first, each under its own epoch, in the snapshot and in the
// metrics; before Splice carried its epoch both were filed under the
// machine's epoch after the step, and the first loss showed as a
// rank-restart without a host (and counted a third failure). (Failures
// come from Failed now, which had its epoch already.)
func TestStatusTwoLossesInOneStep(t *testing.T) {
	j := twoLossJob(t, nil, func(j *job, a hotswap.Action) { j.statusAction(a) })
	f := j.status.failures
	if len(f) != 2 {
		t.Fatalf("want 2 failures, got %+v", f)
	}
	for i, want := range []struct {
		epoch      uint64
		host, with string
	}{{1, "h1", "s0"}, {2, "h2", "s1"}} {
		if f[i].Epoch != want.epoch || f[i].Class != "host-loss" || f[i].Decision != "splice" || f[i].Host != want.host || f[i].With != want.with {
			t.Errorf("failure %d: %+v, want a host loss of %s onto %s in epoch %d", i, f[i], want.host, want.with, want.epoch)
		}
	}
	srv := httptest.NewServer(j.metrics.set)
	defer srv.Close()
	fams := scrape(t, srv.URL)
	if got := failureCounts(fams); !maps.Equal(got, map[string]float64{"host-loss/splice": 2}) {
		t.Errorf("gorun_failures_total %v, want 2 host-loss/splice", got)
	}
}

// twoLossJob is a job of 3 ranks on hosts h0, h1, h2 (one each) and
// spares s0, s1, with metrics and a status service (change, if not nil,
// changes it before its machine is made), whose machine loses h1 and h2
// in one step (both heartbeats time out in one tick): each action of
// every step goes to do (the caller's choice of the launcher's handling).
func twoLossJob(t *testing.T, change func(*job), do func(*job, hotswap.Action)) *job {
	t.Helper()
	cfg := validConfig()
	cfg.HeartbeatTimeout = 3 * time.Second
	j := &job{cfg: cfg, world: 3, rankHost: []int{0, 1, 2}, rankEnded: make([]bool, 3), metrics: newMetrics(), status: &statusState{},
		log: slog.New(slog.DiscardHandler), tabChanged: make(chan struct{}), t0: time.Now()}
	for i, n := range []string{"h0", "h1", "h2", "s0", "s1"} {
		spare := n[0] == 's'
		h := &hostAgent{index: i, name: n, topo: topology.Host{Name: n, Slots: 1, Spare: spare}, spare: spare}
		if !spare {
			h.ranks = []int{i}
		}
		j.hosts = append(j.hosts, h)
	}
	if change != nil {
		change(j)
	}
	var err error
	if j.m, err = hotswap.New(j.machineConfig()); err != nil {
		t.Fatal(err)
	}
	j.prog = newProgress([][]int{{0}, {1}, {2}, nil, nil}, []int{0, 1, 2}, func(*wire.GlobalStep) {})
	step := func(at time.Duration, e hotswap.Event) {
		for _, a := range j.m.Step(at, e) {
			do(j, a)
		}
	}
	for h := range 5 {
		step(0, hotswap.AgentRegistered{Host: h, Spare: h >= 3})
		step(time.Second, hotswap.Heartbeat{Host: h})
	}
	step(3*time.Second, hotswap.Heartbeat{Host: 0})
	step(3500*time.Millisecond, hotswap.Heartbeat{Host: 3})
	step(3500*time.Millisecond, hotswap.Heartbeat{Host: 4})
	step(4100*time.Millisecond, hotswap.Tick{})
	return j
}

// TestStatusSpareStates: a spare is "spare", and counted among the
// spares left (snapshot and gorun_spares_left), only once its agent
// registered and while it is not suspected; a spare whose agent could
// not start is lost, not free. Before the fix such a spare showed as
// free, and unregistered or suspected spares were counted.
func TestStatusSpareStates(t *testing.T) {
	for _, tt := range []struct {
		name   string
		set    func(h *hostAgent)
		state  string
		spares int
	}{
		{"registered", func(h *hostAgent) { h.registered = true }, jobstatus.HostSpare, 1},
		{"starting", func(h *hostAgent) { h.registered = false }, jobstatus.HostStarting, 0},
		{"suspected", func(h *hostAgent) { h.probed.Store(true) }, jobstatus.HostSuspected, 0},
		{"could not start", func(h *hostAgent) { h.registered, h.ended = false, true }, jobstatus.HostLost, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := metricsJob(t)
			j.stopping = true // (the snapshot's state needs no rendezvous then)
			s := j.hosts[2]
			tt.set(s)
			snap := j.snapshot(false)
			if got := snap.Hosts[2].State; got != tt.state {
				t.Errorf("state %q, want %q", got, tt.state)
			}
			if len(snap.Spares) != tt.spares {
				t.Errorf("spares %v, want %d", snap.Spares, tt.spares)
			}
			j.metricsTick()
			srv := httptest.NewServer(j.metrics.set)
			defer srv.Close()
			if got := value(scrape(t, srv.URL), "gorun_spares_left"); got != float64(tt.spares) {
				t.Errorf("gorun_spares_left %v, want %d", got, tt.spares)
			}
		})
	}
}

// TestStatusRequestFlood: a holder of the status credential cannot
// flood the job's stderr nor load its loop: bad requests (malformed, or
// a reply subject outside the status inbox) log one warning per
// statusWarnEvery, and requests within statusReuse of a snapshot get
// that snapshot again (per kind: with or without every rank) instead of
// asking the loop. Before the fix every bad request logged a WARN line
// and every request cost the loop a snapshot. The clock is injected.
func TestStatusRequestFlood(t *testing.T) {
	var log bytes.Buffer
	j := &job{id: "floodjob1", subj: wire.JobSubjects("floodjob1"), quit: make(chan struct{}),
		log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	j.status = &statusState{reqs: make(chan statusReq)}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.status.now = func() time.Time { return now }
	asked := 0
	loopDone := make(chan struct{})
	go func() { // the loop
		defer close(loopDone)
		for {
			select {
			case r := <-j.status.reqs:
				asked++
				r.out <- &jobstatus.Snapshot{Job: j.id, NP: asked}
			case <-j.quit:
				return
			}
		}
	}()
	reply := j.subj.StatusInbox() + ".x1"
	for range 50 {
		j.onStatus(&nats.Msg{Reply: "elsewhere", Data: nil})
		j.onStatus(&nats.Msg{Reply: reply, Data: []byte("{garbage")})
	}
	if n := strings.Count(log.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings for 100 bad requests, want 1:\n%s", n, log.String())
	}
	now = now.Add(statusWarnEvery)
	j.onStatus(&nats.Msg{Reply: "elsewhere"})
	if n := strings.Count(log.String(), "level=WARN"); n != 2 || !strings.Contains(log.String(), "suppressed=99") {
		t.Errorf("after %v: %d warnings, want 2 saying 99 suppressed:\n%s", statusWarnEvery, n, log.String())
	}
	for range 20 {
		j.onStatus(&nats.Msg{Reply: reply, Data: []byte(`{}`)})
		j.onStatus(&nats.Msg{Reply: reply, Data: []byte(`{"ranks":true}`)})
	}
	now = now.Add(statusReuse)
	j.onStatus(&nats.Msg{Reply: reply, Data: []byte(`{}`)})
	close(j.quit)
	<-loopDone
	if asked != 3 {
		t.Errorf("the loop made %d snapshots for 41 requests, want 3 (one per kind, one after %v)", asked, statusReuse)
	}
}

// TestStatusRegistryFallback: a job whose registry directory cannot be
// made (XDG_RUNTIME_DIR=/proc/nouser) registers in the next candidate
// (Config.RegistryFallback) instead of nowhere, and removes its entry at
// its end.
func TestStatusRegistryFallback(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "reg")
	stop := filepath.Join(t.TempDir(), "stop")
	r := startRun(t, 1, `while [ ! -e `+stop+` ]; do sleep 0.02; done`, func(c *Config) {
		c.Registry, c.RegistryFallback = "/proc/nouser/gorun", []string{reg}
	})
	if e := waitRegistered(t, "/proc/nouser/gorun", reg); e.Dir != reg {
		t.Errorf("registered in %s, want %s", e.Dir, reg)
	}
	if err := writeStop(stop); err != nil {
		t.Fatal(err)
	}
	r.wait()
	if r.code != 0 || strings.Contains(r.log.String(), "not registered") {
		t.Fatalf("exit %d; log:\n%s", r.code, r.log.String())
	}
	if _, err := os.Stat(reg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the registry directory stays after the job: %v", err)
	}
}

// waitRegistered waits until a job is registered in one of dirs (the
// launcher registers in a goroutine of its own, once the agents start)
// and returns its entry.
func waitRegistered(t *testing.T, dirs ...string) *jobstatus.Entry {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		es, err := jobstatus.ListAll(dirs)
		if err == nil && len(es) == 1 {
			return es[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry %v: %v, %v; want one entry", dirs, es, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStatusRegisterOffCriticalPath: the job's registration for gorun
// status (the entry's file, the status subscription) is not on the
// launch's critical path: with the registration held up, the agents
// start and the ranks run; once it goes through, the entry is there, and
// it is removed at the job's end. Before, statusServe ran before
// startAgents, and a held-up registration held up every rank.
func TestStatusRegisterOffCriticalPath(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	testHookRegister = func() { <-release }
	t.Cleanup(func() { testHookRegister = nil })
	reg := filepath.Join(t.TempDir(), "reg")
	stop := filepath.Join(t.TempDir(), "stop")
	r := startRun(t, 2, `echo ready; while [ ! -e `+stop+` ]; do sleep 0.02; done`, func(c *Config) { c.Registry = reg })
	t.Cleanup(open) // before startRun's: a held-up job must end
	r.waitLines(regexp.MustCompile(`ready`), 2)
	if es, _ := jobstatus.List(reg); len(es) != 0 {
		t.Fatalf("registered while held up: %v", es)
	}
	open()
	waitRegistered(t, reg)
	if err := writeStop(stop); err != nil {
		t.Fatal(err)
	}
	r.wait()
	if _, err := os.Stat(reg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the registry directory stays after the job: %v", err)
	}
}
