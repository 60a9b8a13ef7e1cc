package comm

// The data plane: a communicator (Comm) for the ranks of one epoch, built
// on authenticated TCP links, with point-to-point messages. The collectives
// are in collective.go.
//
// # Links
//
// Every pair of ranks holds two TCP connections: one carries Send/Recv
// messages, the other the collectives, so that user messages and
// collective traffic never mix and a collective can read straight into the
// caller's memory. The higher rank dials, the lower accepts.
//
// # Handshake
//
// Nothing but the handshake is written to a connection before its peer has
// proven it holds the data-plane key K (Secret.DataKey, the only credential
// a rank receives; see secret.go), and K itself never crosses it:
//
//	acceptor → dialer   "GRDP" version nonceA
//	dialer → acceptor   "GRDP" version channel flags dialerRank acceptorRank nonceD macD
//	acceptor → dialer   macA
//	dialer → acceptor   ack
//
// where macD and macA are HMAC-SHA256(K, label || job || epoch || channel ||
// dialerRank || acceptorRank || nonceA || nonceD) with distinct labels for
// the two roles. Binding job and epoch refuses a rank of another job or a
// stale rank of an earlier epoch; binding both ranks refuses a connection
// that reached the wrong process; the fresh nonces refuse replays. Each
// side checks the other's MAC with hmac.Equal; the acceptor registers the
// link only after the dialer's ack, so both sides agree it exists. A
// refused connection is logged (Warn) and closed. A handshake is bounded
// in time, so a silent peer cannot hold a goroutine.
//
// The data plane authenticates peers; it does not encrypt traffic.
//
// # Frames
//
// Every message and every collective starts with a 16-byte header: kind,
// a sub-kind (element type or algorithm), a sequence number and a length.
// Lengths read from the wire are checked against maxMessage before any
// allocation, and sequence numbers catch ranks that call collectives in
// different orders. Bulk data follows its header raw.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/jobkey"
)

const (
	// maxMessage bounds a single Send, a Broadcast payload and an Allgather
	// block: no length read from the wire is allocated beyond it.
	maxMessage = 1 << 30
	// maxHandshakes bounds concurrent inbound handshakes; more are refused.
	maxHandshakes = 64
	// inboxDepth is how many received messages wait per peer before TCP
	// flow control holds the sender back.
	inboxDepth = 64
	// defaultSegment is the unit of pipelining of the large collectives:
	// one write or read per segment, and the reduction of a segment stays
	// in cache between its receipt and its forwarding.
	defaultSegment = 1 << 20
	// socketBuffer is the kernel send and receive buffer of every link;
	// zero leaves the kernel's autotuning alone, which measured as fast
	// as any fixed size on loopback.
	socketBuffer = 0
)

// Channels: the two connections between a pair of ranks.
const (
	chanP2P  = 0
	chanColl = 1
	numChans = 2
)

// handshakeTimeout bounds the authentication of a new connection.
const handshakeTimeout = 10 * time.Second

// handshakeTimeoutOverride, when positive, replaces handshakeTimeout in
// the Comms created from then on (for tests).
var handshakeTimeoutOverride atomic.Int64

// keepAlive lets a read on a silent (partitioned) peer fail in about 30 s.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// userTimeout (TCP_USER_TIMEOUT) does the same for a write: data left
// unacknowledged that long breaks the link, where the kernel's
// retransmissions alone would keep a write to a partitioned peer blocked
// for about 15 minutes.
const userTimeout = 30 * time.Second

// aLongTimeAgo is a deadline that interrupts blocked I/O at once.
var aLongTimeAgo = time.Unix(1, 0)

// littleEndian reports the host's byte order. Collectives on numbers put
// the host's representation on the wire (no conversion), so all ranks of a
// world must share it; gorun's targets (amd64, arm64) are little-endian,
// and the handshake refuses a peer of the other order.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// CommConfig is what a rank needs to join a world of one epoch.
type CommConfig struct {
	Rank, Size int
	Epoch      uint64
	Job        string       // job id, bound into the authentication
	Key        jobkey.Key   // the job's data-plane key (jobkey.Secret.DataKey)
	Listener   net.Listener // this rank's data-plane listener (already listening; see MultiListener)
	Addrs      []string     // data-plane address of every rank, indexed by rank: "ip:port", or UnixAddrPrefix+path
	Logger     *slog.Logger // nil = discard
}

