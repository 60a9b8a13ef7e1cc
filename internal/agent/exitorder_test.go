package agent

import (
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// TestExitReportedBeforeFenceFails: when a rank ends, the agent reports
// its end to the launcher before it fails, job-wide, the fence the rank
// will never enter. Ranks on other hosts waiting in that fence fail
// because of it (MPICH ranks in MPI_Init abort with code 1), so their ends
// must reach the launcher after the one that caused them: otherwise an
// MPI_Abort(7) across hosts could end the job with 1 (TestMPIMultiHost saw
// it). Both go on the agent's one control connection, whose order the
// launcher, subscribed to every up subject, sees.
func TestExitReportedBeforeFenceFails(t *testing.T) {
	job := uniqueJob("exitorder")
	j := startSwapJob(t, job, []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Ranks: []int{1}}}, 0, swapOpts{})
	subj := wire.JobSubjects(job)
	order := make(chan string, 64)
	sub, err := j.l.Subscribe(subj.Up, func(m *nats.Msg) {
		switch {
		case strings.HasSuffix(m.Subject, "."+wire.UpKindFence):
			order <- "fence"
		case strings.HasSuffix(m.Subject, "."+wire.UpKindEvents):
			if e, err := wire.DecodeEvent(m.Data); err == nil && e.Kind == wire.EventExited && e.Rank == 0 {
				order <- "exit"
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := j.l.Flush(); err != nil {
		t.Fatal(err)
	}
	var pid int
	j.until("rank 0's start", func(e *wire.Event) bool {
		pid = e.Pid
		return e.Kind == wire.EventStarted && e.Rank == 0
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		select {
		case s := <-order:
			got = append(got, s)
		case <-j.ctx.Done():
			t.Fatalf("saw %v, want rank 0's exit and its fence failed", got)
		}
	}
	if got[0] != "exit" || got[1] != "fence" {
		t.Errorf("the launcher saw %v, want the exit reported before the fence failed", got)
	}
}
