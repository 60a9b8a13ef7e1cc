package comm

// Collectives over the collective links (see dataplane.go).
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
	"sync"
	"time"
	"unsafe"
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

// AllreduceFloat32 replaces x, on every rank, by the element-wise sum of
// every rank's x (same length everywhere). See the package notes on
// Allreduce for its determinism.
func (c *Comm) AllreduceFloat32(ctx context.Context, x []float32) error {
	return c.allreduce(ctx, "AllreduceFloat32", typeFloat32, bytesOf(x), 4, reduceFloat32)
}

// AllreduceFloat64 is AllreduceFloat32 for float64.
func (c *Comm) AllreduceFloat64(ctx context.Context, x []float64) error {
	return c.allreduce(ctx, "AllreduceFloat64", typeFloat64, bytesOf(x), 8, reduceFloat64)
}

// AllreduceInt64 is AllreduceFloat32 for int64. Integer sums are exact
// (modulo 2⁶⁴), so the result does not depend on the order of the sum nor
// on the world size: fixed-point gradients reduced with it are the same
// for any number of ranks.
func (c *Comm) AllreduceInt64(ctx context.Context, x []int64) error {
	return c.allreduce(ctx, "AllreduceInt64", typeInt64, bytesOf(x), 8, reduceInt64)
}

func (c *Comm) allreduce(ctx context.Context, op string, typ byte, xb []byte, es int, reduce func(dst, src []byte)) error {
	if c.size == 1 {
		return c.check(ctx, op)
	}
	return c.collective(ctx, op, func(ctx context.Context, fail func(error), seq uint32) error {
		return c.ring(ctx, fail, header{kind: kindAllreduce, sub: typ, seq: seq, n: uint64(len(xb) / es)}, xb, es, reduce)
	})
}

// ring runs the pipelined ring allreduce of xb, whose elements are es
// bytes, with hdr leading the data on the link to the right.
func (c *Comm) ring(ctx context.Context, fail func(error), hdr header, xb []byte, es int, reduce func(dst, src []byte)) error {
	n, r := c.size, c.rank
	right, left := c.mod(r+1), c.mod(r-1)
	N := len(xb) / es
	seg := max(1, c.segBytes/es)
	steps := 2 * (n - 1)
	// chunk returns chunk i's elements [lo, hi).
	chunk := func(i int) (lo, hi int) {
		i = c.mod(i)
		return i * N / n, (i + 1) * N / n
	}
	nseg := func(i int) int {
		lo, hi := chunk(i)
		return (hi - lo + seg - 1) / seg
	}
	// ready: receiver → sender, one per segment received at steps
	// 0..steps-2, which the sender forwards at the next step.
	// sent: sender → receiver, one per segment sent during the
	// reduce-scatter; the receiver overwrites that segment with the final
	// sum only after (the data flow already orders it; this tells the
	// race detector, and costs nothing).
	nready, nsent := 0, 0
	for k := range steps - 1 {
		nready += nseg(r - k - 1)
	}
	for k := range n - 1 {
		nsent += nseg(r - k)
	}
	nsend := nsent // every segment sent
	for k := n - 1; k < steps; k++ {
		nsend += nseg(r - k)
	}
	ready := make(chan struct{}, nready)
	sent := make(chan struct{}, nsent)

	// Rings of shared memory to the right and from the left (shm.go), or
	// nil where the link is a plain socket.
	shmR, shmL := c.ringShm(right, seg*es), c.ringShm(left, seg*es)
	var pipe shmPipe
	if shmL != nil {
		pipe.doorbells = make(chan struct{}, shmSlots)
	}
	if shmR != nil {
		pipe.credits = make(chan struct{}, shmSlots)
	}
	doorbell, credit := []byte{shmDoorbell}, []byte{shmCredit}
	nrecv := nready + nseg(r-steps) // every segment received

	// The header goes first, before the receiver can answer a doorbell
	// with a credit on the same link. It is small: the write does not wait
	// for the peer.
	if err := c.sendHeader(right, hdr); err != nil {
		return err
	}
	send := func() error {
		posted := 0 // segments put in shmR
		for k := range steps {
			lo, hi := chunk(r - k)
			for s := lo; s < hi; s += seg {
				e := min(s+seg, hi)
				if k > 0 {
					select {
					case <-ready:
					case <-ctx.Done():
						return nil // the receiver reports why
					}
				}
				data := xb[s*es : e*es]
				if shmR == nil {
					if err := c.write(right, data); err != nil {
						return err
					}
				} else {
					if posted >= shmSlots {
						select {
						case <-pipe.credits:
						case <-ctx.Done():
							return nil
						}
					}
					copy(shmR.out.slot(posted, len(data)), data)
					posted++
					if err := c.write(right, doorbell); err != nil {
						return err
					}
				}
				if k < n-1 {
					sent <- struct{}{}
				}
			}
		}
		return nil
	}
	recv := func() (err error) {
		if err := c.expectHeader(left, hdr); err != nil {
			return err
		}
		// The readers of doorbells and credits start after the header:
		// with two ranks, left and right are one link. A failure here
		// must end the op (fail) before waiting for them: a reader of
		// credits from the right waits for credits that may never come
		// once this side stopped consuming.
		var readers sync.WaitGroup
		defer func() {
			if err != nil {
				fail(err)
			}
			readers.Wait()
		}()
		startReader := func(peer, doorbells, credits int) {
			readers.Go(func() {
				if err := shmReader(ctx, c.peers[peer].links[chanColl], &pipe, doorbells, credits); err != nil {
					fail(&linkError{peer, err})
				}
			})
		}
		switch {
		case shmL != nil && left == right:
			startReader(left, nrecv, nsend)
		default:
			if shmL != nil {
				startReader(left, nrecv, 0)
			}
			if shmR != nil {
				startReader(right, 0, nsend)
			}
		}
		var scratch []byte
		if shmL == nil {
			scratch = c.scratchBytes(seg * es)
		}
		got := 0 // segments taken from shmL
		for k := range steps {
			lo, hi := chunk(r - k - 1)
			for s := lo; s < hi; s += seg {
				e := min(s+seg, hi)
				dst := xb[s*es : e*es]
				var src []byte // the segment received, for the reduce-scatter
				if shmL != nil {
					select {
					case <-pipe.doorbells:
					case <-ctx.Done():
						return context.Cause(ctx)
					}
					src = shmL.in.slot(got, len(dst))
					got++
				}
				if k < n-1 { // reduce-scatter: add into xb
					if src == nil {
						src = scratch[:len(dst)]
						if err := c.read(left, src); err != nil {
							return err
						}
					}
					reduce(dst, src)
				} else { // allgather: the final sum, straight into xb
					select {
					case <-sent:
					case <-ctx.Done():
						return context.Cause(ctx)
					}
					if src != nil {
						copy(dst, src)
					} else if err := c.read(left, dst); err != nil {
						return err
					}
				}
				if shmL != nil {
					if err := c.write(left, credit); err != nil {
						return err
					}
				}
				if k < steps-1 {
					ready <- struct{}{}
				}
			}
		}
		return nil
	}
	return duplex(ctx, fail, send, recv)
}

