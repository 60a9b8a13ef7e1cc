package keeper

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
)

// cluster is a job's state protection on several in-process hosts, with
// a rank socket per rank served as the agent serves it.
type cluster struct {
	t       testing.TB
	job     string
	secret  jobkey.Secret
	hosts   []*Keeper
	hostOf  []int
	sockets []string // by rank
	dirs    []string // by host: the slot directory
	holders [][]int
	changed chan struct{}
	failed  chan hostFailure // Config.Failed's calls, of every host
	links   chan linkFailure // Config.LinkFailed's calls, of every host
	nhosts  int
	mu      sync.Mutex // guards hosts after start
	wg      sync.WaitGroup
	lns     []net.Listener
	// mod, if set, changes each host's configuration before it starts
	// (e.g. diff mode).
	mod func(*Config)
}

// newCluster starts hosts with ranks[h] on host h; holders[r] are rank
// r's replica holders; peers(r) its data-parallel peers.
func newCluster(t testing.TB, ranks [][]int, holders [][]int, peers func(int) []int) *cluster {
	t.Helper()
	return newClusterWith(t, ranks, holders, peers, nil)
}

// newClusterWith is newCluster with mod applied to every host's
// configuration (those started later too).
func newClusterWith(t testing.TB, ranks [][]int, holders [][]int, peers func(int) []int, mod func(*Config)) *cluster {
	t.Helper()
	s, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, job: "testjob", secret: s, holders: holders, changed: make(chan struct{}, 1), failed: make(chan hostFailure, 16), links: make(chan linkFailure, 64), nhosts: len(ranks), mod: mod}
	world := 0
	for _, rs := range ranks {
		world += len(rs)
	}
	c.hostOf = make([]int, world)
	c.sockets = make([]string, world)
	for h, rs := range ranks {
		for _, r := range rs {
			c.hostOf[r] = h
		}
	}
	sockDir := t.TempDir()
	addrs := make([]string, len(ranks))
	for h := range ranks {
		c.startHost(h, ranks[h], peers, t.TempDir())
		addrs[h] = c.hosts[h].cfg.Listener.Addr().String()
	}
	for _, h := range c.hosts {
		h.SetAddrs(addrs)
	}
	for r := range world {
		c.sockets[r] = filepath.Join(sockDir, fmt.Sprintf("r%d.sock", r))
		ln, err := net.Listen("unix", c.sockets[r])
		if err != nil {
			t.Fatal(err)
		}
		c.lns = append(c.lns, ln)
		c.wg.Add(1)
		go c.acceptRank(ln, r)
	}
	t.Cleanup(c.close)
	return c
}

func (c *cluster) startHost(h int, ranks []int, peers func(int) []int, dir string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := Config{
		Job: c.job, LinkKey: c.secret.LinkKey(), Host: h, Hosts: c.nhosts, Ranks: ranks, Dir: dir,
		Holders: c.holders, Peers: peers, HostOf: func(r int) int { c.mu.Lock(); defer c.mu.Unlock(); return c.hostOf[r] },
		Listener: ln, Changed: c.notify,
		Failed: func(r int, gen uint64, err error) {
			select {
			case c.failed <- hostFailure{r, gen, err}:
			default:
				c.t.Errorf("more failures than the test reads: rank %d generation %d: %v", r, gen, err)
			}
		},
		LinkFailed: func(to int, err error) {
			select {
			case c.links <- linkFailure{h, to, err}:
			default:
				c.t.Errorf("more link failures than the test reads: host %d to host %d: %v", h, to, err)
			}
		},
	}
	if c.mod != nil {
		c.mod(&cfg)
	}
	host, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h < len(c.hosts) {
		c.hosts[h] = host
		c.dirs[h] = dir
	} else {
		c.hosts = append(c.hosts, host)
		c.dirs = append(c.dirs, dir)
	}
}

// linkFailure is one call of Config.LinkFailed by host from.
type linkFailure struct {
	from, to int
	err      error
}

// hostFailure is one call of Config.Failed.
type hostFailure struct {
	rank int
	gen  uint64
	err  error
}

func (c *cluster) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// acceptRank serves rank r's socket: Hello, then the protocol.
func (c *cluster) acceptRank(ln net.Listener, r int) {
	defer c.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer conn.Close()
			c.mu.Lock()
			h := c.hosts[c.hostOf[r]]
			c.mu.Unlock()
			serveRank(h, r, conn, c.job)
		}()
	}
}

