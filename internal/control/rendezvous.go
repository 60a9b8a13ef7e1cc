package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// EpochTable is the world of one epoch; see wire.EpochTable.
type EpochTable = wire.EpochTable

// ErrRegistration reports a registration the launcher refused.
var ErrRegistration = errors.New("control: registration refused")

// ErrJobStopped is returned to an agent that registers after the job was
// stopped before it started (Rendezvous.Cancel) or after it ended
// (Rendezvous.End): the agent has nothing to do and should exit.
var ErrJobStopped = errors.New("control: the job was stopped or has ended")

// ErrMembership reports a membership the rendezvous cannot publish.
var ErrMembership = errors.New("control: bad membership")

// RendezvousHost is one host the launcher expects to register.
type RendezvousHost struct {
	Name  string
	Ranks []int // ranks the host runs in the first epoch, in local-rank order
	// Spare: a host held back to replace a lost one. The first table is
	// not held up for it: a spare that registers late (or never) joins
	// the tables when it registers.
	Spare bool
}

// Membership is one epoch's placement of the job: which host runs which
// ranks, the generation they run in, the step restoring ranks resume
// from, replica holders and the restore plan (see wire.EpochTable).
type Membership struct {
	Ranks   [][]int // per host index: its ranks, in local-rank order (nil: none)
	Gen     uint64
	G       int64
	Holders []wire.HolderRow
	Restore []wire.RestoreRow
	EC      *wire.ECTable // the erasure-coding layout (nil: replicas only)
	// Logs and H are diff mode's under erasure coding: every rank's
	// log-only holders and the newest coded base step when the epoch is
	// published (wire.EpochTable.Logs and H; nil and 0 in other modes).
	Logs []wire.HolderRow
	H    int64
}

// Rendezvous collects the registrations of the job's agents on the
// launcher's side and, once every host that runs ranks is in, publishes
// the epoch table to all of them in a single message. Later epochs are
// published by Advance (the same placement) and Publish (a new one); a
// lost host is fenced out of every later table.
//
// Trust: a registration is taken from the host its subject names (the
// control-plane server lets each agent publish only on its own host's
// subjects), must name that host's index and name, comes once per host,
// and never from a fenced host.
type Rendezvous struct {
	nc         *nats.Conn
	subj       wire.Subjects
	job        string
	hosts      []RendezvousHost
	world      int
	spec       []byte // encoded RegisterReply, the same for every agent
	registered chan int
	done       chan struct{}

	mu    sync.Mutex // guards the fields below
	epoch uint64
	// turn counts the tables with a new epoch published after the first:
	// the epoch's MASTER_PORT is wire.MasterPortOf(rank 0's host, turn),
	// so that two successive epochs never share one (however far apart
	// their numbers are).
	turn   uint64
	member Membership
	fenced []bool
	regs   []*wire.Register
	// firstRegs: the hosts registered when the first table went out.
	firstRegs int
	missing   int    // hosts with ranks not registered yet (before the first table)
	table     []byte // encoded table, once published
	stopped   bool   // Cancel won: the table will never be published
	ended     bool   // End was called: registrations are told to stop
	subs      []*nats.Subscription
}

// StartRendezvous begins accepting registrations for epoch of job, whose
// hosts run hosts[i].Ranks with replica holders holders (nil: none) and
// erasure-coding layout ec (nil: none). Each registered agent gets spec in
// its reply. A placement the first table could not carry (one every
// agent would refuse: wire.EpochTable.Validate) is an error wrapping
// ErrMembership.
func StartRendezvous(nc *nats.Conn, job string, epoch uint64, hosts []RendezvousHost, spec *wire.JobSpec, holders []wire.HolderRow, ec *wire.ECTable) (*Rendezvous, error) {
	world, missing := 0, 0
	m := Membership{Ranks: make([][]int, len(hosts)), G: -1, Holders: holders, EC: ec}
	for i, h := range hosts {
		world += len(h.Ranks)
		m.Ranks[i] = h.Ranks
		if !h.Spare || len(h.Ranks) > 0 {
			missing++
		}
	}
	r := &Rendezvous{
		nc: nc, subj: wire.JobSubjects(job), job: job, epoch: epoch,
		hosts: hosts, world: world, member: m,
		spec:       wire.Marshal(&wire.RegisterReply{Spec: spec}),
		registered: make(chan int, len(hosts)),
		done:       make(chan struct{}),
		regs:       make([]*wire.Register, len(hosts)),
		fenced:     make([]bool, len(hosts)),
		missing:    missing,
	}
	if err := r.buildTable().Validate(); err != nil {
		// The hosts' addresses come with their registrations (checked
		// then); a placement every agent would refuse is refused here.
		return nil, fmt.Errorf("control: rendezvous: %w: %w", ErrMembership, err)
	}
	sub, err := nc.Subscribe(r.subj.Register, r.onRegister)
	if err != nil {
		return nil, fmt.Errorf("control: rendezvous: %w", err)
	}
	get, err := nc.Subscribe(r.subj.EpochGet, r.onEpochGet)
	if err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("control: rendezvous: %w", err)
	}
	for _, s := range []*nats.Subscription{sub, get} {
		s.SetPendingLimits(-1, -1)
	}
	r.subs = []*nats.Subscription{sub, get}
	if err := nc.Flush(); err != nil {
		r.Close()
		return nil, fmt.Errorf("control: rendezvous: %w", err)
	}
	return r, nil
}

