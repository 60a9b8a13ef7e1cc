package cascade

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/replay"
)

// The disk tier: a rank's state at step T is its committed base at step
// v (durable.Load) with the differentials (v, T] replayed onto it
// (durable.ReadBatches, difflog.Decode, replay.Fused: the replay the
// replica holders use, so that with the lossless codec the result is the
// owner's committed state at T bit for bit), the regions other than the
// optimizer's taken whole from T's record.

// ErrDisk is wrapped by Load's errors about what the disk holds: a base
// that does not load, differentials missing, not verifying or not of the
// rank's layout, or a rebuilt state whose CRC32Cs are not the owner's.
var ErrDisk = errors.New("cascade: the durable tier cannot give the rank's state")

// stepRec is one decoded differential.
type stepRec struct {
	rec *difflog.Record
	g   *replay.Tensor
}

// decodeLog decodes and checks recs, the records after step base as
// durable.ReadBatches returns them, up to step upTo (all if upTo < 0),
// against the rank's regions: the records that verify, and why it
// stopped before upTo or the end (nil if it did not).
func decodeLog(recs []durable.Record, regions []durable.Region, base, upTo int64) ([]stepRec, error) {
	var out []stepRec
	for i, dr := range recs {
		s := base + 1 + int64(i)
		if upTo >= 0 && s > upTo {
			break
		}
		if dr.Step != s {
			return out, fmt.Errorf("the record after step %d is of step %d", s-1, dr.Step)
		}
		r, g, err := difflog.DecodeTensor(dr.Data)
		if err != nil {
			return out, fmt.Errorf("step %d: %w", s, err)
		}
		if r.Diff.Step != s {
			return out, fmt.Errorf("step %d: the record says step %d", s, r.Diff.Step)
		}
		if !r.Sealed() {
			return out, fmt.Errorf("step %d: the record's seal is not the owner's (its step, hyper-parameters or regions were changed)", s)
		}
		if err := fits(r, regions); err != nil {
			return out, fmt.Errorf("step %d: %w", s, err)
		}
		if len(out) > 0 {
			p := out[len(out)-1].rec
			if p.Optimizer != r.Optimizer {
				return out, fmt.Errorf("step %d: optimizer layout %+v, step %d's was %+v", s, r.Optimizer, s-1, p.Optimizer)
			}
			if r.Diff.Hyper.T != p.Diff.Hyper.T+1 {
				return out, fmt.Errorf("step %d: Adam step %d after step %d's %d", s, r.Diff.Hyper.T, s-1, p.Diff.Hyper.T)
			}
		}
		out = append(out, stepRec{r, g})
	}
	return out, nil
}

// fits checks that r is of the rank's layout: its table is the rank's
// regions, in order, at their sizes. A rank region it does not carry (a
// region the rank service does not replicate, params) cannot be rebuilt
// past the base.
func fits(r *difflog.Record, regions []durable.Region) error {
	if len(r.Regions) != len(regions) {
		for _, g := range regions {
			if !tableHas(r.Regions, g.Name) {
				return fmt.Errorf("the rank's region %q is not in its differentials (it is not replicated): it cannot be rebuilt past the base", g.Name)
			}
		}
		return fmt.Errorf("the record's %d regions are not the rank's %d", len(r.Regions), len(regions))
	}
	for i, g := range r.Regions {
		if g.Name != regions[i].Name || g.Size != regions[i].Size {
			return fmt.Errorf("the record's region %d is %q of %d bytes, the rank's %q of %d", i, g.Name, g.Size, regions[i].Name, regions[i].Size)
		}
	}
	return nil
}

func tableHas(t []difflog.Region, name string) bool {
	for _, g := range t {
		if g.Name == name {
			return true
		}
	}
	return false
}

// Reach returns the steps rank's state can be rebuilt at from the
// durable tier in dir: from base, the step of the job's commit record,
// to the last of the differentials after base that follow one another
// and verify (the Disk span of Avail). stop says why the differentials
// stop where they do, nil if the log simply ends there (durable.ReadBatches'
// stop: a gap, a corrupt batch; or a record that does not verify or is not
// of the rank's layout). Reach does not check that the base loads (Load
// does, reading every byte).
func Reach(dir string, rank int, regions []durable.Region, base int64) (Span, error) {
	recs, stop := durable.ReadBatches(dir, rank, base)
	got, err := decodeLog(recs, regions, base, -1)
	if err != nil {
		stop = err
	}
	return Span{base, base + int64(len(got))}, stop
}

