package comm

// Authentication: the handshake that proves both ends of a new link hold
// the key (see dataplane.go).

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/gorun/gorun/internal/jobkey"
)

const (
	hsMagic      = "GRDP"
	hsVersion    = 1
	nonceSize    = 32
	macSize      = sha256.Size
	helloSize    = len(hsMagic) + 1 + nonceSize                           // acceptor's challenge
	answerSize   = len(hsMagic) + 1 + 1 + 1 + 4 + 4 + nonceSize + macSize // dialer's answer
	flagLittle   = 1                                                      // the dialer is little-endian
	hsAck        = 0x5a
	roleDialer   = "dialer"
	roleAcceptor = "acceptor"
)

// authenticator proves and checks knowledge of a key (the data-plane key,
// or a link key) for one job and epoch.
type authenticator struct {
	key   jobkey.Key
	job   string
	epoch uint64
	// channelOK says which channels an acceptor takes; higherDials, that
	// only higher ranks may dial (a Comm's rule; links have none).
	channelOK   func(byte) bool
	higherDials bool
}

func newAuthenticator(k jobkey.Key, job string, epoch uint64) authenticator {
	return authenticator{key: k, job: job, epoch: epoch, channelOK: func(ch byte) bool { return ch < numChans }, higherDials: true}
}

func (a *authenticator) mac(role string, ch byte, dialer, acceptor int, nonceA, nonceD []byte) []byte {
	b := make([]byte, 0, 64+len(a.job)+2*nonceSize)
	b = append(b, "gorun-dp\x00"...)
	b = append(b, role...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(a.job)))
	b = append(b, a.job...)
	b = binary.BigEndian.AppendUint64(b, a.epoch)
	b = append(b, ch)
	b = binary.BigEndian.AppendUint32(b, uint32(dialer))
	b = binary.BigEndian.AppendUint32(b, uint32(acceptor))
	b = append(b, nonceA...)
	b = append(b, nonceD...)
	m := hmac.New(sha256.New, a.key[:])
	m.Write(b)
	return m.Sum(nil)
}

// dial runs the dialer's side of the handshake on conn as rank me,
// expecting rank to at the other end.
func (a *authenticator) dial(conn net.Conn, ch byte, me, to int) error {
	var hello [helloSize]byte
	if _, err := io.ReadFull(conn, hello[:]); err != nil {
		return fmt.Errorf("reading challenge: %w", err)
	}
	if string(hello[:4]) != hsMagic || hello[4] != hsVersion {
		return fmt.Errorf("%w: rank %d's address does not speak the gorun data plane (version %d)", ErrAuth, to, hello[4])
	}
	nonceA := hello[5:]
	ans := make([]byte, 0, answerSize)
	ans = append(ans, hsMagic...)
	ans = append(ans, hsVersion, ch, flags())
	ans = binary.BigEndian.AppendUint32(ans, uint32(me))
	ans = binary.BigEndian.AppendUint32(ans, uint32(to))
	nonceD := make([]byte, nonceSize)
	rand.Read(nonceD)
	ans = append(ans, nonceD...)
	ans = append(ans, a.mac(roleDialer, ch, me, to, nonceA, nonceD)...)
	if _, err := conn.Write(ans); err != nil {
		return fmt.Errorf("answering challenge: %w", err)
	}
	var proof [macSize]byte
	if _, err := io.ReadFull(conn, proof[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: refused by rank %d (another job, epoch or key?)", ErrAuth, to)
		}
		return fmt.Errorf("reading proof: %w", err)
	}
	if !hmac.Equal(proof[:], a.mac(roleAcceptor, ch, me, to, nonceA, nonceD)) {
		return fmt.Errorf("%w: rank %d's address failed to prove the job's key for job %q epoch %d", ErrAuth, to, a.job, a.epoch)
	}
	if _, err := conn.Write([]byte{hsAck}); err != nil {
		return fmt.Errorf("acknowledging: %w", err)
	}
	return nil
}

// accept runs the acceptor's side of the handshake on conn as rank me of
// size ranks; free says whether the authenticated dialer may have a link
// on its channel. It returns the authenticated dialer's rank and channel.
// Nothing but the challenge and, once the dialer is authenticated, the
// proof is written to conn.
func (a *authenticator) accept(conn net.Conn, me, size int, free func(int, byte) error) (int, byte, error) {
	hello := make([]byte, 0, helloSize)
	hello = append(hello, hsMagic...)
	hello = append(hello, hsVersion)
	nonceA := make([]byte, nonceSize)
	rand.Read(nonceA)
	hello = append(hello, nonceA...)
	if _, err := conn.Write(hello); err != nil {
		return 0, 0, fmt.Errorf("sending challenge: %w", err)
	}
	var ans [answerSize]byte
	if _, err := io.ReadFull(conn, ans[:]); err != nil {
		return 0, 0, fmt.Errorf("%w: reading answer: %w", ErrAuth, err)
	}
	if string(ans[:4]) != hsMagic || ans[4] != hsVersion {
		return 0, 0, fmt.Errorf("%w: not a gorun data-plane peer", ErrAuth)
	}
	ch, fl := ans[5], ans[6]
	dialer := int(binary.BigEndian.Uint32(ans[7:]))
	acceptor := int(binary.BigEndian.Uint32(ans[11:]))
	nonceD := ans[15 : 15+nonceSize]
	mac := ans[15+nonceSize:]
	switch {
	case !a.channelOK(ch):
		return 0, 0, fmt.Errorf("%w: unknown channel %d", ErrAuth, ch)
	case acceptor != me:
		return 0, 0, fmt.Errorf("%w: peer wants rank %d, this is rank %d", ErrAuth, acceptor, me)
	case dialer == me || dialer < 0 || dialer >= size || a.higherDials && dialer < me:
		return 0, 0, fmt.Errorf("%w: rank %d may not dial rank %d in a world of %d", ErrAuth, dialer, me, size)
	}
	if !hmac.Equal(mac, a.mac(roleDialer, ch, dialer, me, nonceA, nonceD)) {
		return 0, 0, fmt.Errorf("%w: peer claiming rank %d does not hold the key of job %q epoch %d", ErrAuth, dialer, a.job, a.epoch)
	}
	if fl != flags() {
		return 0, 0, fmt.Errorf("%w: rank %d has the other byte order", ErrAuth, dialer)
	}
	if err := free(dialer, ch); err != nil {
		return 0, 0, err
	}
	if _, err := conn.Write(a.mac(roleAcceptor, ch, dialer, me, nonceA, nonceD)); err != nil {
		return 0, 0, fmt.Errorf("sending proof: %w", err)
	}
	var ack [1]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil || ack[0] != hsAck {
		return 0, 0, fmt.Errorf("rank %d did not acknowledge: %v", dialer, err)
	}
	return dialer, ch, nil
}

func flags() byte {
	if littleEndian {
		return flagLittle
	}
	return 0
}
