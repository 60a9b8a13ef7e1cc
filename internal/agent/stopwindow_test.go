package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/wire"
)

// rankEnd is a rank's end as the agent reports it: the rank and its
// generation.
type rankEnd struct {
	rank int
	gen  uint64
}

// stopSeen gathers an agent's events after the job was told to stop.
type stopSeen struct {
	all []*wire.Event
}

// ends returns the rank ends reported, in order.
func (s *stopSeen) ends() []rankEnd {
	var out []rankEnd
	for _, e := range s.all {
		if e.Kind == wire.EventExited {
			out = append(out, rankEnd{e.Rank, e.Gen})
		}
	}
	return out
}

// has says whether every end of want has been reported.
func (s *stopSeen) has(want ...rankEnd) bool {
	ends := s.ends()
	for _, w := range want {
		if !slices.Contains(ends, w) {
			return false
		}
	}
	return true
}

// epoch says whether the agent reported the table of epoch.
func (s *stopSeen) epoch(epoch uint64) bool {
	return slices.ContainsFunc(s.all, func(e *wire.Event) bool { return e.Kind == wire.EventEpoch && e.Epoch == epoch })
}

// doneAfterEnds says whether the agent reported itself done after the
// last rank end it reported.
func (s *stopSeen) doneAfterEnds() bool {
	last := -1
	for i, e := range s.all {
		if e.Kind == wire.EventExited {
			last = i
		}
	}
	return slices.ContainsFunc(s.all[last+1:], func(e *wire.Event) bool { return e.Kind == wire.EventAgentDone })
}

// wait consumes the agent's events until done holds.
func (s *stopSeen) wait(j *swapJob, what string, done func() bool) {
	j.t.Helper()
	for !done() {
		select {
		case e := <-j.events:
			s.all = append(s.all, e)
		case err := <-j.agentErr:
			j.exited = true
			j.t.Fatalf("the agent ended (%v) while the test waited for %s", err, what)
		case <-j.ctx.Done():
			j.t.Fatalf("no %s; events: %v", what, describe(s.all))
		}
	}
}

