package comm

// Collectives over the collective links (see dataplane.go): the collective
// framework, Barrier, Broadcast and Allgather here; Allreduce in allreduce.go.
//
// # Allreduce
//
// A ring: reduce-scatter then allgather, 2(n-1) steps. The vector is cut
// into n chunks (sizes differ by at most one element); at step k rank r
// sends chunk r-k to rank r+1 and receives chunk r-k-1 from rank r-1 (mod
// n), adding it into its own copy during the first n-1 steps and taking it
// as the final value during the last n-1. Chunks are cut into segments
// (Comm.segBytes) and pipelined: a sender goroutine writes a segment of
// step k+1 as soon as the receiver (the caller's goroutine) has reduced
// the same segment at step k, so receiving, reducing and sending overlap.
// Data is sent straight from, and in the allgather phase received straight
// into, the caller's slice; only reduce-scatter segments pass through one
// scratch buffer the size of a segment. Between ring neighbours of one
// host, segments go through shared-memory rings instead (shm.go): the
// sender copies a segment into a slot, the receiver reduces straight out
// of it, and the socket carries one-byte doorbells and credits.
//
// The result is deterministic: chunk c is summed in the fixed order
// x[c] + x[c+1] + ... + x[c-1] by the ranks along the ring, whatever the
// timing, and then copied, so every rank gets bitwise the same result on
// every run (for a given world size and vector length).
//
// Numbers travel in the host's representation (unsafe.Slice views, no
// conversion), which assumes every rank has the same byte order; the
// handshake checks it.

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"
)

// bcastTreeMax is the largest Broadcast sent whole down a binomial tree;
// larger ones go down a pipelined chain.
const bcastTreeMax = 256 << 10

// Broadcast algorithms, in the header's sub field.
const (
	bcastTree  = 1
	bcastChain = 2
)

// Element types of Allreduce, in the header's sub field.
const (
	typeFloat32 = 1
	typeFloat64 = 2
	typeInt64   = 3
)

// linkError is an I/O failure on the collective link to rank.
type linkError struct {
	rank int
	err  error
}

func (e *linkError) Error() string { return fmt.Sprintf("rank %d: %v", e.rank, e.err) }
func (e *linkError) Unwrap() error { return e.err }

// collective runs body as collective op: one at a time, with a sequence
// number, an op context whose end (the caller's ctx, Abort, Close, or a
// call of fail) interrupts the blocked I/O on the collective links, and
// the failure policy described on Comm. body must return only when every
// goroutine it started has stopped.
func (c *Comm) collective(ctx context.Context, op string, body func(ctx context.Context, fail func(error), seq uint32) error) error {
	if c.dead() {
		return c.stateErr(op)
	}
	select {
	case c.collSem <- struct{}{}:
	case <-c.life.Done():
		return c.stateErr(op)
	case <-ctx.Done():
		// Every other rank may now wait for this one: fail the world's
		// collectives, as if the call had started.
		if c.tryCollSem() {
			break
		}
		return ctxErr(op, ctx)
	}
	defer func() { <-c.collSem }()
	if c.collErr != nil {
		return fmt.Errorf("comm: %s: an earlier collective failed: %w", op, c.collErr)
	}
	seq := c.seq
	c.seq++
	opCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := c.watch(opCtx, func() { c.setCollDeadlines(aLongTimeAgo) })
	ran := ctx.Err() == nil
	var err error
	if ran {
		err = body(opCtx, func(err error) { cancel(err) }, seq)
	}
	fired := !stop()
	if ran && err == nil {
		if fired {
			// The context ended just as the collective completed: the
			// links are still in step; undo the interruption.
			c.setCollDeadlines(time.Time{})
		}
		return nil
	}
	if c.dead() {
		// Aborted or closed: no news for the peers, they abort too.
		return c.stateErr(op)
	}
	if ctx.Err() != nil {
		err = ctxErr(op, ctx)
	} else if le, ok := err.(*linkError); ok {
		err = peerLost(op, le.rank, le.err)
		c.reportLost(le.rank)
	} else {
		err = fmt.Errorf("comm: %s: %w", op, err)
	}
	c.collErr = err
	c.log.Warn("comm: collective failed; closing the collective links", "op", op, "seq", seq, "err", err)
	for _, p := range c.peers {
		if p != nil {
			p.links[chanColl].Close()
		}
	}
	return err
}

