package comm

// The data plane: a communicator (Comm) for the ranks of one epoch, built
// on authenticated TCP links, with point-to-point messages. This file holds
// the Comm and its lifecycle; sendrecv.go the point-to-point messages,
// connect.go the connection setup, handshake.go the handshake, frame.go
// the frame header. The collectives are in collective.go and allreduce.go.
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
// proven it holds the data-plane key K (jobkey.Secret.DataKey, the only
// credential a rank receives; see internal/jobkey), and K itself never
// crosses it:
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
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

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
