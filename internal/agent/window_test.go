package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
)

// Recoveries seen by one agent when their messages overtake each other:
// tables that arrive while the ranks of a restart are still being stopped,
// a second table before the first one's ranks started, ranks moved away
// and back. Whatever the interleaving, the agent ends with exactly the
// latest table's ranks of its host running, in its generation.

// uniqueJob returns a job id of this test process: a job's slot files and
// directories are per machine, and other test processes may run.
func uniqueJob(name string) string { return name + "-" + strconv.Itoa(os.Getpid()) }

// wantRank is a rank process expected to run: its GORUN_EPOCH and
// GORUN_RESTART_COUNT.
type wantRank struct{ epoch, gen int }

// liveRank is a rank process of the job that /proc shows running.
type liveRank struct {
	pid int
	wantRank
}

// liveRanks returns the job's rank processes that run now, by rank: the
// children of this process (the agent runs in it) that run this test
// binary (not a probe's hold process) with the job's environment.
func (j *swapJob) liveRanks() map[int]liveRank {
	j.t.Helper()
	self, err := os.Executable()
	if err != nil {
		j.t.Fatal(err)
	}
	out := map[int]liveRank{}
	for _, pid := range childrenWithEnv(os.Getpid(), []byte(wire.EnvJobID+"="+j.job+"\x00"), nil) {
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		if exe, err := os.Readlink(filepath.Join(dir, "exe")); err != nil || exe != self {
			continue
		}
		env, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err != nil {
			continue // it ended meanwhile
		}
		vars := map[string]string{}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if k, v, ok := strings.Cut(string(kv), "="); ok {
				vars[k] = v
			}
		}
		r, err1 := strconv.Atoi(vars[wire.EnvRank])
		epoch, err2 := strconv.Atoi(vars[wire.EnvEpoch])
		gen, err3 := strconv.Atoi(vars[wire.EnvRestartCount])
		if err := errors.Join(err1, err2, err3); err != nil {
			j.t.Fatalf("process %d of the job: %v", pid, err)
		}
		if q, dup := out[r]; dup {
			j.t.Errorf("rank %d runs twice: processes %d and %d", r, q.pid, pid)
		}
		out[r] = liveRank{pid, wantRank{epoch, gen}}
	}
	return out
}

// ranksSeen follows the agent's events: the rank processes started and
// not yet ended, by pid.
type ranksSeen struct {
	running map[int]*wire.Event // EventStarted, by pid
	started []*wire.Event
	exited  []*wire.Event
	epochs  []uint64 // the EventEpochs, in order
	all     []*wire.Event
}

func newRanksSeen() *ranksSeen { return &ranksSeen{running: map[int]*wire.Event{}} }

// add records e; it fails t on the events no scenario here expects: an
// agent error, or an agent reporting itself done while it should wait for
// ranks or the job's end.
func (s *ranksSeen) add(t *testing.T, e *wire.Event) {
	t.Helper()
	s.all = append(s.all, e)
	switch e.Kind {
	case wire.EventStarted:
		s.running[e.Pid] = e
		s.started = append(s.started, e)
	case wire.EventExited:
		delete(s.running, e.Pid)
		s.exited = append(s.exited, e)
	case wire.EventEpoch:
		s.epochs = append(s.epochs, e.Epoch)
	case wire.EventAgentDone, wire.EventAgentError:
		t.Errorf("the agent reported %s: %s", e.Kind, e.Msg)
	}
}

// ranks returns the ranks running as the events tell, by rank.
func (s *ranksSeen) ranks() map[int]*wire.Event {
	out := map[int]*wire.Event{}
	for _, e := range s.running {
		out[e.Rank] = e
	}
	return out
}

