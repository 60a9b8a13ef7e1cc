package comm

// Point-to-point messages: Send, Recv and the reader of each peer's
// message link.

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"
)

// Send sends b to rank to. It returns once b is handed to the kernel (b
// may then be reused), not when the peer received it. Messages to one peer
// arrive in the order they were sent. If ctx ends while b is being
// written, the link's write side is closed (the peer sees ErrPeerLost on
// its next Recv) and later Sends to that rank fail.
func (c *Comm) Send(ctx context.Context, to int, b []byte) error {
	const op = "Send"
	p, err := c.peerFor(op, to)
	if err != nil {
		return err
	}
	if len(b) > maxMessage {
		return fmt.Errorf("comm: Send: %d bytes exceed the %d-byte message limit", len(b), maxMessage)
	}
	if err := c.check(ctx, op); err != nil {
		return err
	}
	select {
	case p.sendSem <- struct{}{}:
	case <-ctx.Done():
		return ctxErr(op, ctx)
	case <-c.life.Done():
		return c.stateErr(op)
	}
	defer func() { <-p.sendSem }()
	if p.sendErr != nil {
		if c.dead() {
			return c.stateErr(op)
		}
		return p.sendErr
	}
	select {
	case <-p.readerDone: // the peer closed the link, or it broke
		return c.classify(op, ctx, to, p.readerErr)
	default:
	}
	conn := p.links[chanP2P]
	var hdr [headerSize]byte
	header{kind: kindMsg, seq: p.sendSeq, n: uint64(len(b))}.put(hdr[:])
	stop := c.watch(ctx, func() { conn.SetWriteDeadline(aLongTimeAgo) })
	bufs := net.Buffers{hdr[:], b}
	_, err = bufs.WriteTo(conn)
	if !stop() && err == nil {
		conn.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		p.sendErr = peerLost(op, to, fmt.Errorf("link cut by an earlier Send: %w", err))
		err = c.classify(op, ctx, to, err)
		if !c.dead() {
			// A partial frame is on the wire: end the stream, so the peer
			// fails instead of waiting for the rest.
			if cw, ok := conn.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			} else {
				conn.Close()
			}
		}
		return err
	}
	p.sendSeq++
	return nil
}

// Recv returns the next message from rank from. Messages already received
// are delivered even after the peer left; then Recv fails with ErrPeerLost.
func (c *Comm) Recv(ctx context.Context, from int) ([]byte, error) {
	const op = "Recv"
	p, err := c.peerFor(op, from)
	if err != nil {
		return nil, err
	}
	if err := c.check(ctx, op); err != nil {
		return nil, err
	}
	select {
	case b := <-p.inbox:
		return b, nil
	case <-p.readerDone:
		select {
		case b := <-p.inbox:
			return b, nil
		default:
		}
		return nil, c.classify(op, ctx, from, p.readerErr)
	case <-ctx.Done():
		return nil, ctxErr(op, ctx)
	case <-c.life.Done():
		return nil, c.stateErr(op)
	}
}

// readLoop reads p's messages into p.inbox until the link fails or the
// Comm ends.
func (c *Comm) readLoop(p *peer, conn net.Conn) {
	defer c.wg.Done()
	var err error
	defer func() {
		p.readerErr = err
		close(p.readerDone)
	}()
	var hb [headerSize]byte
	for seq := uint32(0); ; seq++ {
		if _, err = io.ReadFull(conn, hb[:]); err != nil {
			return
		}
		h := parseHeader(hb[:])
		if h.kind != kindMsg || h.seq != seq || h.n > maxMessage {
			err = fmt.Errorf("comm: bad message frame (kind %d, seq %d, want %d, length %d)", h.kind, h.seq, seq, h.n)
			c.log.Warn("comm: closing point-to-point link", "peer", p.rank, "err", err)
			conn.Close()
			return
		}
		b := make([]byte, h.n)
		if _, err = io.ReadFull(conn, b); err != nil {
			return
		}
		select {
		case p.inbox <- b:
		case <-c.life.Done():
			err = context.Cause(c.life)
			return
		}
	}
}
