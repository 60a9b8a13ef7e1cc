package comm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
)

// ErrNotUnderGorun is returned by Init in a process gorun did not start,
// and by Rebuild on a communicator NewComm made.
var ErrNotUnderGorun = errors.New("comm: not running under gorun (" + wire.EnvSocket + " is not set)")

// Init joins the world of the current epoch, for a rank gorun started: it
// asks the rank's agent, over GORUN_SOCKET, for the epoch table and the
// job's data-plane key (a rank holds no other credential), listens for its peers on its host's address, and exchanges
// listening addresses with every rank in one fence (aggregated per host by
// the agents and once at the launcher: ranks never talk to the control
// plane). Every rank of the job must call Init.
//
// When the launcher publishes a new epoch, the communicator's calls fail
// with ErrEpochChanged; Rebuild then joins the new world.
func Init(ctx context.Context) (*Comm, error) {
	path := os.Getenv(wire.EnvSocket)
	if path == "" {
		return nil, ErrNotUnderGorun
	}
	s, err := dialAgent(ctx, path)
	if err != nil {
		return nil, err
	}
	c, err := s.joinNewest(ctx, s.latest())
	if err != nil {
		s.close()
		return nil, err
	}
	return c, nil
}

// joinNewest joins w's world, or, when a newer epoch arrives while it
// joins (the join fails with ErrEpochChanged: a second failure during a
// recovery), the newest one's.
func (s *agentConn) joinNewest(ctx context.Context, w *wire.Welcome) (*Comm, error) {
	for {
		c, err := s.join(ctx, w)
		if !errors.Is(err, ErrEpochChanged) {
			return c, err
		}
		if w, err = s.newer(ctx, w.Epoch); err != nil {
			return nil, err
		}
	}
}

// Rebuild joins the world of the next epoch once the launcher has
// published it (waiting for it, bounded by ctx), and returns the new
// communicator; c is closed. Every surviving rank must call it. Only a
// communicator made by Init can be rebuilt.
func (c *Comm) Rebuild(ctx context.Context) (*Comm, error) {
	s := c.agent.Load()
	if s == nil {
		return nil, fmt.Errorf("comm: rebuild: %w", ErrNotUnderGorun)
	}
	w, err := s.newer(ctx, c.Epoch())
	if err != nil {
		return nil, err
	}
	if c.agent.CompareAndSwap(s, nil) {
		c.Close() // the world of the old epoch; the agent connection goes on
	}
	nc, err := s.joinNewest(ctx, w)
	if err != nil {
		s.close()
		return nil, err
	}
	return nc, nil
}

// agentConn is a rank's connection to its agent over GORUN_SOCKET. A reader
// goroutine owns the reads: answers go to the one caller waiting, epoch
// pushes abort the current communicator and are kept for Rebuild. close
// ends the reader, wherever it is: in a read, or handing an answer to a
// caller that left (its context ended as the answer came).
//
// A reporter goroutine writes the rank's peer-loss reports (PeerLost, not
// answered), so that a Comm's call never waits on the agent to report a
// loss; close ends it too. Its frames and the callers' requests are each
// written in one Write, which a net.Conn serializes whole.
type agentConn struct {
	path         string // GORUN_SOCKET
	c            net.Conn
	answers      chan frame
	quit         chan struct{} // closed by close: nobody takes answers any more
	closeOnce    sync.Once
	done         chan struct{} // closed when the reader ends
	callMu       sync.Mutex    // one request at a time
	reports      chan wire.PeerLost
	reporterDone chan struct{} // closed when the reporter ends

	mu      sync.Mutex    // guards the fields below
	welcome *wire.Welcome // the newest epoch known
	table   *wire.EpochTable
	rank    int
	cur     *Comm
	newEp   chan struct{} // closed and replaced when a newer epoch arrives
	err     error         // why the reader ended
	seq     int           // the next fence of the current epoch
}

type frame struct {
	typ byte
	b   []byte
}

