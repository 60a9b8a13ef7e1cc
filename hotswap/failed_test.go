package hotswap

import (
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// TestFailedOnePerIncident: every failure the machine decides on is one
// Failed action, before the decision's actions, with its class, decision,
// the epoch it started, the machine's reason and when the failure was
// first seen (the first of a window's rank failures); the fault's consequences
// (the ranks a lost host takes with it, the agent's exit after a GPU
// fault) are no further Failed.
func TestFailedOnePerIncident(t *testing.T) {
	s := time.Second
	cases := []struct {
		name    string
		restart int
		gap     time.Duration // between events; 0: 20 s
		events  []Event
		want    []Failed // Why only checked non-empty
	}{
		{"agent failed", 1, 0, []Event{AgentExited{Host: 1, Why: "it failed: boom"}, AgentExited{Host: 1, Why: "gone"},
			RankExited{Rank: 1, Host: 1, Code: 1}},
			[]Failed{{Host: 1, Name: "b", Rank: -1, Class: ClassHostLoss, Agent: true, Decision: DecisionSplice, Epoch: 1, Detected: 20 * s}}},
		{"gpu permanent then its agent", 1, 0, []Event{GPUHealth{Host: 1, GPU: 0, Class: GPUPermanent, Msg: "xid 79"}, AgentExited{Host: 1, Why: "fenced"}},
			[]Failed{{Host: 1, Name: "b", Rank: -1, Class: ClassGPUPermanent, Decision: DecisionSplice, Epoch: 1, Detected: 20 * s}}},
		{"hang, no restart", 0, 0, []Event{Progress{Rank: 0, Step: 1}, Progress{Rank: 1, Step: 1}, Tick{}},
			[]Failed{{Host: 0, Name: "a", Rank: 0, Class: ClassHang, Decision: DecisionAbort, Code: ExitTimeout, Detected: 60 * s}}},
		{"hang, restart", 1, 0, []Event{Progress{Rank: 0, Step: 1}, Progress{Rank: 1, Step: 1}, Tick{}},
			[]Failed{{Host: 0, Name: "a", Rank: 0, Class: ClassHang, Decision: DecisionRestart, Epoch: 1, Code: ExitTimeout, Detected: 60 * s}}},
		{"killed rank and its peer", 1, 100 * time.Millisecond, []Event{RankExited{Rank: 0, Host: 0, Code: 1}, RankExited{Rank: 1, Host: 1, Code: -1, Signal: syscall.SIGKILL}},
			[]Failed{{Host: 1, Name: "b", Rank: 1, Class: ClassRankExit, Decision: DecisionRestart, Epoch: 1, Code: -1, Signal: syscall.SIGKILL, Detected: 100 * time.Millisecond}}},
		{"spare lost", 1, 0, []Event{AgentExited{Host: 2, Why: "gone"}},
			[]Failed{{Host: 2, Name: "s", Rank: -1, Class: ClassHostLoss, Agent: true, Decision: DecisionNone, Detected: 20 * s}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(Config{World: 2, MaxRestarts: c.restart, HangTimeout: 10 * s, HeartbeatTimeout: time.Hour,
				FailWindow: s, Hosts: []topology.Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}, {Name: "s", Slots: 1, Spare: true}},
				Assign: []int{0, 1}, Holders: [][]int{{1}, {0}}})
			if err != nil {
				t.Fatal(err)
			}
			for h := range 3 {
				m.Step(0, AgentRegistered{Host: h, Spare: h == 2})
			}
			gap := c.gap
			if gap == 0 {
				gap = 20 * s
			}
			var got []Failed
			for i, e := range c.events {
				acts := m.Step(time.Duration(i+1)*gap, e)
				for j, a := range acts {
					if f, ok := a.(Failed); ok {
						if j > 0 {
							t.Errorf("Failed after %v: want it first", acts[:j])
						}
						got = append(got, f)
					}
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("Failed actions %+v, want %+v", got, c.want)
			}
			for i := range got {
				if got[i].Why == "" {
					t.Errorf("%+v: no Why", got[i])
				}
				got[i].Why = ""
				if got[i] != c.want[i] {
					t.Errorf("Failed %+v, want %+v", got[i], c.want[i])
				}
			}
			if f := got[len(got)-1]; f.Epoch > 0 {
				if tl, ok := m.OpenTimeline(); !ok || tl.Epoch != f.Epoch || tl.Detected != f.Detected {
					t.Errorf("open timeline %+v, %v: want epoch %d detected at %v, as its failure", tl, ok, f.Epoch, f.Detected)
				}
			}
		})
	}
}

