package jobkey_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/jobkey"
)

// TestKeysAreSeparated: every derived key differs from the secret and
// from every other, and a host's control key is its own.
func TestKeysAreSeparated(t *testing.T) {
	s := newSecret(t)
	pin := sha256.Sum256([]byte("cert"))
	c0, c1 := s.HostCredentials(0, pin[:]), s.HostCredentials(1, pin[:])
	keys := map[string][32]byte{
		"secret": s, "data": s.DataKey(), "link": s.LinkKey(),
		"host 0 control": c0.Control, "host 1 control": c1.Control,
	}
	seen := map[[32]byte]string{}
	for name, k := range keys {
		if other, dup := seen[k]; dup {
			t.Errorf("%s and %s are the same key", name, other)
		}
		seen[k] = name
	}
	if c0.Data != s.DataKey() || c0.Link != s.LinkKey() || c1.Data != c0.Data {
		t.Error("the agents' data-plane and link keys are not the job's")
	}
	if s.HostCredentials(0, nil).Control != c0.Control || newSecret(t).HostCredentials(0, nil).Control == c0.Control {
		t.Error("a host's control key is not a function of the secret and the host")
	}
	if c0.InProcessPassword() == c1.InProcessPassword() || c0.InProcessPassword() == s.InProcessPassword() {
		t.Error("two principals share a credential")
	}
}

func TestHostCredentialsTransport(t *testing.T) {
	s := newSecret(t)
	pin := sha256.Sum256([]byte("cert"))
	for _, c := range []jobkey.HostCredentials{s.HostCredentials(3, pin[:]), s.HostCredentials(0, nil)} {
		line := c.Encode()
		if strings.ContainsAny(line, "\n\r") {
			t.Fatalf("Encode has a line break: %q", line)
		}
		back, err := jobkey.ParseHostCredentials(line + "\n")
		if err != nil || back.Host != c.Host || back.Control != c.Control || back.Data != c.Data || back.Link != c.Link || !bytes.Equal(back.Pin, c.Pin) {
			t.Fatalf("ParseHostCredentials(Encode) = %+v, %v", back, err)
		}
		if strings.Contains(line, hex.EncodeToString(s[:])) {
			t.Fatal("the credentials line carries the job secret")
		}
	}
	good := s.HostCredentials(1, pin[:]).Encode()
	f := strings.Fields(good)
	for name, bad := range map[string]string{
		"empty": "", "old form (a bare secret)": hex.EncodeToString(s[:]), "other version": "gorun-cred-v0" + good[len("gorun-cred-v1"):],
		"negative host": strings.Replace(good, " 1 ", " -1 ", 1), "short key": strings.Replace(good, f[2], f[2][:10], 1),
		"bad pin": strings.Replace(good, f[5], "zz", 1), "missing field": strings.Join(f[:5], " "),
	} {
		if _, err := jobkey.ParseHostCredentials(bad); !errors.Is(err, jobkey.ErrBadSecret) {
			t.Errorf("%s: ParseHostCredentials = %v, want ErrBadSecret", name, err)
		}
	}
}

// TestKeysAreRedacted: keys and credentials never reach a log or an error
// by accident.
func TestKeysAreRedacted(t *testing.T) {
	s := newSecret(t)
	c := s.HostCredentials(2, []byte("0123456789abcdef0123456789abcdef"))
	k := s.DataKey()
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "creds", c, "key", k, "secret", s)
	out := logs.String() + fmt.Sprint(c, k, s) + fmt.Sprintf("%v %s %+v", c, k, k)
	for _, h := range []string{hex.EncodeToString(s[:]), k.Hex(), c.Control.Hex(), c.Link.Hex()} {
		if strings.Contains(out, h) || strings.Contains(out, h[:16]) {
			t.Fatalf("a key was printed: %s", out)
		}
	}
}

func TestSecretIsRedacted(t *testing.T) {
	s := newSecret(t)
	for _, got := range []string{s.String(), fmt.Sprint(s), fmt.Sprintf("%v %s", s, s)} {
		if got != "[secret]" && got != "[secret] [secret]" {
			t.Errorf("secret printed as %q", got)
		}
	}
	k := s.DataKey()
	back, err := jobkey.ParseKey(k.Hex() + "\n")
	if err != nil || back != k {
		t.Fatalf("ParseKey(Hex) = %v, %v", back == k, err)
	}
	for _, bad := range []string{"", "zz", k.Hex()[:10], k.Hex() + "00"} {
		if _, err := jobkey.ParseKey(bad); !errors.Is(err, jobkey.ErrBadSecret) {
			t.Errorf("ParseKey(%q) = %v", bad, err)
		}
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
