package agent

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/topology"
	"github.com/nats-io/nats.go"
)

// protection runs the host's state protection (package rank): a service
// per local rank, the replicas this host holds, the progress reports to
// the launcher and G from it.
type protection struct {
	a    *agent
	host *rank.Host
	kick chan struct{} // progress changed
	fail chan rankStateFailure
	stop chan struct{} // closed by close
	done chan struct{} // the publisher ended
	gsub *nats.Subscription
}

// rankStateFailure is a local rank whose protected state is corrupt
// (rank.HostConfig.Failed): the agent's loop kills it (failRank).
type rankStateFailure struct {
	rank int
	gen  uint64
	err  error
}

// listenReplicas opens the host's replication listener on addr (other
// hosts' agents connect to it), or returns nil when it cannot.
func listenReplicas(addr string) (net.Listener, int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return nil, 0, fmt.Errorf("replication listener: %w", err)
	}
	return ln, ln.Addr().(*net.TCPAddr).Port, nil
}

// startProtection starts the state protection of this host's ranks of
// table t. It owns ln from then on.
func (a *agent) startProtection(t *wire.EpochTable, ln net.Listener) (*protection, error) {
	hostOf := make([]int, t.World)
	var mine []int
	for h, places := range t.Placements() {
		for _, pl := range places {
			hostOf[pl.Rank] = h
			if h == a.cfg.Host {
				mine = append(mine, pl.Rank)
			}
		}
	}
	holders := t.HolderLists() // checked by wire: ranks of the world, none its own holder
	var peers func(int) []int
	if l, err := topology.NewLayout(t.World, max(a.spec.TP, 1), max(a.spec.PP, 1)); err == nil {
		peers = l.DPGroup
	}
	p := &protection{a: a, kick: make(chan struct{}, 1), fail: make(chan rankStateFailure, len(mine)), stop: make(chan struct{}), done: make(chan struct{})}
	h, err := rank.NewHost(rank.HostConfig{
		Job: a.cfg.Job, LinkKey: a.cfg.Creds.Link, Host: a.cfg.Host, Hosts: len(t.Hosts), Ranks: mine,
		Holders: holders, Peers: peers, HostOf: func(r int) int { return hostOf[r] },
		Listener: ln, Changed: p.changed, Failed: p.failed, Log: a.log,
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, err
	}
	p.host = h
	p.setTable(t)
	sub, err := a.ctl.Subscribe(a.subj.G, p.onG)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("subscribing to G: %w", err)
	}
	p.gsub = sub
	go p.publish()
	return p, nil
}

// setTable gives the hosts' replication addresses of t to the service.
func (p *protection) setTable(t *wire.EpochTable) {
	addrs := make([]string, len(t.Hosts))
	for i, h := range t.Hosts {
		if h.ReplicaPort > 0 {
			addrs[i] = net.JoinHostPort(h.Addr, strconv.Itoa(h.ReplicaPort))
		}
	}
	p.host.SetAddrs(addrs)
}

func (p *protection) changed() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// publish sends the ranks' progress to the launcher whenever it changed:
// changes that come while a report is being sent go in the next one, so
// the launcher gets at most one message per host per change burst.
func (p *protection) publish() {
	defer close(p.done)
	a := p.a
	for {
		select {
		case <-p.kick:
		case <-p.stop:
			return
		}
		gen, ps := p.host.Progress()
		u := &wire.UpProgress{Host: a.cfg.Host, Gen: gen, Ranks: make([]wire.RankProgress, len(ps))}
		for i, q := range ps {
			u.Ranks[i] = wire.RankProgress{Rank: q.Rank, Committed: q.Committed, Replicated: q.Replicated, Stages: q.Stages, WaitNS: q.WaitNS,
				ReplSteps: q.ReplSteps, ReplNS: q.ReplNS, ReplBytes: q.ReplBytes}
		}
		if err := a.ctl.Publish(a.subj.Progress, wire.Marshal(u)); err != nil {
			a.log.Warn("cannot report protection progress", "err", err)
		}
	}
}

// failed hands a rank whose state is corrupt to the agent's loop (it is
// called on the rank's replicator goroutine, which Host.Close waits for:
// it must not block once the protection stops).
func (p *protection) failed(r int, gen uint64, err error) {
	select {
	case p.fail <- rankStateFailure{r, gen, err}:
	case <-p.stop:
	}
}

// failures are the ranks to fail (none before the protection starts).
func (p *protection) failures() <-chan rankStateFailure {
	if p == nil {
		return nil
	}
	return p.fail
}

// failRank kills the rank of f's generation, if it still runs, and has its
// exit reported as a failure saying why (a rank killed by gorun): the
// launcher then restarts the job in place or stops it.
func (a *agent) failRank(f rankStateFailure) {
	for _, p := range a.ranks {
		if p.place.Rank != f.rank || p.gen != f.gen || p.ended {
			continue
		}
		a.log.Error("killing a rank whose protected state is corrupt", "rank", f.rank, "generation", f.gen, "err", f.err)
		p.failWith(f.err.Error())
	}
}

func (p *protection) onG(m *nats.Msg) {
	g, err := wire.DecodeGlobalStep(m.Data)
	if err != nil {
		p.a.log.Warn("bad G from the launcher", "err", err)
		return
	}
	p.host.SetG(g.Gen, g.G)
}

// close stops the state protection and removes this host's slot files.
func (p *protection) close() {
	if p.gsub != nil {
		_ = p.gsub.Unsubscribe()
	}
	close(p.stop)
	<-p.done
	if err := p.host.Close(); err != nil {
		p.a.log.Warn("closing state protection", "err", err)
	}
	if err := p.host.RemoveFiles(); err != nil {
		p.a.log.Warn("cannot remove the ranks' protected state", "err", err)
	}
}

// sweepSlots removes the slot files that dead jobs left in /dev/shm (their
// agents were killed before they could clean up; see ckpt.Sweep).
func sweepSlots(log *slog.Logger) {
	if swept, err := ckpt.Sweep(ckpt.Options{}); err != nil {
		log.Warn("sweeping leftover protected state", "err", err)
	} else if len(swept) > 0 {
		log.Info("removed the protected state of ended jobs", "jobs", swept)
	}
}
