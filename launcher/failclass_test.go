package launcher

import (
	"bytes"
	"io"
	"log/slog"
	"maps"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/report"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

// TestFailureClassEverywhere: each kind of failure, decided on by a real
// machine and carried out by the launcher's do, has one classification
// in the events file's failure record, in gorun status's failure and in
// gorun_failures_total's labels: the same class and decision, the same
// host, rank and reason, and the same epoch (a loss that waited for a
// suspected spare gets its splice's in status and in gorun report, as its
// splice record says); a second loss that needs the durable tier rolls
// back in its own epoch.
// Failures without an epoch (a lost spare, an abort, a wait) are in
// status too. Before, status and the metric said "host-lost" or
// "rank-restart" (what the launcher did, guessed from its splices and
// restarts): a hang, a GPU fault and a rank exit were all one
// "rank-restart" or "host-lost", and a lost spare or an abort was missing.
func TestFailureClassEverywhere(t *testing.T) {
	s := time.Second
	type at struct {
		t time.Duration
		e hotswap.Event
	}
	type fail struct {
		class, decision, host string
		rank                  int
		epoch                 uint64 // the events record's
		statusEpoch           uint64 // status's
	}
	cases := []struct {
		name     string
		restarts int
		hang     time.Duration
		durable  bool // a durable tier, and a second spare s1
		events   []at
		want     []fail
	}{
		{"host loss onto a spare", 1, 0, false, []at{{s, hotswap.AgentExited{Host: 1, Why: "gone"}}},
			[]fail{{"host-loss", "splice", "h1", -1, 1, 1}}},
		{"rank exit, restart", 1, 0, false, []at{{s, hotswap.RankExited{Rank: 2, Host: 1, Code: 3}}, {2 * s, hotswap.Tick{}}},
			[]fail{{"rank-exit", "restart", "h1", 2, 1, 1}}},
		{"hang, restart", 1, 10 * s, false, []at{
			{s, hotswap.Progress{Rank: 0, Step: 1}}, {s, hotswap.Progress{Rank: 1, Step: 1}},
			{s, hotswap.Progress{Rank: 2, Step: 1}}, {s, hotswap.Progress{Rank: 3, Step: 1}}, {20 * s, hotswap.Tick{}}},
			[]fail{{"hang", "restart", "h0", 0, 1, 1}}},
		{"gpu permanent", 1, 0, false, []at{{s, hotswap.GPUHealth{Host: 1, GPU: 0, Class: hotswap.GPUPermanent, Msg: "xid 79"}}},
			[]fail{{"gpu-permanent", "splice", "h1", -1, 1, 1}}},
		{"lost spare", 1, 0, false, []at{{s, hotswap.AgentExited{Host: 2, Why: "gone"}}},
			[]fail{{"host-loss", "none", "s0", -1, 0, 0}}},
		{"abort, no restart", 0, 0, false, []at{{s, hotswap.RankExited{Rank: 2, Host: 1, Code: 3}}, {2 * s, hotswap.Tick{}}},
			[]fail{{"rank-exit", "abort", "h1", 2, 0, 0}}},
		{"abort, no spare left", 1, 0, false, []at{{s, hotswap.AgentExited{Host: 2, Why: "gone"}}, {2 * s, hotswap.AgentExited{Host: 1, Why: "gone"}}},
			[]fail{{"host-loss", "none", "s0", -1, 0, 0}, {"host-loss", "abort", "h1", -1, 0, 0}}},
		{"wait for a suspected spare", 1, 0, false, []at{{s, hotswap.GPublished{G: 3}}, {2 * s, hotswap.ReplicationFailed{From: 0, To: 2}},
			{2010 * time.Millisecond, hotswap.AgentExited{Host: 1, Why: "gone"}}, {2100 * time.Millisecond, hotswap.Heartbeat{Host: 2}}},
			[]fail{{"host-loss", "wait", "h1", -1, 0, 1}}},
		{"two hosts lost, rollback", 1, 0, true, []at{{s, hotswap.GPublished{G: 3}}, {s, hotswap.DiskCommitted{Step: 2}}, {2 * s, hotswap.AgentExited{Host: 0, Why: "gone"}},
			{2100 * time.Millisecond, hotswap.AgentExited{Host: 1, Why: "gone"}}},
			[]fail{{"host-loss", "splice", "h0", -1, 1, 1}, {"host-loss", "rollback", "h1", -1, 2, 2}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var evs bytes.Buffer
			j := failClassJob(t, &evs, c.restarts, c.hang, c.durable)
			for _, e := range c.events {
				for _, a := range j.m.Step(e.t, e.e) {
					switch a.(type) {
					case hotswap.Fence, hotswap.StopRanks, hotswap.KillAll, hotswap.Forward, hotswap.Probe, hotswap.GatherReach, hotswap.RollbackToDisk:
						j.statusAction(a) // as do does first; the rest needs agents
					default:
						j.do(a)
					}
				}
			}

			// The events file.
			recs, err := events.ReadAll(&evs)
			if err != nil {
				t.Fatal(err)
			}
			var recorded []events.Failure
			spliced := map[string]uint64{} // lost host → the splice record's epoch
			for _, r := range recs {
				switch e := r.Event.(type) {
				case events.Failure:
					recorded = append(recorded, e)
				case events.Splice:
					spliced[e.Lost] = e.Epoch
				}
			}
			if len(recorded) != len(c.want) {
				t.Fatalf("failure records %+v, want %d", recorded, len(c.want))
			}
			for i, w := range c.want {
				r := recorded[i]
				if r.Class != w.class || r.Decision != w.decision || r.Host != w.host || r.Rank != w.rank || r.Epoch != w.epoch || r.Msg == "" {
					t.Errorf("failure record %+v, want %+v", r, w)
				}
				if w.decision == "wait" && spliced[w.host] != w.statusEpoch {
					t.Errorf("splice record of %s: epoch %d, want %d", w.host, spliced[w.host], w.statusEpoch)
				}
			}

			// gorun report: the same epoch as status (a wait gets its
			// splice's).
			m, err := report.Build(recs)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range c.want {
				if f := m.Failures[i]; f.Class != w.class || f.Decision != w.decision || f.Epoch != w.statusEpoch {
					t.Errorf("report failure %+v, want class %s, decision %s, epoch %d (status's)", f, w.class, w.decision, w.statusEpoch)
				}
			}

			// gorun status.
			snap := j.snapshot(false)
			if len(snap.Failures) != len(c.want) {
				t.Fatalf("status failures %+v, want %d", snap.Failures, len(c.want))
			}
			for i, w := range c.want {
				f, r := snap.Failures[i], recorded[i]
				if f.Class != r.Class || f.Decision != r.Decision || f.Host != r.Host || f.Rank != r.Rank || f.Why != r.Msg || f.Epoch != w.statusEpoch {
					t.Errorf("status failure %+v, want class %s, decision %s, host %s, rank %d, why %q, epoch %d as the record %+v",
						f, r.Class, r.Decision, r.Host, r.Rank, r.Msg, w.statusEpoch, r)
				}
				if w.decision == "none" || w.decision == "abort" {
					if !f.Done || f.RecoverySeconds != nil {
						t.Errorf("status failure %+v: want done, without a recovery", f)
					}
				}
			}

			// gorun_failures_total.
			srv := httptest.NewServer(j.metrics.set)
			defer srv.Close()
			want := map[string]float64{}
			for _, r := range recorded {
				want[r.Class+"/"+r.Decision]++
			}
			if got := failureCounts(scrape(t, srv.URL)); !maps.Equal(got, want) {
				t.Errorf("gorun_failures_total %v, want %v (the records')", got, want)
			}
		})
	}
}

// failClassJob is a job of 4 ranks on h0 (0, 1) and h1 (2, 3), 2 slots
// each, with a spare s0 of 2 slots, every rank's copy on the other host
// (replicas 1), every agent registered; with an events file (evs), a
// status service and metrics; stopping, so that carrying out the
// machine's actions moves the launcher's tables and starts nothing.
func failClassJob(t *testing.T, evs io.Writer, restarts int, hang time.Duration, durable bool) *job {
	t.Helper()
	cfg := validConfig()
	names := []string{"h0", "h1", "s0"}
	if durable {
		cfg.Durable.Dir = t.TempDir()
		names = append(names, "s1")
	}
	cfg.MaxRestarts, cfg.HangTimeout, cfg.HeartbeatTimeout = restarts, hang, time.Hour
	j := &job{cfg: cfg, world: 4, rankHost: []int{0, 0, 1, 1}, rankEnded: make([]bool, 4), holders: [][]int{{2}, {3}, {0}, {1}},
		log: slog.New(slog.DiscardHandler), evlog: newEventLog(evs, slog.New(slog.DiscardHandler)), metrics: newMetrics(), status: &statusState{},
		tabChanged: make(chan struct{}), t0: time.Now(), stopping: true, rollbackT: -1}
	j.out = newOutputMux(io.Discard, io.Discard, 4, false, false, "")
	t.Cleanup(func() { j.out.close() })
	for i, n := range names {
		spare := n[0] == 's'
		h := &hostAgent{index: i, name: n, topo: topology.Host{Name: n, Slots: 2, Spare: spare}, spare: spare, registered: true}
		if !spare {
			h.ranks = []int{2 * i, 2*i + 1}
		}
		j.hosts = append(j.hosts, h)
	}
	var err error
	if j.m, err = hotswap.New(j.machineConfig()); err != nil {
		t.Fatal(err)
	}
	j.prog = newProgress(append([][]int{{0, 1}, {2, 3}}, make([][]int, len(names)-2)...), []int{0, 0, 1, 1}, func(*wire.GlobalStep) {})
	for h := range names {
		for _, a := range j.m.Step(0, hotswap.AgentRegistered{Host: h, Spare: h >= 2}) {
			j.statusAction(a)
		}
	}
	j.recordLaunch()
	if len(j.status.failures) != 0 {
		t.Fatalf("failures at the start: %+v", j.status.failures)
	}
	return j
}
