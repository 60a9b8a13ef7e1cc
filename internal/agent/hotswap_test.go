package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/nats-io/nats.go"
)

// Hot-swap on the agent's side (issue 14): a launcher-side test double
// publishes the epoch tables a recovery publishes (control.Rendezvous.Fence
// and Publish); one host runs a real agent, the others are registered by
// the test (their agents are not needed for what one agent does).
//
// The harness (swapJob, rankProbe) is in swapjob_test.go.

// TestSpareTakesRanksInRestart: a spare's agent registers, reports each
// epoch's table and starts nothing, until a recovery epoch (--recovery
// restart) places the ranks of a fenced host on it: it starts them in the
// restart's generation and epoch. The launcher sends the restart before
// the table; an agent that missed it (or got it late) restarts from the
// table's generation all the same. The spare's state protection serves
// the ranks it got (they restore: here from nothing, G being -1).
func TestSpareTakesRanksInRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart bool
	}{
		{"restart then table", true},
		{"table only", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := startSwapJob(t, "sparerestart", []control.RendezvousHost{{Name: "h0", Ranks: []int{0, 1}}, {Name: "h1", Spare: true}}, 1, swapOpts{protect: true})
			idle := j.until("the spare's first epoch", epochEvent(0))
			for _, e := range idle {
				if e.Kind != wire.EventEpoch {
					t.Errorf("the idle spare reported %s (rank %d)", e.Kind, e.Rank)
				}
			}
			if tab := j.rv.Table(); !tab.Hosts[1].Spare || tab.Hosts[1].ReplicaPort == 0 {
				t.Errorf("the spare in the table: %+v; want a spare with its replication port", tab.Hosts[1])
			}
			j.rv.Fence(0)
			if tc.restart {
				j.send(&wire.Control{Op: wire.OpRestart, Gen: 1, Epoch: 1, G: -1})
			}
			if _, err := j.rv.Publish(1, control.Membership{Ranks: [][]int{nil, {1, 0}}, Gen: 1, G: -1}); err != nil {
				t.Fatal(err)
			}
			started, epoch1 := map[int]bool{}, false
			j.until("the spliced ranks' start and epoch 1", func(e *wire.Event) bool {
				switch e.Kind {
				case wire.EventStarted:
					if e.Gen != 1 {
						t.Errorf("rank %d started in generation %d, want 1", e.Rank, e.Gen)
					}
					started[e.Rank] = true
				case wire.EventEpoch:
					if e.Epoch != 1 || e.Gen != 1 {
						t.Errorf("epoch event of epoch %d, generation %d; want epoch 1 of generation 1", e.Epoch, e.Gen)
					}
					epoch1 = true
				default:
					t.Errorf("%s rank %d: %s", e.Kind, e.Rank, e.Msg)
				}
				return len(started) == 2 && epoch1
			})
			for local, r := range []int{1, 0} {
				env := j.waitFile(fmt.Sprintf("rank-%d-gen-1-epoch-1.env", r))
				checkEnv(t, fmt.Sprintf("rank %d", r), env, map[string]string{
					wire.EnvRank: strconv.Itoa(r), wire.EnvEpoch: "1", wire.EnvRestartCount: "1",
					wire.EnvLocalRank: strconv.Itoa(local), wire.EnvLocalSize: "2", wire.EnvWorldSize: "2",
				})
				if got := j.waitFile(fmt.Sprintf("rank-%d-gen-1.protect", r)); got != "step -1" {
					t.Errorf("rank %d's restore on the spare: %s, want step -1", r, got)
				}
			}
		})
	}
}

// TestInPlaceStartsNewRanks: a recovery epoch of the same generation
// (--recovery in-place) that places a lost rank beside a running one
// starts just the new rank, in the new epoch; the running rank keeps its
// process and is pushed the new epoch.
func TestInPlaceStartsNewRanks(t *testing.T) {
	j := startSwapJob(t, "inplace", []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Ranks: []int{1}}}, 1, swapOpts{})
	var pid int
	j.until("rank 1's start", func(e *wire.Event) bool {
		pid = e.Pid
		return e.Kind == wire.EventStarted && e.Rank == 1
	})
	j.waitFile("rank-1.welcome")
	j.rv.Fence(0)
	if _, err := j.rv.Publish(1, control.Membership{Ranks: [][]int{nil, {1, 0}}, G: 7}); err != nil {
		t.Fatal(err)
	}
	var epoch1, started0 bool
	j.until("rank 0's start and epoch 1", func(e *wire.Event) bool {
		switch {
		case e.Kind == wire.EventStarted && e.Rank == 0:
			started0 = true
			if e.Gen != 0 {
				t.Errorf("rank 0 started in generation %d, want 0", e.Gen)
			}
		case e.Kind == wire.EventStarted, e.Kind == wire.EventExited, e.Kind == wire.EventAgentError:
			t.Errorf("%s rank %d: %s", e.Kind, e.Rank, e.Msg)
		case e.Kind == wire.EventEpoch && e.Epoch == 1:
			epoch1 = true
		}
		return epoch1 && started0
	})
	checkEnv(t, "rank 0", j.waitFile("rank-0-gen-0-epoch-1.env"), map[string]string{
		wire.EnvRank: "0", wire.EnvEpoch: "1", wire.EnvRestartCount: "0", wire.EnvLocalRank: "1", wire.EnvLocalSize: "2",
	})
	if got := j.waitFile("rank-1.pushes"); got != "epoch 1\n" {
		t.Errorf("rank 1 was pushed %q, want epoch 1", got)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("rank 1's process %d: %v, want it running on", pid, err)
	}
}

