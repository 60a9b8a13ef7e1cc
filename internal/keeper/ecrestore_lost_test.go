package keeper

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
)

// wantRecRow is the parity rows of the stripe whose members are ranks,
// at step, of ecRecJob's states.
func wantRecRow(t *testing.T, k, m int, members []int, step int64) [][]byte {
	t.Helper()
	shards := make([][]byte, len(members))
	for x, r := range members {
		for _, reg := range ecRecRegions(r) {
			if reg.Name != "params" {
				shards[x] = append(shards[x], ecRecState(r, step, reg)...)
			}
		}
	}
	return parityOf(t, k, m, shards)
}

// drainLinkFailures forgets the link failures c's hosts reported: links
// to the hosts a set lost, and those dropLinks closed, which fail when
// next used.
func drainLinkFailures(c *cluster) {
	for {
		select {
		case <-c.links:
		default:
			return
		}
	}
}

// dropLinks closes every replication link into host h and waits until
// their handlers have returned: a request a replicator sent before it
// stopped (the spares' restored ranks left them) may still be read and
// stored after h's stores are emptied, and serve a later set of losses a
// copy it should not have (the 8+4 sets failed so under -race).
func dropLinks(t *testing.T, h *Keeper) {
	t.Helper()
	h.store.mu.Lock()
	for c := range h.store.conns {
		c.Close()
	}
	h.store.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.store.mu.Lock()
		n := len(h.store.conns)
		h.store.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %d: %d replication links still served 10 s after they were closed", h.cfg.Host, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// emptyStores drops every copy and parity row host h holds, as a fresh
// spare's: the restored ranks' replicators sent it clear copies and
// shares of G, which it would keep (G does not pass them here) and serve
// to the next set of losses' decodes.
func emptyStores(h *Keeper) {
	h.store.mu.Lock()
	h.store.owners, h.store.bytes = map[int]*ownerReplica{}, 0
	h.store.mu.Unlock()
	h.parity.mu.Lock()
	h.parity.rows = map[ecRowKey]*parityRow{}
	h.parity.mu.Unlock()
}

// parityOf is the codec's parity rows of shards (padded with zeros to
// the longest).
func parityOf(t *testing.T, k, m int, shards [][]byte) [][]byte {
	t.Helper()
	codec, err := ckpt.NewCodec(k, m)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range shards {
		n = max(n, len(d))
	}
	rows := make([][]byte, m)
	shares := make([][]byte, m)
	for j := range rows {
		rows[j], shares[j] = make([]byte, n), make([]byte, n)
	}
	for x, d := range shards {
		p := make([]byte, n)
		copy(p, d)
		if err := codec.Share(p, x, shares); err != nil {
			t.Fatal(err)
		}
		for j := range rows {
			ckpt.Accumulate(rows[j], shares[j])
		}
	}
	return rows
}

// loseDataAndParity plans the loss of group 0's first data host and its
// parity host (a rank of that data host with no clear copy keeps one
// shard of its stripe's three), onto spares 3 and 4 of a 2+1 job, and
// gives the spares their placement (epoch 1, G).
func (j *ecRecJob) loseDataAndParity() ([]int, ecSwap) {
	t := j.t
	t.Helper()
	g0 := j.groups[0]
	lost := []int{g0.Data[0], g0.Parity[0]}
	spares := []int{3, 4}
	keep := slices.Index(j.hostOf, g0.Data[1])
	sw := swapHosts(j.groups, j.hostOf, j.holders, lost, spares, func(int) int { return keep })
	addrs := make([]string, len(j.c.hosts))
	for h, x := range j.c.hosts {
		if !slices.Contains(lost, h) {
			addrs[h] = x.cfg.Listener.Addr().String()
		}
	}
	for _, sp := range spares {
		j.c.hosts[sp].SetAddrs(addrs)
		if err := j.c.hosts[sp].SetPlacement(sw.placement(sp, 1, j.g)); err != nil {
			t.Fatal(err)
		}
	}
	j.c.mu.Lock()
	copy(j.c.hostOf, sw.hostOf)
	j.c.mu.Unlock()
	return lost, sw
}

// TestECRestoreUnrecoverable: a rank restoring by decode whose stripe
// keeps fewer than K shards gets an error wrapping ErrUnrecoverable from
// restoreRemote, and no slot of G is committed; a lost rank of the same
// job whose clear copy survives restores from it (the ordinary get).
func TestECRestoreUnrecoverable(t *testing.T) {
	j := newECRecJob(t, 2, 1, 2, 2)
	lost, sw := j.loseDataAndParity()
	g0 := j.groups[0]
	decoded, direct := 0, 0
	for _, r := range sw.lost {
		src := sw.sources[r]
		j.connect(r)
		h := j.c.hosts[sw.hostOf[r]]
		s := h.svc(r)
		s.reqMu.Lock()
		_, err := s.restoreRemote(context.Background(), j.g)
		s.reqMu.Unlock()
		if !src.Decode {
			direct++
			if err != nil {
				t.Errorf("rank %d from its clear copy: %v", r, err)
			} else if err := j.checkRestored(h, r, j.g); err != nil {
				t.Error(err)
			}
			continue
		}
		decoded++
		if decodable(g0, j.hostOf, j.holders, lost, r) {
			t.Fatalf("rank %d is decodable: the test's losses are wrong", r)
		}
		if !errors.Is(err, ErrUnrecoverable) {
			t.Errorf("rank %d by decode with one shard of its stripe left: %v, want %v", r, err, ErrUnrecoverable)
		}
		s.mu.Lock()
		_, err = s.slots.At(uint64(j.g))
		s.mu.Unlock()
		if err == nil {
			t.Errorf("rank %d: a slot of G committed after a failed decode", r)
		}
	}
	if decoded == 0 || direct == 0 {
		t.Fatalf("%d ranks decode, %d restore from a clear copy: want both", decoded, direct)
	}
}

// TestECRestoreRowGenerationMoves: a parity row's generation moves on
// when a member of a newer generation confirms its share of G (ecHas, as
// every member's replicator does after a restart), so the rows of one
// stripe may name their members with different generations, even while
// a decode reads them; G's bytes are the same, and the decode that needs
// both rows (both data hosts of a 2+2 group lost) still restores every
// lost rank bitwise.
func TestECRestoreRowGenerationMoves(t *testing.T) {
	const k, m = 2, 2
	j := newECRecJob(t, k, m, 2, 2)
	g0 := j.groups[0]
	ph := g0.Parity[0]
	holder := slices.Index(j.hostOf, ph)
	for i := range len(g0.DataGroups[0]) {
		ms, err := j.c.hosts[ph].parity.read(0, i, 0, j.g, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		for x, mb := range ms {
			h := linkHdr{kind: kindECHas, owner: mb.rank, holder: holder, step: j.g, gen: mb.gen + 1}
			e := ecHdr{group: 0, stripe: i, row: 0, member: x, n: mb.length, epoch: mb.epoch + 1}
			if err := j.c.hosts[g0.Parity[1]].links.ecAcked(context.Background(), ph, h, mb.table, e, nil); err != nil {
				t.Fatalf("stripe %d member %d: ecHas of a newer generation: %v", i, x, err)
			}
		}
		after, err := j.c.hosts[ph].parity.read(0, i, 0, j.g, 0, nil)
		if err != nil || after[0].gen != ms[0].gen+1 {
			t.Fatalf("stripe %d: row 0's members after the ecHas: %+v, %v; want generation %d", i, after, err, ms[0].gen+1)
		}
	}
	lost := g0.Data
	spares := []int{4, 5}
	sw := swapHosts(j.groups, j.hostOf, j.holders, lost, spares, func(int) int { return slices.Index(j.hostOf, g0.Parity[1]) })
	addrs := make([]string, len(j.c.hosts))
	for h, x := range j.c.hosts {
		if !slices.Contains(lost, h) {
			addrs[h] = x.cfg.Listener.Addr().String()
		}
	}
	for _, sp := range spares {
		j.c.hosts[sp].SetAddrs(addrs)
		if err := j.c.hosts[sp].SetPlacement(sw.placement(sp, 1, j.g)); err != nil {
			t.Fatal(err)
		}
	}
	j.c.mu.Lock()
	copy(j.c.hostOf, sw.hostOf)
	j.c.mu.Unlock()
	decoded := 0
	for _, r := range sw.lost {
		if sw.sources[r].Decode {
			decoded++
		}
		got := j.connect(r).restore()
		if got.Err != "" || got.Step != j.g {
			t.Fatalf("rank %d (source %+v): %+v", r, sw.sources[r], got)
		}
		if err := j.checkRestored(j.c.hosts[sw.hostOf[r]], r, j.g); err != nil {
			t.Fatal(err)
		}
	}
	if decoded == 0 {
		t.Fatal("no rank decodes")
	}
}
