package control_test

// Membership changes: spares, lost hosts, recovery epochs and their tables.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/wire"
)

// TestRendezvousMembership: a spare is not waited for, joins the tables
// when it registers, and takes a lost host's ranks in a later epoch; a
// fenced host cannot register again nor be given ranks.
func TestRendezvousMembership(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret, srv, l := testControlPlane(t, "job1", 3)
	holders := []wire.HolderRow{{Rank: 0, Holders: []int{1}}, {Rank: 1, Holders: []int{0}}}
	rv, err := control.StartRendezvous(l.Conn, "job1", 0,
		[]control.RendezvousHost{{Name: "a", Ranks: []int{0}}, {Name: "b", Ranks: []int{1}}, {Name: "s", Spare: true}},
		&wire.JobSpec{Prog: "true", HeartbeatInterval: time.Second}, holders, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rv.Close)
	joins := make([]*control.AgentRendezvous, 3)
	for i := range joins {
		c, err := dialHost(ctx, srv, secret, "job1", i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if joins[i], err = control.JoinRendezvous(c.Conn, "job1", i); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(joins[i].Close)
	}
	names := []string{"a", "b", "s"}
	reg := func(h int) error {
		_, err := joins[h].Register(ctx, &wire.Register{Version: wire.Version, Job: "job1", Host: h, Name: names[h], Addr: "127.0.0." + strconv.Itoa(h+1), ReplicaPort: 9000 + h})
		return err
	}
	for h := range 2 {
		if err := reg(h); err != nil {
			t.Fatal(err)
		}
	}
	// The first table is out without the spare.
	tb, err := joins[0].WaitEpoch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s := tb.Hosts[2]; !s.Spare || s.Addr != "" || len(s.Ranks) != 0 {
		t.Errorf("unregistered spare in the first table: %+v", s)
	}
	if tb.G != -1 || !reflect.DeepEqual(tb.Holders, holders) {
		t.Errorf("first table: G %d holders %v", tb.G, tb.Holders)
	}
	// The spare registers late: it gets the table, with its address.
	if err := reg(2); err != nil {
		t.Fatal(err)
	}
	if got := <-rv.Registered(); got != 0 {
		t.Errorf("registered %d first", got)
	}
	<-rv.Registered()
	if got := <-rv.Registered(); got != 2 {
		t.Errorf("the spare's registration was delivered as host %d", got)
	}
	if s := rv.Table().Hosts[2]; !s.Spare || s.Addr != "127.0.0.3" || s.ReplicaPort != 9002 {
		t.Errorf("registered spare: %+v", s)
	}
	// The events file's rendezvous record counts the hosts in the first
	// table, not the spare that came later.
	if n := rv.FirstRegistered(); n != 2 {
		t.Errorf("FirstRegistered %d, want 2 (the spare registered after the first table)", n)
	}
	// Host b is lost: fenced, its ranks move to the spare.
	rv.Fence(1)
	if err := reg(1); !errors.Is(err, control.ErrRegistration) || !strings.Contains(err.Error(), "fenced") {
		t.Errorf("a fenced host registering again: %v", err)
	}
	m := control.Membership{Ranks: [][]int{{0}, nil, {1}}, Gen: 1, G: 41,
		Holders: []wire.HolderRow{{Rank: 0, Holders: []int{1}}, {Rank: 1, Holders: []int{0}}},
		Restore: []wire.RestoreRow{{Rank: 1, Opt: 0, Params: 0}}}
	bad := []struct {
		name  string
		epoch uint64
		m     control.Membership
	}{
		{"same epoch", 0, m},
		{"ranks on the fenced host", 1, control.Membership{Ranks: [][]int{{0}, {1}, nil}, G: 41}},
		{"a host missing", 1, control.Membership{Ranks: [][]int{{0, 1}}, G: 41}},
		{"a rank twice", 1, control.Membership{Ranks: [][]int{{0, 1}, nil, {1}}, G: 41}},
		{"a holder row out of range", 1, control.Membership{Ranks: m.Ranks, G: 41, Holders: []wire.HolderRow{{Rank: 0, Holders: []int{5}}}}},
	}
	for _, tc := range bad {
		if _, err := rv.Publish(tc.epoch, tc.m); !errors.Is(err, control.ErrMembership) {
			t.Errorf("%s: Publish = %v, want ErrMembership", tc.name, err)
		}
	}
	if tb := rv.Table(); tb.Epoch != 0 || len(tb.Hosts[2].Ranks) != 0 || tb.Gen != 0 {
		t.Errorf("a refused membership changed the table: %+v", tb)
	}
	pub, err := rv.Publish(1, m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := joins[2].WaitEpoch(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, pub) {
		t.Errorf("received %+v, published %+v", got, pub)
	}
	if b := got.Hosts[1]; !b.Fenced || b.Addr != "" || len(b.Ranks) != 0 {
		t.Errorf("fenced host in the table: %+v", b)
	}
	if s := got.Hosts[2]; s.Spare || fmt.Sprint(got.Placements()[2]) != "[{1 2 0 1 1}]" {
		t.Errorf("the spare after the splice: %+v, placements %v", s, got.Placements()[2])
	}
	if got.Gen != 1 || got.G != 41 || !reflect.DeepEqual(got.Restore, m.Restore) {
		t.Errorf("epoch 1: gen %d G %d restore %v", got.Gen, got.G, got.Restore)
	}
	// A restart in place keeps the membership.
	if adv := rv.Advance(2); adv == nil || adv.G != 41 || len(adv.Hosts[2].Ranks) != 1 || !adv.Hosts[1].Fenced {
		t.Errorf("Advance after Publish: %+v", adv)
	}
}

// ringHolders returns the holder rows of world ranks on hosts of
// ranksPerHost: rank r is held by the rank of the same local rank on the
// next host, r+ranksPerHost (mod world).
func ringHolders(world, ranksPerHost int) []wire.HolderRow {
	rows := make([]wire.HolderRow, world)
	for r := range rows {
		rows[r] = wire.HolderRow{Rank: r, Holders: []int{(r + ranksPerHost) % world}}
	}
	return rows
}

// swapMembership is the membership of the recovery epoch after host lost
// of hosts (simHosts, spare the index of the spare taking its ranks) is
// lost: its ranks move to spare, the holders stay the ring, and every moved
// rank restores its optimizer state from its holder and its parameters
// from the rank of the same local rank on the host before it.
func swapMembership(hosts []control.RendezvousHost, lost, spare, ranksPerHost int, gen uint64, g int64) control.Membership {
	world := 0
	m := control.Membership{Ranks: make([][]int, len(hosts)), Gen: gen, G: g}
	for i, h := range hosts {
		m.Ranks[i] = h.Ranks
		world += len(h.Ranks)
	}
	m.Ranks[spare], m.Ranks[lost] = hosts[lost].Ranks, nil
	m.Holders = ringHolders(world, ranksPerHost)
	for _, r := range hosts[lost].Ranks {
		m.Restore = append(m.Restore, wire.RestoreRow{Rank: r, Opt: (r + ranksPerHost) % world, Params: (r - ranksPerHost + world) % world})
	}
	return m
}

// TestRendezvousRecoveryEpoch: after a host is lost, every live agent gets
// exactly the recovery epoch's table, with the lost host's ranks on the
// spare and the lost host fenced and without an address; the new epoch's
// address fence completes without the lost host and with the spare; the
// lost host cannot register again.
func TestRendezvousRecoveryEpoch(t *testing.T) {
	const hosts, perHost = 8, 8
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rh := simHosts(hosts, perHost, 1)
	const lost, spare = 0, hosts // host 0 runs rank 0: the master moves too
	sj := newSimJob(t, "recjob", rh, ringHolders(hosts*perHost, perHost))
	if err := sj.connect(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sj.rendezvous(ctx, true); err != nil {
		t.Fatal(err)
	}
	if s := sj.rv.Table().Hosts[spare]; !s.Spare || s.Addr != simAddr(spare) {
		t.Fatalf("the registered spare in the table: %+v", s)
	}

	sj.lose(lost)
	m := swapMembership(rh, lost, spare, perHost, 1, 41)
	pub, err := sj.recover(lost, 1, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := sj.takeEpoch(ctx, 1); err != nil {
		t.Fatal(err)
	}
	want := pub.Encode()
	for _, a := range sj.agents {
		if a.lost {
			continue
		}
		if got := a.table.Encode(); !bytes.Equal(got, want) {
			t.Errorf("host %d got table %+v, published %+v", a.host, a.table, pub)
		}
		for r := range hosts * perHost {
			host := r / perHost
			if host == lost {
				host = spare
			}
			if got, want := a.fence[fenceAddrKey(r)], simAddr(host)+":"+strconv.Itoa(40000+r%perHost); got != want {
				t.Errorf("host %d: the fence gives rank %d's address as %q, want %q", a.host, r, got, want)
			}
		}
		if len(a.fence) != 2*hosts*perHost {
			t.Errorf("host %d: the fence has %d keys, want %d", a.host, len(a.fence), 2*hosts*perHost)
		}
	}
	tb := sj.agents[spare].table
	if h := tb.Hosts[lost]; !h.Fenced || h.Addr != "" || h.ReplicaPort != 0 || len(h.Ranks) != 0 {
		t.Errorf("the lost host in the recovery table: %+v", h)
	}
	ranks, _ := tb.Hosts[spare].Ranks.Expand(tb.World)
	if s := tb.Hosts[spare]; s.Spare || s.Addr != simAddr(spare) || !slices.Equal(ranks, rh[lost].Ranks) {
		t.Errorf("the spare in the recovery table: %+v, ranks %v", s, ranks)
	}
	if tb.MasterAddr != simAddr(spare) {
		t.Errorf("master at %s, want the spare's %s", tb.MasterAddr, simAddr(spare))
	}
	if tb.Gen != 1 || tb.G != 41 || !reflect.DeepEqual(tb.Holders, m.Holders) || !reflect.DeepEqual(tb.Restore, m.Restore) {
		t.Errorf("recovery table: gen %d G %d holders %v restore %v", tb.Gen, tb.G, tb.Holders, tb.Restore)
	}
	if errs := sj.launcherErrors(); len(errs) > 0 {
		t.Errorf("the launcher refused agents' messages: %v", errs)
	}

	// The lost host comes back: its registration is refused, and the
	// launcher still has the recovery table.
	c, err := dialHost(ctx, sj.srv, sj.secret, sj.job, lost)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	j, err := control.JoinRendezvous(c.Conn, sj.job, lost)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	back := &simAgent{job: sj.job, host: lost, name: rh[lost].Name, rv: j}
	if _, err := j.Register(ctx, back.registration()); !errors.Is(err, control.ErrRegistration) || !strings.Contains(err.Error(), "fenced") {
		t.Errorf("the lost host registering again: %v, want ErrRegistration (fenced)", err)
	}
	if got := sj.rv.Table().Encode(); !bytes.Equal(got, want) {
		t.Errorf("after the lost host's registration the table is %+v", sj.rv.Table())
	}
}

// TestRendezvousMasterPortPerEpoch: every new epoch's table takes the next
// port of rank 0's host's pool (wire.Register.MasterPorts), however far
// the epoch numbers jump, so a restarted job never reuses the port of the
// epoch before; a republish (a spare joining) and a refused Publish keep
// the port; a host without a pool gives its one MasterPort; rank 0 moved
// to another host takes that host's.
func TestRendezvousMasterPortPerEpoch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret, srv, l := testControlPlane(t, "job1", 3)
	hosts := []control.RendezvousHost{{Name: "a", Ranks: []int{0}}, {Name: "b", Ranks: []int{1}}, {Name: "s", Spare: true}}
	rv, err := control.StartRendezvous(l.Conn, "job1", 0, hosts, &wire.JobSpec{Prog: "true", HeartbeatInterval: time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rv.Close)
	regs := []*wire.Register{
		{MasterPort: 5000, MasterPorts: []int{5000, 5001, 5002}},
		{MasterPort: 6000, MasterPorts: []int{6000, 6001}},
		{MasterPort: 7000}, // an agent without a pool
	}
	joins := make([]*control.AgentRendezvous, len(hosts))
	for h := range hosts {
		c, err := dialHost(ctx, srv, secret, "job1", h)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		if joins[h], err = control.JoinRendezvous(c.Conn, "job1", h); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(joins[h].Close)
		r := regs[h]
		r.Version, r.Job, r.Host, r.Name, r.Addr = wire.Version, "job1", h, hosts[h].Name, "127.0.0."+strconv.Itoa(h+1)
	}
	for h := range 2 {
		if _, err := joins[h].Register(ctx, regs[h]); err != nil {
			t.Fatal(err)
		}
	}
	if tb, err := joins[1].WaitEpoch(ctx, 0); err != nil || tb.MasterPort != 5000 || tb.MasterAddr != "127.0.0.1" {
		t.Fatalf("first table: %+v, %v; want master 127.0.0.1:5000", tb, err)
	}
	if _, err := joins[2].Register(ctx, regs[2]); err != nil {
		t.Fatal(err)
	}
	for range hosts {
		<-rv.Registered()
	}
	if tb := rv.Table(); tb.Hosts[2].Addr != "127.0.0.3" || tb.MasterPort != 5000 {
		t.Errorf("after the spare joined (a republish of epoch 0): spare %+v, master port %d, want 5000", tb.Hosts[2], tb.MasterPort)
	}
	same := control.Membership{Ranks: [][]int{{0}, {1}, nil}, G: 7}
	moved := control.Membership{Ranks: [][]int{nil, {1}, {0}}, G: 9}
	steps := []struct {
		name     string
		epoch    uint64
		publish  *control.Membership // nil: Advance
		refused  bool
		addr     string
		wantPort int
	}{
		{"restart in place", 1, nil, false, "127.0.0.1", 5001},
		{"hot swap, two epochs later", 3, &same, false, "127.0.0.1", 5002},
		{"a refused epoch", 3, &same, true, "127.0.0.1", 5002},
		{"the pool wraps", 4, nil, false, "127.0.0.1", 5000},
		{"rank 0 on a host without a pool", 5, &moved, false, "127.0.0.3", 7000},
		{"and restarted there", 6, nil, false, "127.0.0.3", 7000},
	}
	for _, st := range steps {
		var tb *wire.EpochTable
		if st.publish == nil {
			tb = rv.Advance(st.epoch)
		} else {
			tb, err = rv.Publish(st.epoch, *st.publish)
			if st.refused != (err != nil) {
				t.Fatalf("%s: Publish(%d) = %v", st.name, st.epoch, err)
			}
		}
		if !st.refused {
			if tb == nil {
				t.Fatalf("%s: epoch %d not published", st.name, st.epoch)
			}
			got, err := joins[1].WaitEpoch(ctx, st.epoch)
			if err != nil || got.MasterPort != tb.MasterPort {
				t.Fatalf("%s: host b got %+v, %v; published master port %d", st.name, got, err, tb.MasterPort)
			}
		}
		if tb := rv.Table(); tb.MasterAddr != st.addr || tb.MasterPort != st.wantPort {
			t.Errorf("%s: epoch %d master %s:%d, want %s:%d", st.name, tb.Epoch, tb.MasterAddr, tb.MasterPort, st.addr, st.wantPort)
		}
	}
}
