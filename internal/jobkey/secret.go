package jobkey

// Credentials, and who holds which (DESIGN.md §4, least privilege).
//
// The launcher generates a job's Secret and never lets it leave its
// process. Everything else is derived from it with domain-separated
// HMAC-SHA256 (the label names the use, the host index is bound where the
// key is a host's), so that holding one derived key gives neither the
// secret nor any other key:
//
//	Secret (launcher only)
//	├─ InProcessPassword        the launcher's control-plane user: publishes everything
//	├─ HostCredentials(i)       what agent i receives, on its stdin, and nothing more:
//	│  ├─ Control               nkey seed of host i's control-plane user, which may
//	│  │                        publish only host i's subjects (wire.Subjects.ForHost)
//	│  ├─ Data                  the data-plane key (below)
//	│  ├─ Link                  authenticates replica links between agents
//	│  └─ Pin                   SHA-256 of the control-plane server's certificate (TLS)
//	└─ DataKey                  what a rank receives in its Welcome: it authenticates
//	                            Comm links between ranks, and opens nothing else
//
// So a rank cannot connect to the control plane at all, nor open a replica
// link; a compromised host can speak on the control plane only as itself
// (its heartbeats, events, output, fences), never as another host or as
// the launcher. (The link key is shared by the job's agents: a compromised
// host could still open a replica link claiming another host's index.) Keys are redacted in logs and errors
// (String, LogValue) and cross process boundaries only over pipes and
// sockets private to the job's user, never in argv or the environment.

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
)

// SecretSize is the size of a job secret, and of every key derived from
// it, in bytes.
const SecretSize = 32

// Secret is a job's master secret, held by the launcher alone. Its String
// and LogValue methods redact it, so a Secret never reaches a log or an
// error by accident.
type Secret [SecretSize]byte

// Key is a key derived from a job's Secret for one use. Like Secret, it
// redacts itself in logs and errors; use Hex to hand it to another process
// (over a pipe or a socket only the job's user can open, never argv).
type Key [SecretSize]byte

// ErrBadSecret reports a secret, key or credentials line that cannot be
// parsed.
var ErrBadSecret = errors.New("jobkey: bad secret")

// NewSecret returns a fresh random secret.
func NewSecret() (Secret, error) {
	var s Secret
	if _, err := rand.Read(s[:]); err != nil {
		return s, fmt.Errorf("jobkey: generating secret: %w", err)
	}
	return s, nil
}

// ParseKey parses the hex form written by Key.Hex, ignoring surrounding space.
func ParseKey(h string) (Key, error) {
	var k Key
	if err := parseHex(k[:], h); err != nil {
		return k, err
	}
	return k, nil
}

func parseHex(dst []byte, h string) error {
	b, err := hex.DecodeString(strings.TrimSpace(h))
	if err != nil || len(b) != len(dst) {
		return fmt.Errorf("%w: want %d hex-encoded bytes", ErrBadSecret, len(dst))
	}
	copy(dst, b)
	return nil
}

// String redacts s.
func (s Secret) String() string { return "[secret]" }

// LogValue redacts s in structured logs.
func (s Secret) LogValue() slog.Value { return slog.StringValue("[secret]") }

// Hex is the transport form of k.
func (k Key) Hex() string { return hex.EncodeToString(k[:]) }

// String redacts k.
func (k Key) String() string { return "[key]" }

// LogValue redacts k in structured logs.
func (k Key) LogValue() slog.Value { return slog.StringValue("[key]") }

// Labels of the derived keys. Each label that is followed by a host index
// ends in a NUL, so no label is a prefix of another label followed by a
// host index. labelData has none: it keeps the value the data-plane key
// had before the keys were separated, and is never followed by an index.
const (
	labelData       = "gorun data-plane key v1"
	labelLink       = "gorun agent-link key v1\x00"
	labelHost       = "gorun control-plane host key v1\x00"
	labelInProcess  = "gorun in-process password\x00"
	labelHostInProc = "gorun in-process host password v1\x00"
)