// settle consumes the agent's events until the ranks running, as they
// tell, are want's ranks of generation gen, and done (when not nil) holds;
// then checks that exactly those run, as /proc shows, with want's epochs
// and generations. It returns the running ranks' pids by rank.
func (j *swapJob) settle(s *ranksSeen, what string, want map[int]wantRank, done func(*ranksSeen) bool) map[int]int {
	j.t.Helper()
	match := func() bool {
		run := s.ranks()
		if len(run) != len(s.running) || len(run) != len(want) {
			return false
		}
		for r, w := range want {
			if e, ok := run[r]; !ok || e.Gen != uint64(w.gen) {
				return false
			}
		}
		return done == nil || done(s)
	}
	for !match() {
		select {
		case e := <-j.events:
			s.add(j.t, e)
		case err := <-j.agentErr:
			j.exited = true
			j.t.Fatalf("the agent ended (%v) while the test waited for %s", err, what)
		case <-j.ctx.Done():
			j.t.Fatalf("no %s; events: %v", what, describe(s.all))
		}
	}
	pids := map[int]int{}
	for r, e := range s.ranks() {
		pids[r] = e.Pid
	}
	// A process that just started may still be in its exec (/proc shows
	// no environment yet): the check is retried until it holds, for a
	// while.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var wrong []string
		live := j.liveRanks()
		for r, pid := range pids {
			l, ok := live[r]
			switch {
			case !ok:
				wrong = append(wrong, fmt.Sprintf("rank %d (process %d) is not running", r, pid))
			case l.pid != pid || l.wantRank != want[r]:
				wrong = append(wrong, fmt.Sprintf("rank %d runs as process %d, epoch %d, generation %d; want process %d, %+v", r, l.pid, l.epoch, l.gen, pid, want[r]))
			}
		}
		for r, l := range live {
			if _, ok := want[r]; !ok {
				wrong = append(wrong, fmt.Sprintf("rank %d runs (process %d, %+v); the table does not place it here", r, l.pid, l.wantRank))
			}
		}
		if len(wrong) == 0 {
			break
		}
		if time.Now().After(deadline) {
			j.t.Errorf("%s: %s", what, strings.Join(wrong, "; "))
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return pids
}

// resettle publishes the current placement again in a new epoch (no
// change for the agent's host) and settles on want again once the agent
// reported that epoch: whatever the agent did before it, it has been seen
// (an event is checked by ranksSeen.add), and nothing more started or
// ended. It returns the epoch.
func (j *swapJob) resettle(s *ranksSeen, want map[int]wantRank) uint64 {
	j.t.Helper()
	next := j.rv.Table().Epoch + 1
	if j.rv.Advance(next) == nil {
		j.t.Fatalf("cannot advance to epoch %d", next)
	}
	started, exited := len(s.started), len(s.exited)
	j.settle(s, "the same ranks in a table that changes nothing here", want, func(s *ranksSeen) bool { return slices.Contains(s.epochs, next) })
	if len(s.started) != started || len(s.exited) != exited {
		j.t.Errorf("ranks started or ended after the latest table; events: %v", describe(s.all))
	}
	return next
}

// waitContent waits for the probe's file name to hold want.
func (j *swapJob) waitContent(name, want string) {
	j.t.Helper()
	for {
		b, err := os.ReadFile(filepath.Join(j.dir, name))
		if err == nil && string(b) == want {
			return
		}
		select {
		case <-j.ctx.Done():
			j.t.Fatalf("%s holds %q (%v), want %q", name, b, err, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitProbes waits for the probes of ranks, generation gen, epoch epoch
// to have written their environment (and so started their hold process).
func (j *swapJob) waitProbes(gen, epoch int, ranks ...int) {
	j.t.Helper()
	for _, r := range ranks {
		j.waitFile(fmt.Sprintf("rank-%d-gen-%d-epoch-%d.env", r, gen, epoch))
	}
}

// before says whether the EventEpoch for epoch came before every exit of
// generation gen's ranks: the table arrived while they were being stopped.
func (s *ranksSeen) before(epoch uint64, gen uint64) bool {
	at := slices.IndexFunc(s.all, func(e *wire.Event) bool { return e.Kind == wire.EventEpoch && e.Epoch == epoch })
	first := slices.IndexFunc(s.all, func(e *wire.Event) bool { return e.Kind == wire.EventExited && e.Gen == gen })
	return at >= 0 && (first < 0 || at < first)
}

// TestTablesDuringRestart (--recovery restart): the restart's table, and
// a later one, arrive while the ranks the restart kills are still being
// stopped (their ends are held back drainTimeout by a process holding
// their output). The agent starts the ranks once, those of the latest
// table, in the latest restart's generation and the latest table's epoch;
// a table that moves every rank of the host away leaves it idle (up, not
// done) until a later table places a rank on it again.
func TestTablesDuringRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps: before each table, the restart to send (gen 0: none);
		// the tables' membership (epochs 1, 2, ...).
		restarts []uint64
		tables   [][][]int
		gens     []uint64 // each table's generation
		want     map[int]wantRank
	}{
		{
			name:     "a new placement of the restart's generation",
			restarts: []uint64{1, 0},
			tables:   [][][]int{{{0}, {1, 2, 3}}, {{3, 0}, {1, 2}}},
			gens:     []uint64{1, 1},
			want:     map[int]wantRank{3: {2, 1}, 0: {2, 1}},
		},
		{
			name:     "a second restart",
			restarts: []uint64{1, 2},
			tables:   [][][]int{{{0}, {1, 2, 3}}, {{3, 0}, {1, 2}}},
			gens:     []uint64{1, 2},
			want:     map[int]wantRank{3: {2, 2}, 0: {2, 2}},
		},
		{
			name:     "every rank moved away, then one placed back in place",
			restarts: []uint64{1, 0},
			tables:   [][][]int{{nil, {0, 1, 2, 3}}, {{1}, {0, 2, 3}}},
			gens:     []uint64{1, 1},
			want:     map[int]wantRank{1: {2, 1}},
		},
		{
			name:     "every rank moved away",
			restarts: []uint64{1},
			tables:   [][][]int{{nil, {0, 1, 2, 3}}},
			gens:     []uint64{1},
			want:     map[int]wantRank{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := startSwapJob(t, uniqueJob("restartwindow"), []control.RendezvousHost{{Name: "h0", Ranks: []int{0, 1}}, {Name: "h1", Ranks: []int{2, 3}}}, 0, swapOpts{hold: true})
			s := newRanksSeen()
			j.settle(s, "generation 0's ranks", map[int]wantRank{0: {0, 0}, 1: {0, 0}}, nil)
			j.waitProbes(0, 0, 0, 1)
			for i, ranks := range tc.tables {
				epoch := uint64(i + 1)
				if g := tc.restarts[i]; g > 0 {
					j.send(&wire.Control{Op: wire.OpRestart, Gen: g, Epoch: epoch, G: -1})
				}
				if _, err := j.rv.Publish(epoch, control.Membership{Ranks: ranks, Gen: tc.gens[i], G: -1}); err != nil {
					t.Fatal(err)
				}
			}
			last := uint64(len(tc.tables))
			j.settle(s, "the latest table's ranks", tc.want, func(s *ranksSeen) bool {
				return len(s.exited) >= 2 && slices.Contains(s.epochs, last)
			})
			j.resettle(s, tc.want)
			if !s.before(last, 0) {
				t.Errorf("the test missed its window: the agent saw generation 0's ends before epoch %d's table; events: %v", last, describe(s.all))
			}
			if n := len(s.started); n != 2+len(tc.want) {
				t.Errorf("%d ranks started, want %d (2, then the latest table's); events: %v", n, 2+len(tc.want), describe(s.all))
			}
			for _, e := range s.exited {
				if e.Gen != 0 || !e.Stopped {
					t.Errorf("rank %d of generation %d ended (stopped: %t), want only generation 0's ranks, stopped", e.Rank, e.Gen, e.Stopped)
				}
			}
		})
	}
}

// TestTablesInPlace (--recovery in-place): tables of the same generation
// back to back, the second before the first one's new ranks could say
// hello: the agent starts each rank newly placed here once, in the epoch
// of the table that placed it, kills the ranks moved away (their ends are
// stopped ones), keeps the others running, and is left idle (up, never
// done) when every rank moved away, until a table places one here again.
func TestTablesInPlace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fence  []int     // before each table, the host to fence (-1: none)
		tables [][][]int // epochs 1, 2, ...
		want   map[int]wantRank
		kept   bool // rank 1 keeps its process
		killed []int
	}{
		{
			name:   "two hosts lost one after the other",
			fence:  []int{0, 2},
			tables: [][][]int{{nil, {1, 0}, {2}}, {nil, {1, 0, 2}, nil}},
			want:   map[int]wantRank{1: {0, 0}, 0: {1, 0}, 2: {2, 0}},
			kept:   true,
		},
		{
			name:   "a new rank moved away again",
			fence:  []int{0, -1},
			tables: [][][]int{{nil, {1, 0}, {2}}, {nil, {1}, {2, 0}}},
			want:   map[int]wantRank{1: {0, 0}},
			kept:   true,
			killed: []int{0},
		},
		{
			name:   "every rank moved away, then one back",
			fence:  []int{0, -1, -1},
			tables: [][][]int{{nil, {1, 0}, {2}}, {nil, nil, {2, 0, 1}}, {nil, {1}, {2, 0}}},
			want:   map[int]wantRank{1: {3, 0}},
			killed: []int{0, 1},
		},
		{
			name:   "every rank moved away",
			fence:  []int{-1},
			tables: [][][]int{{nil, nil, {0, 1, 2}}},
			want:   map[int]wantRank{},
			killed: []int{1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := startSwapJob(t, uniqueJob("inplacewindow"), []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Ranks: []int{1}}, {Name: "h2", Ranks: []int{2}}}, 1, swapOpts{})
			s := newRanksSeen()
			first := j.settle(s, "rank 1's start", map[int]wantRank{1: {0, 0}}, nil)
			j.waitFile("rank-1.welcome")
			for i, ranks := range tc.tables {
				if h := tc.fence[i]; h >= 0 {
					j.rv.Fence(h)
				}
				if _, err := j.rv.Publish(uint64(i+1), control.Membership{Ranks: ranks, G: -1}); err != nil {
					t.Fatal(err)
				}
			}
			last := uint64(len(tc.tables))
			pids := j.settle(s, "the latest table's ranks", tc.want, func(s *ranksSeen) bool {
				return len(s.exited) == len(tc.killed) && slices.Contains(s.epochs, last)
			})
			end := j.resettle(s, tc.want)
			if got := pids[1] == first[1]; got != tc.kept {
				t.Errorf("rank 1 kept its process: %t, want %t", got, tc.kept)
			}
			var killed []int
			for _, e := range s.exited {
				killed = append(killed, e.Rank)
				if !e.Stopped {
					t.Errorf("rank %d moved away ended as a failure: %+v", e.Rank, e)
				}
			}
			slices.Sort(killed)
			if !slices.Equal(killed, tc.killed) {
				t.Errorf("ranks killed: %v, want %v", killed, tc.killed)
			}
			if tc.kept {
				want := ""
				for e := range end {
					want += fmt.Sprintf("epoch %d\n", e+1)
				}
				j.waitContent("rank-1.pushes", want)
			}
		})
	}
}

