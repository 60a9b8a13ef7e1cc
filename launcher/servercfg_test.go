package launcher

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/agent"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/topology"
)

// TestServerConfigWatchesRemoteOnly: the control plane watches the
// agents' connections (and so runs its system account) only when some
// host's agent connects over TCP; every host is admitted all the same,
// an in-process one by its password, a remote one by its nkey.
func TestServerConfigWatchesRemoteOnly(t *testing.T) {
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		local []bool
		watch bool
	}{
		{"one local host", []bool{true}, false},
		{"two local hosts", []bool{true, true}, false},
		{"local and remote", []bool{true, false}, true},
		{"remote only", []bool{false, false}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := &job{id: "cfgjob", secret: secret, log: slog.New(slog.DiscardHandler), quit: make(chan struct{})}
			for i, l := range tt.local {
				j.hosts = append(j.hosts, &hostAgent{name: "h" + string(rune('0'+i)), local: l})
			}
			scfg, err := j.serverConfig()
			if err != nil {
				t.Fatal(err)
			}
			if got := scfg.HostDisconnected != nil; got != tt.watch {
				t.Errorf("HostDisconnected set: %v, want %v", got, tt.watch)
			}
			if len(scfg.Hosts) != len(tt.local) {
				t.Fatalf("%d host users, want %d", len(scfg.Hosts), len(tt.local))
			}
			for i, l := range tt.local {
				h := scfg.Hosts[i]
				if l && (h.Password == "" || h.Nkey != "") || !l && (h.Nkey == "" || !strings.HasPrefix(h.Nkey, "U") || h.Password != "") {
					t.Errorf("host %d (local %v): password %q, nkey %q", i, l, h.Password, h.Nkey)
				}
			}
		})
	}
}

// TestInProcessDropSuspectsHost: in a job whose agents all run in this
// process (so the control plane watches no connection), an in-process
// agent's dropped control connection still makes its host suspect at
// once (watchInProcess), not only once that agent has stopped its ranks
// and ended. Host 2's rank ignores SIGTERM, so its agent, which stops
// its ranks when it loses the launcher, ends only after the kill grace;
// the launcher must have suspected the host before.
func TestInProcessDropSuspectsHost(t *testing.T) {
	conns := make(chan *control.Control, 4)
	r := startRun(t, 2, `if [ "$RANK" = 1 ]; then trap '' TERM; fi; echo "rank $RANK up"; while :; do sleep 1; done`, func(c *Config) {
		c.Hosts = []topology.Host{{Name: "127.0.0.1", Slots: 1}, {Name: "127.0.0.2", Slots: 1}}
		c.KillGrace = 3 * time.Second
		c.agentConfig = func(ac *agent.Config) {
			if ac.Name != "127.0.0.2" {
				return
			}
			dial := ac.Dial
			ac.Dial = func(ctx context.Context, o control.ControlOptions) (*control.Control, error) {
				cc, err := dial(ctx, o)
				if err == nil {
					conns <- cc
				}
				return cc, err
			}
		}
	})
	r.waitLines(regexp.MustCompile(`rank \d up`), 2)
	(<-conns).Close()
	r.wait()
	stderr := r.stderr.String()
	suspect := strings.Index(stderr, "host 127.0.0.2 suspected: its control connection dropped")
	if suspect < 0 {
		t.Fatalf("host 127.0.0.2 was not suspected for its dropped connection; stderr:\n%s", stderr)
	}
	if ended := strings.Index(stderr, "agent on host 127.0.0.2 ended"); ended >= 0 && ended < suspect {
		t.Errorf("the launcher learnt of the drop only from the agent's end; stderr:\n%s", stderr)
	}
}
