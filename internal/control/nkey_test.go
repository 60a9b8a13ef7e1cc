package control_test

import (
	"testing"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/jobkey"
)

// TestHostPublicKeys: each host's control-plane user has its own public
// nkey, a function of the job's secret and the host index.
func TestHostPublicKeys(t *testing.T) {
	secrets := [2]jobkey.Secret{newSecret(t), newSecret(t)}
	seen := map[string]string{}
	for _, c := range []struct {
		name         string
		secret, host int
	}{
		{"host 0", 0, 0},
		{"host 1", 0, 1},
		{"host 0 of another job", 1, 0},
	} {
		p, err := control.PublicKey(secrets[c.secret].HostCredentials(c.host, nil))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if again, err := control.PublicKey(secrets[c.secret].HostCredentials(c.host, nil)); err != nil || again != p {
			t.Errorf("%s: public key %s, then %s (%v)", c.name, p, again, err)
		}
		if other, dup := seen[p]; dup {
			t.Errorf("%s and %s share a public key", c.name, other)
		}
		seen[p] = c.name
	}
}