// Comm is a communicator: the ranks of one epoch, connected pairwise by
// authenticated TCP links.
//
// Its methods may be called from several goroutines. Messages between a
// pair of ranks are delivered in order. Collectives must be called in the
// same order, with matching arguments, on every rank; calls from several
// goroutines run one at a time. A collective that fails on one rank (its
// context ended, a peer was lost, ranks disagree) leaves the world's
// collectives unusable: the rank closes its collective links, so the
// failure reaches every other rank as ErrPeerLost instead of a hang, and
// later collectives fail at once. Abort, by contrast, only fails this
// rank's calls: every rank is expected to abort (the epoch changed), and
// none of them should see its peers as lost. Send and Recv keep working
// after a failed collective.
type Comm struct {
	rank, size int
	epoch      uint64
	auth       authenticator
	ln         net.Listener
	addrs      []string
	log        *slog.Logger
	hsTimeout  time.Duration

	// segBytes is the pipelining unit of the collectives. Fixed once
	// NewComm returns.
	segBytes int

	life   context.Context // ends on Abort or Close; its cause is the abort error
	cancel context.CancelCauseFunc
	closed atomic.Bool
	once   sync.Once      // Close
	wg     sync.WaitGroup // the accept loop, handshakes and readers
	hsSem  chan struct{}  // bounds inbound handshakes

	// peers is indexed by rank; peers[rank] is nil. Every peer's links are
	// set before NewComm returns and never change after.
	peers []*peer

	connMu  sync.Mutex // guards the fields below and the links while NewComm runs
	missing int        // links not up yet
	allUp   chan struct{}
	closing bool // Close started: register no more links

	// Collectives. collSem is held by the collective running; it guards
	// the fields after it.
	collSem chan struct{}
	seq     uint32 // sequence number of the next collective
	collErr error  // the first collective failure; later ones fail at once
	scratch []uint64

	// agent is the rank's connection to its agent, for a Comm that Init
	// or Rebuild made: Close ends it, Rebuild hands it to the next Comm.
	agent atomic.Pointer[agentConn]
	// reported are the peers whose loss this Comm told its agent of
	// (reportLost), each once.
	reported sync.Map // int → struct{}
}

// peer is this rank's view of another rank.
type peer struct {
	rank  int
	links [numChans]net.Conn
	shm   *shmLink // shared-memory rings beside the collective link, or nil (shm.go)

	// Receive side of the point-to-point link, filled by readLoop.
	inbox      chan []byte
	readerDone chan struct{} // closed when readLoop stops
	readerErr  error         // why; set before readerDone is closed

	// Send side. sendSem is held by the Send writing to the link; it
	// guards the fields after it.
	sendSem chan struct{}
	sendSeq uint32
	sendErr error // the link's write side is unusable
}

