package agent

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// TestAbortReportedBeforeKill: a rank's PMI abort is reported to the
// launcher (EventAbort: its rank, generation, code and wording) before the
// agent kills the rank, so that a peer failing of its death, reported by
// another host's agent, reaches the launcher after it. The peer is the
// test: it reports a failure on host 1's connection as soon as the rank
// is dead, and the launcher's one subscription to every up subject must
// see the abort first (TestMPIMultiHost's abort across hosts ended the job
// with the peer's 1 when only the rank's exit, which waits for it to be
// reaped and its output drained, told of the abort).
func TestAbortReportedBeforeKill(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		code       int
		msg        string
	}{
		{"code", "cmd=abort exitcode=7", 7, "called MPI_Abort with exit code 7"},
		{"message", "cmd=abort exitcode=3 message=application called MPI_Abort(MPI_COMM_WORLD, 3) - process 1", 3,
			"called MPI_Abort with exit code 3: application called MPI_Abort(MPI_COMM_WORLD, 3) - process 1"},
		{"code 0", "cmd=abort exitcode=0", 0, "called MPI_Abort with exit code 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			job := uniqueJob("abortnotice")
			subj := wire.JobSubjects(job)
			secret, err := jobkey.NewSecret()
			if err != nil {
				t.Fatal(err)
			}
			users := make([]ctlserver.HostUser, 2)
			for h := range users {
				users[h] = ctlserver.HostUser{Password: secret.HostCredentials(h, nil).InProcessPassword()}
			}
			srv, err := ctlserver.Start(ctlserver.Config{Job: job, LocalPassword: secret.InProcessPassword(), Hosts: users})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown()
			launcher, err := control.DialInProcess(ctx, srv.InProcess(), secret, control.ControlOptions{Name: "launcher"})
			if err != nil {
				t.Fatal(err)
			}
			defer launcher.Close()
			host := func(h int) *control.Control {
				c, err := control.DialInProcessHost(ctx, srv.InProcess(), secret.HostCredentials(h, nil),
					control.ControlOptions{Name: "host", InboxPrefix: subj.ForHost(h).Inbox})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Close)
				return c
			}
			ctl0, ctl1 := host(0), host(1)

			seen := make(chan *wire.Event, 16)
			sub, err := launcher.Subscribe(subj.Up, func(m *nats.Msg) {
				if e, err := wire.DecodeEvent(m.Data); err == nil {
					seen <- e
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			if err := launcher.Flush(); err != nil {
				t.Fatal(err)
			}

			// The rank: a process in a group of its own, as the agent
			// starts ranks (it kills the group).
			rank := exec.Command("sleep", "60")
			rank.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := rank.Start(); err != nil {
				t.Fatal(err)
			}
			dead := make(chan struct{})
			go func() { _ = rank.Wait(); close(dead) }()
			defer func() {
				_ = rank.Process.Kill()
				<-dead
			}()
			// The peer on host 1 fails as soon as the rank is dead.
			peerDone := make(chan error, 1)
			go func() {
				select {
				case <-dead:
				case <-ctx.Done():
					peerDone <- ctx.Err()
					return
				}
				e := &wire.Event{Kind: wire.EventExited, Host: 1, Rank: 0, Code: 1, Gen: 2, Msg: "its connection to rank 1 broke"}
				if err := ctl1.Publish(subj.ForHost(1).Events, wire.Marshal(e)); err != nil {
					peerDone <- err
					return
				}
				peerDone <- ctl1.Flush()
			}()

			a := &agent{cfg: Config{Job: job, Host: 0}, log: testLogger(t), subj: subj.ForHost(0), ctl: ctl0}
			p := &rankProc{place: wire.Placement{Rank: 1}, gen: 2, pid: rank.Process.Pid}
			mine, theirs, err := pmiSocketPair()
			if err != nil {
				t.Fatal(err)
			}
			defer theirs.Close()
			a.pmiWG.Add(1)
			served := make(chan struct{})
			go func() { a.servePMI(p, mine, 2); close(served) }()
			if _, err := io.WriteString(theirs, "cmd=init pmi_version=1 pmi_subversion=1\n"+tc.line+"\n"); err != nil {
				t.Fatal(err)
			}

			var got []*wire.Event
			for len(got) < 2 {
				select {
				case e := <-seen:
					got = append(got, e)
				case <-ctx.Done():
					var kinds []string
					for _, e := range got {
						kinds = append(kinds, fmt.Sprintf("%s of rank %d on host %d", e.Kind, e.Rank, e.Host))
					}
					t.Fatalf("the launcher saw %v, want the abort then the peer's failure", kinds)
				}
			}
			if err := <-peerDone; err != nil {
				t.Fatal(err)
			}
			theirs.Close() // the rank's end of the PMI connection: its serving ends
			<-served

			want := wire.Event{Kind: wire.EventAbort, Host: 0, Rank: 1, Pid: rank.Process.Pid, Gen: 2, Code: tc.code, Msg: tc.msg}
			if e := got[0]; e.Kind != want.Kind || e.Host != want.Host || e.Rank != want.Rank || e.Pid != want.Pid || e.Gen != want.Gen || e.Code != want.Code || e.Msg != want.Msg {
				t.Errorf("the launcher saw first %+v, want %+v", *e, want)
			}
			if e := got[1]; e.Kind != wire.EventExited || e.Host != 1 {
				t.Errorf("the launcher saw second %+v, want the peer's exit", *e)
			}
			if c := p.abort.Load() - 1; int(c) != tc.code {
				t.Errorf("the rank's abort code is %d, want %d", c, tc.code)
			}
		})
	}
}