// Registered delivers the index of every host as it registers.
func (r *Rendezvous) Registered() <-chan int { return r.registered }

// FirstRegistered is how many hosts had registered when the first table
// was published (spares that register later are not counted); 0 before.
func (r *Rendezvous) FirstRegistered() int {
	select {
	case <-r.done:
	default:
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.firstRegs
}

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
	if r.stopped || r.ended {
		r.mu.Unlock()
		r.reply(m, wire.Marshal(&wire.RegisterReply{Stop: true}))
		return
	}
	if r.fenced[reg.Host] {
		r.mu.Unlock()
		r.refuse(m, "host %d %q was lost and is fenced out of the job", reg.Host, reg.Name)
		return
	}
	if r.regs[reg.Host] != nil {
		r.mu.Unlock()
		r.refuse(m, "host %d %q registered twice", reg.Host, reg.Name)
		return
	}
	r.regs[reg.Host] = reg
	waited := len(r.member.Ranks[reg.Host]) > 0 || !r.hosts[reg.Host].Spare
	if waited && r.table == nil {
		r.missing--
	}
	last := r.missing == 0 && r.table == nil
	late := r.table != nil // a spare joining a published job
	r.mu.Unlock()

	if late {
		r.republish() // before the launcher hears of it, which may place ranks there
	}
	r.reply(m, r.spec)
	r.registered <- reg.Host
	if last {
		r.publish()
	}
}

// buildTable builds the table of the current epoch and membership. r.mu
// is held.
func (r *Rendezvous) buildTable() *wire.EpochTable {
	t := &wire.EpochTable{
		Version: wire.Version, Job: r.job, Epoch: r.epoch, World: r.world,
		Hosts: make([]wire.TableHost, len(r.hosts)),
		Gen:   r.member.Gen, G: r.member.G, Holders: r.member.Holders, Restore: r.member.Restore,
		EC: r.member.EC, Logs: r.member.Logs, H: r.member.H,
	}
	for i, h := range r.hosts {
		th := &t.Hosts[i]
		th.Name = h.Name
		ranks := r.member.Ranks[i]
		th.Ranks = wire.CompressRanks(ranks)
		if r.fenced[i] {
			// Until Publish moves its ranks, the table says where they
			// were (and does not validate).
			th.Fenced = true
			continue
		}
		th.Spare = h.Spare && len(ranks) == 0
		reg := r.regs[i]
		if reg == nil {
			continue
		}
		th.Addr, th.ReplicaPort = reg.Addr, reg.ReplicaPort
		if slices.Contains(ranks, 0) {
			t.MasterAddr, t.MasterPort = reg.Addr, wire.MasterPortOf(reg, r.turn)
		}
	}
	return t
}

func (r *Rendezvous) publish() {
	r.mu.Lock()
	if r.stopped || r.table != nil {
		r.mu.Unlock()
		return
	}
	b := r.buildTable().Encode()
	r.table = b
	for _, reg := range r.regs {
		if reg != nil {
			r.firstRegs++
		}
	}
	r.mu.Unlock()
	// If the publication is lost, agents fetch the table with EpochGet.
	_ = r.nc.Publish(r.subj.Epoch, b)
	close(r.done)
}

// republish publishes the current epoch's table again, with what changed
// since (a spare that joined): agents that have this epoch ignore it.
func (r *Rendezvous) republish() {
	r.mu.Lock()
	if r.table == nil {
		r.mu.Unlock()
		return
	}
	b := r.buildTable().Encode()
	r.table = b
	r.mu.Unlock()
	_ = r.nc.Publish(r.subj.Epoch, b)
}

