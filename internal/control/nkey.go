package control

import (
	"fmt"

	"github.com/gorun/gorun/internal/jobkey"
	"github.com/nats-io/nkeys"
)

// keyPair is the nkey user key of c's host: its control key is the seed.
func keyPair(c jobkey.HostCredentials) (nkeys.KeyPair, error) {
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, c.Control[:])
	if err != nil {
		return nil, fmt.Errorf("control: deriving control-plane key: %w", err)
	}
	return kp, nil
}

// PublicKey is the public nkey the control-plane server admits as the user
// of c's host (over TCP).
func PublicKey(c jobkey.HostCredentials) (string, error) {
	kp, err := keyPair(c)
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}
