package launcher

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/jobkey"
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