// serveRank is the agent's serving loop, reduced to what state
// protection needs.
func serveRank(h *Keeper, r int, conn net.Conn, job string) {
	typ, _, err := wire.ReadSock(conn)
	if err != nil || typ != wire.SockHello {
		return
	}
	if wire.WriteSock(conn, wire.SockWelcome, &wire.Welcome{Version: wire.SockVersion, Job: job, Rank: r}) != nil {
		return
	}
	sess := h.Session(r)
	for {
		typ, b, err := wire.ReadSock(conn)
		if err != nil {
			return
		}
		if !protect.IsRequest(typ) {
			wire.WriteSock(conn, wire.SockError, &wire.SockErr{Err: "unknown type"})
			return
		}
		at, ans, err := sess.Handle(context.Background(), typ, b)
		if err != nil {
			wire.WriteSock(conn, wire.SockError, &wire.SockErr{Err: err.Error()})
			return
		}
		if wire.WriteSock(conn, at, ans) != nil {
			return
		}
	}
}

func (c *cluster) close() {
	for _, ln := range c.lns {
		ln.Close()
	}
	for _, h := range c.hosts {
		h.Close()
	}
	c.wg.Wait()
}

func (c *cluster) connect(r int, regions []protect.Region) *protect.Client {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := protect.Connect(ctx, regions, protect.Options{Socket: c.sockets[r]})
	if err != nil {
		c.t.Fatalf("rank %d: %v", r, err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// waitFor polls cond whenever a host reports progress, for up to 10 s.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-c.changed:
		case <-tick.C:
		case <-deadline:
			c.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// progress returns rank r's progress.
func (c *cluster) progress(r int) Progress {
	c.mu.Lock()
	h := c.hosts[c.hostOf[r]]
	c.mu.Unlock()
	_, ps := h.Progress()
	for _, p := range ps {
		if p.Rank == r {
			return p
		}
	}
	c.t.Fatalf("no progress for rank %d", r)
	return Progress{}
}

// place gives every host in hosts the placement where rank r runs on
// host hostOf[r], with holders and sources, and routes the ranks'
// sockets there.
func (c *cluster) place(hosts []int, hostOf []int, holders [][]int, sources map[int]Source) {
	c.t.Helper()
	for _, h := range hosts {
		var mine []int
		for r, x := range hostOf {
			if x == h {
				mine = append(mine, r)
			}
		}
		p := Placement{Ranks: mine, HostOf: hostOf, Holders: holders, Sources: sources}
		if err := c.hosts[h].SetPlacement(p); err != nil {
			c.t.Fatalf("host %d: SetPlacement(%+v): %v", h, p, err)
		}
	}
	c.mu.Lock()
	copy(c.hostOf, hostOf)
	c.holders = holders
	c.mu.Unlock()
}

// g computes G as the launcher does and tells every host.
func (c *cluster) publishG() int64 {
	g := int64(protect.MaxStep)
	for r := range c.hostOf {
		g = min(g, c.progress(r).Replicated)
	}
	for _, h := range c.hosts {
		h.SetG(h.Gen(), g)
	}
	return g
}

// stateOf is a rank's deterministic state at step.
func stateOf(r int, step int64, regions []protect.Region) map[string][][]byte {
	out := map[string][][]byte{}
	for i, reg := range regions {
		b := make([]byte, reg.Size)
		for j := range b {
			b[j] = byte(int64(r)*131 + step*17 + int64(i)*7 + int64(j)*3)
		}
		if reg.Name == "params" {
			// Params are the same on every rank of a data-parallel group.
			for j := range b {
				b[j] = byte(step*5 + int64(j))
			}
		}
		// Two parts, to exercise concatenation.
		h := len(b) / 3
		out[reg.Name] = [][]byte{b[:h], b[h:]}
	}
	return out
}

func joined(parts [][]byte) []byte { return bytes.Join(parts, nil) }

// dumpStall logs what a test that waited in vain for progress needs to
// find the stall: every rank's progress and every goroutine's stack.
func (c *cluster) dumpStall(t testing.TB) {
	t.Helper()
	for r := range c.hostOf {
		c.mu.Lock()
		h := c.hosts[c.hostOf[r]]
		c.mu.Unlock()
		t.Logf("stall: rank %d on host %d (G %d): %+v", r, c.hostOf[r], h.G(), c.progress(r))
	}
	buf := make([]byte, 1<<22)
	t.Logf("stall: goroutines:\n%s", buf[:runtime.Stack(buf, true)])
}

// setECCommitHook sets testHookECCommit to fn until the test ends; the
// job's links may be serving meanwhile.
func setECCommitHook(t testing.TB, fn func(h linkHdr, e ecHdr)) {
	testHookECCommit.Store(&fn)
	t.Cleanup(func() { testHookECCommit.Store(nil) })
}