// NewComm joins the world of cfg.Epoch: it accepts links from higher ranks
// on cfg.Listener, dials lower ranks (retrying until they listen) and
// returns once every link is up and authenticated, or fails when ctx ends
// first, with an error wrapping ErrPeerLost that names the ranks that
// never came. ctx bounds only NewComm, not the Comm it returns.
//
// NewComm owns cfg.Listener from then on: Close closes it, and so does a
// failed NewComm. cfg.Listener may be nil for a world of one rank.
func NewComm(ctx context.Context, cfg CommConfig) (*Comm, error) {
	if err := cfg.validate(); err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Comm{
		rank: cfg.Rank, size: cfg.Size, epoch: cfg.Epoch,
		auth:      newAuthenticator(cfg.Key, cfg.Job, cfg.Epoch),
		ln:        cfg.Listener,
		addrs:     cfg.Addrs,
		log:       log.With("rank", cfg.Rank, "epoch", cfg.Epoch),
		hsTimeout: handshakeTimeout,
		segBytes:  defaultSegment,
		hsSem:     make(chan struct{}, maxHandshakes),
		peers:     make([]*peer, cfg.Size),
		missing:   numChans * (cfg.Size - 1),
		allUp:     make(chan struct{}),
		collSem:   make(chan struct{}, 1),
	}
	if d := handshakeTimeoutOverride.Load(); d > 0 {
		c.hsTimeout = time.Duration(d)
	}
	c.life, c.cancel = context.WithCancelCause(context.Background())
	for r := range c.peers {
		if r != c.rank {
			c.peers[r] = &peer{
				rank:       r,
				inbox:      make(chan []byte, inboxDepth),
				readerDone: make(chan struct{}),
				sendSem:    make(chan struct{}, 1),
			}
		}
	}
	if c.missing == 0 {
		close(c.allUp)
	}
	if c.ln != nil {
		c.wg.Add(1)
		go c.acceptLoop()
	}

	var g errgroup.Group
	g.SetLimit(64)
	for r := range c.rank {
		for ch := range byte(numChans) {
			g.Go(func() error {
				c.dialLoop(ctx, r, ch)
				return nil
			})
		}
	}
	_ = g.Wait()
	select {
	case <-c.allUp:
	case <-ctx.Done():
	}
	select {
	case <-c.allUp: // up, even if ctx ended at the same time
		c.log.Debug("comm: data plane up", "size", c.size)
		return c, nil
	default:
	}
	var missing []int
	c.connMu.Lock()
	for _, p := range c.peers {
		if p != nil && (p.links[chanP2P] == nil || p.links[chanColl] == nil) {
			missing = append(missing, p.rank)
		}
	}
	c.connMu.Unlock()
	c.Close()
	return nil, fmt.Errorf("comm: rank %d of epoch %d: ranks %v did not connect: %w (%w)", c.rank, c.epoch, missing, ErrPeerLost, ctx.Err())
}

func (cfg *CommConfig) validate() error {
	switch {
	case cfg.Size < 1:
		return fmt.Errorf("comm: world size %d", cfg.Size)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return fmt.Errorf("comm: rank %d out of range [0, %d)", cfg.Rank, cfg.Size)
	case len(cfg.Addrs) != cfg.Size && cfg.Size > 1:
		return fmt.Errorf("comm: %d addresses for %d ranks", len(cfg.Addrs), cfg.Size)
	case cfg.Listener == nil && cfg.Size > 1:
		return errors.New("comm: no data-plane listener")
	}
	return nil
}

// Rank is this rank's index in the world.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the world.
func (c *Comm) Size() int { return c.size }

// Epoch is the epoch the world belongs to.
func (c *Comm) Epoch() uint64 { return c.epoch }

// Done is closed once the communicator can no longer be used: it was
// aborted (with ErrEpochChanged when gorun moved the job to a new epoch)
// or closed; Err then says why. A rank that spends long stretches between
// collectives (waiting for its accelerator, loading data) selects on it to
// learn of a new epoch at once rather than at its next collective.
func (c *Comm) Done() <-chan struct{} { return c.life.Done() }

// Err is nil while the communicator is usable, else the error its calls
// return (wrapping ErrEpochChanged, ErrClosed, or the abort's error).
func (c *Comm) Err() error {
	if !c.dead() {
		return nil
	}
	return c.stateErr("Done")
}

// Abort makes every pending and future call return an error wrapping err
// (ErrEpochChanged when the job moves to a new epoch). It does not close
// the links, so peers are not told: they are expected to abort too. Only
// the first Abort counts. Call Close to release the resources.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = errAborted
	}
	c.cancel(err)
}

// Close aborts pending calls with ErrClosed, closes every link and the
// listener, and returns once the Comm's goroutines have stopped. It is
// idempotent and always returns nil.
func (c *Comm) Close() error {
	c.once.Do(func() {
		c.connMu.Lock()
		c.closing = true
		c.connMu.Unlock()
		c.closed.Store(true)
		c.cancel(ErrClosed)
		if c.ln != nil {
			c.ln.Close()
		}
		// No link is registered after closing was set, and links never
		// change after NewComm returned.
		c.connMu.Lock()
		for _, p := range c.peers {
			if p != nil {
				for _, l := range p.links {
					if l != nil {
						l.Close()
					}
				}
			}
		}
		c.connMu.Unlock()
		c.wg.Wait()
		// Unmap the rings only once no collective can touch them: a
		// running one ends promptly now that the links are closed, and
		// every later one fails before taking collSem.
		c.collSem <- struct{}{}
		for _, p := range c.peers {
			if p != nil {
				p.shm.unmap()
			}
		}
		if s := c.agent.Swap(nil); s != nil {
			s.close()
		}
	})
	return nil
}

