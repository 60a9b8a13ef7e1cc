package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// EpochTable is the world of one epoch; see wire.EpochTable.
type EpochTable = wire.EpochTable

// ErrRegistration reports a registration the launcher refused.
var ErrRegistration = errors.New("comm: registration refused")

// ErrJobStopped is returned to an agent that registers after the job was
// stopped before it started: the agent has nothing to do and should exit.
var ErrJobStopped = errors.New("comm: the job was stopped before it started")

// RendezvousHost is one host the launcher expects to register.
type RendezvousHost struct {
	Name  string
	Ranks []int // ranks the host runs, in local-rank order
	// Holders, when not nil, replaces the spec's Holders in this host's
	// reply (each host gets the replica placement rows it needs).
	Holders []wire.HolderRow
}

// Rendezvous collects the registrations of one epoch's agents on the
// launcher's side and, once every host is in, publishes the epoch table to
// all of them in a single message.
type Rendezvous struct {
	nc         *nats.Conn
	subj       wire.Subjects
	job        string
	epoch      uint64
	hosts      []RendezvousHost
	world      int
	spec       []byte        // encoded RegisterReply, the same for every agent without its own Holders
	specV      *wire.JobSpec // the spec, for hosts with their own Holders
	registered chan int
	done       chan struct{}

	mu      sync.Mutex // guards the fields below
	regs    []*wire.Register
	missing int
	table   []byte // encoded table, once published
	stopped bool   // Cancel won: the table will never be published
	subs    []*nats.Subscription
}

// StartRendezvous begins accepting registrations for epoch of job. Each
// registered agent gets spec in its reply.
func StartRendezvous(nc *nats.Conn, job string, epoch uint64, hosts []RendezvousHost, spec *wire.JobSpec) (*Rendezvous, error) {
	world := 0
	for _, h := range hosts {
		world += len(h.Ranks)
	}
	r := &Rendezvous{
		nc: nc, subj: wire.JobSubjects(job), job: job, epoch: epoch,
		hosts: hosts, world: world,
		spec:       wire.Marshal(&wire.RegisterReply{Spec: spec}),
		specV:      spec,
		registered: make(chan int, len(hosts)),
		done:       make(chan struct{}),
		regs:       make([]*wire.Register, len(hosts)),
		missing:    len(hosts),
	}
	sub, err := nc.Subscribe(r.subj.Register, r.onRegister)
	if err != nil {
		return nil, fmt.Errorf("comm: rendezvous: %w", err)
	}
	get, err := nc.Subscribe(r.subj.EpochGet, r.onEpochGet)
	if err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("comm: rendezvous: %w", err)
	}
	for _, s := range []*nats.Subscription{sub, get} {
		s.SetPendingLimits(-1, -1)
	}
	r.subs = []*nats.Subscription{sub, get}
	if err := nc.Flush(); err != nil {
		r.Close()
		return nil, fmt.Errorf("comm: rendezvous: %w", err)
	}
	return r, nil
}

// Registered delivers the index of every host as it registers.
func (r *Rendezvous) Registered() <-chan int { return r.registered }

// Done is closed once the table has been published.
func (r *Rendezvous) Done() <-chan struct{} { return r.done }

// reply answers request m, at its sender's inbox only (a request naming
// any other reply subject is dropped: see wire.Subjects.ReplyAllowed).
func (r *Rendezvous) reply(m *nats.Msg, data []byte) {
	if m.Reply == "" {
		return
	}
	if !r.subj.ReplyAllowed(m.Subject, m.Reply) {
		return // only a forged request names another reply subject
	}
	_ = r.nc.Publish(m.Reply, data)
}

func (r *Rendezvous) refuse(m *nats.Msg, format string, args ...any) {
	r.reply(m, wire.Marshal(&wire.RegisterReply{Err: fmt.Sprintf(format, args...)}))
}

func (r *Rendezvous) onRegister(m *nats.Msg) {
	reg, err := wire.DecodeRegister(m.Data)
	if err != nil {
		r.refuse(m, "%v", err)
		return
	}
	if reg.Job != r.job {
		r.refuse(m, "registration for job %q, this is job %q", reg.Job, r.job)
		return
	}
	// The subject says which host's user sent it (the server lets each
	// publish only on its own): a host cannot register as another.
	if from, _, ok := r.subj.ParseRequest(m.Subject); !ok || from != reg.Host {
		r.refuse(m, "registration of host %d on subject %s", reg.Host, m.Subject)
		return
	}
	if reg.Host >= len(r.hosts) || reg.Name != r.hosts[reg.Host].Name {
		r.refuse(m, "unknown host %d %q", reg.Host, reg.Name)
		return
	}
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		r.reply(m, wire.Marshal(&wire.RegisterReply{Stop: true}))
		return
	}
	if r.regs[reg.Host] != nil {
		r.mu.Unlock()
		r.refuse(m, "host %d %q registered twice", reg.Host, reg.Name)
		return
	}
	r.regs[reg.Host] = reg
	r.missing--
	last := r.missing == 0
	r.mu.Unlock()

	if hs := r.hosts[reg.Host].Holders; hs != nil {
		own := *r.specV
		own.Holders = hs
		r.reply(m, wire.Marshal(&wire.RegisterReply{Spec: &own}))
	} else {
		r.reply(m, r.spec)
	}
	r.registered <- reg.Host
	if last {
		r.publish()
	}
}