// TestTablesAfterStop: a table that places ranks newly on the agent's host
// after the job was told to stop (OpStop) — of the same generation
// (--recovery in-place) or of a restart's (OpRestart, then its table) —
// starts none of them, and the agent reports each of them ended (stopped,
// not started) in the table's generation as soon as it has the table: the
// launcher waits for the end of every rank of the generation, and would
// otherwise wait for them until its stop deadline. Whether the host's
// ranks have ended already or still run through the stop's grace period
// (they ignore its signal), and for a spare that had no ranks. The agent
// reports itself done once no rank runs here, never before.
func TestTablesAfterStop(t *testing.T) {
	twoHosts := []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Ranks: []int{1}}}
	spare := []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Spare: true}}
	for _, tc := range []struct {
		name  string
		hosts []control.RendezvousHost // the agent runs host 1
		// grace: the stop's signal is one the ranks ignore, so they run
		// on through its grace period (else they end at the stop, before
		// the table is published).
		grace bool
		// first: the stop comes before the first table (host 0
		// registers after it): no rank ever started here.
		first   bool
		restart bool    // an OpRestart to generation 1 comes before the table
		table   [][]int // epoch 1's ranks, host 0 fenced
		// want are the rank ends reported once the agent has the table;
		// running are those of the ranks still in the stop's grace period.
		want, running []rankEnd
	}{
		{
			name: "in place, the ranks ended", hosts: twoHosts,
			table: [][]int{nil, {1, 0}},
			want:  []rankEnd{{1, 0}, {0, 0}},
		},
		{
			name: "in place, during the grace period", hosts: twoHosts, grace: true,
			table:   [][]int{nil, {1, 0}},
			want:    []rankEnd{{0, 0}},
			running: []rankEnd{{1, 0}},
		},
		{
			name: "restart, the ranks ended", hosts: twoHosts, restart: true,
			table: [][]int{nil, {1, 0}},
			want:  []rankEnd{{1, 0}, {1, 1}, {0, 1}},
		},
		{
			name: "restart, during the grace period", hosts: twoHosts, grace: true, restart: true,
			table: [][]int{nil, {1, 0}},
			want:  []rankEnd{{1, 0}, {1, 1}, {0, 1}},
		},
		{
			name: "in place, before the ranks started", hosts: twoHosts, first: true,
			table: [][]int{nil, {1, 0}},
			want:  []rankEnd{{1, 0}, {0, 0}},
		},
		{
			name: "restart, before the ranks started", hosts: twoHosts, first: true, restart: true,
			table: [][]int{nil, {1, 0}},
			want:  []rankEnd{{1, 0}, {1, 1}, {0, 1}},
		},
		{
			name: "spare, in place", hosts: spare,
			table: [][]int{nil, {0}},
			want:  []rankEnd{{0, 0}},
		},
		{
			name: "spare, restart", hosts: spare, restart: true,
			table: [][]int{nil, {0}},
			want:  []rankEnd{{0, 1}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o swapOpts
			if tc.first {
				o.later = []int{0}
			}
			j := startSwapJob(t, uniqueJob("stopwindow"), tc.hosts, 1, o)
			switch {
			case tc.first:
				// Registered: it has subscribed to the launcher's
				// control messages (it does before registering).
				for h := -1; h != 1; {
					select {
					case h = <-j.rv.Registered():
					case <-j.ctx.Done():
						t.Fatal("the agent did not register")
					}
				}
			case tc.hosts[1].Spare:
				j.until("the spare's first epoch", epochEvent(0))
			default:
				j.until("rank 1's start", func(e *wire.Event) bool { return e.Kind == wire.EventStarted && e.Rank == 1 })
				j.waitFile("rank-1.welcome")
			}
			sig := syscall.SIGTERM
			if tc.grace {
				sig = syscall.SIGWINCH // ignored by the probes (Go programs)
			}
			j.send(&wire.Control{Op: wire.OpStop, Signal: int(sig), Grace: time.Hour})
			s := &stopSeen{}
			if tc.first {
				// The first table now, after the stop, from the
				// connection that sent the stop.
				j.register(0)
			}
			if !tc.grace && !tc.hosts[1].Spare {
				s.wait(j, "rank 1's end at the stop", func() bool { return s.has(rankEnd{1, 0}) })
			}
			j.rv.Fence(0)
			gen := uint64(0)
			if tc.restart {
				gen = 1
				j.send(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: -1})
			}
			if _, err := j.rv.Publish(1, control.Membership{Ranks: tc.table, Gen: gen, G: -1}); err != nil {
				t.Fatal(err)
			}
			// The table is in, and every rank of generation 0 the stop
			// or the restart killed has ended (their ends may be seen
			// after the table). A table that changes nothing then marks
			// the end of what the agent did about them.
			var killed []rankEnd
			if first := (rankEnd{1, 0}); !tc.hosts[1].Spare && !slices.Contains(tc.running, first) {
				killed = append(killed, first)
			}
			s.wait(j, "epoch 1's table and the ends of the ranks killed", func() bool { return s.epoch(1) && s.has(killed...) })
			if j.rv.Advance(2) == nil {
				t.Fatal("cannot advance to epoch 2")
			}
			s.wait(j, "epoch 2's table", func() bool { return s.epoch(2) })
			ends := s.ends()
			if got, want := sortedEnds(ends), sortedEnds(tc.want); !slices.Equal(got, want) {
				t.Errorf("rank ends reported: %v, want %v; events: %v", got, want, describe(s.all))
			}
			for _, e := range s.all {
				switch {
				case e.Kind == wire.EventStarted, e.Kind == wire.EventAgentError:
					t.Errorf("%s rank %d after the stop: %s", e.Kind, e.Rank, e.Msg)
				case e.Kind == wire.EventExited && !e.Stopped:
					t.Errorf("rank %d (generation %d) ended as a failure after the stop: %+v", e.Rank, e.Gen, e)
				}
			}
			if tc.running == nil {
				if !s.doneAfterEnds() {
					t.Errorf("the agent did not report itself done after its ranks' ends; events: %v", describe(s.all))
				}
				return
			}
			if slices.ContainsFunc(s.all, func(e *wire.Event) bool { return e.Kind == wire.EventAgentDone }) {
				t.Errorf("the agent reported itself done while ranks %v still run; events: %v", tc.running, describe(s.all))
			}
			// The grace period's end (the launcher's kill): the ranks
			// still running end, and then the agent is done.
			j.send(&wire.Control{Op: wire.OpKill})
			s.wait(j, "the end of the ranks still running, then the agent's done", func() bool {
				return s.has(tc.running...) && s.doneAfterEnds()
			})
		})
	}
}

