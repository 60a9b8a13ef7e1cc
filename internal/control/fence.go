package control

import (
	"fmt"
	"sync"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// FenceCollector is the launcher's side of fences (see wire.Fence): it
// merges the aggregate of every member host's ranks and, once all members
// are in, publishes the merged values to every agent in one message. Its
// fan-in is one message per member host and fence.
//
// The members of an epoch's fences are the hosts that run ranks in it: an
// idle spare has no part to send, and a lost (fenced) host's part is
// refused, so neither holds the fence up or completes it.
type FenceCollector struct {
	nc    *nats.Conn
	subj  wire.Subjects
	hosts int

	mu      sync.Mutex // guards the fields below
	epoch   uint64
	member  []bool // by host index: the host enters this epoch's fences
	members int    // hosts with member set
	pending map[int]*fenceMerge
	failed  map[int]string // fences of this epoch failed by a host's Err
}

type fenceMerge struct {
	kv   map[string]string
	from []bool // hosts in
	n    int
	err  string
}

// NewFenceCollector collects the fences of epoch of a job of hosts hosts,
// every one of which is a member until SetPlacement says otherwise.
func NewFenceCollector(nc *nats.Conn, job string, epoch uint64, hosts int) *FenceCollector {
	f := &FenceCollector{nc: nc, subj: wire.JobSubjects(job), hosts: hosts, epoch: epoch,
		member: make([]bool, hosts), members: hosts, pending: map[int]*fenceMerge{}}
	for i := range f.member {
		f.member[i] = true
	}
	return f
}

// SetEpoch moves the collector to a new epoch with the same members:
// fences of older epochs still pending are dropped (their ranks' agents
// fail them).
func (f *FenceCollector) SetEpoch(epoch uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setEpoch(epoch)
}

// SetPlacement moves the collector to epoch (as SetEpoch), whose placement
// is ranks: per host index, the host's ranks in the epoch (as
// Membership.Ranks; nil: none). The hosts with ranks are the members of
// the epoch's fences. Call it before the epoch's table is published, so
// that no member's part comes before it. It refuses a placement of another
// number of hosts, or without any rank, and then changes nothing.
func (f *FenceCollector) SetPlacement(epoch uint64, ranks [][]int) error {
	if len(ranks) != f.hosts {
		return fmt.Errorf("control: fence placement of %d hosts, the job has %d", len(ranks), f.hosts)
	}
	member, n := make([]bool, f.hosts), 0
	for h, rs := range ranks {
		if len(rs) > 0 {
			member[h] = true
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("control: fence placement of epoch %d runs no rank", epoch)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.member, f.members = member, n
	f.setEpoch(epoch)
	return nil
}

// setEpoch moves the collector to epoch. f.mu is held.
func (f *FenceCollector) setEpoch(epoch uint64) {
	f.epoch = epoch
	f.pending = map[int]*fenceMerge{}
	f.failed = nil
}

// Handle takes one host's aggregate (a wire.UpFence as received on host
// from's subject; the aggregate must be that host's).
func (f *FenceCollector) Handle(from int, data []byte) error {
	u, err := wire.DecodeUpFence(data)
	if err != nil {
		return err
	}
	if u.Host != from {
		return fmt.Errorf("control: fence of host %d on host %d's subject", u.Host, from)
	}
	if u.Host >= f.hosts {
		return fmt.Errorf("control: fence from host %d of %d", u.Host, f.hosts)
	}
	f.mu.Lock()
	if cur := f.epoch; u.Epoch != cur {
		f.mu.Unlock()
		return fmt.Errorf("control: fence of epoch %d, the current one is %d", u.Epoch, cur)
	}
	if !f.member[u.Host] {
		f.mu.Unlock()
		return fmt.Errorf("control: fence from host %d, which runs no rank in epoch %d", u.Host, u.Epoch)
	}
	if why, failed := f.failed[u.Seq]; failed || u.Err != "" {
		// One host's error fails the fence for the whole job at once, and
		// any part that comes later hears the same.
		if !failed {
			why = fmt.Sprintf("host %d: %s", u.Host, u.Err)
			if f.failed == nil {
				f.failed = map[int]string{}
			}
			f.failed[u.Seq] = why
			delete(f.pending, u.Seq)
		}
		f.mu.Unlock()
		if err := f.nc.Publish(f.subj.Fence, wire.Marshal(&wire.Fence{Epoch: u.Epoch, Seq: u.Seq, Err: why})); err != nil {
			return fmt.Errorf("control: publishing fence %d: %w", u.Seq, err)
		}
		return nil
	}
	m := f.pending[u.Seq]
	if m == nil {
		m = &fenceMerge{kv: map[string]string{}, from: make([]bool, f.hosts)}
		f.pending[u.Seq] = m
	}
	if m.from[u.Host] {
		f.mu.Unlock()
		return fmt.Errorf("control: host %d entered fence %d twice", u.Host, u.Seq)
	}
	m.from[u.Host] = true
	m.n++
	for k, v := range u.KV {
		if _, dup := m.kv[k]; dup && m.err == "" {
			m.err = fmt.Sprintf("key %q set by two ranks", k)
		}
		m.kv[k] = v
	}
	done := m.n == f.members
	if done {
		delete(f.pending, u.Seq)
	}
	f.mu.Unlock()
	if !done {
		return nil
	}
	out := &wire.Fence{Epoch: u.Epoch, Seq: u.Seq, KV: m.kv, Err: m.err}
	if m.err != "" {
		out.KV = nil
	}
	if err := f.nc.Publish(f.subj.Fence, wire.Marshal(out)); err != nil {
		return fmt.Errorf("control: publishing fence %d: %w", u.Seq, err)
	}
	return nil
}