func dialAgent(ctx context.Context, path string) (*agentConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("comm: connecting to the agent at %s: %w", path, err)
	}
	s := newAgentConn(path, c)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	err = wire.WriteSock(c, wire.SockHello, &wire.Hello{Version: wire.SockVersion, Pid: os.Getpid()})
	var typ byte
	var b []byte
	if err == nil {
		typ, b, err = wire.ReadSock(c)
	}
	stop()
	c.SetDeadline(time.Time{})
	if err == nil {
		err = s.welcomed(typ, b)
	}
	if err != nil {
		// The reader never started: end the reporter and the connection.
		s.closeOnce.Do(func() {
			close(s.quit)
			c.Close()
		})
		<-s.reporterDone
		if ctx.Err() != nil {
			return nil, fmt.Errorf("comm: talking to the agent: %w", context.Cause(ctx))
		}
		return nil, err
	}
	go s.read()
	return s, nil
}

// reportQueue bounds the peer-loss reports waiting to be written; more
// are dropped.
const reportQueue = 16

// newAgentConn makes the agentConn of connection c to the agent at path, and
// starts its reporter; its reader is not started yet.
func newAgentConn(path string, c net.Conn) *agentConn {
	s := &agentConn{path: path, c: c, answers: make(chan frame), quit: make(chan struct{}), done: make(chan struct{}), newEp: make(chan struct{}),
		reports: make(chan wire.PeerLost, reportQueue), reporterDone: make(chan struct{})}
	go s.reporter()
	return s
}

// report queues a report that the links to peer broke in epoch, without
// waiting; it is dropped if the queue is full.
func (s *agentConn) report(epoch uint64, peer int) {
	select {
	case s.reports <- wire.PeerLost{Epoch: epoch, Peers: []int{peer}}:
	default:
	}
}

// reporter writes the queued peer-loss reports until the agent connection closes
// or a write fails (the connection is then broken for the reader too).
func (s *agentConn) reporter() {
	defer close(s.reporterDone)
	for {
		select {
		case p := <-s.reports:
			if err := wire.WriteSock(s.c, wire.SockPeerLost, &p); err != nil {
				return
			}
		case <-s.quit:
			return
		}
	}
}

// welcomed takes the agent's answer to Hello.
func (s *agentConn) welcomed(typ byte, b []byte) error {
	if typ == wire.SockError {
		var e wire.SockErr
		_ = wire.DecodeSock(b, &e)
		return fmt.Errorf("comm: the agent refused: %s", e.Err)
	}
	var w wire.Welcome
	if typ != wire.SockWelcome {
		return fmt.Errorf("comm: the agent answered message type %d to hello", typ)
	}
	if err := wire.DecodeSock(b, &w); err != nil {
		return fmt.Errorf("comm: the agent's welcome: %w", err)
	}
	if w.Version != wire.SockVersion {
		return fmt.Errorf("comm: the agent speaks protocol %d, this rank %d", w.Version, wire.SockVersion)
	}
	t, err := wire.DecodeEpochTable(w.Table)
	if err != nil {
		return fmt.Errorf("comm: the agent's welcome: %w", err)
	}
	if w.Rank < 0 || w.Rank >= t.World {
		return fmt.Errorf("comm: the agent says rank %d of %d", w.Rank, t.World)
	}
	s.welcome, s.table, s.rank = &w, t, w.Rank
	return nil
}

