package launcher

import (
	"bytes"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/internal/events"
	"github.com/gorun/gorun/internal/wire"
)

func ptrTo[T any](v T) *T { return &v }

// TestEventLogRoundTrip writes every kind of record through the
// launcher's eventLog and reads the file back with events.Reader: the
// same records, in order, at the same times.
func TestEventLogRoundTrip(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		write func(l *eventLog)
		want  []events.Record
	}{
		{"launch", func(l *eventLog) {
			l.record(0, events.Launch{Schema: events.SchemaVersion, Job: "j1", NP: 2, Hosts: []events.LaunchHost{{Name: "a", Role: events.RoleRunning, Ranks: []int{0, 1}}, {Name: "s", Role: events.RoleSpare, Ranks: []int{}}}, Spares: 1, Redundancy: "replicas:1", Protect: "full", Recovery: "restart", Program: []string{"p", "<arg>"}})
		}, []events.Record{{T: 0, Event: events.Launch{Schema: events.SchemaVersion, Job: "j1", NP: 2, Hosts: []events.LaunchHost{{Name: "a", Role: events.RoleRunning, Ranks: []int{0, 1}}, {Name: "s", Role: events.RoleSpare, Ranks: []int{}}}, Spares: 1, Redundancy: "replicas:1", Protect: "full", Recovery: "restart", Program: []string{"p", "<arg>"}}}}},
		{"rendezvous", func(l *eventLog) { l.record(40*ms, events.Rendezvous{Registered: 3, Took: 0.04}) },
			[]events.Record{{T: 0.04, Event: events.Rendezvous{Registered: 3, Took: 0.04}}}},
		{"sample", func(l *eventLog) {
			l.record(time.Second, events.Sample{Epoch: 1, G: 4, D: ptrTo(int64(2)), Rate: 12.5, Min: []int64{4, -1}, Max: []int64{5, -1}, Wait: []float64{0.25, 0}, ReplBytes: []int64{1000, 0}, Stages: []int64{10, 0}})
		}, []events.Record{{T: 1, Event: events.Sample{Epoch: 1, G: 4, D: ptrTo(int64(2)), Rate: 12.5, Min: []int64{4, -1}, Max: []int64{5, -1}, Wait: []float64{0.25, 0}, ReplBytes: []int64{1000, 0}, Stages: []int64{10, 0}}}}},
		{"failure", func(l *eventLog) {
			l.record(2*time.Second, events.Failure{Host: "a", Rank: 1, What: events.FailRankExit, Signal: "SIGKILL"})
		}, []events.Record{{T: 2, Event: events.Failure{Host: "a", Rank: 1, What: events.FailRankExit, Signal: "SIGKILL"}}}},
		{"fence", func(l *eventLog) { l.record(time.Second, evFence{Host: "a"}) },
			[]events.Record{{T: 1, Event: events.Fence{Host: "a"}}}},
		{"splice", func(l *eventLog) {
			l.record(time.Second, evSplice{Epoch: 1, Lost: "a", With: "s", Ranks: []int{0, 1}, Spare: true})
		}, []events.Record{{T: 1, Event: events.Splice{Epoch: 1, Lost: "a", With: "s", Ranks: []int{0, 1}, Spare: true}}}},
		{"restart", func(l *eventLog) { l.record(time.Second, evRestart{Epoch: 1, Gen: 1, G: -1}) },
			[]events.Record{{T: 1, Event: events.Restart{Epoch: 1, Gen: 1, G: -1}}}},
		{"publish", func(l *eventLog) { l.record(time.Second, evPublish{Epoch: 1, Gen: 1, G: 3, Restore: 2}) },
			[]events.Record{{T: 1, Event: events.Publish{Epoch: 1, Gen: 1, G: 3, Restore: 2}}}},
		{"under-protected", func(l *eventLog) { l.record(time.Second, evUnder{Epoch: 1, Owners: []int{1}}) },
			[]events.Record{{T: 1, Event: events.UnderProtected{Epoch: 1, Owners: []int{1}}}}},
		{"protected", func(l *eventLog) { l.record(time.Second, evProtected{}) },
			[]events.Record{{T: 1, Event: events.Protected{}}}},
		{"abort", func(l *eventLog) { l.record(time.Second, evAbort{Code: 1, Msg: "no spare"}) },
			[]events.Record{{T: 1, Event: events.Abort{Code: 1, Msg: "no spare"}}}},
		{"timeline", func(l *eventLog) {
			l.timeline(hotswap.Timeline{Epoch: 1, Cause: "host a lost", Detected: 1000 * ms, Classified: 1000 * ms, Replaced: 1100 * ms, Published: 1200 * ms, Restored: -1, Resumed: 1500 * ms}, 1500*ms)
		}, []events.Record{
			{T: 1, Event: events.Stage{Name: "detected", Epoch: 1, Cause: "host a lost"}},
			{T: 1, Event: events.Stage{Name: "classified", Epoch: 1, Cause: "host a lost"}},
			{T: 1.1, Event: events.Stage{Name: "replaced", Epoch: 1, Cause: "host a lost"}},
			{T: 1.2, Event: events.Stage{Name: "published", Epoch: 1, Cause: "host a lost"}},
			{T: 1.5, Event: events.Stage{Name: "resumed", Epoch: 1, Cause: "host a lost"}},
			{T: 1.5, Event: events.Timeline{Epoch: 1, Cause: "host a lost", Detected: ptrTo(1.0), Classified: ptrTo(1.0), Replaced: ptrTo(1.1), Published: ptrTo(1.2), Resumed: ptrTo(1.5)}},
		}},
		// A superseded epoch's record is written when the failure that
		// ended it is, not back at its last stage.
		{"superseded timeline", func(l *eventLog) {
			l.timeline(hotswap.Timeline{Epoch: 1, Cause: "c", Detected: 1000 * ms, Classified: 1000 * ms, Replaced: -1, Published: -1, Restored: -1, Resumed: -1, Superseded: true}, 2*time.Second)
		}, []events.Record{
			{T: 1, Event: events.Stage{Name: "detected", Epoch: 1, Cause: "c"}},
			{T: 1, Event: events.Stage{Name: "classified", Epoch: 1, Cause: "c"}},
			{T: 2, Event: events.Timeline{Epoch: 1, Cause: "c", Superseded: true, Detected: ptrTo(1.0), Classified: ptrTo(1.0)}},
		}},
		{"unfinished timeline", func(l *eventLog) {
			l.timeline(hotswap.Timeline{Epoch: 2, Cause: "c", Detected: 1000 * ms, Classified: 1000 * ms, Replaced: -1, Published: 1200 * ms, Restored: -1, Resumed: -1, Unfinished: true}, 3*time.Second)
		}, []events.Record{
			{T: 1, Event: events.Stage{Name: "detected", Epoch: 2, Cause: "c"}},
			{T: 1, Event: events.Stage{Name: "classified", Epoch: 2, Cause: "c"}},
			{T: 1.2, Event: events.Stage{Name: "published", Epoch: 2, Cause: "c"}},
			{T: 3, Event: events.Timeline{Epoch: 2, Cause: "c", Unfinished: true, Detected: ptrTo(1.0), Classified: ptrTo(1.0), Published: ptrTo(1.2)}},
		}},
		{"exit", func(l *eventLog) { l.record(3*time.Second, events.Exit{Code: 143, Reason: "interrupted", Duration: 3}) },
			[]events.Record{{T: 3, Event: events.Exit{Code: 143, Reason: "interrupted", Duration: 3}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			l := newEventLog(&b, slog.New(slog.DiscardHandler))
			c.write(l)
			got, err := events.ReadAll(&b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("read back\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
}

// TestProgressSample: a sample has per-host arrays in the hosts' order,
// -1 steps for a host without ranks, sums of the hosts' ranks' figures.
func TestProgressSample(t *testing.T) {
	p := newProgress([][]int{{0, 1}, {2}, {}}, []int{0, 0, 1}, func(*wire.GlobalStep) {})
	for _, u := range []*wire.UpProgress{
		{Host: 0, Ranks: []wire.RankProgress{{Rank: 0, Committed: 7, Replicated: 6, Stages: 8, WaitNS: 250e6, ReplBytes: 100}, {Rank: 1, Committed: 5, Replicated: 5, Stages: 6, WaitNS: 250e6, ReplBytes: 50}}},
		{Host: 1, Ranks: []wire.RankProgress{{Rank: 2, Committed: 6, Replicated: 6, Stages: 7}}},
	} {
		if err := p.handle(u); err != nil {
			t.Fatal(err)
		}
	}
	got := p.sample()
	want := events.Sample{G: 5, Min: []int64{5, 6, -1}, Max: []int64{7, 6, -1}, Wait: []float64{0.5, 0, 0}, ReplBytes: []int64{150, 0, 0}, Stages: []int64{14, 7, 0}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sample %+v, want %+v", got, want)
	}
}

// TestRecordFailed: the machine's Failed actions become failure records
// with the machine's reason (msg), class, decision, epoch and detection
// time (detected: when it was first seen, which gorun status shows, not
// the record's t, when it was decided on); what says how it was seen (a
// hang is "hang", an agent's exit "agent-failed").
func TestRecordFailed(t *testing.T) {
	cases := []struct {
		name string
		a    hotswap.Failed
		want events.Failure
	}{
		{"exit code", hotswap.Failed{Host: 1, Name: "b", Rank: 1, Class: hotswap.ClassRankExit, Decision: hotswap.DecisionRestart, Epoch: 1, Code: 3, Why: "rank 1 exited with code 3", Detected: 1500 * time.Millisecond},
			events.Failure{Host: "b", Rank: 1, What: events.FailRankExit, Exit: ptrTo(3), Msg: "rank 1 exited with code 3", Class: "rank-exit", Decision: "restart", Epoch: 1, Detected: ptrTo(1.5)}},
		{"suspected, decided later", hotswap.Failed{Host: 1, Name: "b", Rank: -1, Class: hotswap.ClassHostLoss, Decision: hotswap.DecisionSplice, Epoch: 1, Why: "suspicion not cleared", Detected: 250 * time.Millisecond},
			events.Failure{Host: "b", Rank: -1, What: events.FailHostLost, Msg: "suspicion not cleared", Class: "host-loss", Decision: "splice", Epoch: 1, Detected: ptrTo(0.25)}},
		{"signal", hotswap.Failed{Host: 0, Name: "a", Rank: 0, Class: hotswap.ClassRankExit, Decision: hotswap.DecisionAbort, Code: -1, Signal: syscall.SIGKILL, Why: "killed"},
			events.Failure{Host: "a", Rank: 0, What: events.FailRankExit, Signal: "SIGKILL", Msg: "killed", Class: "rank-exit", Decision: "abort", Detected: ptrTo(0.0)}},
		{"hang", hotswap.Failed{Host: 0, Name: "a", Rank: 0, Class: hotswap.ClassHang, Decision: hotswap.DecisionAbort, Code: hotswap.ExitTimeout, Why: "no progress"},
			events.Failure{Host: "a", Rank: 0, What: events.FailHang, Msg: "no progress", Class: "hang", Decision: "abort", Detected: ptrTo(0.0)}},
		{"agent", hotswap.Failed{Host: 1, Name: "b", Rank: -1, Class: hotswap.ClassHostLoss, Agent: true, Decision: hotswap.DecisionSplice, Epoch: 2, Why: "its agent exited: boom"},
			events.Failure{Host: "b", Rank: -1, What: events.FailAgent, Msg: "its agent exited: boom", Class: "host-loss", Decision: "splice", Epoch: 2, Detected: ptrTo(0.0)}},
		{"heartbeat", hotswap.Failed{Host: 1, Name: "b", Rank: -1, Class: hotswap.ClassHostLoss, Decision: hotswap.DecisionSplice, Epoch: 1, Why: "no heartbeat for 3s"},
			events.Failure{Host: "b", Rank: -1, What: events.FailHostLost, Msg: "no heartbeat for 3s", Class: "host-loss", Decision: "splice", Epoch: 1, Detected: ptrTo(0.0)}},
		{"gpu", hotswap.Failed{Host: 1, Name: "b", Rank: -1, Class: hotswap.ClassGPUPermanent, Decision: hotswap.DecisionNone, Why: "GPU 0 permanent fault"},
			events.Failure{Host: "b", Rank: -1, What: events.FailGPU, Msg: "GPU 0 permanent fault", Class: "gpu-permanent", Decision: "none", Detected: ptrTo(0.0)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			j := &job{evlog: newEventLog(&b, slog.New(slog.DiscardHandler)), t0: time.Now()}
			j.recordFailed(c.a)
			recs, err := events.ReadAll(&b)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 1 || !reflect.DeepEqual(recs[0].Event, c.want) {
				t.Fatalf("records %+v, want %+v", recs, c.want)
			}
		})
	}
}

// TestEventsTwoLossesInOneStep: two hosts lost in one step of the machine
// (both heartbeats time out in one tick) are two splice records, each
// with its own epoch, and each loss's under-protected record has the
// epoch of its splice, as the failure records do. Before the fix both
// splices (and both under-protected records) had the machine's epoch
// after the step, the second loss's.
func TestEventsTwoLossesInOneStep(t *testing.T) {
	var b bytes.Buffer
	twoLossJob(t, func(j *job) {
		j.holders = [][]int{{1}, {2}, {0}} // rank r's copy on rank r+1's host
		j.evlog = newEventLog(&b, slog.New(slog.DiscardHandler))
		j.stopping = true // splice moves the tables, and starts nothing
	}, func(j *job, a hotswap.Action) {
		switch a.(type) {
		case hotswap.Splice, hotswap.UnderProtected, hotswap.Failed:
			j.do(a)
		}
	})
	recs, err := events.ReadAll(&b)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		switch e := r.Event.(type) {
		case events.Failure:
			got = append(got, fmt.Sprintf("failure %s epoch %d", e.Host, e.Epoch))
		case events.Splice:
			got = append(got, fmt.Sprintf("splice %s epoch %d", e.Lost, e.Epoch))
		case events.UnderProtected:
			got = append(got, fmt.Sprintf("under-protected %v epoch %d", e.Owners, e.Epoch))
		}
	}
	want := []string{"failure h1 epoch 1", "splice h1 epoch 1", "under-protected [0] epoch 1",
		"failure h2 epoch 2", "splice h2 epoch 2", "under-protected [0 1] epoch 2"}
	if !slices.Equal(got, want) {
		t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestEventsHang: a rank that hangs (--hang-timeout) has its failure
// record, class hang, with the machine's reason; with a restart allowed
// and the job stopped before the restarted rank resumes, the recovery
// epoch's stages and its timeline, unfinished, are written before exit.
func TestEventsHang(t *testing.T) {
	for _, c := range []struct {
		name     string
		restarts int
		want     []string
	}{
		{"no restart", 0, []string{"launch", "rendezvous", "failure", "abort", "exit"}},
		{"restart", 1, []string{"launch", "rendezvous", "failure", "restart", "publish", "detected", "classified", "timeline", "exit"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			evs := &syncBuffer{}
			jobs := make(chan *job, 1)
			r := startRun(t, 1, `echo up; exec env -u GORUN_JOB_ID sleep 600`, func(cfg *Config) {
				cfg.Events = evs
				cfg.HangTimeout = time.Second
				cfg.MaxRestarts = c.restarts
				cfg.KillGrace = time.Second
				cfg.running = func(j *job) { jobs <- j }
			})
			j := <-jobs
			r.waitLines(regexp.MustCompile(`(?m)^\[0\] up$`), 1)
			j.progress <- &wire.UpProgress{Host: 0, Ranks: []wire.RankProgress{{Rank: 0, Committed: 1}}}
			if c.restarts > 0 {
				waitUntil(t, r, "restart in --events", func() bool { return strings.Contains(evs.String(), `"event":"restart"`) })
				r.signals <- syscall.SIGTERM
			}
			r.wait()
			recs := checkRecordOrder(t, evs.String(), c.want...)
			var fails []events.Failure
			var tl *events.Timeline
			for _, rec := range recs {
				switch e := rec.Event.(type) {
				case events.Failure:
					fails = append(fails, e)
				case events.Timeline:
					tl = &e
				}
			}
			decision := "abort"
			if c.restarts > 0 {
				decision = "restart"
			}
			if len(fails) != 1 || fails[0].What != events.FailHang || fails[0].Class != "hang" || fails[0].Decision != decision || fails[0].Rank != 0 || !strings.Contains(fails[0].Msg, "made no progress") {
				t.Errorf("failure records %+v: want one, hang of rank 0, decision %s, with its reason", fails, decision)
			}
			if c.restarts > 0 && (tl == nil || !tl.Unfinished || tl.Epoch != 1 || tl.Resumed != nil || fails[0].Epoch != 1) {
				t.Errorf("timeline %+v, failure epoch %d: want epoch 1's, unfinished, not resumed", tl, fails[0].Epoch)
			}
		})
	}
}

// checkRecordOrder reads an --events record with events.Reader (it must
// read without error) and checks that its kinds include want in that
// order, launch first and exit last.
func checkRecordOrder(t *testing.T, s string, want ...string) []events.Record {
	t.Helper()
	recs, err := events.ReadAll(strings.NewReader(s))
	if err != nil {
		t.Fatalf("reading --events: %v\n%s", err, s)
	}
	kinds := make([]string, len(recs))
	for i, r := range recs {
		kinds[i] = r.Event.Kind()
	}
	if len(kinds) == 0 || kinds[0] != "launch" || kinds[len(kinds)-1] != "exit" {
		t.Errorf("--events kinds %v: want launch first and exit last", kinds)
	}
	i := 0
	for _, k := range kinds {
		if i < len(want) && k == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Errorf("--events kinds %v do not have %v in order (missing %q)", kinds, want, want[i])
	}
	if l, ok := recs[0].Event.(events.Launch); ok && (l.Schema != events.SchemaVersion || l.Job == "") {
		t.Errorf("launch record %+v: want schema %d and a job id", l, events.SchemaVersion)
	}
	return recs
}

// TestEventsAgentErrorOneFailure: an agent's error in a job with a spare
// is one failure record (not agent-failed and then host-lost for the
// same host), with the agent's words; the recovery it starts, stopped
// before it resumes, is written at exit with its stages, unfinished.
func TestEventsAgentErrorOneFailure(t *testing.T) {
	r, j, evs := startSpareJob(t)
	for h := range 2 {
		j.progress <- &wire.UpProgress{Host: h, Ranks: []wire.RankProgress{{Rank: h, Committed: 5, Replicated: 5}}}
	}
	waitUntil(t, r, "G = 5", func() bool { return j.prog.G() == 5 })
	j.events <- &wire.Event{Kind: wire.EventAgentError, Host: 1, Rank: -1, Msg: "boom"}
	waitUntil(t, r, "published epoch in --events", func() bool { return strings.Contains(evs.String(), `"event":"publish"`) })
	r.signals <- syscall.SIGTERM
	r.wait()
	recs := checkRecordOrder(t, evs.String(), "launch", "rendezvous", "failure", "fence", "splice", "publish", "detected", "classified", "replaced", "timeline", "exit")
	var fails []events.Failure
	var tl *events.Timeline
	for _, rec := range recs {
		switch e := rec.Event.(type) {
		case events.Failure:
			fails = append(fails, e)
		case events.Timeline:
			tl = &e
		}
	}
	if len(fails) != 1 || fails[0].Host != "127.0.0.2" || fails[0].What != events.FailAgent || fails[0].Class != "host-loss" ||
		fails[0].Decision != "splice" || fails[0].Epoch != 1 || !strings.Contains(fails[0].Msg, "boom") {
		t.Errorf("failure records %+v: want one, agent-failed on 127.0.0.2, host-loss, splice, epoch 1, saying boom", fails)
	}
	if tl == nil || tl.Epoch != 1 || !tl.Unfinished || tl.Resumed != nil || tl.Replaced == nil {
		t.Errorf("timeline %+v: want epoch 1, replaced, not resumed, unfinished", tl)
	}
}

// TestEventsExitSignal: a job stopped by SIGTERM ends its events file
// with an exit record that says so (the machine's stop carries no
// message; the reason was empty).
func TestEventsExitSignal(t *testing.T) {
	evs := &syncBuffer{}
	r := startRun(t, 1, `echo up; exec sleep 600`, func(cfg *Config) {
		cfg.Events = evs
		cfg.KillGrace = time.Second
	})
	r.waitLines(regexp.MustCompile(`(?m)^\[0\] up$`), 1)
	r.signals <- syscall.SIGTERM
	r.wait()
	recs := checkRecordOrder(t, evs.String(), "launch", "exit")
	e, _ := recs[len(recs)-1].Event.(events.Exit)
	if e.Code != 128+int(syscall.SIGTERM) || e.Reason != "interrupted by SIGTERM" {
		t.Errorf("exit record %+v: want code 143, reason %q", e, "interrupted by SIGTERM")
	}
}