// TestFencedHostExits: the agent of a host that a table marks fenced (the
// launcher declared it lost and replaced it), or whose launcher stream
// ends, kills its ranks, removes the job's files (its directory, the
// ranks' slot files in /dev/shm) and exits.
func TestFencedHostExits(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{
		{"fenced in a table", ErrFenced},
		{"launcher stream closed", ErrLauncherLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream, launcher := io.Pipe()
			defer launcher.Close()
			job := uniqueJob("fenced")
			j := startSwapJob(t, job, []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Ranks: []int{1}}}, 0,
				swapOpts{protect: true, with: func(c *Config) { c.Launcher = stream }})
			var pid int
			j.until("rank 0's start", func(e *wire.Event) bool {
				pid = e.Pid
				return e.Kind == wire.EventStarted && e.Rank == 0
			})
			j.waitFile("rank-0-gen-0-epoch-0.env") // the rank is up
			// The job's one directory (the rank's socket is an abstract
			// one, in no directory).
			dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), jobDirPrefix+job+"-*"+jobDirSuffix))
			if len(dirs) != 1 {
				t.Fatalf("job directories %q, want one", dirs)
			}
			jobDir := dirs[0]
			if _, err := os.Stat(jobDir); err != nil {
				t.Fatalf("the job directory %q: %v", jobDir, err)
			}
			if got := j.waitFile("rank-0-gen-0.protect"); got != "step -1" {
				t.Fatalf("rank 0's protection session: %s", got)
			}
			if slots, _ := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+job+".r0.*")); len(slots) == 0 {
				t.Fatal("rank 0 has no slot files in /dev/shm")
			}
			if tc.want == ErrFenced {
				j.rv.Fence(0)
				if _, err := j.rv.Publish(1, control.Membership{Ranks: [][]int{nil, {1, 0}}}); err != nil {
					t.Fatal(err)
				}
			} else {
				launcher.Close()
			}
			select {
			case err := <-j.agentErr:
				j.exited = true
				if !errors.Is(err, tc.want) {
					t.Errorf("the agent ended with %v, want %v", err, tc.want)
				}
			case <-j.ctx.Done():
				t.Fatal("the agent did not exit")
			}
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("rank 0's process %d: %v, want it gone", pid, err)
			}
			if _, err := os.Stat(jobDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the job directory %q is still there (%v)", jobDir, err)
			}
			checkNoSlotFiles(t, job)
		})
	}
}

// rankStager is a rank that protects one step (its replicas go to its
// holders), then runs until killed.
func rankStager() int {
	ctx := context.Background()
	c, err := protect.Connect(ctx, []protect.Region{{Name: "optimizer", Size: 64}}, protect.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		return 1
	}
	if err := c.Stage(ctx, 0, map[string][][]byte{"optimizer": {make([]byte, 64)}}); err != nil {
		fmt.Fprintln(os.Stderr, "stage:", err)
		return 1
	}
	if err := c.Wait(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "commit:", err)
		return 1
	}
	for {
		time.Sleep(time.Hour) // until killed
	}
}

// TestReplFailedReported: when replication from the agent's host to a
// holder's host fails at the link (nothing listens at its replication
// port), the agent reports EventReplFailed naming that host, so that the
// launcher suspects it at once.
func TestReplFailedReported(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	j := startSwapJob(t, "replfailed", []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Ranks: []int{1}}}, 1,
		swapOpts{probe: "rankstager", replicaPort: dead, holders: []wire.HolderRow{{Rank: 0, Holders: []int{1}}, {Rank: 1, Holders: []int{0}}}})
	es := j.until("the replication failure", func(e *wire.Event) bool { return e.Kind == wire.EventReplFailed })
	e := es[len(es)-1]
	if e.Host != 1 || e.Peer != 0 || e.Msg == "" {
		t.Errorf("event %+v, want replication from host 1 to host 0 failed, saying why", e)
	}
}

// TestProbeAnswered: an agent asked for a sign of life (wire.OpProbe, the
// launcher suspects its host) sends a heartbeat at once, not at its next
// interval; a probe of another host is not its to answer.
func TestProbeAnswered(t *testing.T) {
	j := startSwapJob(t, uniqueJob("probe"), []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Ranks: []int{1}}}, 0, swapOpts{})
	beats := make(chan uint64, 256)
	sub, err := j.l.Subscribe(wire.JobSubjects(j.job).ForHost(0).Heartbeat, func(m *nats.Msg) {
		if hb, err := wire.DecodeHeartbeat(m.Data); err == nil {
			beats <- hb.Seq
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	j.until("rank 0's start", func(e *wire.Event) bool { return e.Kind == wire.EventStarted })
	// The heartbeat interval is 1s: 20 probes answered at once give 20
	// heartbeats long before 20 intervals have passed.
	const probes = 20
	for range probes {
		j.send(&wire.Control{Op: wire.OpProbe, Host: 1}) // not this host's
		j.send(&wire.Control{Op: wire.OpProbe, Host: 0})
	}
	deadline := time.After(8 * time.Second)
	for n := 0; n < probes; n++ {
		select {
		case <-beats:
		case <-deadline:
			t.Fatalf("%d heartbeats within 8s of %d probes (heartbeat interval 1s)", n, probes)
		}
	}
	// The other host's probes were not answered here: at most the
	// interval's own heartbeats come on top.
	extra := 0
	for drained := false; !drained; {
		select {
		case <-beats:
			extra++
		default:
			drained = true
		}
	}
	if extra > 9 {
		t.Errorf("%d heartbeats beyond the probes' answers: another host's probes were answered", extra)
	}
}