// stateErr is the error of a call on an aborted or closed Comm.
func (c *Comm) stateErr(op string) error {
	cause := context.Cause(c.life)
	if c.closed.Load() {
		if cause == nil || cause == ErrClosed {
			return fmt.Errorf("comm: %s: %w", op, ErrClosed)
		}
		return fmt.Errorf("comm: %s: %w (after abort: %w)", op, ErrClosed, cause)
	}
	return fmt.Errorf("comm: %s: %w", op, cause)
}

func (c *Comm) dead() bool { return c.closed.Load() || c.life.Err() != nil }

// check is the entry test of every call.
func (c *Comm) check(ctx context.Context, op string) error {
	if c.dead() {
		return c.stateErr(op)
	}
	if ctx.Err() != nil {
		return ctxErr(op, ctx)
	}
	return nil
}

// classify turns an I/O error on the link to rank into the error the call
// returns: the abort error if the Comm was aborted or closed, the
// context's if ctx ended, ErrPeerLost otherwise.
func (c *Comm) classify(op string, ctx context.Context, rank int, err error) error {
	if c.dead() {
		return c.stateErr(op)
	}
	if ctx.Err() != nil {
		return ctxErr(op, ctx)
	}
	c.reportLost(rank)
	return peerLost(op, rank, err)
}

// reportLost tells the rank's agent, if the Comm has a connection to one
// (Init, Rebuild), that the link to peer broke: the launcher then suspects
// the peer's host at once. Each peer is reported once per Comm (so once
// per epoch). It never blocks: a report the agent connection cannot take at once
// is dropped (the launcher learns of the loss from elsewhere, later).
func (c *Comm) reportLost(peer int) {
	s := c.agent.Load()
	if s == nil {
		return
	}
	if _, dup := c.reported.LoadOrStore(peer, struct{}{}); dup {
		return
	}
	s.report(c.epoch, peer)
}

// watch runs f once if ctx or the Comm's life ends before the returned
// stop is called. stop reports whether f was prevented; if it was not,
// stop waits for f to finish.
func (c *Comm) watch(ctx context.Context, f func()) (stop func() bool) {
	var once sync.Once
	done := make(chan struct{})
	run := func() {
		once.Do(func() {
			f()
			close(done)
		})
	}
	s1 := context.AfterFunc(ctx, run)
	s2 := context.AfterFunc(c.life, run)
	return func() bool {
		a, b := s1(), s2()
		if a && b {
			return true
		}
		<-done
		return false
	}
}

func (c *Comm) peerFor(op string, r int) (*peer, error) {
	if r < 0 || r >= c.size {
		return nil, fmt.Errorf("comm: %s: rank %d out of range [0, %d)", op, r, c.size)
	}
	if r == c.rank {
		return nil, fmt.Errorf("comm: %s: rank %d is this rank", op, r)
	}
	return c.peers[r], nil
}

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

// Connection setup.

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

// Authentication.

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

// Framing.

const headerSize = 16

// Frame kinds: a point-to-point message, or a collective.
const (
	kindMsg = 1 + iota
	kindBarrier
	kindBroadcast
	kindAllreduce
	kindAllgather
)

var kindNames = [...]string{kindMsg: "message", kindBarrier: "Barrier", kindBroadcast: "Broadcast", kindAllreduce: "Allreduce", kindAllgather: "Allgather"}

func kindName(k byte) string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind %d", k)
}

// header starts every frame: kind(1) sub(1) reserved(2) seq(4) n(8), big-endian.
type header struct {
	kind, sub byte
	seq       uint32
	n         uint64
}

func (h header) put(b []byte) {
	b = b[:headerSize]
	b[0], b[1], b[2], b[3] = h.kind, h.sub, 0, 0
	binary.BigEndian.PutUint32(b[4:], h.seq)
	binary.BigEndian.PutUint64(b[8:], h.n)
}

func parseHeader(b []byte) header {
	b = b[:headerSize]
	return header{kind: b[0], sub: b[1], seq: binary.BigEndian.Uint32(b[4:]), n: binary.BigEndian.Uint64(b[8:])}
}
