package comm

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nkeys"
)

// SecretSize is the size of a job secret in bytes.
const SecretSize = 32

// Secret is a job's shared secret. Its String and LogValue methods redact
// it, so a Secret never reaches a log or an error by accident; use Hex to
// hand it to another process (over a pipe or a 0600 file, never argv).
type Secret [SecretSize]byte

// ErrBadSecret reports a secret that cannot be parsed.
var ErrBadSecret = errors.New("comm: bad secret")

// NewSecret returns a fresh random secret.
func NewSecret() (Secret, error) {
	var s Secret
	if _, err := rand.Read(s[:]); err != nil {
		return s, fmt.Errorf("comm: generating secret: %w", err)
	}
	return s, nil
}

// ParseSecret parses the hex form written by Hex, ignoring surrounding space.
func ParseSecret(h string) (Secret, error) {
	var s Secret
	b, err := hex.DecodeString(strings.TrimSpace(h))
	if err != nil || len(b) != SecretSize {
		return s, fmt.Errorf("%w: want %d hex-encoded bytes", ErrBadSecret, SecretSize)
	}
	copy(s[:], b)
	return s, nil
}

// Hex is the transport form of s.
func (s Secret) Hex() string { return hex.EncodeToString(s[:]) }

// String redacts s.
func (s Secret) String() string { return "[secret]" }

// LogValue redacts s in structured logs.
func (s Secret) LogValue() slog.Value { return slog.StringValue("[secret]") }

// InProcessPassword is the password in-process clients present (see
// DialInProcess); it is derived from s and never crosses a socket.
func (s Secret) InProcessPassword() string {
	h := sha256.Sum256(append([]byte("gorun in-process password\x00"), s[:]...))
	return hex.EncodeToString(h[:])
}

// keyPair is the nkey user key derived from s.
func (s Secret) keyPair() (nkeys.KeyPair, error) {
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, s[:])
	if err != nil {
		return nil, fmt.Errorf("comm: deriving control-plane key: %w", err)
	}
	return kp, nil
}

// PublicKey is the public nkey the control-plane server admits for s.
func (s Secret) PublicKey() (string, error) {
	kp, err := s.keyPair()
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}
