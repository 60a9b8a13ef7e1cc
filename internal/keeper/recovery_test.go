package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/comm"
	"github.com/gorun/gorun/protect"
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

// protectFrom has every rank of rs protect steps from to to-1, each step
// replicated and published as G before the next.
func protectFrom(c *cluster, rs []*sessRank, from, to int64) {
	c.t.Helper()
	for s := from; s < to; s++ {
		for _, sr := range rs {
			sr.protect(s)
		}
		c.waitFor(fmt.Sprintf("replication of step %d", s), func() bool {
			for r := range rs {
				if c.progress(r).Replicated != s {
					return false
				}
			}
			return true
		})
		c.publishG()
	}
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

// TestCorruptSlotFailsRank: a holder that refuses a put because its data
// do not match the owner's CRC32Cs has the owner verify its slot against
// the CRC32Cs of its commit. When the slot's bytes changed after the
// commit (here through the rank's read-write view, before the step was
// replicated), the rank is failed: Config.Failed is called once with
// a *CorruptError, the replicator stops retrying, and the rank's next
// Stage is refused at once instead of waiting forever at the overwrite
// rule; after a restart the rank protects steps again. When the slot
// still matches (the bytes were damaged on the way), the put is retried
// and nothing fails.
func TestCorruptSlotFailsRank(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt bool // the slot changes after commit; else the link damages a byte of the put
	}{
		{"slot changed after commit", true},
		{"damaged in transit", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holders := [][]int{{1}, {0}}
			c := newCluster(t, [][]int{{0}, {1}}, holders, func(int) []int { return []int{0, 1} })
			addrs := []string{c.hosts[0].cfg.Listener.Addr().String(), c.hosts[1].cfg.Listener.Addr().String()}
			var proxy *flipProxy
			if !tc.corrupt {
				// Rank 0 replicates through a proxy, from its first link.
				proxy = newFlipProxy(t, addrs[1], propState(0, 2)["optimizer"][1000:1016])
				c.hosts[0].SetAddrs([]string{addrs[0], proxy.addr})
			}
			rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
			protectReplicated(c, rs, 2) // G = 1

			if tc.corrupt {
				// Rank 0 commits step 2, which cannot leave the host yet
				// (no address for host 1), then writes into the
				// committed slot.
				c.hosts[0].SetAddrs([]string{addrs[0], ""})
				slot := rs[0].protect(2)
				rs[0].views[slot][0][100] ^= 0xFF // optimizer
				c.hosts[0].SetAddrs(addrs)
			} else {
				proxy.armed.Store(true)
				rs[0].protect(2)
			}
			rs[1].protect(2)

			if !tc.corrupt {
				c.waitFor("replication of step 2 after a damaged put", func() bool {
					return c.progress(0).Replicated == 2 && c.progress(1).Replicated == 2
				})
				select {
				case f := <-c.failed:
					t.Fatalf("rank %d failed for a put damaged in transit: %v", f.rank, f.err)
				default:
				}
				return
			}

			// The rank's next stage is refused, not left waiting for a G
			// that cannot come.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, ans, err := rs[0].sess.Handle(ctx, protect.TypeStage, []byte(`{"step":3}`))
			if err != nil {
				t.Fatal(err)
			}
			const why = "state of rank 0 corrupted in memory: step 2, CRC mismatch in region optimizer"
			if msg := ans.(*protect.Staged).Err; !strings.Contains(msg, why) {
				t.Errorf("rank 0's Stage(3) after its committed step 2 changed: %q, want %q", msg, why)
			}
			select {
			case f := <-c.failed:
				ce, ok := errors.AsType[*CorruptError](f.err)
				if f.rank != 0 || f.gen != 0 || !ok || ce.Step != 2 || ce.Region != "optimizer" || !errors.Is(f.err, ckpt.ErrCorrupt) {
					t.Errorf("Failed(%d, %d, %v), want rank 0, generation 0, a CorruptError of step 2, region optimizer", f.rank, f.gen, f.err)
				}
			case <-ctx.Done():
				t.Fatal("rank 0 was not failed")
			}
			svc := c.hosts[0].svc(0)
			c.waitFor("rank 0's replicator to stop", func() bool {
				svc.rep.mu.Lock()
				defer svc.rep.mu.Unlock()
				return !svc.rep.running
			})
			if p := c.progress(0); p.Replicated != 1 {
				t.Errorf("rank 0's corrupt step counts as replicated: %+v", p)
			}

			// The job restarts in place from G = 1: the corrupt step is
			// discarded, and rank 0 protects and replicates again.
			for _, h := range c.hosts {
				if err := h.Restart(1, 1); err != nil {
					t.Fatal(err)
				}
			}
			for r := range rs {
				rs[r] = newSessRank(t, c.hosts[r], r)
				if res := rs[r].restore(context.Background()); res.Err != "" || res.Step != 1 || res.Tier != 1 {
					t.Fatalf("rank %d restored %+v", r, res)
				}
			}
			protectFrom(c, rs, 2, 4)
			select {
			case f := <-c.failed:
				t.Errorf("rank %d failed again after the restart: %v", f.rank, f.err)
			default:
			}
		})
	}
}

// flipProxy forwards replication links to a host and, once armed, flips
// one byte of the data sent through it: the byte after the first
// occurrence of marker sent after arming.
type flipProxy struct {
	addr    string
	armed   atomic.Bool
	flipped atomic.Bool
}

func newFlipProxy(t *testing.T, to string, marker []byte) *flipProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &flipProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
		if !p.flipped.Load() {
			t.Error("the proxy damaged no put")
		}
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { io.Copy(in, out); in.Close() })
			wg.Go(func() {
				defer out.Close()
				var seen []byte
				from := -1   // the offset in this stream where the proxy was armed
				target := -1 // the offset of the byte to flip in this stream
				buf := make([]byte, 64<<10)
				for {
					n, err := in.Read(buf)
					if n > 0 {
						start := len(seen)
						seen = append(seen, buf[:n]...)
						if from < 0 && p.armed.Load() {
							from = start
						}
						if from >= 0 && target < 0 && !p.flipped.Load() {
							if i := bytes.Index(seen[from:], marker); i >= 0 {
								target = from + i + len(marker)
							}
						}
						if target >= start && target < len(seen) && p.flipped.CompareAndSwap(false, true) {
							buf[target-start] ^= 0xFF
						}
						if _, err := out.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return p
}