// Loaded says how Load rebuilt a rank's state.
type Loaded struct {
	Replayed int // differentials replayed onto the base
	// Exact: every differential replayed was lossless (the Raw codec), and
	// every region matched the CRC32C the owner committed at the target.
	// A lossy log gives an approximation of the optimizer's region, not
	// checked against the owner's (the other regions are).
	Exact bool
	// AdamT is Adam's step count at the target (the last differential's
	// replay.Hyper.T), or 0 when none was replayed (a base does not say).
	AdamT int
	// Where the time went: loading the base, reading and decoding the
	// differentials, replaying them (and checking the result).
	BaseTime, LogTime, ReplayTime time.Duration
}

// Load rebuilds rank's state at step target from the durable tier in
// dir into dst, one slice per region of regions (the manifest's, in
// order), each of the region's size: the version of step base (the
// commit record's) read with durable.Load, every chunk's CRC32C checked,
// then, if target > base, the differentials (base, target] decoded,
// checked (see Reach) and replayed with replay.Fused onto the optimizer's
// W, M and V, the other regions taken from target's record, and every
// region checked against the CRC32Cs the owner committed at target (the
// optimizer's only when the log is lossless). On error dst holds
// partial data. The optimizer's arrays in dst must be 4-byte aligned
// (slot memory and make's are).
func Load(ctx context.Context, dir string, rank int, regions []durable.Region, base, target int64, dst [][]byte, opt replay.ReplayOptions) (Loaded, error) {
	if target < base {
		return Loaded{}, fmt.Errorf("cascade: rank %d: target step %d before the base %d", rank, target, base)
	}
	if len(dst) != len(regions) {
		return Loaded{}, fmt.Errorf("cascade: rank %d: %d buffers for %d regions", rank, len(dst), len(regions))
	}
	t0 := time.Now()
	if err := durable.Load(ctx, dir, rank, base, dst); err != nil {
		return Loaded{}, fmt.Errorf("%w: rank %d: the base at step %d: %w", ErrDisk, rank, base, err)
	}
	t1 := time.Now()
	if target == base {
		return Loaded{Exact: true, BaseTime: t1.Sub(t0)}, nil
	}
	recs, stop := durable.ReadBatches(dir, rank, base)
	log, err := decodeLog(recs, regions, base, target)
	if err == nil && int64(len(log)) < target-base {
		err = stop
		if err == nil {
			err = errors.New("the log ends there")
		}
	}
	if err != nil {
		return Loaded{}, fmt.Errorf("%w: rank %d: differentials after step %d reach step %d, not %d: %w", ErrDisk, rank, base, base+int64(len(log)), target, err)
	}
	last := log[len(log)-1].rec
	t2 := time.Now()
	idx := make(map[string]int, len(regions))
	for i, g := range regions {
		idx[g.Name] = i
	}
	o := last.Optimizer
	st, err := state(dst[idx[o.Region]], o.N, o.WOff, o.MOff, o.VOff)
	if err != nil {
		return Loaded{}, fmt.Errorf("cascade: rank %d: %w", rank, err)
	}
	exact := true
	for i := 0; i < len(log); i += 64 {
		if err := ctx.Err(); err != nil {
			return Loaded{}, err
		}
		part := log[i:min(i+64, len(log))]
		diffs := make([]*replay.Tensor, len(part))
		hypers := make([]replay.Hyper, len(part))
		for k, s := range part {
			diffs[k], hypers[k] = s.g, s.rec.Diff.Hyper
			exact = exact && s.g.Codec == replay.Raw
		}
		if err := replay.Fused(st, diffs, hypers, opt); err != nil {
			return Loaded{}, fmt.Errorf("%w: rank %d: replaying steps %d to %d: %w", ErrDisk, rank, part[0].rec.Diff.Step, part[len(part)-1].rec.Diff.Step, err)
		}
	}
	for name, b := range last.Diff.Other {
		copy(dst[idx[name]], b)
	}
	for _, g := range last.Regions {
		if g.Name == o.Region && !exact {
			continue
		}
		if got := crc32c.Checksum(dst[idx[g.Name]]); got != g.Sum {
			return Loaded{}, fmt.Errorf("%w: rank %d: region %q rebuilt at step %d has CRC32C %#08x, the owner committed %#08x", ErrDisk, rank, g.Name, target, got, g.Sum)
		}
	}
	return Loaded{Replayed: len(log), Exact: exact, AdamT: last.Diff.Hyper.T,
		BaseTime: t1.Sub(t0), LogTime: t2.Sub(t1), ReplayTime: time.Since(t2)}, nil
}

// state views W, M and V of n elements at offsets w, m, v of region b.
func state(b []byte, n, w, m, v int64) (replay.State, error) {
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return replay.State{}, errors.New("the optimizer's region is not 4-byte aligned in memory")
	}
	view := func(off int64) []float32 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[off])), n)
	}
	return replay.State{W: view(w), M: view(m), V: view(v)}, nil
}