// read dispatches the agent's frames until the connection ends.
func (s *agentConn) read() {
	defer close(s.done)
	for {
		typ, b, err := wire.ReadSock(s.c)
		if err != nil {
			s.mu.Lock()
			s.err = fmt.Errorf("comm: the connection to the agent ended: %w", err)
			cur := s.cur
			s.mu.Unlock()
			if cur != nil {
				cur.Abort(fmt.Errorf("%w: the agent is gone", ErrPeerLost))
			}
			return
		}
		if typ != wire.SockEpoch {
			// A caller waits for every answer, unless it gave up and
			// closed the agent connection: then the next read fails.
			select {
			case s.answers <- frame{typ, b}:
			case <-s.quit:
			}
			continue
		}
		var w wire.Welcome
		t, err := (*wire.EpochTable)(nil), wire.DecodeSock(b, &w)
		if err == nil {
			t, err = wire.DecodeEpochTable(w.Table)
		}
		if err != nil {
			continue // a bad push is ignored; the next one will do
		}
		s.mu.Lock()
		if t.Epoch > s.table.Epoch {
			w.Rank = s.rank
			s.welcome, s.table, s.seq = &w, t, 0
			close(s.newEp)
			s.newEp = make(chan struct{})
		}
		cur := s.cur
		s.mu.Unlock()
		if cur != nil && cur.Epoch() < t.Epoch {
			cur.Abort(ErrEpochChanged)
		}
	}
}

// latest is the newest epoch known.
func (s *agentConn) latest() *wire.Welcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.welcome
}

// newer waits for an epoch after epoch.
func (s *agentConn) newer(ctx context.Context, epoch uint64) (*wire.Welcome, error) {
	for {
		s.mu.Lock()
		w, ch, err := s.welcome, s.newEp, s.err
		s.mu.Unlock()
		if w.Epoch > epoch {
			return w, nil
		}
		if err != nil {
			return nil, err
		}
		select {
		case <-ch:
		case <-s.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("comm: waiting for a new epoch: %w", context.Cause(ctx))
		}
	}
}

// call sends one request and waits for its answer of type want.
func (s *agentConn) call(ctx context.Context, typ byte, req any, want byte, resp any) error {
	s.callMu.Lock()
	defer s.callMu.Unlock()
	if err := wire.WriteSock(s.c, typ, req); err != nil {
		return fmt.Errorf("comm: talking to the agent: %w", err)
	}
	var f frame
	select {
	case f = <-s.answers:
	case <-s.done:
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.err
	case <-ctx.Done():
		// The answer will still come (or is being handed over now), and
		// answers carry no request id: a later call could take it for its
		// own. The agent connection is unusable, so close it.
		s.close()
		return fmt.Errorf("comm: talking to the agent: %w", context.Cause(ctx))
	}
	if f.typ == wire.SockError {
		var e wire.SockErr
		_ = wire.DecodeSock(f.b, &e)
		return fmt.Errorf("comm: the agent refused: %s", e.Err)
	}
	if f.typ != want {
		return fmt.Errorf("comm: the agent answered message type %d, expected %d", f.typ, want)
	}
	if err := wire.DecodeSock(f.b, resp); err != nil {
		return fmt.Errorf("comm: the agent's answer: %w", err)
	}
	return nil
}

// fence enters the rank's next fence of epoch and returns every rank's values.
func (s *agentConn) fence(ctx context.Context, epoch uint64, kv map[string]string) (map[string]string, error) {
	s.mu.Lock()
	if cur := s.welcome.Epoch; cur != epoch {
		// A newer epoch arrived, and its fences count from 0: this one
		// must not take a number of them.
		s.mu.Unlock()
		return nil, fmt.Errorf("comm: fence of epoch %d: %w (epoch %d arrived)", epoch, ErrEpochChanged, cur)
	}
	seq := s.seq
	s.seq++
	s.mu.Unlock()
	var res wire.Fence
	if err := s.call(ctx, wire.SockFence, &wire.Fence{Epoch: epoch, Seq: seq, KV: kv}, wire.SockFenceDone, &res); err != nil {
		return nil, err
	}
	if res.Err != "" {
		return nil, fmt.Errorf("comm: fence: %s", res.Err)
	}
	return res.KV, nil
}