func (r *Rendezvous) buildTable() *wire.EpochTable {
	t := &wire.EpochTable{
		Version: wire.Version, Job: r.job, Epoch: r.epoch, World: r.world,
		Hosts: make([]wire.TableHost, len(r.hosts)),
	}
	for i, h := range r.hosts {
		t.Hosts[i] = wire.TableHost{Name: h.Name, Addr: r.regs[i].Addr, Ranks: wire.CompressRanks(h.Ranks), ReplicaPort: r.regs[i].ReplicaPort}
		for _, rank := range h.Ranks {
			if rank == 0 {
				t.MasterAddr, t.MasterPort = r.regs[i].Addr, r.regs[i].MasterPort
			}
		}
	}
	return t
}

func (r *Rendezvous) publish() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	b := r.buildTable().Encode()
	r.table = b
	r.mu.Unlock()
	// If the publication is lost, agents fetch the table with EpochGet.
	_ = r.nc.Publish(r.subj.Epoch, b)
	close(r.done)
}

// Advance publishes the table again as epoch, which must be later than
// the current one (the same hosts and ranks: a restart of the ranks in
// place). It returns the new table, or nil before the first was published.
func (r *Rendezvous) Advance(epoch uint64) *wire.EpochTable {
	select {
	case <-r.done:
	default:
		return nil
	}
	r.mu.Lock()
	if epoch <= r.epoch {
		r.mu.Unlock()
		return nil
	}
	r.epoch = epoch
	t := r.buildTable()
	b := t.Encode()
	r.table = b
	r.mu.Unlock()
	_ = r.nc.Publish(r.subj.Epoch, b)
	return t
}

func (r *Rendezvous) onEpochGet(m *nats.Msg) {
	r.mu.Lock()
	b := r.table
	r.mu.Unlock()
	if b != nil {
		r.reply(m, b)
	}
	// Before publication the request goes unanswered and the agent retries.
}

// Cancel stops the rendezvous before the table is published, if it still
// can: it reports whether it did, in which case no agent will ever receive
// the table (so no rank starts) and agents registering from now on are told
// the job stopped. Once the table is out, Cancel does nothing and reports
// false.
func (r *Rendezvous) Cancel() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.table != nil {
		return false
	}
	r.stopped = true
	return true
}

// Missing returns the hosts that have not registered yet.
func (r *Rendezvous) Missing() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for i, reg := range r.regs {
		if reg == nil {
			out = append(out, i)
		}
	}
	return out
}

// Table returns the published table, or nil before publication.
func (r *Rendezvous) Table() *wire.EpochTable {
	select {
	case <-r.done:
	default:
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buildTable()
}

// Close stops accepting registrations.
func (r *Rendezvous) Close() {
	r.mu.Lock()
	subs := r.subs
	r.subs = nil
	r.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

// AgentRendezvous is an agent's side of the rendezvous.
type AgentRendezvous struct {
	nc     *nats.Conn
	subj   wire.Subjects
	epochs chan *nats.Msg
	sub    *nats.Subscription
}

// JoinRendezvous subscribes to the job's epoch tables, for the agent of
// host. Call it before Register so that the table published after the last
// registration cannot be missed.
func JoinRendezvous(nc *nats.Conn, job string, host int) (*AgentRendezvous, error) {
	a := &AgentRendezvous{nc: nc, subj: wire.JobSubjects(job).ForHost(host), epochs: make(chan *nats.Msg, 16)}
	sub, err := nc.ChanSubscribe(a.subj.Epoch, a.epochs)
	if err != nil {
		return nil, fmt.Errorf("comm: subscribing to epochs: %w", err)
	}
	a.sub = sub
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("comm: subscribing to epochs: %w", err)
	}
	return a, nil
}

// Register announces the agent and returns the job's spec.
func (a *AgentRendezvous) Register(ctx context.Context, reg *wire.Register) (*wire.JobSpec, error) {
	m, err := a.nc.RequestWithContext(ctx, a.subj.Register, wire.Marshal(reg))
	if err != nil {
		return nil, fmt.Errorf("comm: registering: %w", err)
	}
	rep, err := wire.DecodeRegisterReply(m.Data)
	if err != nil {
		return nil, fmt.Errorf("comm: registering: %w", err)
	}
	if rep.Err != "" {
		return nil, fmt.Errorf("%w: %s", ErrRegistration, rep.Err)
	}
	if rep.Stop {
		return nil, ErrJobStopped
	}
	return rep.Spec, nil
}

// WaitEpoch returns the first valid table of at least epoch min. If none
// arrives for a while it asks the launcher for the current table, so a lost
// publication costs time, not the job.
func (a *AgentRendezvous) WaitEpoch(ctx context.Context, min uint64) (*EpochTable, error) {
	poll := time.NewTimer(5 * time.Second)
	defer poll.Stop()
	for {
		var data []byte
		select {
		case m := <-a.epochs:
			data = m.Data
		case <-poll.C:
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			m, err := a.nc.RequestWithContext(rctx, a.subj.EpochGet, nil)
			cancel()
			poll.Reset(5 * time.Second)
			if err != nil {
				continue
			}
			data = m.Data
		case <-ctx.Done():
			return nil, fmt.Errorf("comm: waiting for epoch table: %w", context.Cause(ctx))
		}
		t, err := wire.DecodeEpochTable(data)
		if err != nil {
			return nil, fmt.Errorf("comm: epoch table: %w", err)
		}
		if t.Epoch >= min {
			return t, nil
		}
	}
}

// Close unsubscribes.
func (a *AgentRendezvous) Close() { _ = a.sub.Unsubscribe() }
