package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// epochWorlds is an in-process job whose world can move to a new epoch,
// as gorun's in-place recovery does: the current epoch's fakeWorld is
// aborted with comm.ErrEpochChanged (or with a lost peer), and the ranks
// rebuild into the next one.
type epochWorlds struct {
	size int

	mu      sync.Mutex // guards the fields below
	worlds  []*fakeWorld
	changed chan struct{} // closed and replaced by advance
}

func newEpochWorlds(size int) *epochWorlds {
	return &epochWorlds{size: size, worlds: []*fakeWorld{newFakeWorld(size)}, changed: make(chan struct{})}
}

// current is the newest epoch and its world.
func (e *epochWorlds) current() (int, *fakeWorld, chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.worlds) - 1, e.worlds[len(e.worlds)-1], e.changed
}

// advance publishes a new epoch: the old world's calls fail with
// comm.ErrEpochChanged.
func (e *epochWorlds) advance() {
	e.mu.Lock()
	old := e.worlds[len(e.worlds)-1]
	e.worlds = append(e.worlds, newFakeWorld(e.size))
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	old.abort(fmt.Errorf("fake: %w", comm.ErrEpochChanged))
}

// lose fails the current world's calls as a lost peer does.
func (e *epochWorlds) lose(peer int) {
	_, w, _ := e.current()
	w.abort(&comm.PeerLostError{Op: "fake", Rank: peer})
}

// join gives rank's communicator in the current epoch and the rebuild
// function that follows it into later ones (comm.Comm.Rebuild's part).
func (e *epochWorlds) join(rank int) (collectives, func(context.Context) (collectives, error)) {
	epoch, w, _ := e.current()
	rebuild := func(ctx context.Context) (collectives, error) {
		for {
			ep, w, changed := e.current()
			if ep > epoch {
				epoch = ep
				return &fakeComm{w, rank}, nil
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return nil, fmt.Errorf("fake: waiting for a new epoch: %w", context.Cause(ctx))
			}
		}
	}
	return &fakeComm{w, rank}, rebuild
}

// protCluster is gorun's state protection in process: a keeper.Keeper per
// host (the last ones spares), replicating over loopback, each rank's
// socket served by the host the rank is placed on, and G published as
// the launcher does (the minimum of the ranks' Replicated, never going
// back).
type protCluster struct {
	t      *testing.T
	job    string
	socks  []string
	hosts  []*keeper.Keeper
	closed []bool

	mu      sync.Mutex // guards hostOf, holders, closed
	hostOf  []int
	holders [][]int
	g       int64

	kick chan struct{}
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// newProtCluster starts nhosts hosts, rank r on host r (nhosts-nranks
// spares), rank r's replicas held by rank r+1 (mod nranks), in protect
// mode mode (a diff-mode base every 4 steps, folds of 3: a 30-step run
// sees both).
func newProtCluster(t *testing.T, nranks, nhosts int, mode protect.ProtectMode) *protCluster {
	t.Helper()
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	c := &protCluster{t: t, job: "inplace", g: -1, kick: make(chan struct{}, 1), closed: make([]bool, nhosts)}
	for r := range nranks {
		c.hostOf = append(c.hostOf, r)
		c.holders = append(c.holders, []int{(r + 1) % nranks})
	}
	all := make([]int, nranks)
	for r := range all {
		all[r] = r
	}
	addrs := make([]string, nhosts)
	for h := range nhosts {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[h] = ln.Addr().String()
		var ranks []int
		if h < nranks {
			ranks = []int{h}
		}
		host, err := keeper.New(keeper.Config{
			Job: c.job, LinkKey: secret.LinkKey(), Host: h, Hosts: nhosts, Ranks: ranks, Dir: t.TempDir(),
			Holders: c.holders, Peers: func(int) []int { return all },
			HostOf:   func(r int) int { c.mu.Lock(); defer c.mu.Unlock(); return c.hostOf[r] },
			Listener: ln,
			Changed:  func() { c.poke() },
			Mode:     mode,
			Diff:     keeper.DiffConfig{Fold: 3, BaseEvery: 4, Codec: replay.Options{Lossless: true}},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.hosts = append(c.hosts, host)
	}
	for _, h := range c.hosts {
		h.SetAddrs(addrs)
	}
	dir := t.TempDir()
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	var lns []net.Listener
	for r := range nranks {
		c.socks = append(c.socks, filepath.Join(dir, fmt.Sprintf("r%d.sock", r)))
		ln, err := net.Listen("unix", c.socks[r])
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		c.wg.Go(func() { c.acceptRank(ln, r) })
	}
	c.wg.Go(func() { c.publishG(ctx) })
	t.Cleanup(func() {
		stop()
		for _, ln := range lns {
			ln.Close()
		}
		for h, host := range c.hosts {
			if !c.isClosed(h) {
				host.Close()
			}
		}
		c.wg.Wait()
	})
	return c
}

func (c *protCluster) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *protCluster) isClosed(h int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed[h]
}

// acceptRank serves rank r's connections, each by the host r is placed
// on when it connects (the agent's serving loop, reduced to what state
// protection needs).
func (c *protCluster) acceptRank(ln net.Listener, r int) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		host := c.hosts[c.hostOf[r]]
		c.mu.Unlock()
		c.wg.Go(func() {
			defer conn.Close()
			typ, _, err := wire.ReadSock(conn)
			if err != nil || typ != wire.SockHello {
				return
			}
			if wire.WriteSock(conn, wire.SockWelcome, &wire.Welcome{Version: wire.SockVersion, Job: c.job, Rank: r}) != nil {
				return
			}
			sess := host.Session(r)
			if sess == nil {
				return
			}
			defer sess.Close() // as the agent does: the rank is gone with its socket
			for {
				typ, b, err := wire.ReadSock(conn)
				if err != nil || !protect.IsRequest(typ) {
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
		})
	}
}

// publishG publishes G to every live host whenever it rises.
func (c *protCluster) publishG(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		}
		c.mu.Lock()
		hostOf := append([]int(nil), c.hostOf...)
		c.mu.Unlock()
		g, complete := int64(1<<53-1), true
		for r, h := range hostOf {
			if c.isClosed(h) {
				complete = false
				break
			}
			found := false
			_, ps := c.hosts[h].Progress()
			for _, p := range ps {
				if p.Rank == r {
					g, found = min(g, p.Replicated), true
				}
			}
			complete = complete && found
		}
		c.mu.Lock()
		if complete && g > c.g {
			c.g = g
			for h, host := range c.hosts {
				if !c.closed[h] {
					host.SetG(host.Gen(), g)
				}
			}
		}
		c.mu.Unlock()
	}
}

