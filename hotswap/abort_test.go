package hotswap

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/topology"
)

// TestRankAborted: an MPI_Abort told before the rank's exit (RankAborted)
// is the job's failure, whatever its peers' failures reported before it,
// even once their failure window has passed, until something is decided:
// TestMPIMultiHost's abort across hosts ended the job with a peer's 1 when
// the aborting rank's exit came after the window. Its own exit then ends
// it without being a second failure; an abort of an older generation, or
// of a host the rank is not on, is ignored; an earlier abort stays; and
// MPI_Abort(comm, 0) ends the job with 0.
func TestRankAborted(t *testing.T) {
	ms := time.Millisecond
	type at struct {
		t time.Duration
		e Event
	}
	// Rank 1 (host a, pid 42) aborts; ranks 0 (a), 2 and 3 (b) are its
	// peers. The window is 250 ms.
	notice := func(code int) RankAborted {
		return RankAborted{Rank: 1, Host: 0, Pid: 42, Code: code, Msg: "called MPI_Abort with exit code " + strconv.Itoa(code) + ": it failed"}
	}
	exit := func(code int) RankExited {
		return RankExited{Rank: 1, Host: 0, Pid: 42, Code: code, Abort: true, Msg: "called MPI_Abort with exit code " + strconv.Itoa(code) + ": it failed"}
	}
	peer := func(r, code int) RankExited { return RankExited{Rank: r, Host: r / 2, Code: code} }
	cases := []struct {
		name     string
		restarts int
		events   []at
		stopped  bool
		code     int
		why      string // in the Abort's message
		failed   int    // the generation's failed ranks at the end
		failures int    // Failed actions
	}{
		{"peer first, abort after the window", 0,
			[]at{{1000 * ms, peer(0, 1)}, {1300 * ms, notice(7)}, {1400 * ms, exit(7)}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort with exit code 7: it failed; stopping the job", 2, 1},
		{"peer first, abort after the window, restarts left", 3,
			[]at{{1000 * ms, peer(0, 1)}, {1300 * ms, notice(7)}, {1400 * ms, exit(7)}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort with exit code 7: it failed; stopping the job", 2, 1},
		{"peers on both hosts first", 0,
			[]at{{1000 * ms, peer(2, 1)}, {1100 * ms, peer(0, 1)}, {1400 * ms, notice(7)}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort", 3, 1},
		{"peer killed by a signal first", 3,
			[]at{{1000 * ms, RankExited{Rank: 3, Host: 1, Code: -1, Signal: syscall.SIGKILL}}, {1100 * ms, notice(7)}, {1400 * ms, Tick{}}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort", 2, 1},
		{"abort with code 0 after a peer's 1", 0,
			[]at{{1000 * ms, peer(0, 1)}, {1300 * ms, notice(0)}, {1400 * ms, exit(0)}},
			true, 0, "rank 1 on host a (pid 42) called MPI_Abort with exit code 0", 2, 1},
		{"abort then its exit: one failure", 0,
			[]at{{1000 * ms, notice(7)}, {1100 * ms, exit(7)}, {1300 * ms, Tick{}}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort with exit code 7", 1, 1},
		{"abort, its exit, every peer's: decided at the last", 0,
			[]at{{1000 * ms, notice(7)}, {1010 * ms, exit(7)}, {1020 * ms, peer(0, 1)}, {1030 * ms, peer(2, 1)}, {1040 * ms, peer(3, 1)}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort with exit code 7", 4, 1},
		{"an earlier abort stays", 0,
			[]at{{1000 * ms, notice(7)}, {1100 * ms, RankAborted{Rank: 2, Host: 1, Code: 9}}, {1300 * ms, Tick{}}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort with exit code 7", 2, 1},
		{"an abort of an older generation", 1,
			[]at{{1000 * ms, peer(0, 3)}, {1300 * ms, Tick{}}, {2000 * ms, notice(7)}, {3000 * ms, Tick{}}},
			false, 0, "", 0, 1},
		{"an abort of another host", 0,
			[]at{{1000 * ms, RankAborted{Rank: 1, Host: 1, Code: 7}}, {2000 * ms, Tick{}}},
			false, 0, "", 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(Config{World: 4, MaxRestarts: c.restarts, FailWindow: 250 * ms, HeartbeatTimeout: time.Hour,
				Hosts: []topology.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}}, Assign: []int{0, 0, 1, 1}})
			if err != nil {
				t.Fatal(err)
			}
			for h := range 2 {
				m.Step(0, AgentRegistered{Host: h})
			}
			var aborts []Abort
			var failed []Failed
			for _, x := range c.events {
				for _, a := range m.Step(x.t, x.e) {
					switch a := a.(type) {
					case Abort:
						aborts = append(aborts, a)
					case Failed:
						failed = append(failed, a)
					}
				}
			}
			if m.stopped != c.stopped || m.stopped && m.ExitCode() != c.code {
				t.Fatalf("stopped %t with code %d (aborts %+v), want stopped %t with code %d", m.stopped, m.ExitCode(), aborts, c.stopped, c.code)
			}
			if len(failed) != c.failures {
				t.Errorf("Failed actions %+v, want %d", failed, c.failures)
			}
			if m.nFailed != c.failed {
				t.Errorf("%d failed ranks in the generation, want %d", m.nFailed, c.failed)
			}
			if !c.stopped {
				if len(aborts) > 0 {
					t.Errorf("aborted %+v, want no abort", aborts)
				}
				return
			}
			if len(aborts) != 1 || !strings.Contains(aborts[0].Msg, c.why) {
				t.Fatalf("aborts %+v, want one saying %q", aborts, c.why)
			}
			if f := failed[len(failed)-1]; f.Rank != 1 || f.Code != c.code || f.Decision != DecisionAbort || f.Class != ClassRankExit {
				t.Errorf("Failed %+v, want rank 1's abort with code %d", f, c.code)
			}
		})
	}
}
