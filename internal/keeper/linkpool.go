package keeper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/comm"
)

// ---- Links to other hosts ----------------------------------------------

type link struct {
	// turn is held (a value in it) by the one request on the link at a
	// time; a request waiting for its turn gives up when its context
	// ends, whatever the request before it waits for.
	turn chan struct{}
	conn atomic.Pointer[net.Conn] // the connection, or nil; read by close without turn
}

type linkPool struct {
	h      *Keeper
	mu     sync.Mutex
	links  map[linkKey]*link
	addrs  []string
	closed bool
}

// linkKey names a link: each local rank has its own to each other host,
// so that the ranks of a host replicate side by side rather than one
// after the other (at most ranks per host × replicas links per host).
// lane is 0 but for a rank's erasure-coding shares to a host that keeps
// several parity rows of its stripe (a host holding several places of a
// group): each row's stream has a lane of its own, as the rows' senders
// run side by side (ecSend).
type linkKey struct{ host, rank, lane int }

func newLinkPool(h *Keeper) *linkPool { return &linkPool{h: h, links: map[linkKey]*link{}} }

// SetAddrs sets the replication address of every host (indexed by host).
// Replications waiting to retry try again at once.
func (h *Keeper) SetAddrs(addrs []string) {
	h.links.mu.Lock()
	h.links.addrs = slices.Clone(addrs)
	h.links.mu.Unlock()
	for _, s := range h.place().svcs {
		s.rep.poke()
	}
}

// linkError is a failure of the link to another host itself (it could
// not be dialed, or broke), not a refusal by that host.
type linkError struct {
	host int
	err  error
}

func (e *linkError) Error() string { return fmt.Sprintf("link to host %d: %v", e.host, e.err) }
func (e *linkError) Unwrap() error { return e.err }

func (p *linkPool) get(host, rank, lane int) (*link, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, "", ErrStopping
	}
	if host != p.h.cfg.Host && (host < 0 || host >= len(p.addrs) || p.addrs[host] == "") {
		return nil, "", fmt.Errorf("no replication address for host %d", host)
	}
	k := linkKey{host, rank, lane}
	l := p.links[k]
	if l == nil {
		l = &link{turn: make(chan struct{}, 1)}
		p.links[k] = l
	}
	if host == p.h.cfg.Host {
		return l, "", nil
	}
	return l, p.addrs[host], nil
}

// pipe returns a link to this host itself: an in-process connection
// served by the replica store as an accepted link is (erasure coding
// sends a rank's share of a parity row kept on its own host). p.mu is
// held, p is not closed.
func (p *linkPool) pipe() net.Conn {
	c, srv := net.Pipe()
	p.h.wg.Add(1)
	go func() {
		defer p.h.wg.Done()
		p.h.store.serve(p.h.life, p.h.cfg.Host, srv)
	}()
	return c
}

func (p *linkPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, l := range p.links {
		// A request in flight holds l.turn; closing its conn ends it.
		if c := l.conn.Load(); c != nil {
			(*c).Close()
		}
	}
}

// do runs one request of local rank rank on its link to host: f writes
// it and reads the answer. A link failure drops the connection (the next
// request redials); a refusal keeps it.
func (p *linkPool) do(ctx context.Context, host, rank int, f func(c net.Conn) error) error {
	return p.doLane(ctx, host, rank, 0, f)
}

