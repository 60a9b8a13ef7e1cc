package comm

// Connection setup: accepting and dialling a Comm's links, and
// registering them.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func (c *Comm) acceptLoop() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			if c.dead() || errors.Is(err, net.ErrClosed) {
				return
			}
			c.log.Warn("comm: data-plane accept", "err", err)
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-t.C:
			case <-c.life.Done():
				t.Stop()
				return
			}
			continue
		}
		select {
		case c.hsSem <- struct{}{}:
		default:
			c.log.Warn("comm: refused data-plane connection: too many handshakes", "remote", conn.RemoteAddr().String())
			conn.Close()
			continue
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() { <-c.hsSem }()
			c.accept(conn)
		}()
	}
}

// accept authenticates an inbound connection and registers it.
func (c *Comm) accept(conn net.Conn) {
	conn.SetDeadline(time.Now().Add(c.hsTimeout))
	stop := context.AfterFunc(c.life, func() { conn.SetDeadline(aLongTimeAgo) })
	from, ch, err := c.auth.accept(conn, c.rank, c.size, c.linkFree)
	var shm *shmLink
	if err == nil {
		shm, err = c.setupShm(conn, from, ch)
	}
	if !stop() {
		shm.unmap()
		conn.Close()
		return
	}
	if err != nil {
		c.log.Warn("comm: refused data-plane connection", "remote", conn.RemoteAddr().String(), "err", err)
		conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	if err := c.register(from, ch, conn, shm); err != nil {
		c.log.Warn("comm: refused data-plane connection", "remote", conn.RemoteAddr().String(), "peer", from, "err", err)
		shm.unmap()
		conn.Close()
	}
}

// setupShm gives the collective link to rank r its shared-memory rings
// when r is a ring neighbour on this host (shm.go). Only a failure of conn
// is an error; without rings the link works as a plain socket.
func (c *Comm) setupShm(conn net.Conn, r int, ch byte) (*shmLink, error) {
	if ch != chanColl || !wantsShm(conn, c.rank, r, c.size) {
		return nil, nil
	}
	shm, err := setupShm(conn, c.segBytes)
	if nse, ok := errors.AsType[*noShmError](err); ok {
		c.log.Debug("comm: collective link without shared memory", "peer", r, "err", nse)
		return nil, nil
	}
	return shm, err
}

// dialLoop connects to rank to on channel ch, retrying until it succeeds
// or ctx ends.
func (c *Comm) dialLoop(ctx context.Context, to int, ch byte) {
	backoff := 2 * time.Millisecond
	for {
		conn, shm, err := c.dial(ctx, to, ch)
		if err == nil {
			if err := c.register(to, ch, conn, shm); err != nil {
				c.log.Warn("comm: dropped data-plane link", "peer", to, "err", err)
				shm.unmap()
				conn.Close()
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrAuth) {
			c.log.Warn("comm: data-plane handshake failed; retrying", "peer", to, "addr", c.addrs[to], "err", err)
		} else {
			c.log.Debug("comm: dialing data plane; retrying", "peer", to, "addr", c.addrs[to], "err", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

func (c *Comm) dial(ctx context.Context, to int, ch byte) (net.Conn, *shmLink, error) {
	d := net.Dialer{KeepAliveConfig: keepAlive}
	network, addr := splitAddr(c.addrs[to])
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, nil, err
	}
	conn.SetDeadline(time.Now().Add(c.hsTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(aLongTimeAgo) })
	err = c.auth.dial(conn, ch, c.rank, to)
	var shm *shmLink
	if err == nil {
		shm, err = c.setupShm(conn, to, ch)
	}
	if !stop() {
		shm.unmap()
		conn.Close()
		return nil, nil, ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	conn.SetDeadline(time.Time{})
	return conn, shm, nil
}

// linkFree says whether rank r may still connect on channel ch.
func (c *Comm) linkFree(r int, ch byte) error {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	switch {
	case c.closing:
		return ErrClosed
	case c.peers[r].links[ch] != nil:
		return fmt.Errorf("comm: rank %d is already connected (channel %d)", r, ch)
	}
	return nil
}

// register installs an authenticated link (and the collective link's
// rings, when it has them).
func (c *Comm) register(r int, ch byte, conn net.Conn, shm *shmLink) error {
	if err := c.linkFree(r, ch); err != nil {
		return err
	}
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.closing || c.peers[r].links[ch] != nil {
		return fmt.Errorf("comm: rank %d: link raced with another (channel %d)", r, ch)
	}
	p := c.peers[r]
	tune(conn)
	p.links[ch] = conn
	if ch == chanColl {
		p.shm = shm
	}
	if ch == chanP2P {
		c.wg.Add(1)
		go c.readLoop(p, conn)
	}
	c.missing--
	if c.missing == 0 {
		close(c.allUp)
	}
	return nil
}

// UnixAddrPrefix marks an address in CommConfig.Addrs as a Unix socket
// path: ranks on one host link through Unix sockets, several times faster
// than loopback TCP.
const UnixAddrPrefix = "unix:"

// splitAddr returns the network and address of a data-plane address.
func splitAddr(a string) (network, addr string) {
	if p, ok := strings.CutPrefix(a, UnixAddrPrefix); ok {
		return "unix", p
	}
	return "tcp", a
}

func tune(conn net.Conn) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return
	}
	tc.SetNoDelay(true)
	tc.SetKeepAliveConfig(keepAlive)
	if rc, err := tc.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout/time.Millisecond))
		})
	}
	if socketBuffer > 0 {
		tc.SetReadBuffer(socketBuffer)
		tc.SetWriteBuffer(socketBuffer)
	}
}