// connect is runOptions.protect for rank r.
func (c *protCluster) connect(r int) func(ctx context.Context, regions []protect.Region, opt protect.Options) (protector, error) {
	return func(ctx context.Context, regions []protect.Region, opt protect.Options) (protector, error) {
		opt.Socket = c.socks[r]
		return protect.Connect(ctx, regions, opt)
	}
}

// replace loses rank r's host and places r on host spare, restoring from
// its holder's copy, as hotswap's plan does.
func (c *protCluster) replace(r, spare int) {
	c.t.Helper()
	c.mu.Lock()
	lost := c.hostOf[r]
	c.closed[lost] = true
	c.mu.Unlock()
	c.hosts[lost].Close()
	c.mu.Lock()
	c.hostOf[r] = spare
	hostOf := append([]int(nil), c.hostOf...)
	holders := c.holders
	c.mu.Unlock()
	holder := holders[r][0]
	for h, host := range c.hosts {
		if c.isClosed(h) {
			continue
		}
		var mine []int
		for x, hx := range hostOf {
			if hx == h {
				mine = append(mine, x)
			}
		}
		p := keeper.Placement{Ranks: mine, HostOf: hostOf, Holders: holders, Sources: map[int]keeper.Source{r: {Opt: holder, Params: holder}}}
		if err := host.SetPlacement(p); err != nil {
			c.t.Errorf("host %d: SetPlacement: %v", h, err)
		}
	}
}

// progress is rank r's protection progress on its host.
func (c *protCluster) progress(r int) keeper.Progress {
	c.mu.Lock()
	h := c.hostOf[r]
	c.mu.Unlock()
	_, ps := c.hosts[h].Progress()
	for _, p := range ps {
		if p.Rank == r {
			return p
		}
	}
	c.t.Fatalf("no progress of rank %d on host %d", r, h)
	return keeper.Progress{}
}

// inPlaceRun is one rank's outcome.
type inPlaceRun struct {
	res *result
	err error
}

// startRank trains rank r of ew in a goroutine from the current epoch.
func startRank(t *testing.T, ctx context.Context, wg *sync.WaitGroup, ew *epochWorlds, cfg Config, o runOptions, r int, done chan<- inPlaceRun) {
	c, rebuild := ew.join(r)
	o.rebuild = rebuild
	wg.Go(func() {
		res, err := train(ctx, c, cfg, o)
		done <- inPlaceRun{res, err}
	})
}