// doLane is do on lane lane of the link (linkKey).
func (p *linkPool) doLane(ctx context.Context, host, rank, lane int, f func(c net.Conn) error) error {
	l, addr, err := p.get(host, rank, lane)
	if err != nil {
		return err
	}
	if ctx.Err() != nil { // select would pick a free turn as readily
		return context.Cause(ctx)
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { <-l.turn }()
	if l.conn.Load() == nil && host == p.h.cfg.Host {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ErrStopping
		}
		c := p.pipe()
		l.conn.Store(&c)
		p.mu.Unlock()
	}
	if l.conn.Load() == nil {
		c, err := comm.DialLink(ctx, addr, p.h.linkAuth(), p.h.cfg.Host, host)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			return &linkError{host: host, err: err}
		}
		// Stored under p.mu, so that close either sees it or refuses it.
		p.mu.Lock()
		closed := p.closed
		if !closed {
			l.conn.Store(&c)
		}
		p.mu.Unlock()
		if closed {
			c.Close()
			return ErrStopping
		}
	}
	c := *l.conn.Load()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err = f(c)
	_, refused := errors.AsType[*remoteError](err)
	if fired := !stop(); fired || err != nil && !refused {
		if fired && err == nil {
			err = ctx.Err()
		}
		if !fired {
			err = &linkError{host: host, err: err}
		}
		c.Close()
		l.conn.Store(nil)
	}
	return err
}

// has asks host whether it holds the step of h (a has request) with the
// regions of t, and waits for the answer: nil if it does.
func (p *linkPool) has(ctx context.Context, host int, h linkHdr, t []tableEntry) error {
	return p.acked(ctx, host, h, t, nil)
}

// put sends a put and waits for its acknowledgement.
func (p *linkPool) put(ctx context.Context, host int, h linkHdr, t []tableEntry, data [][]byte) error {
	return p.acked(ctx, host, h, t, data)
}

// acked sends request h with table t and data (nil: none) and waits for
// its acknowledgement.
func (p *linkPool) acked(ctx context.Context, host int, h linkHdr, t []tableEntry, data [][]byte) error {
	return p.do(ctx, host, h.owner, func(c net.Conn) error {
		if err := writeFrame(c, h, t, data); err != nil {
			return err
		}
		return readAck(c, h)
	})
}

// fetch asks host for regions (a get or getSlot request h) and reads them
// into dst, by name, verifying each region's CRC32C and size (readFetched).
func (p *linkPool) fetch(ctx context.Context, host int, h linkHdr, want []tableEntry, dst map[string][]byte) error {
	return p.do(ctx, host, h.owner, func(c net.Conn) error {
		if err := writeFrame(c, h, want, nil); err != nil {
			return err
		}
		return readFetched(c, h, dst)
	})
}

// readFetched reads the answer to request h (a get or getSlot) into dst,
// by name, verifying each region's CRC32C and size, and deleting from dst
// each region it filled: every region of dst must be in the answer. The
// answer is a data answer, or, to a get, a pieces answer (a diff-mode
// holder's: pieces.go), whose pieces it writes where they go.
func readFetched(c io.Reader, h linkHdr, dst map[string][]byte) error {
	a, err := readAnswer(c)
	if err != nil {
		return err
	}
	pieces := a.kind == kindPieces && h.kind == kindGet
	if a.kind != kindData && !pieces || a.step != h.step {
		return fmt.Errorf("unexpected answer kind %#x step %d", a.kind, a.step)
	}
	t, err := readTable(c, a.count)
	if err != nil {
		return err
	}
	if total := tableBytes(t); total != a.length {
		return fmt.Errorf("data of %d bytes for regions of %d", a.length, total)
	}
	if pieces {
		views := make([][]byte, len(t))
		for i, e := range t {
			d, ok := dst[e.name]
			if !ok || int64(len(d)) != e.size {
				return fmt.Errorf("region %q of %d bytes does not fit here (%d)", e.name, e.size, len(d))
			}
			views[i] = d
		}
		if err := readPieces(c, t, views, h.step); err != nil {
			return err
		}
	}
	for _, e := range t {
		if !pieces {
			err := fillRegion(dst, e, h.step, func(d []byte) error { _, err := io.ReadFull(c, d); return err })
			if err != nil {
				return err
			}
		}
		delete(dst, e.name)
	}
	if len(dst) > 0 {
		return fmt.Errorf("regions missing from the answer: %d", len(dst))
	}
	return nil
}

var _ = ckpt.ErrNoStep
