package rank

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	"github.com/gorun/gorun/comm"
)

// TestStalePutRefused: a put of step g+1 sent before a restart (restart
// generation 0) and still queued on an old link when the holder already
// has the new generation's g+1 must be refused: it would replace the new
// step, and since its CRCs match its own bytes, a Tier-2 restore would
// take it.
func TestStalePutRefused(t *testing.T) {
	holders := [][]int{{1}, {0}}
	peers := func(int) []int { return []int{0, 1} }
	c := newCluster(t, [][]int{{0}, {1}}, holders, peers)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2) // G = 1 in generation 0

	// Rank 0 had committed step 2 in generation 0 with other bytes than
	// it will after the restart; that put is the stale one, sent below.
	stale := map[string][]byte{}
	for name, b := range propState(0, 2) {
		stale[name] = bytes.Repeat([]byte{0xEE}, len(b))
	}

	// The job restarts in place from G = 1 (generation 1); every rank
	// protects step 2 again, and it is replicated: G = 2.
	for _, h := range c.hosts {
		if err := h.Restart(1, 1); err != nil {
			t.Fatal(err)
		}
	}
	for r := range rs {
		rs[r] = newSessRank(t, c.hosts[r], r)
		if res := rs[r].restore(context.Background()); res.Err != "" || res.Step != 1 {
			t.Fatalf("rank %d restored %+v", r, res)
		}
	}
	protectFrom(c, rs, 2, 3)

	// The pre-restart put of rank 0's step 2 arrives now.
	var tab []tableEntry
	var data [][]byte
	for _, reg := range propRegions {
		if reg.Name == "params" {
			continue
		}
		tab = append(tab, tableEntry{name: reg.Name, size: reg.Size, sum: crc32.Checksum(stale[reg.Name], castagnoli)})
		data = append(data, stale[reg.Name])
	}
	err := rawPut(t, c, 0, linkHdr{kind: kindPut, owner: 0, holder: 1, step: 2, gen: 0}, tab, data)
	if err == nil {
		t.Error("the holder acknowledged a put of generation 0 after one of generation 1")
	} else if !errors.Is(err, errPutStale) {
		t.Errorf("stale put refused with %v, want errPutStale", err)
	}

	// Host 0 fails; rank 0 restores step 2 from its holder.
	replaceHost(t, c, 0, []int{0}, peers, 2, 2)
	r0 := newSessRank(t, c.hosts[0], 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res := r0.restore(ctx)
	if res.Err != "" || res.Step != 2 || res.Tier != 2 {
		t.Fatalf("rank 0's Tier-2 restore of step 2: %+v", res)
	}
	want := propState(0, 2)
	for i, reg := range propRegions {
		got := r0.views[res.Slot][i]
		switch {
		case bytes.Equal(got, want[reg.Name]):
		case bytes.Equal(got, stale[reg.Name]):
			t.Errorf("region %s restored from the pre-restart put of step 2 (generation 0), not from generation 1's", reg.Name)
		default:
			t.Errorf("region %s restored with other bytes", reg.Name)
		}
	}
}

// protectFrom has every rank of rs protect steps from to to-1, waits until
// the holders have step to-1 of every rank, and publishes G = to-1.
func protectFrom(c *cluster, rs []*sessRank, from, to int64) {
	c.t.Helper()
	for s := from; s < to; s++ {
		for _, sr := range rs {
			sr.protect(s)
		}
	}
	c.waitFor("replication", func() bool {
		for r := range rs {
			if c.progress(r).Replicated != to-1 {
				return false
			}
		}
		return true
	})
	c.publishG()
}

// rawPut sends one put to the host of h.holder over a link of its own,
// as the host of h.owner, and returns the holder's refusal, if any.
func rawPut(t *testing.T, c *cluster, from int, h linkHdr, tab []tableEntry, data [][]byte) error {
	t.Helper()
	to := c.hostOf[h.holder]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := comm.DialLink(ctx, c.hosts[to].cfg.Listener.Addr().String(), c.hosts[from].linkAuth(), from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if err := writeFrame(conn, h, tab, data); err != nil {
		t.Fatal(err)
	}
	a, err := readAnswer(conn)
	if _, refused := errors.AsType[*remoteError](err); err != nil && !refused {
		t.Fatalf("put: %v", err)
	}
	if err == nil && a.kind != kindAck {
		t.Fatalf("put answered with kind %#x", a.kind)
	}
	return err
}

// TestStalePutRefusedBeforeHolderRestart: the same, when the holder's own
// host has not begun the new generation yet (its agent restarts its ranks
// later than the owner's): the generation of the owner's newer put is
// what makes the holder refuse the older one.
func TestStalePutRefusedBeforeHolderRestart(t *testing.T) {
	holders := [][]int{{1}, {0}}
	c := newCluster(t, [][]int{{0}, {1}}, holders, func(int) []int { return []int{0, 1} })
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2)

	put := func(gen uint64, fill byte) error {
		var tab []tableEntry
		var data [][]byte
		for _, reg := range propRegions {
			if reg.Name != "params" {
				b := bytes.Repeat([]byte{fill}, int(reg.Size))
				tab = append(tab, tableEntry{name: reg.Name, size: reg.Size, sum: crc32.Checksum(b, castagnoli)})
				data = append(data, b)
			}
		}
		return rawPut(t, c, 0, linkHdr{kind: kindPut, owner: 0, holder: 1, step: 2, gen: gen}, tab, data)
	}
	if err := put(1, 0x11); err != nil {
		t.Fatalf("put of generation 1: %v", err)
	}
	if err := put(0, 0xEE); !errors.Is(err, errPutStale) {
		t.Errorf("put of generation 0 after one of generation 1: %v, want errPutStale", err)
	}
	o := c.hosts[1].store.owner(0)
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.bufs {
		if b.step == 2 && b.data[0][0] != 0x11 {
			t.Errorf("the holder keeps rank 0's step 2 with bytes %#x: the generation 0 put replaced generation 1's", b.data[0][0])
		}
	}
}