// TestInPlaceRecoveryReplacesRank: 4 ranks on hosts 0–3, host 4 a spare.
// Rank 2 dies at the start of step 11 with its host. The survivors lose
// it, gorun places rank 2 on the spare and publishes epoch 1: the
// survivors keep running, roll back to G from their own slots, a fresh
// rank 2 restores from its holder's replica, and the job ends with the
// hashes of a run without failure. In the second case a further epoch
// change comes while the world is recovering (when the new rank 2
// connects): every rank, the replacement too, rebuilds again.
func TestInPlaceRecoveryReplacesRank(t *testing.T) {
	const size, victim, spare = 4, 2, 4
	want := mustRunWorld(t, size, testConfig(t), runOptions{})
	for _, tc := range []struct {
		name  string
		mode  protect.ProtectMode
		again bool // a second epoch change during the recovery
	}{
		{"one epoch change", protect.ModeFull, false},
		{"epoch changes again during recovery", protect.ModeFull, true},
		{"diff mode", protect.ModeDiff, false},
		{"diff mode, epoch changes again during recovery", protect.ModeDiff, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cfg := testConfig(t, "--protect", "--fail-at-step", "11", "--fail-rank", fmt.Sprint(victim), "--rebuild-timeout", "1m")
			pc := newProtCluster(t, size, size+1, tc.mode)
			ew := newEpochWorlds(size)
			var wg sync.WaitGroup
			defer wg.Wait()
			dones := make([]chan inPlaceRun, size)
			outs := make([]*bytes.Buffer, size)
			for r := range size {
				dones[r], outs[r] = make(chan inPlaceRun, 1), new(bytes.Buffer)
				startRank(t, ctx, &wg, ew, cfg, runOptions{out: outs[r], errOut: outs[r], protect: pc.connect(r)}, r, dones[r])
			}
			if got := <-dones[victim]; !errors.Is(got.err, errCrashed) {
				ew.lose(victim)
				t.Fatalf("rank %d: %v, want errCrashed", victim, got.err)
			}
			// gorun notices, fences the host, places rank 2 on the
			// spare and publishes epoch 1, where it starts rank 2 anew.
			ew.lose(victim)
			pc.replace(victim, spare)
			ew.advance()
			o := runOptions{errOut: outs[victim], protect: pc.connect(victim)}
			if tc.again {
				connect := o.protect
				o.protect = func(ctx context.Context, regions []protect.Region, opt protect.Options) (protector, error) {
					p, err := connect(ctx, regions, opt)
					ew.advance() // epoch 2, same placement
					return p, err
				}
			}
			fresh := cfg
			fresh.FailAtStep = -1 // as dptrain does when GORUN_EPOCH > 0
			startRank(t, ctx, &wg, ew, fresh, o, victim, dones[victim])
			for r := range size {
				got := <-dones[r]
				if got.err != nil {
					t.Errorf("rank %d: %v\n%s", r, got.err, outs[r])
					ew.lose(r)
					continue
				}
				if got.res.ParamsHash != want.ParamsHash || got.res.OptimizerHash != want.OptimizerHash {
					t.Errorf("rank %d: hashes %x %x, want %x %x (no failure)", r, got.res.ParamsHash, got.res.OptimizerHash, want.ParamsHash, want.OptimizerHash)
				}
				wantLosses := want.Losses
				if r == victim { // the replacement logs the steps it trained
					wantLosses = wantLosses[len(wantLosses)-len(got.res.Losses):]
				}
				if len(got.res.Losses) == 0 || fmt.Sprint(got.res.Losses) != fmt.Sprint(wantLosses) {
					t.Errorf("rank %d: losses %v, want %v", r, got.res.Losses, wantLosses)
				}
			}
			if t.Failed() {
				return
			}
			for r := range size {
				p := pc.progress(r)
				minRestores := int64(2) // the start, and in place
				if r == victim {
					minRestores = 1
				}
				if p.Restores < minRestores {
					t.Errorf("rank %d: %d restores, want at least %d: %+v", r, p.Restores, minRestores, p)
				}
				// Diff mode sends differentials (and bases), full mode
				// none: the mode reached the trainer and was used.
				if diff := tc.mode == protect.ModeDiff; diff != (p.ReplDiffBytes > 0) {
					t.Errorf("rank %d in %s mode: %d bytes of differentials sent", r, tc.mode, p.ReplDiffBytes)
				}
				// Every holder's host runs a data-parallel peer of its
				// owner, whose reduced gradient (no --device-grad) has
				// the owner's: the holders took gradients from it.
				if tc.mode == protect.ModeDiff && p.DiffLocal == 0 {
					t.Errorf("rank %d: no differential taken from a local peer (%d with the record): %+v", r, p.DiffNet, p)
				}
			}
			if tc.mode == protect.ModeDiff {
				var folded int64
				for _, h := range pc.hosts {
					folded += h.FoldStats().Steps
				}
				if folded == 0 {
					t.Errorf("no holder folded a step into a base (--diff-fold 3 over 30 steps)")
				}
			}
			if !strings.Contains(outs[victim].String(), "from tier 2") {
				t.Errorf("rank %d did not restore from its holder (tier 2):\n%s", victim, outs[victim])
			}
			if !strings.Contains(outs[0].String(), "(in place)\n") {
				t.Errorf("rank 0 did not report resuming in place:\n%s", outs[0])
			}
		})
	}
}

