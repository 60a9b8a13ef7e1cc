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
// makes the failure window's decision wait for that exit, at most
// abortExitWait: TestMPIMultiHost's abort across hosts ended the job with
// a peer's 1 when the aborting rank's exit came after the window. The
// exit then counts as inside the window (a signaled failure, an abort
// among them, takes the place of one that is not); the notice itself is
// no failure: an abort that follows a crash (MPICH aborts on a fatal
// error such as a dead peer) does not take the crash's place, and the job
// restarts as it would without the notice. An abort of an older
// generation, or of a host the rank is not on, makes nothing wait; a
// notice whose exit never comes is waited for abortExitWait only; and
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
	peerAbort := func(r, code int) RankExited {
		return RankExited{Rank: r, Host: r / 2, Code: code, Abort: true, Msg: "Fatal error in internal_Init"}
	}
	crash := RankExited{Rank: 1, Host: 0, Pid: 42, Code: -1, Signal: syscall.SIGSEGV}
	const abortMsg7 = "rank 1 on host a (pid 42) called MPI_Abort with exit code 7: it failed; stopping the job"
	cases := []struct {
		name     string
		restarts int
		events   []at
		stopped  bool
		code     int
		why      string // in the Abort's message
		blamed   int    // the rank the last Failed names (-1: no Failed)
		failed   int    // the generation's failed ranks at the end
		restart  bool   // a Restart was decided
	}{
		{"notice, peer, window passes, then the abort's exit", 0,
			[]at{{1000 * ms, notice(7)}, {1010 * ms, peer(0, 1)}, {1300 * ms, Tick{}}, {1400 * ms, Tick{}}, {1500 * ms, exit(7)}},
			true, 7, abortMsg7, 1, 2, false},
		{"the same with restarts left", 3,
			[]at{{1000 * ms, notice(7)}, {1010 * ms, peer(0, 1)}, {1300 * ms, Tick{}}, {1500 * ms, exit(7)}},
			true, 7, abortMsg7, 1, 2, false},
		{"peers on both hosts, the abort's exit last", 0,
			[]at{{1000 * ms, notice(7)}, {1010 * ms, peer(2, 1)}, {1020 * ms, peer(0, 1)}, {1400 * ms, Tick{}}, {1900 * ms, exit(7)}},
			true, 7, "rank 1 on host a (pid 42) called MPI_Abort", 1, 3, false},
		{"abort with code 0 after a peer's 1", 0,
			[]at{{1000 * ms, notice(0)}, {1010 * ms, peer(0, 1)}, {1300 * ms, Tick{}}, {1400 * ms, exit(0)}},
			true, 0, "rank 1 on host a (pid 42) called MPI_Abort with exit code 0", 1, 2, false},
		// A peer fails of the abort in MPI_Init and MPICH aborts it (code
		// 1), its exit first: the abort told first is the failure.
		{"a peer's abort on the fatal error, its exit before the abort's", 3,
			[]at{{1000 * ms, notice(7)}, {1010 * ms, RankAborted{Rank: 2, Host: 1, Code: 1}}, {1020 * ms, peerAbort(2, 1)}, {1300 * ms, Tick{}}, {1400 * ms, exit(7)}},
			true, 7, abortMsg7, 1, 2, false},
		// The notice comes as the window ends, before the Tick.
		{"a notice after the window, before its tick", 0,
			[]at{{1000 * ms, peer(0, 1)}, {1300 * ms, notice(7)}, {1400 * ms, exit(7)}},
			true, 7, abortMsg7, 1, 2, false},
		{"notice then its exit: one failure", 0,
			[]at{{1000 * ms, notice(7)}, {1100 * ms, exit(7)}, {1400 * ms, Tick{}}},
			true, 7, abortMsg7, 1, 1, false},
		// A crash, then a peer's abort on the fatal error it caused: the
		// crash is the failure, and the job restarts, as without notices.
		{"a crash, then a peer's abort told and its exit", 3,
			[]at{{1000 * ms, crash}, {1010 * ms, RankAborted{Rank: 2, Host: 1, Code: 1}}, {1020 * ms, peerAbort(2, 1)}, {1300 * ms, Tick{}}},
			false, 0, "", 1, 0, true},
		{"a peer's abort told, then the crash, then the abort's exit", 3,
			[]at{{1000 * ms, RankAborted{Rank: 2, Host: 1, Code: 1}}, {1010 * ms, crash}, {1300 * ms, Tick{}}, {1400 * ms, peerAbort(2, 1)}},
			false, 0, "", 1, 0, true},
		// The exit never comes (its agent hangs): decided abortExitWait
		// after the notice, with the failure pending then.
		{"the abort's exit never comes", 0,
			[]at{{1000 * ms, notice(7)}, {1010 * ms, peer(0, 1)}, {1300 * ms, Tick{}}, {1000*ms + abortExitWait - ms, Tick{}}, {1000*ms + abortExitWait, Tick{}}},
			true, 1, "rank 0 on host a exited with code 1", 0, 1, false},
		{"an abort of an older generation", 1,
			[]at{{1000 * ms, peer(0, 3)}, {1300 * ms, Tick{}}, {2000 * ms, notice(7)}, {2010 * ms, RankExited{Rank: 0, Host: 0, Gen: 1, Code: 3}}, {2300 * ms, Tick{}}},
			true, 3, "rank 0 on host a exited with code 3", 0, 1, true},
		{"an abort of another host", 0,
			[]at{{1000 * ms, RankAborted{Rank: 1, Host: 1, Code: 7}}, {1010 * ms, peer(0, 1)}, {1300 * ms, Tick{}}},
			true, 1, "rank 0 on host a exited with code 1", 0, 1, false},
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
			restarted := false
			for _, x := range c.events {
				for _, a := range m.Step(x.t, x.e) {
					switch a := a.(type) {
					case Abort:
						aborts = append(aborts, a)
					case Failed:
						failed = append(failed, a)
					case Restart:
						restarted = true
					}
				}
			}
			if m.stopped != c.stopped || m.stopped && m.ExitCode() != c.code {
				t.Fatalf("stopped %t with code %d (aborts %+v, failed %+v), want stopped %t with code %d", m.stopped, m.ExitCode(), aborts, failed, c.stopped, c.code)
			}
			if restarted != c.restart {
				t.Errorf("restarted %t, want %t (failed %+v)", restarted, c.restart, failed)
			}
			if c.blamed >= 0 && (len(failed) == 0 || failed[len(failed)-1].Rank != c.blamed) {
				t.Errorf("Failed actions %+v, want the last to name rank %d", failed, c.blamed)
			}
			if c.stopped && m.nFailed != c.failed {
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
		})
	}
}
