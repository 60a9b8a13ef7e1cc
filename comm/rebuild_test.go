package comm_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// The test binary plays a rank under a test launcher when commtestHelper
// is set.
const commtestHelper = "COMMTEST_HELPER"

func TestMain(m *testing.M) {
	gortest.RunHelper(commtestHelper, map[string]func() int{"rebuild": rebuildRank})
	os.Exit(m.Run())
}

// rebuildRank runs Allreduces until the epoch changes, rebuilds, and runs
// one in the new epoch.
func rebuildRank() int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := comm.Init(ctx)
	if err != nil {
		fmt.Println("init:", err)
		return 1
	}
	x := []float64{0}
	for i := 0; ; i++ {
		x[0] = float64(c.Rank())
		err = c.AllreduceFloat64(ctx, x)
		if err != nil {
			break
		}
		if i == 0 {
			fmt.Println("epoch0 allreduce ok")
		}
		time.Sleep(2 * time.Millisecond) // pace the loop: the test publishes the next epoch
	}
	if !errors.Is(err, comm.ErrEpochChanged) {
		fmt.Println("allreduce failed otherwise:", err)
		return 1
	}
	fmt.Println("epoch changed")
	c, err = c.Rebuild(ctx)
	if err != nil {
		fmt.Println("rebuild:", err)
		return 1
	}
	defer c.Close()
	x[0] = float64(c.Rank())
	if err := c.AllreduceFloat64(ctx, x); err != nil {
		fmt.Println("allreduce in the new epoch:", err)
		return 1
	}
	fmt.Printf("epoch%d sum=%v\n", c.Epoch(), x[0])
	return 0
}

// TestEpochChangeAndRebuild runs an agent with three ranks under a test
// launcher, publishes epoch 1 while the ranks run collectives: every rank
// must see ErrEpochChanged (no hang), rebuild, and compute in epoch 1.
func TestEpochChangeAndRebuild(t *testing.T) {
	const job = "rebuildtest"
	secret := newSecret(t)
	creds := secret.HostCredentials(0, nil)
	srv, err := ctlserver.Start(ctlserver.Config{Job: job, LocalPassword: secret.InProcessPassword(),
		Hosts: []ctlserver.HostUser{{Password: creds.InProcessPassword()}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func(ctx context.Context, o control.ControlOptions) (*control.Control, error) {
		return control.DialInProcessHost(ctx, srv.InProcess(), creds, o)
	}
	l, err := control.DialInProcess(ctx, srv.InProcess(), secret, control.ControlOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	subj := wire.JobSubjects(job)
	fc := control.NewFenceCollector(l.Conn, job, 0, 1)
	outc := make(chan string, 1024)
	sub, err := l.Subscribe(subj.Up, func(m *nats.Msg) {
		host, kind, _ := subj.ParseUp(m.Subject)
		switch kind {
		case wire.UpKindOutput:
			_ = wire.DecodeOutputFrame(m.Data, 3, func(_ int, r wire.OutputRecord) { outc <- string(r.Data) })
		case wire.UpKindFence:
			if err := fc.Handle(host, m.Data); err != nil {
				t.Errorf("fence: %v", err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	rv, err := control.StartRendezvous(l.Conn, job, 0, []control.RendezvousHost{{Name: "h0", Ranks: []int{0, 1, 2}}}, &wire.JobSpec{
		Prog: os.Args[0], Env: []string{commtestHelper + "=rebuild"}, Dir: t.TempDir(),
		KillGrace: time.Second, HeartbeatInterval: time.Second, StdinRank: wire.NoStdin,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rv.Close()
	agentErr := make(chan error, 1)
	go func() {
		agentErr <- agent.Run(ctx, agent.Config{Job: job, Host: 0, Name: "h0", Creds: creds, Dial: dial, Addr: "127.0.0.1",
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	}()
	var out strings.Builder
	waitCount := func(what string, n int) {
		t.Helper()
		for strings.Count(out.String(), what) < n {
			select {
			case s := <-outc:
				out.WriteString(s)
			case err := <-agentErr:
				t.Fatalf("agent ended: %v\noutput:\n%s", err, out.String())
			case <-ctx.Done():
				t.Fatalf("%d × %q not seen; output:\n%s", n, what, out.String())
			}
		}
	}
	waitCount("epoch0 allreduce ok\n", 3)
	next := rv.Table()
	next.Epoch = 1
	fc.SetEpoch(1)
	start := time.Now()
	if err := l.Publish(subj.Epoch, next.Encode()); err != nil {
		t.Fatal(err)
	}
	waitCount("epoch changed\n", 3)
	t.Logf("every rank saw the epoch change within %v", time.Since(start))
	waitCount("epoch1 sum=3\n", 3)
	l.Publish(subj.Control, wire.Marshal(&wire.Control{Op: wire.OpExit}))
	if err := <-agentErr; err != nil {
		t.Fatalf("agent: %v", err)
	}
	if strings.Contains(out.String(), "failed") || strings.Contains(out.String(), ":") {
		t.Errorf("a rank reported an error:\n%s", out.String())
	}
}

func newSecret(t testing.TB) jobkey.Secret {
	t.Helper()
	s, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