// SetDiffEC makes the first table one of diff mode under erasure coding:
// it carries every rank's log-only holders, logs, and H = -1 (no base is
// coded yet). It returns an error wrapping ErrMembership, changing
// nothing, once the table is out, or when the table with logs would not
// validate (every agent would refuse it: wire.EpochTable.Validate).
func (r *Rendezvous) SetDiffEC(logs []wire.HolderRow) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.table != nil {
		return fmt.Errorf("%w: log holders after the first table", ErrMembership)
	}
	old := r.member
	r.member.Logs, r.member.H = logs, -1
	if err := r.buildTable().Validate(); err != nil {
		r.member = old
		return fmt.Errorf("%w: %w", ErrMembership, err)
	}
	return nil
}

// Advance publishes the table again as epoch, which must be later than
// the current one (the same placement: a restart of the ranks in place).
// It returns the new table, or nil before the first was published, for an
// epoch not later than the current one, or when a fenced host still has
// ranks (only Publish can move them).
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
	old := r.epoch
	r.epoch = epoch
	r.turn++
	t := r.buildTable()
	if t.Validate() != nil {
		r.epoch = old
		r.turn--
		r.mu.Unlock()
		return nil
	}
	b := t.Encode()
	r.table = b
	r.mu.Unlock()
	_ = r.nc.Publish(r.subj.Epoch, b)
	return t
}

// Publish publishes epoch, later than the current one, with membership m:
// the recovery epoch of a hot-swap. Every rank must be on a host that is
// neither fenced nor unregistered. It returns the table published.
func (r *Rendezvous) Publish(epoch uint64, m Membership) (*wire.EpochTable, error) {
	select {
	case <-r.done:
	default:
		return nil, fmt.Errorf("%w: epoch %d before the first table", ErrMembership, epoch)
	}
	r.mu.Lock()
	if epoch <= r.epoch {
		e := r.epoch
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: epoch %d is not after epoch %d", ErrMembership, epoch, e)
	}
	if len(m.Ranks) != len(r.hosts) {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: ranks for %d hosts, the job has %d", ErrMembership, len(m.Ranks), len(r.hosts))
	}
	for h, ranks := range m.Ranks {
		if len(ranks) > 0 && (r.fenced[h] || r.regs[h] == nil) {
			r.mu.Unlock()
			return nil, fmt.Errorf("%w: ranks on host %s, which is fenced or not registered", ErrMembership, r.hosts[h].Name)
		}
	}
	oldEpoch, oldMember := r.epoch, r.member
	r.epoch, r.member = epoch, m
	r.turn++
	t := r.buildTable()
	if err := t.Validate(); err != nil {
		r.epoch, r.member = oldEpoch, oldMember
		r.turn--
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrMembership, err)
	}
	b := t.Encode()
	r.table = b
	r.mu.Unlock()
	_ = r.nc.Publish(r.subj.Epoch, b)
	return t, nil
}

// Fence marks host lost: it appears fenced in every later table, and its
// registrations are refused. Its ranks must move in the next Publish.
func (r *Rendezvous) Fence(host int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if host >= 0 && host < len(r.fenced) {
		r.fenced[host] = true
	}
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

// End marks the job ended: every agent registering from now on is told
// to stop (RegisterReply.Stop; ErrJobStopped on its side) rather than
// joining the job. The launcher calls it before it tells the agents to
// exit: an agent subscribes to the launcher's control messages before it
// registers (and JoinRendezvous flushes that), so an agent registered
// before End gets the exit sent after it, and one that registers later,
// which may have subscribed too late for the exit, is told here.
func (r *Rendezvous) End() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
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

// Table returns the current table, or nil before the first publication.
// Between Fence and the Publish that moves its ranks, the fenced host is
// shown with them, and the table does not validate.
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
		return nil, fmt.Errorf("control: subscribing to epochs: %w", err)
	}
	a.sub = sub
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("control: subscribing to epochs: %w", err)
	}
	return a, nil
}

// Register announces the agent and returns the job's spec.
func (a *AgentRendezvous) Register(ctx context.Context, reg *wire.Register) (*wire.JobSpec, error) {
	m, err := a.nc.RequestWithContext(ctx, a.subj.Register, wire.Marshal(reg))
	if err != nil {
		return nil, fmt.Errorf("control: registering: %w", err)
	}
	rep, err := wire.DecodeRegisterReply(m.Data)
	if err != nil {
		return nil, fmt.Errorf("control: registering: %w", err)
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
			return nil, fmt.Errorf("control: waiting for epoch table: %w", context.Cause(ctx))
		}
		t, err := wire.DecodeEpochTable(data)
		if err != nil {
			return nil, fmt.Errorf("control: epoch table: %w", err)
		}
		if t.Epoch >= min {
			return t, nil
		}
	}
}

// Close unsubscribes.
func (a *AgentRendezvous) Close() { _ = a.sub.Unsubscribe() }
