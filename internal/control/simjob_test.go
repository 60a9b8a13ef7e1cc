package control_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// simJob is a job's control plane at scale with simulated agents: the real
// server, authenticated as in production; the launcher's in-process
// connection with its rendezvous and fence collector, fed from the up
// subjects as launcher/onup.go feeds them; and one simulated agent per host,
// each on its own authenticated TCP connection, which registers, takes the
// epoch tables and enters its ranks' address fence as internal/agent does,
// with no rank behind it.
//
// A simJob belongs to one test goroutine; its agents' work runs in
// goroutines that each phase (connect, register, epoch) waits for. Close
// (registered with tb.Cleanup) ends everything.
type simJob struct {
	tb       testing.TB
	job      string
	secret   jobkey.Secret
	srv      *ctlserver.Server
	launcher *control.Control
	hosts    []control.RendezvousHost
	rv       *control.Rendezvous
	fences   *control.FenceCollector
	up       *nats.Subscription
	agents   []*simAgent

	closeOnce sync.Once
	decoded   fenceDecoder

	mu     sync.Mutex
	upErrs []error // the launcher's complaints about agents' messages
}

// simAgent is the simulated agent of one host.
type simAgent struct {
	job    string
	host   int
	name   string
	ctl    *control.Control
	rv     *control.AgentRendezvous
	fences chan *nats.Msg // merged fences, as the launcher broadcasts them
	// registered: the agent's registration was taken.
	registered bool
	table      *wire.EpochTable  // the newest table the agent took
	fence      map[string]string // the newest merged fence the agent took
	// tableAt is when the agent held the newest table, decoded.
	tableAt time.Time
	// decoded is the job's, shared by its agents.
	decoded *fenceDecoder
	lost    bool // its connection was closed: the host is gone
}

