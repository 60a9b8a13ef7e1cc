package launcher

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// TestOnUpTakesOnlyTheSubjectsHost: the launcher takes a message as the
// word of the host whose subject it came on (the server lets each agent
// publish only there), and drops one that speaks for another host or for
// another host's rank.
func TestOnUpTakesOnlyTheSubjectsHost(t *testing.T) {
	subj := wire.JobSubjects("upjob")
	h0, h1 := subj.ForHost(0), subj.ForHost(1)
	frame := func(host, rank int) []byte {
		f := wire.NewOutputFrame(host)
		f.Add(rank, wire.Stdout, []byte("forged line\n"))
		return bytes.Clone(f.Bytes())
	}
	tests := []struct {
		name    string
		subject string
		data    []byte
		taken   bool
	}{
		{"own event", h0.Events, wire.Marshal(&wire.Event{Kind: wire.EventExited, Host: 0, Rank: 0}), true},
		{"own host event", h0.Events, wire.Marshal(&wire.Event{Kind: wire.EventAgentDone, Host: 0, Rank: -1}), true},
		{"event naming another host", h0.Events, wire.Marshal(&wire.Event{Kind: wire.EventAgentError, Host: 1, Rank: -1}), false},
		{"event of another host's rank", h0.Events, wire.Marshal(&wire.Event{Kind: wire.EventExited, Host: 0, Rank: 1, Code: 1}), false},
		{"own heartbeat", h1.Heartbeat, wire.Marshal(&wire.Heartbeat{Host: 1}), true},
		{"heartbeat naming another host", h0.Heartbeat, wire.Marshal(&wire.Heartbeat{Host: 1}), false},
		{"own output", h1.Output, frame(1, 1), true},
		{"output naming another host", h0.Output, frame(1, 1), false},
		{"output of another host's rank", h0.Output, frame(0, 1), false},
		{"progress naming another host", h0.Progress, wire.Marshal(&wire.UpProgress{Host: 1}), false},
		{"own resume reach", h1.Resume, wire.Marshal(&wire.ResumeReach{Host: 1, Base: 3, Ranks: []wire.ResumeRank{{Rank: 1, To: 5}}}), true},
		{"resume reach naming another host", h0.Resume, wire.Marshal(&wire.ResumeReach{Host: 1, Base: 3, Ranks: []wire.ResumeRank{{Rank: 1, To: 5}}}), false},
		{"malformed resume reach", h0.Resume, []byte(`{"host":0,"base":-2}`), false},
		{"unknown host", "gorun.upjob.up.7.hb", wire.Marshal(&wire.Heartbeat{Host: 7}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, logs bytes.Buffer
			j := &job{
				log: slog.New(slog.NewTextHandler(&logs, nil)), id: "upjob", subj: subj, world: 2,
				hosts:    []*hostAgent{{index: 0, name: "a", ranks: []int{0}}, {index: 1, name: "b", ranks: []int{1}}},
				rankHost: []int{0, 1}, events: make(chan *wire.Event, 4), quit: make(chan struct{}),
				beats: make(chan int, 4), progress: make(chan *wire.UpProgress, 4), resumes: make(chan *wire.ResumeReach, 4),
			}
			j.out = newOutputMux(&stdout, &stdout, 2, true, false, "")
			j.out.owns = j.owns
			j.prog = newProgress([][]int{{0}, {1}}, j.rankHost, func(*wire.GlobalStep) {})
			j.onUp(&nats.Msg{Subject: tt.subject, Data: tt.data})
			j.out.close()
			taken := len(j.events) > 0 || stdout.Len() > 0 || j.hosts[0].lastSeen.Load() != 0 || j.hosts[1].lastSeen.Load() != 0 || len(j.resumes) > 0
			if taken != tt.taken {
				t.Errorf("taken = %v, want %v (events %d, output %q, logs %s)", taken, tt.taken, len(j.events), stdout.String(), logs.String())
			}
			if !tt.taken && !strings.Contains(logs.String(), "WARN") {
				t.Errorf("a dropped message was not logged: %s", logs.String())
			}
		})
	}
}
