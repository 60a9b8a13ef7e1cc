package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/phasetrace"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/nats-io/nats.go"
)

// handshakeTimeout bounds how long a rank may take to say hello.
const handshakeTimeout = 30 * time.Second

// rankSockets serves every local rank's GORUN_SOCKET (the protocol is
// documented in internal/wire/PROTOCOL.md): the rank's world (epoch table
// and the data-plane key, the one credential a rank gets) and fences. One listener per rank: which socket a
// connection came in on says which rank it is.
type rankSockets struct {
	job     string
	host    int
	dataKey string // hex
	log     *slog.Logger
	nc      *nats.Conn
	subj    wire.Subjects
	stop    chan struct{} // closed by close
	// prot serves the state-protection requests (internal/keeper), once
	// started; ctx ends with close, for the requests that wait.
	prot   *keeper.Keeper
	ctx    context.Context
	cancel context.CancelFunc

	table []byte // encoded epoch table
	epoch uint64
	world int // the epoch's world size
	// The epoch's torchrun rendezvous address (the table's), repeated in
	// the Welcome and Epoch frames.
	masterAddr string
	masterPort int
	// report sends an event to the launcher (the agent's event): the
	// ranks' peer-loss reports.
	report func(*wire.Event)

	wg    subgroup // serving goroutines
	tasks *group   // the agent's, for the other goroutines (nil: uncounted)

	mu        sync.Mutex // guards the fields below, and table and epoch after start
	listeners []net.Listener
	conns     map[net.Conn]*rankConn
	local     int                // ranks on this host
	nextSeq   map[int]int        // per rank: the sequence of its next fence
	ended     map[int]bool       // local ranks that ended in this epoch
	fences    map[int]*hostFence // by sequence
	closed    bool
	// gen is the restart generation whose ranks the current epoch is for:
	// ranks of other generations (killed by a restart, their exits and
	// connections late) neither enter its fences nor fail them. A restart
	// (wire.OpRestart) says from which epoch on its generation runs;
	// until that epoch's table is here it waits in restartGen and
	// restartEpoch (restartGen 0: none).
	gen          uint64
	restartGen   uint64
	restartEpoch uint64
	// live is the generation of the ranks started last: a connection
	// welcomed from then on is theirs (the older ranks have all ended).
	live uint64
}

// rankConn is one connection of a rank; pushes of new epochs and answers
// are written from different goroutines.
type rankConn struct {
	mu       sync.Mutex // guards writes, welcomed and gen (which only serve writes)
	c        net.Conn
	welcomed bool
	gen      uint64 // the restart generation of the rank, set at the welcome
	// The peers whose loss the rank reported in epoch lostEpoch (owned by
	// the connection's frame reader): each is passed on once.
	lost      map[int]bool
	lostEpoch uint64
}

func (ss *rankConn) write(typ byte, v any) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return wire.WriteSock(ss.c, typ, v)
}

func newRankSockets(a *agent, t *wire.EpochTable, local int) *rankSockets {
	ctx, cancel := context.WithCancel(context.Background())
	return &rankSockets{
		ctx: ctx, cancel: cancel,
		job: a.cfg.Job, host: a.cfg.Host, dataKey: a.cfg.Creds.Data.Hex(), log: a.log,
		nc: a.ctl.Conn, subj: a.subj, stop: make(chan struct{}),
		table: t.Encode(), epoch: t.Epoch, world: t.World, masterAddr: t.MasterAddr, masterPort: t.MasterPort, local: local, gen: a.gen, live: a.gen, report: a.event,
		conns: map[net.Conn]*rankConn{}, nextSeq: map[int]int{}, fences: map[int]*hostFence{},
		wg: newSubgroup(&a.tasks, "rank socket"), tasks: &a.tasks,
	}
}