// TestSpareStops: a spare's agent, idle, never reports itself done; when
// the job stops (OpKill, then OpExit; or its launcher's stream ends) it
// exits and leaves no job directory and no slot files.
func TestSpareStops(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{
		{"kill then exit", nil},
		{"launcher stream closed", ErrLauncherLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream, launcher := io.Pipe()
			defer launcher.Close()
			job := uniqueJob("sparestops")
			j := startSwapJob(t, job, []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Spare: true}}, 1,
				swapOpts{with: func(c *Config) { c.Launcher = stream }})
			s := newRanksSeen()
			j.settle(s, "the spare's first epoch", map[int]wantRank{}, func(s *ranksSeen) bool { return len(s.epochs) > 0 })
			dirs, err := filepath.Glob(filepath.Join(os.TempDir(), "gorun-"+job+"-*"))
			if err != nil || len(dirs) != 1 {
				t.Fatalf("the spare's job directories: %v (%v), want one", dirs, err)
			}
			if tc.want == nil {
				j.send(&wire.Control{Op: wire.OpKill})
				j.send(&wire.Control{Op: wire.OpExit})
			} else {
				launcher.Close()
			}
			for done := false; !done; {
				select {
				case e := <-j.events:
					s.add(t, e)
				case err := <-j.agentErr:
					j.exited, done = true, true
					if !errors.Is(err, tc.want) {
						t.Errorf("the agent ended with %v, want %v", err, tc.want)
					}
				case <-j.ctx.Done():
					t.Fatal("the agent did not exit")
				}
			}
			// Events sent before the agent returned have reached the
			// launcher's connection; drain what is there.
			if err := j.l.Flush(); err != nil {
				t.Fatal(err)
			}
			for len(j.events) > 0 {
				s.add(t, <-j.events)
			}
			if _, err := os.Stat(dirs[0]); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the job directory %s is still there (%v)", dirs[0], err)
			}
			checkNoSlotFiles(t, job)
		})
	}
}

