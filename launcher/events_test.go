package launcher

import (
	"bytes"
	"log/slog"
	"reflect"
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
			l.timeline(hotswap.Timeline{Epoch: 1, Cause: "host a lost", Detected: 1000 * ms, Classified: 1000 * ms, Replaced: 1100 * ms, Published: 1200 * ms, Restored: -1, Resumed: 1500 * ms})
		}, []events.Record{
			{T: 1, Event: events.Stage{Name: "detected", Epoch: 1, Cause: "host a lost"}},
			{T: 1, Event: events.Stage{Name: "classified", Epoch: 1, Cause: "host a lost"}},
			{T: 1.1, Event: events.Stage{Name: "replaced", Epoch: 1, Cause: "host a lost"}},
			{T: 1.2, Event: events.Stage{Name: "published", Epoch: 1, Cause: "host a lost"}},
			{T: 1.5, Event: events.Stage{Name: "resumed", Epoch: 1, Cause: "host a lost"}},
			{T: 1.5, Event: events.Timeline{Epoch: 1, Cause: "host a lost", Detected: ptrTo(1.0), Classified: ptrTo(1.0), Replaced: ptrTo(1.1), Published: ptrTo(1.2), Resumed: ptrTo(1.5)}},
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

// TestRecordFailure: the agents' events that tell of a failure get a
// failure record; a rank stopped by gorun, a clean exit, an exit of an
// older generation or a transient GPU report do not.
func TestRecordFailure(t *testing.T) {
	cases := []struct {
		name string
		e    wire.Event
		want *events.Failure
	}{
		{"exit code", wire.Event{Kind: wire.EventExited, Host: 1, Rank: 1, Code: 3, Msg: "bad"}, &events.Failure{Host: "b", Rank: 1, What: events.FailRankExit, Exit: ptrTo(3), Msg: "bad"}},
		{"signal", wire.Event{Kind: wire.EventExited, Host: 0, Rank: 0, Code: -1, Signal: int(syscall.SIGKILL)}, &events.Failure{Host: "a", Rank: 0, What: events.FailRankExit, Signal: "SIGKILL"}},
		{"clean exit", wire.Event{Kind: wire.EventExited, Host: 0, Rank: 0}, nil},
		{"stopped", wire.Event{Kind: wire.EventExited, Host: 0, Rank: 0, Code: -1, Signal: int(syscall.SIGTERM), Stopped: true}, nil},
		{"older generation", wire.Event{Kind: wire.EventExited, Host: 0, Rank: 0, Code: 1, Gen: 7}, nil},
		{"rank of another host", wire.Event{Kind: wire.EventExited, Host: 0, Rank: 1, Code: 1}, nil},
		{"agent error", wire.Event{Kind: wire.EventAgentError, Host: 1, Rank: -1, Msg: "no such program"}, &events.Failure{Host: "b", Rank: -1, What: events.FailAgent, Msg: "no such program"}},
		{"permanent gpu", wire.Event{Kind: wire.EventGPU, Host: 1, Rank: -1, GPU: &wire.GPUReport{Class: wire.GPUPermanent}, Msg: "xid 79"}, &events.Failure{Host: "b", Rank: -1, What: events.FailGPU, Msg: "xid 79"}},
		{"transient gpu", wire.Event{Kind: wire.EventGPU, Host: 1, Rank: -1, GPU: &wire.GPUReport{}}, nil},
		{"started", wire.Event{Kind: wire.EventStarted, Host: 0, Rank: 0}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			j := &job{world: 2, rankHost: []int{0, 1}, hosts: []*agentHost{{name: "a"}, {name: "b"}},
				evlog: newEventLog(&b, slog.New(slog.DiscardHandler)), t0: time.Now()}
			j.recordFailure(&c.e)
			recs, err := events.ReadAll(&b)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == nil && len(recs) != 0:
				t.Fatalf("records %+v, want none", recs)
			case c.want != nil && (len(recs) != 1 || !reflect.DeepEqual(recs[0].Event, *c.want)):
				t.Fatalf("records %+v, want %+v", recs, *c.want)
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
