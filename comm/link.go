package comm

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/gorun/gorun/internal/jobkey"
)

// Links: authenticated point-to-point streams between processes of a job
// that are not the ranks of one Comm, such as the agents of the hosts,
// which send each other replicas of the ranks' protected state. A link is
// a plain stream once authenticated (the caller frames it); the handshake
// is the data plane's, bound to the link key, the job, a purpose and
// both ends' identities, so that a link of one purpose (or a rank's link)
// is never taken for another.

// chanLink is the channel number links use in the handshake; a Comm
// refuses it, and links refuse a Comm's channels.
const chanLink = 2

// LinkAuth is what both ends of a link must agree on.
type LinkAuth struct {
	Job     string     // the job id
	Key     jobkey.Key // the job's link key (jobkey.Secret.LinkKey), which ranks never hold
	Purpose string     // what the links are for, e.g. "replica"; bound into the authentication
}

func (la LinkAuth) authenticator() authenticator {
	// A job id has no '/', so no purpose makes a Comm's job string.
	a := newAuthenticator(la.Key, la.Job+"/"+la.Purpose, 0)
	a.channelOK = func(ch byte) bool { return ch == chanLink }
	a.higherDials = false
	return a
}

// DialLink connects to the process with identity to listening at addr (as
// in CommConfig.Addrs: "ip:port" or UnixAddrPrefix+path), as identity me,
// and authenticates both ends. The handshake is bounded by ctx and by the
// data plane's handshake timeout.
func DialLink(ctx context.Context, addr string, la LinkAuth, me, to int) (net.Conn, error) {
	d := net.Dialer{KeepAliveConfig: keepAlive}
	network, a := splitAddr(addr)
	conn, err := d.DialContext(ctx, network, a)
	if err != nil {
		return nil, fmt.Errorf("comm: link to %d at %s: %w", to, addr, err)
	}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(aLongTimeAgo) })
	auth := la.authenticator()
	err = auth.dial(conn, chanLink, me, to)
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("comm: link to %d: %w", to, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("comm: link to %d at %s: %w", to, addr, err)
	}
	conn.SetDeadline(time.Time{})
	tune(conn)
	return conn, nil
}

// AcceptLink authenticates an inbound connection as identity me of size
// identities (0 to size-1) and returns the dialer's identity. The caller
// closes conn when AcceptLink fails. The handshake is bounded by the data
// plane's handshake timeout.
func AcceptLink(conn net.Conn, la LinkAuth, me, size int) (int, error) {
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	auth := la.authenticator()
	from, _, err := auth.accept(conn, me, size, func(int, byte) error { return nil })
	if err != nil {
		return 0, fmt.Errorf("comm: link: %w", err)
	}
	conn.SetDeadline(time.Time{})
	tune(conn)
	return from, nil
}
