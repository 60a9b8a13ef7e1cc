package launcher

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
	"github.com/nats-io/nats.go"
)

// TestRunLateSpareIsToldToExit: a spare's agent that connects and
// registers only after the ranks have ended and the launcher has told the
// agents to exit (it missed that OpExit: it was not subscribed yet) is told
// at its registration that the job has ended, and exits at once: gorun
// does not wait for it and does not kill it.
//
// The ordering is injected: the spare's dial waits until the launcher's
// OpExit has gone out (seen on a subscription the test makes on the
// launcher's own connection before the loop runs).
func TestRunLateSpareIsToldToExit(t *testing.T) {
	exitSent := make(chan struct{})
	var once sync.Once
	r := startRun(t, 2, `echo "rank $RANK done"`, func(c *Config) {
		c.Hosts = []topology.Host{{Name: "127.0.0.1", Slots: 2}, {Name: "127.0.0.2", Slots: 1, Spare: true}}
		c.StartTimeout = 10 * time.Minute // the start timeout must play no part
		c.running = func(j *job) {
			_, err := j.ctl.Subscribe(j.subj.Control, func(m *nats.Msg) {
				if c, err := wire.DecodeControl(m.Data); err == nil && c.Op == wire.OpExit {
					once.Do(func() { close(exitSent) })
				}
			})
			if err == nil {
				err = j.ctl.Flush()
			}
			if err != nil {
				t.Errorf("subscribing to the agents' control: %v", err)
			}
		}
		c.agentConfig = func(ac *agent.Config) {
			if ac.Name != "127.0.0.2" {
				return
			}
			dial := ac.Dial
			ac.Dial = func(ctx context.Context, o comm.ControlOptions) (*comm.Control, error) {
				select {
				case <-exitSent:
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
				return dial(ctx, o)
			}
		}
	})
	r.wait()
	if r.code != 0 {
		t.Fatalf("exit %d, want 0", r.code)
	}
	select {
	case <-exitSent:
	default:
		t.Fatal("the launcher sent no OpExit")
	}
	if s := r.stderr.String(); strings.Contains(s, "did not exit") {
		t.Errorf("the late spare's agent was killed, not told the job ended:\n%s", s)
	}
	if l := r.log.String(); !strings.Contains(l, "the job ended before this agent registered") {
		t.Errorf("the late spare's agent did not learn at its registration that the job ended; log:\n%s", l)
	}
}