// tryCollSem takes collSem if it is free at once.
func (c *Comm) tryCollSem() bool {
	select {
	case c.collSem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (c *Comm) setCollDeadlines(t time.Time) {
	for _, p := range c.peers {
		if p != nil {
			p.links[chanColl].SetDeadline(t)
		}
	}
}

func (c *Comm) write(r int, b []byte) error {
	if _, err := c.peers[r].links[chanColl].Write(b); err != nil {
		return &linkError{r, err}
	}
	return nil
}

func (c *Comm) writev(r int, bufs ...[]byte) error {
	nb := net.Buffers(bufs)
	if _, err := nb.WriteTo(c.peers[r].links[chanColl]); err != nil {
		return &linkError{r, err}
	}
	return nil
}

func (c *Comm) read(r int, b []byte) error {
	if _, err := io.ReadFull(c.peers[r].links[chanColl], b); err != nil {
		return &linkError{r, err}
	}
	return nil
}

func (c *Comm) sendHeader(r int, h header) error {
	var b [headerSize]byte
	h.put(b[:])
	return c.write(r, b[:])
}

// recvHeader reads a header from r and checks that r is in the same
// collective (kind and sequence number) as this rank.
func (c *Comm) recvHeader(r int, kind byte, seq uint32) (header, error) {
	var b [headerSize]byte
	if err := c.read(r, b[:]); err != nil {
		return header{}, err
	}
	h := parseHeader(b[:])
	if h.kind != kind || h.seq != seq {
		return h, fmt.Errorf("collectives out of step: rank %d is in %s #%d, this rank in %s #%d", r, kindName(h.kind), h.seq, kindName(kind), seq)
	}
	return h, nil
}

// expectHeader reads a header from r that must equal want: the same
// collective with the same arguments.
func (c *Comm) expectHeader(r int, want header) error {
	h, err := c.recvHeader(r, want.kind, want.seq)
	if err != nil {
		return err
	}
	if h != want {
		return fmt.Errorf("%s #%d: rank %d passed (type %d, length %d), this rank (type %d, length %d)", kindName(want.kind), want.seq, r, h.sub, h.n, want.sub, want.n)
	}
	return nil
}

func (c *Comm) mod(i int) int { return ((i % c.size) + c.size) % c.size }

// Barrier returns once every rank has called it (dissemination barrier:
// ⌈log2 n⌉ rounds of one header each).
func (c *Comm) Barrier(ctx context.Context) error {
	const op = "Barrier"
	if c.size == 1 {
		return c.check(ctx, op)
	}
	return c.collective(ctx, op, func(ctx context.Context, _ func(error), seq uint32) error {
		for d, round := 1, uint64(0); d < c.size; d, round = 2*d, round+1 {
			h := header{kind: kindBarrier, seq: seq, n: round}
			if err := c.sendHeader(c.mod(c.rank+d), h); err != nil {
				return err
			}
			if err := c.expectHeader(c.mod(c.rank-d), h); err != nil {
				return err
			}
		}
		return nil
	})
}

// Broadcast sends root's b to every rank: the root passes its data and
// gets it back, the others pass nil and get a copy of root's. Up to 256 KiB
// it goes down a binomial tree; beyond, the tree carries only the length
// and the data flows down a pipelined chain root, root+1, ....
func (c *Comm) Broadcast(ctx context.Context, root int, b []byte) ([]byte, error) {
	const op = "Broadcast"
	if root < 0 || root >= c.size {
		return nil, fmt.Errorf("comm: Broadcast: root %d out of range [0, %d)", root, c.size)
	}
	if c.rank == root && len(b) > maxMessage {
		return nil, fmt.Errorf("comm: Broadcast: %d bytes exceed the %d-byte message limit", len(b), maxMessage)
	}
	if c.size == 1 {
		return b, c.check(ctx, op)
	}
	n := c.size
	v := c.mod(c.rank - root) // rank relative to root
	abs := func(v int) int { return c.mod(v + root) }
	var out []byte
	err := c.collective(ctx, op, func(ctx context.Context, _ func(error), seq uint32) error {
		// mask is v's lowest set bit: v's parent is v-mask, its children
		// v+m for the smaller powers of two m. The root's mask is past n.
		mask := 1
		for mask < n && v&mask == 0 {
			mask <<= 1
		}
		hdr := header{kind: kindBroadcast, seq: seq}
		if v == 0 {
			out = b
			hdr.n, hdr.sub = uint64(len(b)), bcastTree
			if len(b) > bcastTreeMax {
				hdr.sub = bcastChain
			}
		} else {
			parent := abs(v - mask)
			h, err := c.recvHeader(parent, kindBroadcast, seq)
			if err != nil {
				return err
			}
			if h.n > maxMessage || (h.sub != bcastTree && h.sub != bcastChain) {
				return fmt.Errorf("rank %d sent a bad Broadcast header (length %d, algorithm %d)", parent, h.n, h.sub)
			}
			hdr = h
			out = make([]byte, h.n)
			if h.sub == bcastTree {
				if err := c.read(parent, out); err != nil {
					return err
				}
			}
		}
		var hb [headerSize]byte
		hdr.put(hb[:])
		for m := mask >> 1; m > 0; m >>= 1 {
			if v+m < n {
				payload := out
				if hdr.sub == bcastChain {
					payload = nil
				}
				if err := c.writev(abs(v+m), hb[:], payload); err != nil {
					return err
				}
			}
		}
		if hdr.sub != bcastChain {
			return nil
		}
		// The chain: receive each segment from v-1, pass it to v+1.
		last := v == n-1
		if v > 0 {
			if err := c.expectHeader(abs(v-1), hdr); err != nil {
				return err
			}
		}
		if !last {
			if err := c.write(abs(v+1), hb[:]); err != nil {
				return err
			}
		}
		for s := 0; s < len(out); s += c.segBytes {
			seg := out[s:min(s+c.segBytes, len(out))]
			if v > 0 {
				if err := c.read(abs(v-1), seg); err != nil {
					return err
				}
			}
			if !last {
				if err := c.write(abs(v+1), seg); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Allgather returns every rank's bytes, indexed by rank; sizes may differ.
// The slices are this call's own (mine is copied). Ring algorithm: at step
// k rank r forwards block r-k to r+1 and receives block r-k-1 from r-1.
func (c *Comm) Allgather(ctx context.Context, mine []byte) ([][]byte, error) {
	const op = "Allgather"
	if len(mine) > maxMessage {
		return nil, fmt.Errorf("comm: Allgather: %d bytes exceed the %d-byte message limit", len(mine), maxMessage)
	}
	out := make([][]byte, c.size)
	out[c.rank] = append([]byte{}, mine...)
	if c.size == 1 {
		return out, c.check(ctx, op)
	}
	right, left := c.mod(c.rank+1), c.mod(c.rank-1)
	err := c.collective(ctx, op, func(ctx context.Context, fail func(error), seq uint32) error {
		ready := make(chan struct{}, c.size)
		send := func() error {
			for k := range c.size - 1 {
				if k > 0 {
					select {
					case <-ready:
					case <-ctx.Done():
						return nil // the receiver reports why
					}
				}
				blk := out[c.mod(c.rank-k)]
				var hb [headerSize]byte
				header{kind: kindAllgather, seq: seq, n: uint64(len(blk))}.put(hb[:])
				if err := c.writev(right, hb[:], blk); err != nil {
					return err
				}
			}
			return nil
		}
		recv := func() error {
			for k := range c.size - 1 {
				h, err := c.recvHeader(left, kindAllgather, seq)
				if err != nil {
					return err
				}
				if h.n > maxMessage {
					return fmt.Errorf("rank %d sent an Allgather block of %d bytes", left, h.n)
				}
				blk := make([]byte, h.n)
				if err := c.read(left, blk); err != nil {
					return err
				}
				out[c.mod(c.rank-k-1)] = blk
				ready <- struct{}{}
			}
			return nil
		}
		return duplex(ctx, fail, send, recv)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
