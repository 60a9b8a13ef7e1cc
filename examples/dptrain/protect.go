package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// protector is what the trainer needs from gorun's state protection;
// *protect.Client implements it.
type protector interface {
	Restore(ctx context.Context) (*protect.Restored, error)
	Stage(ctx context.Context, step int64, data map[string][][]byte) error
	Wait(ctx context.Context) error
	Stats() protect.Stats
	Close() error
	// Mode, GradientBuffer and Gradient are differential protection
	// (gorun --protect-mode diff): each step's gradient and
	// hyper-parameters go to the service, which the holders replay.
	Mode() protect.ProtectMode
	GradientBuffer(step int64) []float32
	Gradient(ctx context.Context, step int64, g []float32, h replay.Hyper) error
	// Deposits are the ranges of the full reduced gradient the service
	// asks this rank to write for the replica holders on its host that
	// take a peer's gradient from it (rank.Optimizer.Reduced).
	Deposits(step int64) ([]float32, []protect.DepositRange)
}

var _ protector = (*protect.Client)(nil)

// metaSize is the meta region: magic, step, and a hash of what the state
// depends on (so that a restart with other flags is refused, not resumed).
const metaSize = 64

var metaMagic = [8]byte{'d', 'p', 't', 'r', 'a', 'i', 'n', '1'}

// regions are the rank's protected regions: its optimizer shard (m, v and
// the master weights) and meta. The parameters are not protected: they
// are the master weights of all shards, gathered again after a restore.
func (t *trainer) regions() []protect.Region {
	n := int64(len(t.master))
	return []protect.Region{{Name: "optimizer", Size: 3 * 4 * n}, {Name: "meta", Size: metaSize}}
}

// optimizer declares where the optimizer region holds the state
// replay.Step updates (m, v, then the master weights, as stage writes
// them): dptrain's update is replay.Step itself (adamUpdate), so a holder
// that replays its gradients gets its state bit for bit.
//
// Without --device-grad the exact allreduce leaves every rank with all
// the parameters' reduced gradient, bitwise, its shard's gradient a slice
// of it: declared (Reduced), so that a holder whose host runs another
// rank takes the gradient from that rank's deposits instead of the
// network. With --device-grad each shard's gradient is computed on its
// own rank from its own weights, not reduced: no peer holds it.
func (t *trainer) optimizer() *protect.Optimizer {
	n := int64(len(t.master))
	o := &protect.Optimizer{Region: "optimizer", N: n, M: 0, V: 4 * n, W: 8 * n}
	if !t.cfg.DeviceGrad {
		o.Reduced = &protect.Reduced{N: int64(t.cfg.Params), Off: int64(t.lo)}
	}
	return o
}

// stateKey identifies the run the state belongs to.
func (t *trainer) stateKey() [32]byte {
	c := t.cfg
	return sha256.Sum256(fmt.Appendf(nil, "%d/%d/%d/%d/%+v/%d/%d/%v", c.Params, c.Seed, c.Batch, c.Compute, c.Adam, t.rank, t.size, t.bounds))
}

// protectStep protects the state after step s: in differential mode the
// step's gradient and hyper-parameters first (the service needs them
// before the commit), then the state itself (stage).
func (t *trainer) protectStep(ctx context.Context, s int) error {
	if t.diff {
		if err := t.prot.Gradient(ctx, int64(s), t.g, t.cfg.Adam.at(s+1)); err != nil {
			return err
		}
	}
	return t.stage(ctx, s)
}

// stage protects the state after step s (in the background: Wait before
// the next update).
func (t *trainer) stage(ctx context.Context, s int) error {
	if t.meta == nil {
		t.meta = make([]byte, metaSize)
	}
	copy(t.meta, metaMagic[:])
	binary.LittleEndian.PutUint64(t.meta[8:], uint64(s))
	k := t.stateKey()
	copy(t.meta[16:], k[:])
	return t.prot.Stage(ctx, int64(s), map[string][][]byte{
		"optimizer": {float32Bytes(t.m), float32Bytes(t.v), float32Bytes(t.master)},
		"meta":      {t.meta},
	})
}

// restore resumes from the protected state, if there is one, and returns
// the first step to run. At the start, and again after the world was
// rebuilt in place: the service answers the epoch's recoverable step G
// (discarding this rank's later steps), or none, and the rank goes back
// to that state (or to the initial one), whatever it had trained since.
func (t *trainer) restore(ctx context.Context) (int, error) {
	start := time.Now()
	r, err := t.prot.Restore(ctx)
	if err != nil {
		return 0, fmt.Errorf("restoring: %w", err)
	}
	if r.Step < 0 {
		return 0, nil // join resets the state
	}
	meta, opt := r.Regions["meta"], r.Regions["optimizer"]
	n := len(t.master)
	switch {
	case len(meta) != metaSize || string(meta[:8]) != string(metaMagic[:]):
		return 0, fmt.Errorf("restoring: the protected meta region is not dptrain's")
	case binary.LittleEndian.Uint64(meta[8:]) != uint64(r.Step):
		return 0, fmt.Errorf("restoring: meta says step %d, the service step %d", binary.LittleEndian.Uint64(meta[8:]), r.Step)
	case len(opt) != 12*n:
		return 0, fmt.Errorf("restoring: optimizer region of %d bytes, want %d", len(opt), 12*n)
	}
	if k := t.stateKey(); string(meta[16:48]) != string(k[:]) {
		return 0, usageError("the protected state is from a run with other flags or another world; not resuming from it")
	}
	copy(float32Bytes(t.m), opt[:4*n])
	copy(float32Bytes(t.v), opt[4*n:8*n])
	copy(float32Bytes(t.master), opt[8*n:])
	note := fmt.Sprintf("dptrain: rank %d: restored step %d from tier %d in %v", t.rank, r.Step, r.Tier, time.Since(start).Round(time.Millisecond))
	gather := time.Now()
	if ok, err := t.paramsFromShards(ctx); err != nil {
		return 0, err
	} else if ok {
		note += fmt.Sprintf(", parameters gathered in %v", time.Since(gather).Round(time.Millisecond))
	}
	fmt.Fprintln(t.errOut, note)
	return int(r.Step) + 1, nil
}

// float32Bytes views x's memory as bytes (the host's byte order).
func float32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}