// listen creates rank's socket at path (before the rank starts, so that it
// is there when the rank looks).
func (s *rankSockets) listen(rank int, path string) error {
	phasetrace.Mark("rank-listen")
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("rank socket: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return errors.New("rank socket: agent stopping")
	}
	s.listeners = append(s.listeners, ln)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ss := &rankConn{c: c}
			if !s.track(ss) {
				c.Close()
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.untrack(c)
				if err := s.serve(rank, ss); err != nil {
					s.log.Warn("rank socket", "rank", rank, "err", err)
				}
			}()
		}
	}()
	return nil
}

func (s *rankSockets) track(ss *rankConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[ss.c] = ss
	return true
}

func (s *rankSockets) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// serve runs one connection of rank.
func (s *rankSockets) serve(rank int, ss *rankConn) error {
	c := ss.c
	if err := checkPeer(c.(*net.UnixConn)); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	typ, b, err := wire.ReadSock(c)
	if err != nil {
		return fmt.Errorf("reading hello: %w", err)
	}
	var h wire.Hello
	if typ != wire.SockHello {
		return s.refuse(ss, fmt.Sprintf("expected hello, got message type %d", typ))
	}
	if err := wire.DecodeSock(b, &h); err != nil {
		return s.refuse(ss, err.Error())
	}
	if h.Version != wire.SockVersion {
		return s.refuse(ss, fmt.Sprintf("protocol version %d, this agent speaks %d", h.Version, wire.SockVersion))
	}
	c.SetReadDeadline(time.Time{})
	// The welcome and the connection's place in epoch pushes are settled under
	// both locks, so a new epoch is either in the welcome or pushed after it.
	s.mu.Lock()
	ss.mu.Lock()
	ss.gen = s.live
	err = wire.WriteSock(c, wire.SockWelcome, &wire.Welcome{
		Version: wire.SockVersion, Job: s.job, Rank: rank, Epoch: s.epoch, DataKey: s.dataKey, Table: s.table,
		MasterAddr: s.masterAddr, MasterPort: s.masterPort,
	})
	ss.welcomed = err == nil
	ss.mu.Unlock()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	// The state-protection session is the welcomed rank's generation's:
	// a request of a rank a restart killed, read late, is refused by it.
	var prot *keeper.Session
	if s.prot != nil {
		if prot = s.prot.Session(rank); prot != nil {
			// The rank is gone when its socket is: holders waiting for
			// its gradient deposits stop waiting.
			defer prot.Close()
		}
	}
	// Frames are read by their own goroutine, so that a rank that goes
	// away while its request waits (a stage at the overwrite rule) ends
	// the wait: its socket's end is seen at once. It passes peer-loss
	// reports on itself: they are not requests, and may come while one
	// waits.
	frames := make(chan sockFrame)
	stop := make(chan struct{})
	defer close(stop)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			typ, b, err := wire.ReadSock(c)
			if err == nil && typ == wire.SockPeerLost {
				s.peerLost(rank, ss, b)
				continue
			}
			select {
			case frames <- sockFrame{typ, b, err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		f := <-frames
		if f.err != nil {
			return nil // the rank closed its end (or ended)
		}
		if live := s.liveGen(); ss.gen != live {
			// Left over from a rank that a restart killed.
			return s.refuse(ss, fmt.Sprintf("rank %d of restart generation %d: the ranks were restarted (generation %d)", rank, ss.gen, live))
		}
		typ, b := f.typ, f.b
		if protect.IsRequest(typ) {
			if prot == nil {
				return s.refuse(ss, "state protection is not available on this host")
			}
			r, next := s.handle(prot, typ, b, frames)
			if next != nil {
				if next.err != nil {
					return nil // the rank went away while its request waited
				}
				return s.refuse(ss, fmt.Sprintf("message type %d before the answer to the previous request", next.typ))
			}
			if r.err != nil {
				return s.refuse(ss, r.err.Error())
			}
			if err := ss.write(r.typ, r.ans); err != nil {
				return err
			}
			continue
		}
		switch typ {
		case wire.SockFence:
			f, err := wire.DecodeFence(b, wire.MaxFenceKeys)
			if err != nil {
				return s.refuse(ss, err.Error())
			}
			res, err := s.fence(ss.gen, rank, f)
			if err != nil {
				return s.refuse(ss, err.Error())
			}
			if err := ss.write(wire.SockFenceDone, res); err != nil {
				return err
			}
		default:
			return s.refuse(ss, fmt.Sprintf("unknown message type %d", typ))
		}
	}
}

// peerLost passes on to the launcher a rank's report that it lost peers
// (wire.PeerLost): an EventPeerLost naming the peers not reported before
// in the epoch on this connection. A report of another epoch than the current
// one, or of a rank of another generation than the epoch's (killed by a
// restart), is stale and dropped; one that does not decode or check is
// dropped with a warning. Nothing is answered. It runs on the connection's
// frame reader.
func (s *rankSockets) peerLost(rank int, ss *rankConn, b []byte) {
	var p wire.PeerLost
	s.mu.Lock()
	epoch, world, gen := s.epoch, s.world, s.gen
	s.mu.Unlock()
	ss.mu.Lock()
	sgen := ss.gen
	ss.mu.Unlock()
	if err := wire.DecodeSock(b, &p); err != nil {
		s.log.Warn("ignoring a peer-loss report", "rank", rank, "err", err)
		return
	}
	if err := p.Check(rank, world); err != nil {
		s.log.Warn("ignoring a peer-loss report", "rank", rank, "err", err)
		return
	}
	if p.Epoch != epoch || sgen != gen {
		return
	}
	if ss.lost == nil || ss.lostEpoch != epoch {
		ss.lost, ss.lostEpoch = map[int]bool{}, epoch
	}
	var fresh []int
	for _, r := range p.Peers {
		if !ss.lost[r] {
			ss.lost[r] = true
			fresh = append(fresh, r)
		}
	}
	if len(fresh) == 0 || s.report == nil {
		return
	}
	s.log.Warn("a rank lost peers", "rank", rank, "peers", fresh, "epoch", epoch)
	s.report(&wire.Event{Kind: wire.EventPeerLost, Host: s.host, Rank: rank, Gen: gen, Epoch: epoch, Peers: fresh})
}

// sockFrame is one frame read from a rank's socket, or the read's error.
type sockFrame struct {
	typ byte
	b   []byte
	err error
}

// handle runs one state-protection request. If a frame arrives before it
// is answered (the rank closed its socket, or broke the protocol), the
// request is cancelled and that frame returned in next.
func (s *rankSockets) handle(prot *keeper.Session, typ byte, b []byte, frames <-chan sockFrame) (protResult, *sockFrame) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	done := make(chan protResult, 1)
	s.tasks.Go("state-protection request", func() {
		at, ans, err := prot.Handle(ctx, typ, b)
		done <- protResult{at, ans, err}
	})
	select {
	case r := <-done:
		return r, nil
	case f := <-frames:
		cancel()
		<-done
		return protResult{}, &f
	}
}

// protResult is a state-protection request's answer (or why it was
// refused).
type protResult struct {
	typ byte
	ans any
	err error
}

// refuse tells the rank what was wrong and ends the connection.
func (s *rankSockets) refuse(ss *rankConn, msg string) error {
	_ = ss.write(wire.SockError, &wire.SockErr{Err: msg})
	return errors.New(msg)
}

// checkPeer admits only processes of this agent's user.
func checkPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("peer credentials: %w", cerr)
	}
	if int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("refused a connection from uid %d (pid %d)", cred.Uid, cred.Pid)
	}
	return nil
}

// close stops serving: listeners and connections are closed and the
// serving goroutines waited for, at most until ctx ends.
func (s *rankSockets) close(ctx context.Context) {
	s.cancel()
	s.mu.Lock()
	if !s.closed {
		close(s.stop)
	}
	s.closed = true
	for _, ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	s.tasks.Go("rank socket close wait", func() { s.wg.Wait(); close(done) })
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("rank socket goroutines still running at exit")
	}
}
