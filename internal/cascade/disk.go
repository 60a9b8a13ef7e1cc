package cascade

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/replay"
)

// The disk tier: a rank's state at step T is its committed base at step
// v (durable.Load) with the differentials (v, T] replayed onto it
// (durable.ScanBatches, difflog.Decode, replay.Fused: the replay the
// replica holders use, so that with the lossless codec the result is the
// owner's committed state at T bit for bit), the regions other than the
// optimizer's taken whole from T's record. The log is read one batch at
// a time and no further than T: what Reach and Load hold of it is one
// batch's records.

// ErrDisk is wrapped by Load's errors about what the disk holds: a base
// that does not load, differentials missing, not verifying or not of the
// rank's layout, or a rebuilt state whose CRC32Cs are not the owner's.
var ErrDisk = errors.New("cascade: the durable tier cannot give the rank's state")

// stepRec is one decoded differential.
type stepRec struct {
	rec *difflog.Record
	g   *replay.Tensor
}

// logCheck decodes and checks the records after a base, one at a time
// in step order, against the rank's regions and the record before (the
// step, the seal, the layout, the optimizer's layout and Adam's step
// count following on), keeping nothing of a record but what the next
// one is checked against.
type logCheck struct {
	regions []durable.Region
	next    int64 // the step of the next record
	prev    bool  // a record was checked: opt and t are its
	opt     diffstore.Optimizer
	t       int
}

// reached is the step of the last record checked (the base if none).
func (c *logCheck) reached() int64 { return c.next - 1 }