// ringShm returns the rings of the collective link to rank r when the ring
// can move segments of segBytes through them, or nil.
func (c *Comm) ringShm(r, segBytes int) *shmLink {
	if l := c.peers[r].shm; l != nil && segBytes <= l.out.slotBytes && segBytes <= l.in.slotBytes {
		return l
	}
	return nil
}

// duplex runs send on a goroutine of its own beside recv and returns once
// both are done. An error of either goes to fail (which ends ctx, so the
// other side stops too); the result is ctx's cause, or nil.
func duplex(ctx context.Context, fail func(error), send, recv func() error) error {
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := send(); err != nil {
			fail(err)
		}
	})
	if err := recv(); err != nil {
		fail(err)
	}
	wg.Wait()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// scratchBytes returns an 8-byte-aligned buffer of n bytes, reused across
// collectives (the caller holds collSem).
func (c *Comm) scratchBytes(n int) []byte {
	if w := (n + 7) / 8; len(c.scratch) < w {
		c.scratch = make([]uint64, w)
	}
	return bytesOf(c.scratch)[:n]
}

// bytesOf views s as bytes, without copying.
func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}

// sliceOf views b, which must be aligned for T, as a []T, without copying.
func sliceOf[T any](b []byte) []T {
	var z T
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

func reduceFloat32(dst, src []byte) { add(sliceOf[float32](dst), sliceOf[float32](src)) }
func reduceFloat64(dst, src []byte) { add(sliceOf[float64](dst), sliceOf[float64](src)) }
func reduceInt64(dst, src []byte)   { add(sliceOf[int64](dst), sliceOf[int64](src)) }

// add is the reduction kernel: dst[i] += src[i]. Reslicing src to dst's
// length, and both to eight elements per iteration, lets the compiler drop
// every bounds check from the loop; the eight independent adds keep the
// pipeline busy. (Plain adds: no fused multiply-add can change the bits.)
func add[T float32 | float64 | int64](dst, src []T) {
	src = src[:len(dst)]
	for len(dst) >= 8 && len(src) >= 8 {
		d, s := dst[:8:8], src[:8:8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
		dst, src = dst[8:], src[8:]
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}