// checkNoSlotFiles checks that job left no file in /dev/shm.
func checkNoSlotFiles(t *testing.T, job string) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+job+".*"))
	if err != nil || len(left) > 0 {
		t.Errorf("the job's files in /dev/shm: %v (%v), want none", left, err)
	}
}

// TestMovedAwayRankEnds: the end of a rank that an in-place epoch moved
// away (the agent killed it) fails no fence on this host, even when a
// later epoch placed the rank here again before the end was seen (its
// successor runs, and must be able to enter its fences); the end of a
// rank placed here fails them, as before hot-swap.
func TestMovedAwayRankEnds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		movedAway bool
		refused   bool
	}{
		{"moved away, placed here again", true, false},
		{"placed here", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, creds, dial := testControlPlane(t, ctx, "movedaway")
			ctl, err := dial(ctx, control.ControlOptions{Name: "agent", InboxPrefix: wire.JobSubjects("movedaway").ForHost(0).Inbox})
			if err != nil {
				t.Fatal(err)
			}
			defer ctl.Close()
			s := testSockets(t)
			s.setEpoch(twoRankTable(2), 3)
			tab := twoRankTable(2)
			a := &agent{cfg: Config{Job: "movedaway", Host: 0, Creds: creds}, log: testLogger(t), ctl: ctl,
				subj: wire.JobSubjects("movedaway").ForHost(0), out: discardBatcher(), socks: s,
				table: tab, places: tab.Placements()[0], running: 2}
			old := &rankProc{place: wire.Placement{Rank: 0}, movedAway: tc.movedAway}
			old.stopped.Store(tc.movedAway)
			a.ranks = []*rankProc{old, {place: wire.Placement{Rank: 0}}}
			a.exited(old)
			err = enter(t, s, 0, 0)
			if refused := err != nil; refused != tc.refused {
				t.Errorf("rank 0's next fence after the old process's end: %v; want refused: %t", err, tc.refused)
			}
		})
	}
}