// TestInPlaceRecoveryEnds: what cannot be survived in place ends every
// rank with an error that says why, rather than hanging: an epoch change
// without --protect (no state to rebuild from), and a lost peer that no
// new epoch follows within --rebuild-timeout.
func TestInPlaceRecoveryEnds(t *testing.T) {
	const size = 3
	for _, tc := range []struct {
		name    string
		args    []string
		protect bool
		fail    func(ew *epochWorlds) // what gorun does at step 5 of rank 1
		want    error
		inText  string
	}{
		{"epoch change without --protect", nil, false, (*epochWorlds).advance, comm.ErrEpochChanged, "only with --protect"},
		{"peer lost, no new epoch", []string{"--protect", "--rebuild-timeout", "200ms"}, true,
			func(ew *epochWorlds) { ew.lose(1) }, comm.ErrPeerLost, "no new epoch joined within --rebuild-timeout 200ms"},
		{"peer lost, not waiting", []string{"--protect", "--rebuild-timeout", "0"}, true,
			func(ew *epochWorlds) { ew.lose(1) }, comm.ErrPeerLost, "not waiting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cfg := testConfig(t, append([]string{"--fail-at-step", "5", "--fail-rank", "1"}, tc.args...)...)
			var pc *protCluster
			if tc.protect {
				pc = newProtCluster(t, size, size, protect.ModeFull)
			}
			ew := newEpochWorlds(size)
			var wg sync.WaitGroup
			defer wg.Wait()
			done := make([]chan inPlaceRun, size)
			for r := range size {
				done[r] = make(chan inPlaceRun, 1)
				o := runOptions{crash: func(int) error {
					tc.fail(ew)
					return errCrashed
				}}
				if pc != nil {
					o.protect = pc.connect(r)
				}
				startRank(t, ctx, &wg, ew, cfg, o, r, done[r])
			}
			for _, r := range []int{0, 2} {
				got := <-done[r]
				if !errors.Is(got.err, tc.want) || !strings.Contains(got.err.Error(), tc.inText) {
					t.Errorf("rank %d: %v; want an error matching %v and saying %q", r, got.err, tc.want, tc.inText)
				}
			}
			if got := <-done[1]; !errors.Is(got.err, errCrashed) {
				t.Errorf("rank 1: %v, want errCrashed", got.err)
			}
		})
	}
}

// TestEpochChangeEndsDeviceTime: with --device-grad a step has no
// collective, so a rank waiting for its (emulated) accelerator learns of
// a new epoch from the world's Done, at once, not after the step: here
// the device time is an hour and the ranks must still end, in step 0,
// with the epoch change (without --protect, they cannot survive it). The
// epoch changes only once every rank is waiting on Done.
func TestEpochChangeEndsDeviceTime(t *testing.T) {
	const size = 2
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cfg := testConfig(t, "--device-grad", "--device-ms", "3600000")
	ew := newEpochWorlds(size)
	var wg sync.WaitGroup
	defer wg.Wait()
	done := make([]chan inPlaceRun, size)
	waiting := make([]chan struct{}, size)
	for r := range size {
		done[r], waiting[r] = make(chan inPlaceRun, 1), make(chan struct{})
		c, rebuild := ew.join(r)
		w := &doneWatch{fakeComm: c.(*fakeComm), waiting: waiting[r]}
		wg.Go(func() {
			res, err := train(ctx, w, cfg, runOptions{rebuild: rebuild})
			done[r] <- inPlaceRun{res, err}
		})
	}
	for r := range size {
		select {
		case <-waiting[r]:
		case got := <-done[r]:
			t.Fatalf("rank %d ended before its device time: %v", r, got.err)
		case <-ctx.Done():
			t.Fatalf("rank %d never waited on its world's Done", r)
		}
	}
	ew.advance()
	for r := range size {
		select {
		case got := <-done[r]:
			if !errors.Is(got.err, comm.ErrEpochChanged) || !strings.Contains(got.err.Error(), "step 0:") {
				t.Errorf("rank %d: %v; want step 0 to end with the epoch change", r, got.err)
			}
		case <-ctx.Done():
			t.Fatalf("rank %d still in its hour of device time after the epoch changed", r)
		}
	}
}

// doneWatch is a fakeComm that says when its Done is first asked for
// (the rank is about to wait on it).
type doneWatch struct {
	*fakeComm
	waiting chan struct{}
	once    sync.Once
}

func (w *doneWatch) Done() <-chan struct{} {
	w.once.Do(func() { close(w.waiting) })
	return w.fakeComm.Done()
}
