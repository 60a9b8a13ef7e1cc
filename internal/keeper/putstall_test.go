package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/crc32c"
)

// pipeLinks serves in-process replication links to hosts; close closes
// them all, then waits for their serving goroutines (all closed first:
// one may wait on another's request).
type pipeLinks struct {
	conns []net.Conn
	wg    sync.WaitGroup
}

// serve serves a link to h as host from's, and returns the dialer's end.
func (p *pipeLinks) serve(h *Keeper, from int) net.Conn {
	cli, srv := net.Pipe()
	p.conns = append(p.conns, cli)
	p.wg.Go(func() { h.store.serve(context.Background(), from, srv) })
	return cli
}

func (p *pipeLinks) close() {
	for _, c := range p.conns {
		c.Close()
	}
	p.wg.Wait()
}

// within runs f and fails the test if it has not returned in 10 s (a
// request blocked behind a stalled one).
func within(t *testing.T, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still blocked after 10 s, behind a stalled request", what)
	}
}

// stallGet sends a get of rank 0's step to h (rank 1's host) on a new
// link of links and reads the answer's first byte: the holder is then
// writing the rest, which nobody reads (net.Pipe does not buffer), the
// buffer pinned. It returns the link, the get, and the byte read.
func stallGet(t *testing.T, links *pipeLinks, h *Keeper, step int64) (net.Conn, linkHdr, []byte) {
	t.Helper()
	l := links.serve(h, 0)
	get := linkHdr{kind: kindGet, owner: 0, holder: 1, step: step, gen: h.Gen()}
	if err := writeFrame(l, get, nil, nil); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(l, first); err != nil {
		t.Fatal(err)
	}
	return l, get, first
}

// TestPutStalledMidFrame: a put whose sender stalls partway through its
// data (its host frozen, or partitioned) holds nothing else up on the
// holder: another put of the owner on another link is received and
// acknowledged, a has answered, a restart and the debug flip done; the
// stalled put is ended (its link closed) when its buffer is taken over,
// and the newer copy stays.
func TestPutStalledMidFrame(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, nil)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2) // host 1 holds rank 0's steps 0 and 1
	h1 := c.hosts[1]

	// Step 2 of rank 0, as its host would send it.
	var tab []tableEntry
	var data [][]byte
	for i, reg := range propRegions {
		d := bytes.Repeat([]byte{byte(0x40 + i)}, int(reg.Size))
		tab = append(tab, tableEntry{name: reg.Name, size: reg.Size, sum: crc32c.Checksum(d)})
		data = append(data, d)
	}
	hdr := linkHdr{kind: kindPut, owner: 0, holder: 1, step: 2, gen: h1.Gen()}
	var frame bytes.Buffer
	if err := writeFrame(&frame, hdr, tab, data); err != nil {
		t.Fatal(err)
	}
	half := frame.Len() - int(tableBytes(tab)) + len(data[0])/2

	links := &pipeLinks{}
	t.Cleanup(links.close)
	stalled := links.serve(h1, 0)
	// The header, the table and half the first region: once the write
	// returns (net.Pipe), the holder is reading the rest of the data.
	if _, err := stalled.Write(frame.Bytes()[:half]); err != nil {
		t.Fatal(err)
	}

	other := links.serve(h1, 0)
	within(t, "another put of rank 0's step 2", func() error {
		if err := writeFrame(other, hdr, tab, data); err != nil {
			return err
		}
		return readAck(other, hdr)
	})
	has := hdr
	has.kind = kindHas
	within(t, "a has of rank 0's step 2", func() error {
		if err := writeFrame(other, has, tab, nil); err != nil {
			return err
		}
		return readAck(other, has)
	})
	within(t, "the debug flip", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, busy, err := h1.FlipReplicas(ctx)
		if err == nil && len(busy) > 0 {
			err = errors.New("busy owners: the flip waited on a lock")
		}
		return err
	})
	within(t, "a restart of host 1", func() error { return h1.Restart(1, 2) })

	// The stalled put was ended when its buffer was taken over (its link
	// closed: its bytes were dead), and the copy received meanwhile
	// (flipped since) is the one kept.
	within(t, "the end of the stalled put", func() error {
		_, err := io.ReadAll(stalled)
		return err
	})
	got := replicaRegions(h1, 0, 2)
	if len(got) != len(tab) {
		t.Fatalf("host 1 holds %d regions of rank 0's step 2, want %d", len(got), len(tab))
	}
	for i, e := range tab {
		flipped := bytes.Clone(data[i])
		if len(flipped) > 0 {
			flipped[min(FlipByte, len(flipped)-1)] ^= 0x5a
		}
		if !bytes.Equal(got[e.name], data[i]) && !bytes.Equal(got[e.name], flipped) {
			t.Errorf("region %s of rank 0's step 2 on host 1 is neither the put's nor the put's flipped", e.name)
		}
	}
}

