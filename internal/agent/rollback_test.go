package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// TestReachAskedAgain: the launcher sends a roll-back's OpReach again
// while a host has not answered (launcher.reachTick). The agent reads
// its ranks' reach once per epoch: a repeat of the epoch it took, or an
// older epoch's, starts no second read and sends no second answer (its
// answer is sent again at heartbeats instead); a newer epoch's is read
// and answered.
func TestReachAskedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const job = "reachagain"
	l, creds, dial := testControlPlane(t, ctx, job)
	subj := wire.JobSubjects(job).ForHost(0)
	got := make(chan *wire.ResumeReach, 16)
	sub, err := l.Subscribe(subj.Resume, func(m *nats.Msg) {
		r, err := wire.DecodeResumeReach(m.Data)
		if err != nil {
			t.Errorf("answer: %v", err)
			return
		}
		got <- r
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	ctl, err := dial(ctx, control.ControlOptions{Name: "agent", InboxPrefix: subj.Inbox})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	a := &agent{cfg: Config{Job: job, Host: 0, Creds: creds}, log: testLogger(t), ctl: ctl, subj: subj}
	// An empty directory: every answer says it has no commit record.
	a.protect.persist.Dir = t.TempDir()
	defer a.stopRollback()
	ask := func(epoch uint64) {
		a.reachDisk(&wire.Control{Op: wire.OpReach, Epoch: epoch, G: 4, Ranks: []int{0, 0}})
		a.rb.wg.Wait() // the read ends
		if err := ctl.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for _, epoch := range []uint64{2, 2, 1, 3, 3} {
		ask(epoch)
	}
	// A marker after the answers: every answer sent came before it.
	if err := ctl.Publish(subj.Resume, wire.Marshal(&wire.ResumeReach{Host: 0, Epoch: 99, Ranks: []wire.ResumeRank{}})); err != nil {
		t.Fatal(err)
	}
	var epochs []uint64
	for {
		select {
		case r := <-got:
			if r.Epoch == 99 {
				if want := []uint64{2, 3}; !slices.Equal(epochs, want) {
					t.Fatalf("answers of epochs %v, want %v", epochs, want)
				}
				return
			}
			if r.Err == "" {
				t.Errorf("epoch %d's answer has no error for a directory without a commit record", r.Epoch)
			}
			epochs = append(epochs, r.Epoch)
		case <-ctx.Done():
			t.Fatalf("no marker; answers of epochs %v", epochs)
		}
	}
}

// TestReachReadHangs: a read of the checkpoint directory that hangs (a
// stalled network file system) does not keep the agent from exiting once
// the launcher stops the job: cleanup (stopRollback, stopResume) returns
// while the read still blocks, and nothing is answered. Before, cleanup
// waited for the read's goroutine. The read is injected (Config.ReadReach);
// the limit on cleanup only tells a hang.
func TestReachReadHangs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		begin func(a *agent)
		stop  func(a *agent)
	}{
		{"roll-back", func(a *agent) {
			a.reachDisk(&wire.Control{Op: wire.OpReach, Epoch: 2, G: 4, Ranks: []int{0, 0}})
		}, (*agent).stopRollback},
		{"--resume", func(a *agent) {
			a.beginResume(&wire.EpochTable{}, []wire.Placement{{Rank: 0}})
		}, (*agent).stopResume},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(release) })
			read := func(ctx context.Context, host int, dir string, ranks []int) *wire.ResumeReach {
				close(started)
				<-release // the hung read: it ignores ctx
				return &wire.ResumeReach{Host: host, Ranks: []wire.ResumeRank{}}
			}
			// No control plane: an answer would panic on the nil ctl.
			a := &agent{cfg: Config{Job: "reachhangs", Host: 0, ReadReach: read}, log: testLogger(t)}
			a.protect.persist.Dir = t.TempDir()
			tc.begin(a)
			<-started
			done := make(chan struct{})
			go func() {
				tc.stop(a)
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("cleanup still waits for the hung read of the checkpoint directory after 20 s")
			}
		})
	}
}
