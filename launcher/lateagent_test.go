package launcher

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
	"github.com/nats-io/nats.go"
)

// TestRunLateSpare: a spare's agent still starting when the ranks end.
//
// One that connects and registers only after the launcher has told the
// agents to exit (it missed that OpExit: it was not subscribed yet) is
// told at its registration that the job has ended, and exits at once:
// gorun does not wait for it and does not kill it. The ordering is
// injected: the spare's dial waits until the launcher's OpExit has gone
// out (seen on a subscription the test makes on the launcher's own
// connection before the loop runs).
//
// One that never gets as far as registering is killed once the bounded
// wait for the agents' exit is over (not after the start timeout, which
// is set far beyond the test's limit), and does not outlive Run.
func TestRunLateSpare(t *testing.T) {
	for _, tc := range []struct {
		name      string
		registers bool // the spare's dial goes on once the OpExit is out; else never
	}{
		{"registers after the exit", true},
		{"never registers", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exitSent := make(chan struct{})
			var once sync.Once
			dialEnded := make(chan error, 1)
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
					gate := exitSent
					if !tc.registers {
						gate = nil
					}
					ac.Dial = func(ctx context.Context, o control.ControlOptions) (*control.Control, error) {
						select {
						case <-gate:
						case <-ctx.Done():
							dialEnded <- context.Cause(ctx)
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
			stderr, log := r.stderr.String(), r.log.String()
			if strings.Contains(log, "agents still running after exit") {
				t.Errorf("Run returned with an agent still running; log:\n%s", log)
			}
			if tc.registers {
				if strings.Contains(stderr, "did not exit") {
					t.Errorf("the late spare's agent was killed, not told the job ended:\n%s", stderr)
				}
				if !strings.Contains(log, "the job ended before this agent registered") {
					t.Errorf("the late spare's agent did not learn at its registration that the job ended; log:\n%s", log)
				}
				return
			}
			if !strings.Contains(stderr, "agent on host 127.0.0.2 did not exit; killing it") {
				t.Errorf("stderr does not report the spare's agent killed:\n%s", stderr)
			}
			select {
			case <-dialEnded:
			default:
				t.Error("the spare's agent was not stopped: its dial did not end")
			}
		})
	}
}
