package agent

import (
	"context"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// outputSink is a real in-process control plane with one connection that
// both publishes (through a batcher under test) and subscribes to what the
// batcher sends.
type outputSink struct {
	t    *testing.T
	ctl  *control.Control
	msgs chan *nats.Msg
}

const (
	sinkSubject = "agenttest.out"
	sinkDone    = "agenttest.done"
	// sinkOutputDone receives the batcher's OutputDone (drain skips them).
	sinkOutputDone = "agenttest.outdone"
)

func newOutputSink(t *testing.T) *outputSink {
	t.Helper()
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ctlserver.Start(ctlserver.Config{LocalPassword: secret.InProcessPassword()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctl, err := control.DialInProcess(ctx, srv.InProcess(), secret, control.ControlOptions{Name: "agenttest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ctl.Close)
	s := &outputSink{t: t, ctl: ctl, msgs: make(chan *nats.Msg, 1<<16)}
	// One subscription for both subjects: messages of one publisher reach
	// one subscription in the order they were published.
	sub, err := ctl.Subscribe("agenttest.>", func(m *nats.Msg) { s.msgs <- m })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *outputSink) batcher(host int, delay time.Duration) *batcher {
	return newBatcher(s.ctl.Conn, sinkSubject, sinkOutputDone, host, delay)
}

// frame is one decoded output frame.
type frame struct {
	host    int
	records []wire.OutputRecord
}

// next waits up to timeout for the next output frame; ok is false when
// none came.
func (s *outputSink) next(timeout time.Duration) (f frame, ok bool) {
	s.t.Helper()
	select {
	case m := <-s.msgs:
		if m.Subject != sinkSubject {
			s.t.Fatalf("unexpected message on %s", m.Subject)
		}
		return s.decode(m.Data), true
	case <-time.After(timeout):
		return frame{}, false
	}
}

func (s *outputSink) decode(b []byte) frame {
	s.t.Helper()
	var f frame
	err := wire.DecodeOutputFrame(b, wire.MaxWorld, func(host int, r wire.OutputRecord) {
		f.host = host
		f.records = append(f.records, r)
	})
	if err != nil {
		s.t.Fatalf("batcher sent a bad frame: %v", err)
	}
	return f
}

// drain returns every frame published before it was called (the caller
// must have flushed the batcher, if it wants its contents sent).
func (s *outputSink) drain() []frame {
	s.t.Helper()
	if err := s.ctl.Publish(sinkDone, nil); err != nil {
		s.t.Fatal(err)
	}
	var out []frame
	deadline := time.After(30 * time.Second)
	for {
		select {
		case m := <-s.msgs:
			if m.Subject == sinkDone {
				return out
			}
			if m.Subject == sinkOutputDone {
				continue
			}
			out = append(out, s.decode(m.Data))
		case <-deadline:
			s.t.Fatalf("control plane did not deliver the end marker; %d frames so far", len(out))
		}
	}
}

// records flattens frames.
func records(fs []frame) []wire.OutputRecord {
	var out []wire.OutputRecord
	for _, f := range fs {
		out = append(out, f.records...)
	}
	return out
}

// discardBatcher is a batcher that drops everything (as in
// start_bench_test.go): for tests that do not look at output.
func discardBatcher() *batcher {
	b := newBatcher(nil, "", "", 0, 0)
	b.closed = true
	return b
}

// testControlPlane starts a job's control plane with one host (host 0) and
// connects the launcher to it: it returns the launcher's connection, the
// host's credentials and the Dial an agent for host 0 uses.
func testControlPlane(t testing.TB, ctx context.Context, job string) (*control.Control, jobkey.HostCredentials, func(context.Context, control.ControlOptions) (*control.Control, error)) {
	t.Helper()
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	creds := secret.HostCredentials(0, nil)
	srv, err := ctlserver.Start(ctlserver.Config{Job: job, LocalPassword: secret.InProcessPassword(),
		Hosts: []ctlserver.HostUser{{Password: creds.InProcessPassword()}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	l, err := control.DialInProcess(ctx, srv.InProcess(), secret, control.ControlOptions{Name: "launcher"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	dial := func(ctx context.Context, o control.ControlOptions) (*control.Control, error) {
		return control.DialInProcessHost(ctx, srv.InProcess(), creds, o)
	}
	return l, creds, dial
}