// TestOpenTimeline: a recovery epoch not resumed yet is the machine's
// open timeline, unfinished, with its stages so far; none once it
// resumed.
func TestOpenTimeline(t *testing.T) {
	m, err := New(Config{World: 2, Hosts: []topology.Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}, {Name: "s", Slots: 1, Spare: true}},
		Assign: []int{0, 1}, Holders: [][]int{{1}, {0}}, HeartbeatTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for h := range 3 {
		m.Step(0, AgentRegistered{Host: h, Spare: h == 2})
	}
	if _, ok := m.OpenTimeline(); ok {
		t.Fatal("an open timeline before any failure")
	}
	m.Step(time.Second, AgentExited{Host: 1, Why: "gone"})
	m.Step(2*time.Second, RecoveryReport{Epoch: 1, Stage: StagePublished})
	tl, ok := m.OpenTimeline()
	if !ok || !tl.Unfinished || tl.Epoch != 1 || tl.Detected != time.Second || tl.Replaced != time.Second || tl.Published != 2*time.Second || tl.Resumed != -1 {
		t.Fatalf("open timeline %+v, %v: want epoch 1 unfinished, detected and replaced at 1s, published at 2s, not resumed", tl, ok)
	}
	m.Step(3*time.Second, RecoveryReport{Epoch: 1, Stage: StageResumed})
	if tl, ok := m.OpenTimeline(); ok {
		t.Fatalf("open timeline %+v after the resume", tl)
	}
}

// TestHangNamesRankBehind: of the ranks without progress for the hang
// timeout, the one that reported the lowest step is named hung, not the
// one whose last report arrived first (a stopped rank's peers block in
// its collective, and their reports race its own); on a tie, the one
// whose progress is oldest.
func TestHangNamesRankBehind(t *testing.T) {
	s := time.Second
	cases := []struct {
		name   string
		events []Event
		at     []time.Duration
		want   int
	}{
		{"lowest step, reported last", []Event{Progress{Rank: 1, Step: 6}, Progress{Rank: 0, Step: 5}}, []time.Duration{s, 2 * s}, 0},
		{"lowest step, reported first", []Event{Progress{Rank: 0, Step: 5}, Progress{Rank: 1, Step: 6}}, []time.Duration{s, 2 * s}, 0},
		{"tie: oldest progress", []Event{Progress{Rank: 1, Step: 5}, Progress{Rank: 0, Step: 5}}, []time.Duration{s, 2 * s}, 1},
		// Steps reported before a restart do not count: rank 0 was ahead
		// then, and is behind now.
		{"after a restart", []Event{Progress{Rank: 0, Step: 10}, Progress{Rank: 1, Step: 8}, Tick{},
			RecoveryReport{Epoch: 1, Stage: StageResumed}, Progress{Rank: 1, Step: 6}, Progress{Rank: 0, Step: 5}},
			[]time.Duration{s, s, 12 * s, 13 * s, 14 * s, 15 * s}, 0},
		// Rank 0, ahead before the restart, reports nothing after it: it
		// is at the generation's start, behind rank 1's step 9.
		{"after a restart, silent rank", []Event{Progress{Rank: 0, Step: 10}, Progress{Rank: 1, Step: 8}, Tick{},
			RecoveryReport{Epoch: 1, Stage: StageResumed}, Progress{Rank: 1, Step: 9}},
			[]time.Duration{s, s, 12 * s, 13 * s, 14 * s}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(Config{World: 2, MaxRestarts: 1, HangTimeout: 10 * s, HeartbeatTimeout: time.Hour,
				Hosts:  []topology.Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}},
				Assign: []int{0, 1}, Holders: [][]int{{1}, {0}}})
			if err != nil {
				t.Fatal(err)
			}
			for h := range 2 {
				m.Step(0, AgentRegistered{Host: h})
			}
			for i, e := range c.events {
				m.Step(c.at[i], e)
			}
			var got []Failed
			for _, a := range m.Step(30*s, Tick{}) {
				if f, ok := a.(Failed); ok {
					got = append(got, f)
				}
			}
			if len(got) != 1 || got[0].Rank != c.want || got[0].Class != ClassHang {
				t.Fatalf("Failed actions %+v, want one hang of rank %d", got, c.want)
			}
		})
	}
}
