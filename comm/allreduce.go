package comm

// Allreduce: the ring (see the notes at the top of collective.go), its
// shared-memory path, and the element views and sums it reduces with.

import (
	"context"
	"sync"
	"unsafe"
)

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
