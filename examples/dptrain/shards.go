package main

// The parameters and the optimizer state over the ranks' shards: their
// initial state and the shard bounds, the chunked all-gather of the
// parameters and the loss's reduction, and the hashes every rank must
// agree on.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"math"
)

// reset puts the model and the optimizer in their initial state.
func (t *trainer) reset() {
	initParams(t.params, t.cfg.Seed)
	copy(t.master, t.params[t.lo:t.hi])
	clear(t.m)
	clear(t.v)
}

// paramsFromShards sets the parameters after the rank's shard (master
// weights) was restored, as a step leaves them: its shard's from the
// master weights, the others' gathered from their owners. With
// --device-grad no step gathers them (the emulated device holds the
// parameters, the host only its shard's master weights, gathered once at
// the end for the hash), and neither does this: the other shards'
// parameters are not read until then. It reports whether it gathered.
func (t *trainer) paramsFromShards(ctx context.Context) (bool, error) {
	copy(t.params[t.lo:t.hi], t.master)
	if t.cfg.DeviceGrad {
		return false, nil
	}
	return true, t.allgatherParams(ctx)
}

// checkBounds checks shard boundaries.
func checkBounds(b []int, n, size int) error {
	if len(b) != size+1 || b[0] != 0 || b[size] != n {
		return fmt.Errorf("bad shard boundaries %v for %d parameters on %d ranks", b, n, size)
	}
	for r := range size {
		if b[r] > b[r+1] {
			return fmt.Errorf("bad shard boundaries %v", b)
		}
	}
	return nil
}

// reduceLoss returns the step's loss per parameter. Each sample's loss is
// computed whole on one rank; their float64 bits are placed at the sample's
// global index and summed as int64 (one non-zero term per slot, so the sum
// is the bits themselves), then every rank adds them up in sample order.
func (t *trainer) reduceLoss(ctx context.Context) (float64, error) {
	clear(t.lossBits)
	for n, l := range t.sampleLoss {
		t.lossBits[t.first+n] = int64(math.Float64bits(0.5 * l))
	}
	if err := t.c.AllreduceInt64(ctx, t.lossBits); err != nil {
		return 0, fmt.Errorf("reducing the loss: %w", err)
	}
	var sum float64
	for _, b := range t.lossBits {
		sum += math.Float64frombits(uint64(b))
	}
	return sum / (float64(t.cfg.Batch) * float64(t.cfg.Params)), nil
}

// shardChunk is the part [lo, hi) of rank r's shard that round off of a
// chunked exchange carries (empty when the shard is shorter than off).
func (t *trainer) shardChunk(r, off int) (lo, hi int) {
	lo = min(t.bounds[r]+off, t.bounds[r+1])
	return lo, min(lo+t.chunk, t.bounds[r+1])
}

// allgatherParams gives every rank the whole parameter vector from each
// rank's shard, one chunk of every shard per Allgather.
func (t *trainer) allgatherParams(ctx context.Context) error {
	longest := 0
	for r := range t.size {
		longest = max(longest, t.bounds[r+1]-t.bounds[r])
	}
	for off := 0; off < longest; off += t.chunk {
		lo, hi := t.shardChunk(t.rank, off)
		all, err := t.c.Allgather(ctx, putFloat32s(t.buf, t.params[lo:hi]))
		if err != nil {
			return fmt.Errorf("gathering parameters: %w", err)
		}
		if len(all) != t.size {
			return fmt.Errorf("gathering parameters: %d shards from %d ranks", len(all), t.size)
		}
		for r, b := range all {
			lo, hi := t.shardChunk(r, off)
			if len(b) != 4*(hi-lo) {
				return fmt.Errorf("gathering parameters: rank %d sent %d bytes, want %d", r, len(b), 4*(hi-lo))
			}
			if r != t.rank {
				getFloat32s(t.params[lo:hi], b)
			}
		}
	}
	return nil
}

// paramsHash hashes the parameters and checks that every rank has the same.
func (t *trainer) paramsHash(ctx context.Context) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	h := sha256.New()
	for a := 0; a < len(t.params); a += t.chunk {
		h.Write(putFloat32s(t.buf, t.params[a:min(a+t.chunk, len(t.params))]))
	}
	h.Sum(sum[:0])
	all, err := t.c.Allgather(ctx, sum[:])
	if err != nil {
		return sum, fmt.Errorf("comparing parameter hashes: %w", err)
	}
	for r, b := range all {
		if string(b) != string(sum[:]) {
			return sum, fmt.Errorf("rank %d's parameters differ from rank %d's (hash %x, not %x)", r, t.rank, b, sum)
		}
	}
	return sum, nil
}

// optimizerHash hashes the optimizer state gathered in canonical order: m,
// then v, then the master weights, each over all parameters in index order.
// Each shard is streamed chunk by chunk from its owner (Broadcast), so no
// rank ever holds the whole state. Rank 0 hashes the stream and broadcasts
// the digest: SHA-256 is the end's costliest part (about 400 MB/s a core on
// some machines, and the state is 12 bytes per parameter), paid once rather
// than on every rank.
func (t *trainer) optimizerHash(ctx context.Context) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	var h hash.Hash
	if t.rank == 0 {
		h = sha256.New()
	}
	for _, region := range [][]float32{t.m, t.v, t.master} {
		for r := range t.size {
			for off := 0; off < t.bounds[r+1]-t.bounds[r]; off += t.chunk {
				lo, hi := t.shardChunk(r, off)
				var mine []byte
				if r == t.rank {
					mine = putFloat32s(t.buf, region[lo-t.lo:hi-t.lo])
				}
				b, err := t.c.Broadcast(ctx, r, mine)
				if err != nil {
					return sum, fmt.Errorf("gathering the optimizer state: %w", err)
				}
				if r == t.rank {
					b = mine
				}
				if len(b) != 4*(hi-lo) {
					return sum, fmt.Errorf("gathering the optimizer state: rank %d sent %d bytes, want %d", r, len(b), 4*(hi-lo))
				}
				if h != nil {
					h.Write(b)
				}
			}
		}
	}
	if h != nil {
		h.Sum(sum[:0])
	}
	b, err := t.c.Broadcast(ctx, 0, sum[:])
	if err != nil {
		return sum, fmt.Errorf("sharing the optimizer state's hash: %w", err)
	}
	if len(b) != len(sum) {
		return sum, fmt.Errorf("sharing the optimizer state's hash: rank 0 sent %d bytes, want %d", len(b), len(sum))
	}
	copy(sum[:], b)
	return sum, nil
}

// putFloat32s encodes x little-endian into the start of buf and returns that part.
func putFloat32s(buf []byte, x []float32) []byte {
	buf = buf[:4*len(x)]
	for i, f := range x {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
	}
	return buf
}

// getFloat32s decodes len(x) little-endian float32s from b.
func getFloat32s(x []float32, b []byte) {
	b = b[:4*len(x)]
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}