// join builds the world of w: a listener on this rank's host address,
// the addresses of all ranks through fence 0 of the epoch, and the links.
func (s *agentConn) join(ctx context.Context, w *wire.Welcome) (*Comm, error) {
	t, err := wire.DecodeEpochTable(w.Table)
	if err != nil {
		return nil, err
	}
	key, err := jobkey.ParseKey(w.DataKey)
	if err != nil {
		return nil, fmt.Errorf("comm: the agent's welcome: %w", err)
	}
	hostOf := make([]int, t.World)
	for i, h := range t.Hosts {
		ranks, _ := h.Ranks.Expand(t.World)
		for _, r := range ranks {
			hostOf[r] = i
		}
	}
	addr := t.Hosts[hostOf[s.rank]].Addr
	tcp, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return nil, fmt.Errorf("comm: data-plane listener on %s: %w", addr, err)
	}
	// Ranks of this host link through a Unix socket beside the rank's
	// GORUN_SOCKET, in the agent's private socket directory (on a tmpfs
	// where the host has one: internal/agent/sockdir.go).
	path := filepath.Join(filepath.Dir(s.path), fmt.Sprintf("rank-%d-epoch-%d.dp.sock", s.rank, t.Epoch))
	unix, err := net.Listen("unix", path)
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("comm: data-plane listener on %s: %w", path, err)
	}
	ln := NewMultiListener(tcp, unix)
	tcpKey := func(r int) string { return "comm/addr/" + strconv.Itoa(r) }
	unixKey := func(r int) string { return "comm/unix/" + strconv.Itoa(r) }
	all, err := s.fence(ctx, t.Epoch, map[string]string{tcpKey(s.rank): tcp.Addr().String(), unixKey(s.rank): path})
	if err != nil {
		ln.Close()
		return nil, s.supersededErr(t.Epoch, err)
	}
	addrs := make([]string, t.World)
	for r := range addrs {
		addrs[r] = all[tcpKey(r)]
		if u := all[unixKey(r)]; u != "" && hostOf[r] == hostOf[s.rank] {
			addrs[r] = UnixAddrPrefix + u
		}
		if addrs[r] == "" {
			ln.Close()
			return nil, fmt.Errorf("comm: rank %d gave no data-plane address", r)
		}
	}
	// A newer epoch ends the linking: ranks of this epoch's world may be
	// gone for good (joinNewest then joins the newer one). The fence
	// needs no such care: the agent fails it when it moves on.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.whenNewer(lctx, t.Epoch, cancel)
	c, err := NewComm(lctx, CommConfig{
		Rank: s.rank, Size: t.World, Epoch: t.Epoch, Job: w.Job, Key: key,
		Listener: ln, Addrs: addrs,
	})
	if err != nil {
		return nil, s.supersededErr(t.Epoch, err)
	}
	c.agent.Store(s)
	s.mu.Lock()
	s.cur = c
	newer := s.table.Epoch > t.Epoch
	s.mu.Unlock()
	if newer { // an epoch arrived while joining
		c.Abort(ErrEpochChanged)
	}
	return c, nil
}

// whenNewer calls f, from a goroutine of its own, once an epoch after
// epoch is known; the goroutine ends then, or when ctx ends or the
// agent connection does.
func (s *agentConn) whenNewer(ctx context.Context, epoch uint64, f func()) {
	go func() {
		for {
			s.mu.Lock()
			w, ch := s.welcome, s.newEp
			s.mu.Unlock()
			if w.Epoch > epoch {
				f()
				return
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return
			case <-s.done:
				return
			}
		}
	}()
}

// supersededErr is err, a failure to join epoch, wrapped with
// ErrEpochChanged when a newer epoch has arrived meanwhile: the join's
// fence was failed by the agent's move to it, or a peer of epoch's world
// is gone from the newer one.
func (s *agentConn) supersededErr(epoch uint64, err error) error {
	s.mu.Lock()
	newer := s.welcome.Epoch > epoch
	s.mu.Unlock()
	if newer {
		return fmt.Errorf("comm: joining epoch %d: %w (%w)", epoch, ErrEpochChanged, err)
	}
	return err
}

// close ends the agent connection and waits for its reader; it may be called
// more than once.
func (s *agentConn) close() {
	s.closeOnce.Do(func() {
		close(s.quit)
		s.c.Close()
	})
	<-s.done
	<-s.reporterDone
}
