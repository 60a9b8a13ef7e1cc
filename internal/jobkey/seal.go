package jobkey

// Sealed credentials: how one stream read by every agent (srun's stdin,
// which it broadcasts to every task) carries each host's credentials so
// that only that host can read them. Each agent makes an ephemeral X25519
// key and shows the launcher its public half; the launcher seals host i's
// HostCredentials to it: a fresh X25519 key of its own, ECDH, HKDF-SHA256
// over the shared secret and both public keys, AES-256-GCM with the job
// and the host index as associated data. A sealed line opens only with
// the one private key, and only as the job's host i.

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
)

// sealInfo labels the HKDF expansion of a seal's key.
const sealInfo = "gorun sealed host credentials v1"

// NewSealKey returns a fresh X25519 key to receive sealed credentials with
// (OpenHostCredentials); its PublicKey().Bytes() is what the launcher
// seals to.
func NewSealKey() (*ecdh.PrivateKey, error) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("jobkey: seal key: %w", err)
	}
	return k, nil
}

// SealHostCredentials seals c, the credentials of host c.Host of job, to
// the X25519 public key to. The result is one line of base64 (no newline).
func SealHostCredentials(c HostCredentials, job string, to []byte) (string, error) {
	pub, err := ecdh.X25519().NewPublicKey(to)
	if err != nil {
		return "", fmt.Errorf("%w: the agent's public key: %w", ErrBadSecret, err)
	}
	eph, err := NewSealKey()
	if err != nil {
		return "", err
	}
	aead, err := sealAEAD(eph, pub, eph.PublicKey().Bytes(), to)
	if err != nil {
		return "", err
	}
	out := append([]byte{}, eph.PublicKey().Bytes()...)
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("jobkey: seal: %w", err)
	}
	out = append(out, nonce...)
	out = aead.Seal(out, nonce, []byte(c.Encode()), sealAD(job, c.Host))
	return base64.RawStdEncoding.EncodeToString(out), nil
}

// OpenHostCredentials opens what SealHostCredentials sealed to key's public
// half for host of job. Anything else (another host's line, another job's,
// a line sealed to another key, a changed byte) is an error wrapping
// ErrBadSecret.
func OpenHostCredentials(sealed, job string, host int, key *ecdh.PrivateKey) (HostCredentials, error) {
	b, err := base64.RawStdEncoding.DecodeString(sealed)
	const ephLen, nonceLen = 32, 12
	if err != nil || len(b) < ephLen+nonceLen {
		return HostCredentials{}, fmt.Errorf("%w: not sealed credentials", ErrBadSecret)
	}
	peer, err := ecdh.X25519().NewPublicKey(b[:ephLen])
	if err != nil {
		return HostCredentials{}, fmt.Errorf("%w: sealed credentials: %w", ErrBadSecret, err)
	}
	aead, err := sealAEAD(key, peer, b[:ephLen], key.PublicKey().Bytes())
	if err != nil {
		return HostCredentials{}, err
	}
	plain, err := aead.Open(nil, b[ephLen:ephLen+nonceLen], b[ephLen+nonceLen:], sealAD(job, host))
	if err != nil {
		return HostCredentials{}, fmt.Errorf("%w: sealed credentials do not open for host %d", ErrBadSecret, host)
	}
	c, err := ParseHostCredentials(string(plain))
	if err == nil && c.Host != host {
		err = fmt.Errorf("%w: credentials of host %d sealed for host %d", ErrBadSecret, c.Host, host)
	}
	return c, err
}

// sealAEAD is the AES-256-GCM of the ECDH of priv and pub, its key expanded
// with both public keys (the sender's ephemeral one first).
func sealAEAD(priv *ecdh.PrivateKey, pub *ecdh.PublicKey, ephPub, toPub []byte) (cipher.AEAD, error) {
	shared, err := priv.ECDH(pub)
	if err != nil {
		return nil, fmt.Errorf("%w: seal: %w", ErrBadSecret, err)
	}
	info := append(append([]byte(sealInfo), ephPub...), toPub...)
	key, err := hkdf.Key(sha256.New, shared, nil, string(info), 32)
	if err != nil {
		return nil, fmt.Errorf("jobkey: seal: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("jobkey: seal: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("jobkey: seal: %w", err)
	}
	return aead, nil
}

// sealAD binds a sealed line to its job and host.
func sealAD(job string, host int) []byte {
	return []byte(sealInfo + "\x00" + job + "\x00" + strconv.Itoa(host))
}