// newSimJob starts the control plane of job whose hosts are hosts, with
// replica holders holders, and the launcher's side: the rendezvous of epoch
// 0 and the fence collector, whose epoch-0 members are the hosts that run
// ranks. No agent is connected yet (see connect).
func newSimJob(tb testing.TB, job string, hosts []control.RendezvousHost, holders []wire.HolderRow) *simJob {
	tb.Helper()
	sj := &simJob{tb: tb, job: job, secret: newSecret(tb), hosts: hosts}
	sj.srv = startServer(tb, sj.secret, job, len(hosts))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var err error
	if sj.launcher, err = control.DialInProcess(ctx, sj.srv.InProcess(), sj.secret, control.ControlOptions{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(sj.close)
	sj.fences = control.NewFenceCollector(sj.launcher.Conn, job, 0, len(hosts))
	placement := make([][]int, len(hosts))
	for i, h := range hosts {
		placement[i] = h.Ranks
	}
	if err := sj.fences.SetPlacement(0, placement); err != nil {
		tb.Fatal(err)
	}
	subj := wire.JobSubjects(job)
	if sj.up, err = sj.launcher.Subscribe(subj.Up, sj.onUp); err != nil {
		tb.Fatal(err)
	}
	sj.up.SetPendingLimits(-1, -1)
	sj.rv, err = control.StartRendezvous(sj.launcher.Conn, job, 0, hosts, &wire.JobSpec{Prog: "true", HeartbeatInterval: time.Second}, holders, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return sj
}

// onUp is the launcher's handler of the agents' up subjects: fence parts
// go to the collector, as in launcher/onup.go; nothing else is expected.
func (sj *simJob) onUp(m *nats.Msg) {
	subj := wire.JobSubjects(sj.job)
	from, kind, ok := subj.ParseUp(m.Subject)
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("message on %s", m.Subject)
	case kind != wire.UpKindFence:
		err = fmt.Errorf("host %d: unexpected %s message", from, kind)
	default:
		err = sj.fences.Handle(from, m.Data)
	}
	if err != nil {
		sj.mu.Lock()
		sj.upErrs = append(sj.upErrs, err)
		sj.mu.Unlock()
	}
}

// launcherErrors returns the launcher's complaints about the agents'
// messages so far.
func (sj *simJob) launcherErrors() []error {
	sj.mu.Lock()
	defer sj.mu.Unlock()
	return slices.Clone(sj.upErrs)
}

// close ends the job: agents, launcher and server. It may be called more
// than once.
func (sj *simJob) close() {
	sj.closeOnce.Do(sj.doClose)
}

func (sj *simJob) doClose() {
	for _, a := range sj.agents {
		if a != nil && a.ctl != nil && !a.lost {
			a.ctl.Close()
		}
	}
	if sj.up != nil {
		_ = sj.up.Unsubscribe()
	}
	if sj.rv != nil {
		sj.rv.Close()
	}
	sj.launcher.Close()
	sj.srv.Shutdown()
}

// each runs f for every agent that is not lost, concurrently, and returns
// the first error.
func (sj *simJob) each(f func(a *simAgent) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(sj.agents))
	for _, a := range sj.agents {
		if a.lost {
			continue
		}
		wg.Go(func() {
			if err := f(a); err != nil {
				errs <- fmt.Errorf("host %d: %w", a.host, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// connect connects every host's agent: an authenticated TCP connection,
// the epoch subscription (JoinRendezvous) and the fence subscription.
func (sj *simJob) connect(ctx context.Context) error {
	sj.agents = make([]*simAgent, len(sj.hosts))
	for i, h := range sj.hosts {
		sj.agents[i] = &simAgent{job: sj.job, decoded: &sj.decoded, host: i, name: h.Name, fences: make(chan *nats.Msg, 16)}
	}
	return sj.each(func(a *simAgent) error {
		c, err := dialHost(ctx, sj.srv, sj.secret, sj.job, a.host)
		if err != nil {
			return err
		}
		a.ctl = c
		if a.rv, err = control.JoinRendezvous(c.Conn, sj.job, a.host); err != nil {
			return err
		}
		if _, err = c.ChanSubscribe(wire.JobSubjects(sj.job).Fence, a.fences); err != nil {
			return err
		}
		return c.Flush()
	})
}

// registerSpares registers the agents of the spare hosts, which the first
// table does not wait for.
func (sj *simJob) registerSpares(ctx context.Context) error {
	return sj.each(func(a *simAgent) error {
		if !sj.hosts[a.host].Spare {
			return nil
		}
		return a.register(ctx)
	})
}

// rendezvous has every agent register (unless it did), each with its own
// address, and wait for the first table; with fence, each then enters
// fence 0 of epoch 0 and waits for the merged fence. It returns once every
// agent has done so.
func (sj *simJob) rendezvous(ctx context.Context, fence bool) error {
	return sj.each(func(a *simAgent) error {
		if !a.registered {
			if err := a.register(ctx); err != nil {
				return err
			}
		}
		return a.takeEpoch(ctx, 0, fence)
	})
}

// register registers a.
func (a *simAgent) register(ctx context.Context) error {
	spec, err := a.rv.Register(ctx, a.registration())
	if err != nil {
		return err
	}
	if spec.Prog != "true" {
		return fmt.Errorf("spec %+v", spec)
	}
	a.registered = true
	return nil
}

// registration is a's registration (see simAddr).
func (a *simAgent) registration() *wire.Register {
	return &wire.Register{Version: wire.Version, Job: a.job, Host: a.host, Name: a.name,
		Addr: simAddr(a.host), MasterPort: 29500, ReplicaPort: 9000}
}

// simAddr is the address of simulated host host.
func simAddr(host int) string { return fmt.Sprintf("10.%d.%d.1", host>>8&255, host&255) }

// takeEpoch has every agent that is not lost take epoch (see
// simAgent.takeEpoch) and enter its address fence.
func (sj *simJob) takeEpoch(ctx context.Context, epoch uint64) error {
	return sj.each(func(a *simAgent) error { return a.takeEpoch(ctx, epoch, true) })
}

// takeEpoch waits for the table of epoch (a later one is an error) and
// decodes it; with fence, it then enters fence 0 of the epoch with its
// ranks' data-plane addresses, under the keys comm.Init's join uses (if it
// has ranks), and waits for the merged fence and decodes it.
func (a *simAgent) takeEpoch(ctx context.Context, epoch uint64, fence bool) error {
	t, err := a.rv.WaitEpoch(ctx, epoch)
	if err != nil {
		return err
	}
	if t.Epoch != epoch {
		return fmt.Errorf("waiting for epoch %d, got epoch %d", epoch, t.Epoch)
	}
	a.table, a.tableAt = t, time.Now()
	if !fence {
		return nil
	}
	if err := a.enterFence(epoch); err != nil {
		return err
	}
	for {
		select {
		case m := <-a.fences:
			f, err := a.decoded.fence(m.Data)
			if err != nil {
				return err
			}
			if f.Epoch != epoch {
				continue // an older epoch's, late
			}
			if f.Seq != 0 || f.Err != "" {
				return fmt.Errorf("fence %d of epoch %d failed: %s", f.Seq, f.Epoch, f.Err)
			}
			a.fence = f.KV
			return nil
		case <-a.ctl.Lost():
			return fmt.Errorf("waiting for the fence of epoch %d: connection lost: %v", epoch, a.ctl.LastError())
		case <-ctx.Done():
			return fmt.Errorf("waiting for the fence of epoch %d: %w", epoch, context.Cause(ctx))
		}
	}
}

// enterFence sends a's part of fence 0 of epoch: the addresses of its
// ranks in its table, as its ranks would enter them.
func (a *simAgent) enterFence(epoch uint64) error {
	ranks, err := a.table.Hosts[a.host].Ranks.Expand(a.table.World)
	if err != nil || len(ranks) == 0 {
		return err // a host without ranks has no part
	}
	kv := make(map[string]string, 2*len(ranks))
	for l, r := range ranks {
		kv[fenceAddrKey(r)] = simAddr(a.host) + ":" + strconv.Itoa(40000+l)
		kv[fenceUnixKey(r)] = fmt.Sprintf("/tmp/gorun-%s/rank-%d-epoch-%d.dp.sock", a.job, r, epoch)
	}
	up := &wire.UpFence{Host: a.host, Epoch: epoch, Seq: 0, KV: kv}
	return a.ctl.Publish(wire.JobSubjects(a.job).ForHost(a.host).UpFence, wire.Marshal(up))
}

func fenceAddrKey(r int) string { return "comm/addr/" + strconv.Itoa(r) }
func fenceUnixKey(r int) string { return "comm/unix/" + strconv.Itoa(r) }

// lose closes host's agent's connection, as a lost host's would close.
func (sj *simJob) lose(host int) {
	a := sj.agents[host]
	a.ctl.Close()
	a.lost = true
}

// recover is the launcher's side of a recovery epoch after lost was lost:
// Fence(lost), then Publish(epoch, m), the fence collector moved to epoch
// and its placement first so that no agent's part can come before it.
func (sj *simJob) recover(lost int, epoch uint64, m control.Membership) (*wire.EpochTable, error) {
	sj.rv.Fence(lost)
	if err := sj.fences.SetPlacement(epoch, m.Ranks); err != nil {
		return nil, err
	}
	return sj.rv.Publish(epoch, m)
}

// fenceDecoder decodes the merged fences the agents of a simJob receive.
// The launcher publishes one message to all of them: an agent that
// receives the very bytes already decoded takes the decoded fence (the
// same bytes decode the same) instead of spending on its own decoding the
// CPU that a real host would spend on its own cores and that here the
// simulated agents of a thousand hosts would take from the server and the
// launcher, which share two cores with them.
type fenceDecoder struct {
	mu   sync.Mutex
	data []byte
	f    *wire.Fence
}

// fence returns the decoded fence data, decoding it unless it is the same
// as the last.
func (d *fenceDecoder) fence(data []byte) (*wire.Fence, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f != nil && bytes.Equal(d.data, data) {
		return d.f, nil
	}
	f, err := wire.DecodeFence(data, wire.MaxWorld)
	if err != nil {
		return nil, err
	}
	d.data, d.f = data, f
	return f, nil
}