// derive is HMAC-SHA256(s, label || host) for a host's key, or
// HMAC-SHA256(s, label) when host < 0.
func (s Secret) derive(label string, host int) Key {
	m := hmac.New(sha256.New, s[:])
	m.Write([]byte(label))
	if host >= 0 {
		m.Write(binary.BigEndian.AppendUint64(nil, uint64(host)))
	}
	var k Key
	m.Sum(k[:0])
	return k
}

// DataKey is the key ranks authenticate their data-plane links with
// (comm.CommConfig.Key); it is all a rank receives.
func (s Secret) DataKey() Key { return s.derive(labelData, -1) }

// LinkKey is the key agents authenticate replica links with (comm.LinkAuth.Key).
func (s Secret) LinkKey() Key { return s.derive(labelLink, -1) }

// InProcessPassword is the password of the launcher's own in-process
// control-plane client (control.DialInProcess), which may publish on every
// subject; it never crosses a socket.
func (s Secret) InProcessPassword() string {
	h := sha256.Sum256(append([]byte(labelInProcess), s[:]...))
	return hex.EncodeToString(h[:])
}

// HostCredentials returns what the agent of host (an index in the job's
// host list) receives, with pin, the server certificate's fingerprint
// (nil when the control plane does not use TLS).
func (s Secret) HostCredentials(host int, pin []byte) HostCredentials {
	return HostCredentials{
		Host: host, Control: s.derive(labelHost, host),
		Data: s.DataKey(), Link: s.LinkKey(), Pin: bytes.Clone(pin),
	}
}

// HostCredentials are one agent's credentials (see the top of this file).
// Its String and LogValue redact it; Encode is its transport form, one
// line on the agent's stdin.
type HostCredentials struct {
	Host    int    // the host they belong to
	Control Key    // nkey seed of the host's control-plane user (control.PublicKey)
	Data    Key    // the data-plane key, passed on to the host's ranks
	Link    Key    // the replica-link key
	Pin     []byte // SHA-256 of the server's TLS certificate; nil: no TLS
}

// credVersion starts the transport form of HostCredentials.
const credVersion = "gorun-cred-v1"

// Encode is the transport form of c: one line, without its newline.
func (c HostCredentials) Encode() string {
	pin := "-"
	if len(c.Pin) > 0 {
		pin = hex.EncodeToString(c.Pin)
	}
	return strings.Join([]string{credVersion, strconv.Itoa(c.Host), c.Control.Hex(), c.Data.Hex(), c.Link.Hex(), pin}, " ")
}

// ParseHostCredentials parses what Encode wrote, ignoring surrounding space.
func ParseHostCredentials(line string) (HostCredentials, error) {
	var c HostCredentials
	f := strings.Fields(line)
	if len(f) != 6 || f[0] != credVersion {
		return c, fmt.Errorf("%w: not a %s credentials line", ErrBadSecret, credVersion)
	}
	h, err := strconv.Atoi(f[1])
	if err != nil || h < 0 {
		return c, fmt.Errorf("%w: bad host index", ErrBadSecret)
	}
	c.Host = h
	for i, k := range []*Key{&c.Control, &c.Data, &c.Link} {
		if err := parseHex(k[:], f[2+i]); err != nil {
			return c, err
		}
	}
	if f[5] != "-" {
		pin, err := hex.DecodeString(f[5])
		if err != nil || len(pin) != sha256.Size {
			return c, fmt.Errorf("%w: bad certificate fingerprint", ErrBadSecret)
		}
		c.Pin = pin
	}
	return c, nil
}

// String redacts c.
func (c HostCredentials) String() string { return fmt.Sprintf("[credentials of host %d]", c.Host) }

// LogValue redacts c in structured logs.
func (c HostCredentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

// InProcessPassword is the password of this host's user on an in-process
// connection (the agent of the launcher's own host); it never crosses a
// socket.
func (c HostCredentials) InProcessPassword() string {
	h := sha256.Sum256(append([]byte(labelHostInProc), c.Control[:]...))
	return hex.EncodeToString(h[:])
}