// sortedEnds returns ends sorted by generation, then rank.
func sortedEnds(ends []rankEnd) []rankEnd {
	out := slices.Clone(ends)
	slices.SortFunc(out, func(a, b rankEnd) int {
		if a.gen != b.gen {
			return int(a.gen) - int(b.gen)
		}
		return a.rank - b.rank
	})
	return out
}

func (e rankEnd) String() string { return fmt.Sprintf("rank %d gen %d", e.rank, e.gen) }

// TestNoRestartAtShutdown: a restart is pending, its table here, when the
// agent is told to exit or loses its launcher, before the ranks the
// restart killed have ended (their ends are held back drainTimeout by a
// process holding their output). The agent's last wait for them (drain)
// must start none of the restart's ranks: after an exit order, cleanup
// has sent its SIGKILL already, and they would outlive the agent; after
// the launcher's loss they would start only to be killed.
func TestNoRestartAtShutdown(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(j *swapJob, launcher *io.PipeWriter)
		said string // what the agent logs when it takes the end
		want error  // Run's error, by errors.Is; nil: none
	}{
		{"exit order", func(j *swapJob, _ *io.PipeWriter) { j.send(&wire.Control{Op: wire.OpExit}) }, "exiting as told", nil},
		{"launcher lost", func(_ *swapJob, launcher *io.PipeWriter) { launcher.Close() }, "stopping ranks", ErrLauncherLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs gortest.SyncBuffer
			pr, pw := io.Pipe()
			t.Cleanup(func() { pw.Close() })
			j := startSwapJob(t, uniqueJob("restartatend"), []control.RendezvousHost{{Name: "h0", Ranks: []int{0, 1}}, {Name: "h1", Ranks: []int{2, 3}}}, 0, swapOpts{
				hold: true,
				with: func(c *Config) {
					c.Launcher = pr
					c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), nil))
				},
			})
			s := newRanksSeen()
			j.settle(s, "generation 0's ranks", map[int]wantRank{0: {0, 0}, 1: {0, 0}}, nil)
			j.waitProbes(0, 0, 0, 1)
			j.send(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: -1})
			if _, err := j.rv.Publish(1, control.Membership{Ranks: [][]int{{0, 1}, {2, 3}}, Gen: 1, G: -1}); err != nil {
				t.Fatal(err)
			}
			all := j.until("epoch 1's table", epochEvent(1))
			tc.end(j, pw)
			var err error
			select {
			case err = <-j.agentErr:
				j.exited = true
			case <-j.ctx.Done():
				t.Fatal("the agent did not end")
			}
			switch {
			case tc.want == nil && err != nil:
				t.Errorf("Run: %v, want nil", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Errorf("Run: %v, want %v", err, tc.want)
			}
			// The agent flushed its events before it returned.
			if err := j.l.Flush(); err != nil {
				t.Fatal(err)
			}
			for more := true; more; {
				select {
				case e := <-j.events:
					all = append(all, e)
				default:
					more = false
				}
			}
			log := logs.String()
			if end, ended := strings.Index(log, tc.said), strings.Index(log, "rank ended"); end < 0 || ended < end {
				t.Errorf("the test missed its window: the agent saw generation 0's ends before it took the end (%q)\n%s", tc.said, log)
			}
			var started []string
			for _, e := range all {
				if e.Kind == wire.EventStarted && e.Gen > 0 {
					started = append(started, fmt.Sprintf("rank %d of generation %d (process %d)", e.Rank, e.Gen, e.Pid))
					_ = syscall.Kill(-e.Pid, syscall.SIGKILL) // it would outlive the test
				}
			}
			if started != nil {
				t.Errorf("started as the agent ended: %s; events: %v", strings.Join(started, ", "), describe(all))
			}
			if names, _ := filepath.Glob(filepath.Join(j.dir, "rank-*-gen-1-*.env")); len(names) > 0 {
				t.Errorf("generation 1's ranks ran: %v", names)
			}
		})
	}
}
