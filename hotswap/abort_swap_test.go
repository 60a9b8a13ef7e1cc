package hotswap

import (
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// TestRankAbortedAroundSwap: an MPI_Abort that lands while a lost host is
// being replaced. Host b (ranks 2, 3) is lost and spliced with spare c;
// rank 1 on host a aborts with code 7.
//
//   - An abort in the recovery's epoch (after the splice, of the
//     generation then running) stops the job with its code, in both
//     recovery modes, as it would outside a recovery.
//   - An abort told before the host's loss, whose exit comes after it: in
//     place, the rank is not replaced by the splice and its exit stops the
//     job with 7; under restart, the splice's restart ends the whole
//     generation, the abort's among it, and the job goes on in the next
//     one (an MPICH rank aborts on the fatal error a lost peer causes, and
//     no order of reports tells that abort from a deliberate one: the host
//     loss, which every such abort follows, is the failure).
func TestRankAbortedAroundSwap(t *testing.T) {
	ms := time.Millisecond
	lost := AgentExited{Host: 1, Why: "lost"}
	notice := func(gen uint64) RankAborted {
		return RankAborted{Rank: 1, Host: 0, Pid: 42, Gen: gen, Code: 7, Msg: "called MPI_Abort with exit code 7"}
	}
	exit := func(gen uint64) RankExited {
		return RankExited{Rank: 1, Host: 0, Pid: 42, Gen: gen, Code: 7, Abort: true, Msg: "called MPI_Abort with exit code 7"}
	}
	peer := func(gen uint64) RankExited { return RankExited{Rank: 0, Host: 0, Gen: gen, Code: 1} }
	type at struct {
		t time.Duration
		e Event
	}
	cases := []struct {
		name    string
		rec     Recovery
		events  []at
		stopped bool
		code    int
		gen     uint64
	}{
		{"in place: abort in the recovery's epoch", RecoveryInPlace,
			[]at{{1000 * ms, lost}, {1100 * ms, notice(0)}, {1110 * ms, peer(0)}, {1400 * ms, Tick{}}, {1500 * ms, exit(0)}, {1800 * ms, Tick{}}},
			true, 7, 0},
		{"restart: abort of the restarted generation", RecoveryRestart,
			[]at{{1000 * ms, lost}, {1100 * ms, notice(1)}, {1110 * ms, peer(1)}, {1400 * ms, Tick{}}, {1500 * ms, exit(1)}, {1800 * ms, Tick{}}},
			true, 7, 1},
		{"in place: abort told, host lost, then the abort's exit", RecoveryInPlace,
			[]at{{1000 * ms, notice(0)}, {1010 * ms, lost}, {1020 * ms, peer(0)}, {1300 * ms, Tick{}}, {1500 * ms, exit(0)}, {1800 * ms, Tick{}}, {5000 * ms, Tick{}}},
			true, 7, 0},
		{"restart: abort told, host lost, then the abort's exit", RecoveryRestart,
			[]at{{1000 * ms, notice(0)}, {1010 * ms, lost}, {1020 * ms, peer(0)}, {1300 * ms, Tick{}}, {1500 * ms, exit(0)}, {1800 * ms, Tick{}}, {5000 * ms, Tick{}}},
			false, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(Config{World: 4, MaxRestarts: 3, Spares: 1, Recovery: c.rec, FailWindow: 250 * ms, HeartbeatTimeout: time.Hour,
				Hosts:  []topology.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}, {Name: "c", Slots: 2}},
				Assign: []int{0, 0, 1, 1}, Holders: [][]int{{2}, {3}, {0}, {1}}})
			if err != nil {
				t.Fatal(err)
			}
			for h := range 3 {
				m.Step(0, AgentRegistered{Host: h, Spare: h == 2})
			}
			m.Step(500*ms, GPublished{G: 2})
			spliced := false
			for _, x := range c.events {
				for _, a := range m.Step(x.t, x.e) {
					if s, ok := a.(Splice); ok && s.Lost == 1 && s.With == 2 {
						spliced = true
					}
				}
			}
			if !spliced {
				t.Fatal("host b was not spliced with spare c")
			}
			if m.stopped != c.stopped || m.ExitCode() != c.code || m.gen != c.gen {
				t.Fatalf("stopped %t, code %d, generation %d; want stopped %t, code %d, generation %d",
					m.stopped, m.ExitCode(), m.gen, c.stopped, c.code, c.gen)
			}
		})
	}
}

// TestGPublishedBeforeProgress: the launcher tells a new G (GPublished)
// before the Progress events of the report that raised it; a failure
// window that ends in between restarts the job from that G, rather than
// stopping it for an I4 violation (G past the ranks' reported steps),
// as it did.
func TestGPublishedBeforeProgress(t *testing.T) {
	ms := time.Millisecond
	m, err := New(Config{World: 4, MaxRestarts: 3, FailWindow: 250 * ms, HeartbeatTimeout: time.Hour,
		Hosts:  []topology.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}},
		Assign: []int{0, 0, 1, 1}, Holders: [][]int{{2}, {3}, {0}, {1}}})
	if err != nil {
		t.Fatal(err)
	}
	for h := range 2 {
		m.Step(0, AgentRegistered{Host: h})
	}
	for r := range 4 {
		m.Step(100*ms, Progress{Rank: r, Step: 5})
	}
	m.Step(100*ms, GPublished{G: 4})
	m.Step(1000*ms, RankExited{Rank: 1, Host: 0, Code: 1})
	m.Step(1249*ms, GPublished{G: 6})
	var restart *Restart
	for _, a := range m.Step(1250*ms, Progress{Rank: 0, Step: 6}) {
		if r, ok := a.(Restart); ok {
			restart = &r
		}
	}
	if m.stopped || restart == nil || restart.G != 6 {
		t.Fatalf("stopped %t (code %d), restart %+v; want a restart from G 6", m.stopped, m.ExitCode(), restart)
	}
}

// TestViolationI4: the I4 check itself (which the events as handled can
// no longer fail: a published G raises every rank's step) names the rank
// a resume step past its committed step would be, and a rank that never
// reported is not held to it.
func TestViolationI4(t *testing.T) {
	m, err := New(Config{World: 2, Hosts: []topology.Host{{Name: "a", Slots: 2}}, Assign: []int{0, 0}, HeartbeatTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m.g = 6
	m.lastStep = []int64{7, -1}
	if v := m.violation(nil); v != "" {
		t.Fatalf("G 6 with steps 7 and none: %q, want no violation", v)
	}
	m.lastStep = []int64{7, 5}
	if v, want := m.violation(nil), "I4: resume step 6 is past rank 1's committed step 5"; v != want {
		t.Fatalf("G 6 with steps 7 and 5: %q, want %q", v, want)
	}
}