// check decodes dr, which must be of step c.next, and checks it. The
// record and tensor returned alias dr.Data.
func (c *logCheck) check(dr durable.Record) (*difflog.Record, *replay.Tensor, error) {
	s := c.next
	if dr.Step != s {
		return nil, nil, fmt.Errorf("the record after step %d is of step %d", s-1, dr.Step)
	}
	r, g, err := difflog.DecodeTensor(dr.Data)
	if err != nil {
		return nil, nil, fmt.Errorf("step %d: %w", s, err)
	}
	if r.Diff.Step != s {
		return nil, nil, fmt.Errorf("step %d: the record says step %d", s, r.Diff.Step)
	}
	if !r.Sealed() {
		return nil, nil, fmt.Errorf("step %d: the record's seal is not the owner's (its step, hyper-parameters or regions were changed)", s)
	}
	if err := fits(r, c.regions); err != nil {
		return nil, nil, fmt.Errorf("step %d: %w", s, err)
	}
	if c.prev {
		if c.opt != r.Optimizer {
			return nil, nil, fmt.Errorf("step %d: optimizer layout %+v, step %d's was %+v", s, r.Optimizer, s-1, c.opt)
		}
		if r.Diff.Hyper.T != c.t+1 {
			return nil, nil, fmt.Errorf("step %d: Adam step %d after step %d's %d", s, r.Diff.Hyper.T, s-1, c.t)
		}
	}
	c.prev, c.opt, c.t = true, r.Optimizer, r.Diff.Hyper.T
	c.next++
	return r, g, nil
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
// stop where they do, nil if the log simply ends there (durable.ScanBatches'
// stop: a gap, a corrupt batch, a trim cut short; or a record that does
// not verify or is not of the rank's layout). Reach reads the whole log,
// one batch at a time, and keeps none of it. Reach does not check that
// the base loads (Load does, reading every byte).
func Reach(dir string, rank int, regions []durable.Region, base int64) (Span, error) {
	return ReachTo(dir, rank, regions, base, math.MaxInt64)
}

// ReachTo is Reach reading the log no further than step upTo (≥ base):
// the span ends at upTo at most, and stop is nil when it gets there. A
// batch that begins after upTo is never opened (what is wrong there
// does not matter); upTo's own batch is checked whole (see Load).
func ReachTo(dir string, rank int, regions []durable.Region, base, upTo int64) (Span, error) {
	if upTo < base {
		return Span{base, base}, fmt.Errorf("cascade: rank %d: reach up to step %d, before the base %d", rank, upTo, base)
	}
	c := logCheck{regions: regions, next: base + 1}
	stop := durable.ScanBatches(dir, rank, base, upTo, func(recs []durable.Record) error {
		for _, dr := range recs {
			if _, _, err := c.check(dr); err != nil {
				return err
			}
		}
		return nil
	})
	return Span{base, c.reached()}, stop
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
	// differentials, replaying them (and checking the result). The log
	// is read and replayed batch by batch: LogTime and ReplayTime are the
	// sums of their parts.
	BaseTime, LogTime, ReplayTime time.Duration
}

// Load rebuilds rank's state at step target from the durable tier in
// dir into dst, one slice per region of regions (the manifest's, in
// order), each of the region's size: the version of step base (the
// commit record's) read with durable.Load, every chunk's CRC32C checked,
// then, if target > base, the differentials (base, target] read one
// batch at a time (durable.ScanBatches: no batch after target is
// opened), decoded, checked (see Reach) and replayed with replay.Fused
// onto the optimizer's W, M and V (up to 64 steps a pass), each batch
// released before the next is read; the other regions taken from
// target's record, and every region checked against the CRC32Cs the
// owner committed at target (the optimizer's only when the log is
// lossless). The log is read up to target's batch: a batch that begins
// after target is never opened, so nothing in it matters; target's own
// batch is read and checked whole (every record's CRC32C, the records
// after target too, which are not decoded): a record after target there
// that does not verify makes Load fail (ErrDisk wrapping
// durable.ErrCorrupt). On error dst holds partial data. The
// optimizer's arrays in dst must be 4-byte aligned (slot memory and
// make's are).
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
	idx := make(map[string]int, len(regions))
	for i, g := range regions {
		idx[g.Name] = i
	}
	var (
		c         = logCheck{regions: regions, next: base + 1}
		st        replay.State
		exact     = true
		last      []difflog.Region // target's record's regions
		replaying time.Duration
		failed    error // an error of Load's own, not the log's
	)
	part := make([]stepRec, 0, 64)
	stop := durable.ScanBatches(dir, rank, base, target, func(recs []durable.Record) error {
		part = part[:0]
		for _, dr := range recs {
			r, g, err := c.check(dr)
			if err != nil {
				return err
			}
			part = append(part, stepRec{r, g})
		}
		t := time.Now()
		defer func() { replaying += time.Since(t) }()
		if st.W == nil {
			o := part[0].rec.Optimizer
			var err error
			if st, err = state(dst[idx[o.Region]], o.N, o.WOff, o.MOff, o.VOff); err != nil {
				failed = fmt.Errorf("cascade: rank %d: %w", rank, err)
				return failed
			}
		}
		for i := 0; i < len(part); i += 64 {
			if err := ctx.Err(); err != nil {
				failed = err
				return err
			}
			p := part[i:min(i+64, len(part))]
			diffs := make([]*replay.Tensor, len(p))
			hypers := make([]replay.Hyper, len(p))
			for k, s := range p {
				diffs[k], hypers[k] = s.g, s.rec.Diff.Hyper
				exact = exact && s.g.Codec == replay.Raw
			}
			if err := replay.Fused(st, diffs, hypers, opt); err != nil {
				failed = fmt.Errorf("%w: rank %d: replaying steps %d to %d: %w", ErrDisk, rank, p[0].rec.Diff.Step, p[len(p)-1].rec.Diff.Step, err)
				return failed
			}
		}
		if r := part[len(part)-1].rec; r.Diff.Step == target {
			// Target's regions but the optimizer's, while the batch
			// holding them is.
			for name, b := range r.Diff.Other {
				copy(dst[idx[name]], b)
			}
			last = r.Regions
		}
		clear(part) // the batch's buffers are the next one's
		return nil
	})
	if failed != nil {
		return Loaded{}, failed
	}
	if stop == nil && c.reached() < target {
		stop = errors.New("the log ends there")
	}
	if stop != nil {
		return Loaded{}, fmt.Errorf("%w: rank %d: differentials after step %d reach step %d, not %d: %w", ErrDisk, rank, base, c.reached(), target, stop)
	}
	t2 := time.Now()
	for _, g := range last {
		if g.Name == c.opt.Region && !exact {
			continue
		}
		if got := crc32c.Checksum(dst[idx[g.Name]]); got != g.Sum {
			return Loaded{}, fmt.Errorf("%w: rank %d: region %q rebuilt at step %d has CRC32C %#08x, the owner committed %#08x", ErrDisk, rank, g.Name, target, got, g.Sum)
		}
	}
	return Loaded{Replayed: int(target - base), Exact: exact, AdamT: c.t,
		BaseTime: t1.Sub(t0), LogTime: t2.Sub(t1) - replaying, ReplayTime: replaying + time.Since(t2)}, nil
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