// TestGetStalledMidFrame: a get whose receiver stalls (its host frozen)
// holds nothing else up on the holder either: a put of the same step on
// another link, which takes the buffer being sent over, is acknowledged,
// the debug flip leaves the buffer being sent alone (the owner busy), and
// the stalled get, read at last, carries the step as it was when it
// began, not the put's bytes.
func TestGetStalledMidFrame(t *testing.T) {
	c := newCluster(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, nil)
	rs := []*sessRank{newSessRank(t, c.hosts[0], 0), newSessRank(t, c.hosts[1], 1)}
	protectReplicated(c, rs, 2) // host 1 holds rank 0's steps 0 and 1
	h1 := c.hosts[1]
	held := replicaRegions(h1, 0, 1)

	links := &pipeLinks{}
	t.Cleanup(links.close)
	stalled, get, first := stallGet(t, links, h1, 1)

	// Step 1 again, other bytes: the put takes the buffer being sent.
	var tab []tableEntry
	var data [][]byte
	for i, reg := range propRegions {
		if held[reg.Name] == nil {
			continue
		}
		d := bytes.Repeat([]byte{byte(0x70 + i)}, int(reg.Size))
		tab = append(tab, tableEntry{name: reg.Name, size: reg.Size, sum: crc32c.Checksum(d)})
		data = append(data, d)
	}
	put := linkHdr{kind: kindPut, owner: 0, holder: 1, step: 1, gen: h1.Gen()}
	other := links.serve(h1, 0)
	within(t, "a put of rank 0's step 1 while a get of it is stalled", func() error {
		if err := writeFrame(other, put, tab, data); err != nil {
			return err
		}
		return readAck(other, put)
	})

	// A second stalled get, of step 0, pins that buffer: the flip
	// leaves it alone and names rank 0 busy.
	stallGet(t, links, h1, 0)
	within(t, "the debug flip", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		flipped, busy, err := h1.FlipReplicas(ctx)
		if err != nil {
			return err
		}
		if !slices.Equal(busy, []int{0}) || slices.ContainsFunc(flipped, func(f FlippedReplica) bool { return f.Owner == 0 && f.Step == 0 }) {
			return fmt.Errorf("flipped %+v, busy %v: want rank 0 busy, its step 0 (being sent) not flipped", flipped, busy)
		}
		return nil
	})

	// The stalled get of step 1, read at last: the bytes of step 1 when
	// it began.
	rest := io.MultiReader(bytes.NewReader(first), stalled)
	dst := map[string][]byte{}
	for name, b := range held {
		dst[name] = make([]byte, len(b))
	}
	got := maps.Clone(dst) // readFetched deletes what it filled from dst
	if err := readFetched(rest, get, dst); err != nil {
		t.Fatalf("the stalled get of rank 0's step 1: %v", err)
	}
	for name, b := range got {
		if !bytes.Equal(b, held[name]) {
			t.Errorf("the stalled get's region %s is not the step it began to send", name)
		}
	}
}
