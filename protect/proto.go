package protect

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/replay"
)

// Message types of the state-protection protocol (PROTOCOL.md), after the
// rank socket's own (internal/wire: 1 to 6).
const (
	TypeProtectHello   byte = 16
	TypeProtectWelcome byte = 17
	TypeStage          byte = 18
	TypeStaged         byte = 19
	TypeCommit         byte = 20
	TypeCommitted      byte = 21
	TypeGradient       byte = 22
	TypeGradientDone   byte = 23
	TypeRestore        byte = 24
	TypeRestorable     byte = 25
	TypeStatus         byte = 26
	TypeStatusReply    byte = 27
)

// IsRequest reports whether typ is a request of the protocol, which the
// agent hands to the rank's service.
func IsRequest(typ byte) bool {
	switch typ {
	case TypeProtectHello, TypeStage, TypeCommit, TypeGradient, TypeRestore, TypeStatus:
		return true
	}
	return false
}

// Version is the protocol's version, in ProtectHello and ProtectWelcome.
const Version = 1

// Limits of what a rank may ask for.
const (
	MaxRegions    = 16
	MaxRegionSize = 1 << 40
	MaxGradient   = 1 << 31 // float32 elements of the gradient buffer
	MaxStep       = 1<<53 - 1
)

// NoStep is the step -1, "none" (PROTOCOL.md: a committed step, G, or a
// restorable step of -1).
const NoStep = -1

// GradientRegion is the file name part of the gradient buffer; no region
// may be declared with it.
const GradientRegion = "gradient"

// Region is a named region of a rank's protected state.
type Region struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// ProtectHello declares a rank's regions.
type ProtectHello struct {
	Version  int      `json:"v"`
	Regions  []Region `json:"regions"`
	Gradient int64    `json:"gradient,omitempty"`
	// Optimizer declares that the rank steps its optimizer shard with
	// replay's Adam kernel (replay.Step): what differential protection
	// (gorun --protect-mode diff) needs to rebuild the state from
	// gradients. Without it a diff-mode job refuses the rank.
	Optimizer *Optimizer `json:"optimizer,omitempty"`
}

// Optimizer says where a rank's replay optimizer state is: N float32
// master weights (W), first moments (M) and second moments (V), at byte
// offsets W, M and V of region Region (little-endian float32, each array
// N elements, inside the region, not overlapping). Every step s the rank
// applies replay.Step to them with the reduced gradient of its shard and
// the step's hyper-parameters, which it hands the service (Gradient)
// before it commits s.
type Optimizer struct {
	Region string `json:"region"`
	N      int64  `json:"n"`
	W      int64  `json:"w"`
	M      int64  `json:"m"`
	V      int64  `json:"v"`
	// Reduced, if set, declares that the rank's shard gradient is a
	// slice of a reduced gradient every data-parallel peer holds
	// bitwise (internal/keeper/localpeer.go): what lets a holder take it from a local
	// peer instead of the network.
	Reduced *Reduced `json:"reduced,omitempty"`
}

// Hyper are one optimizer step's hyper-parameters (replay.Hyper) on the
// wire. float32 values survive JSON exactly (encoding/json writes the
// shortest decimal that reads back to the same float32).
type Hyper struct {
	LR          float32 `json:"lr"`
	Beta1       float32 `json:"beta1"`
	Beta2       float32 `json:"beta2"`
	Eps         float32 `json:"eps"`
	WeightDecay float32 `json:"weight_decay"`
	T           int     `json:"t"`
}

// ProtectMode is how a job protects its ranks' state on other hosts.
type ProtectMode string

const (
	// ModeFull replicates every committed step's replicated regions
	// whole (any trainer). The zero value means ModeFull.
	ModeFull ProtectMode = "full"
	// ModeDiff sends each step's differential (the gradient of the
	// rank's shard and the step's hyper-parameters, with the small
	// regions whole) and a base every DiffConfig.BaseEvery steps; holders
	// rebuild the state by replay (trainers that declare an Optimizer).
	ModeDiff ProtectMode = "diff"
)

// RegionFile says where a region's bytes are: slot i's are the Size bytes
// at offset i·Stride of the file at Path.
type RegionFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	Path   string `json:"path"`
	Stride int64  `json:"stride"`
}

// GradientFile is the gradient buffer: two halves of Size bytes of
// float32 elements each (little-endian), half i at byte offset i·Stride of
// the file at Path (Stride ≥ Size, a multiple of the page size; the file
// is 2·Stride bytes). The gradient of step s is in half s mod 2 (ping-pong:
// the service may still read step s's half while the rank writes step
// s+1's). A Stride of 0 (an older service) means one half at offset 0.
type GradientFile struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Stride int64  `json:"stride,omitempty"`
	// Deposit and Reduced, for a rank that declared Optimizer.Reduced in
	// diff mode: each half holds, from byte offset Deposit, room for the
	// Reduced elements of the full reduced gradient (element i at
	// Deposit + 4i), where the rank writes the deposits its plan asks
	// for (DepositPlan). Stride ≥ Deposit + 4·Reduced then.
	Deposit int64 `json:"deposit,omitempty"`
	Reduced int64 `json:"reduced,omitempty"`
}

// ProtectWelcome answers ProtectHello.
type ProtectWelcome struct {
	Version  int           `json:"v"`
	Job      string        `json:"job"`
	Rank     int           `json:"rank"`
	Replicas int           `json:"replicas"`
	Regions  []RegionFile  `json:"regions"`
	Gradient *GradientFile `json:"gradient,omitempty"`
	// Mode is the job's protect mode: "full", or "diff" (the rank hands
	// its gradient and hyper-parameters every step before Commit).
	Mode ProtectMode `json:"mode,omitempty"`
	// Deposits is the rank's deposit plan (a rank that declared
	// Optimizer.Reduced in diff mode), also in every Staged.
	Deposits  *DepositPlan `json:"deposits,omitempty"`
	Committed int64        `json:"committed"`
	G         int64        `json:"g"`
	Err       string       `json:"err,omitempty"`
}

// StepReq is Stage, Commit and (with N and Hyper) Gradient.
type StepReq struct {
	Step  int64  `json:"step"`
	N     int64  `json:"n,omitempty"`     // Gradient: elements
	Hyper *Hyper `json:"hyper,omitempty"` // Gradient: the optimizer step's hyper-parameters
	// Deposits (Gradient): the version of the deposit plan whose ranges
	// the rank wrote into the buffer's half of step (0: none).
	Deposits uint64 `json:"deposits,omitempty"`
}

// Staged answers Stage.
type Staged struct {
	Step   int64 `json:"step"`
	Slot   int   `json:"slot"`
	WaitNS int64 `json:"wait_ns"`
	// Deposits is the rank's current deposit plan (see ProtectWelcome).
	Deposits *DepositPlan `json:"deposits,omitempty"`
	Err      string       `json:"err,omitempty"`
	// NewPlacement, with Err, says that the stage was refused because a
	// new placement (epoch) began: the rank restores from G again
	// (in-place recovery) rather than failing. Omitted otherwise.
	NewPlacement bool `json:"new_placement,omitempty"`
}

// Committed answers Commit.
type Committed struct {
	Step int64  `json:"step"`
	Err  string `json:"err,omitempty"`
}

// GradientDone answers Gradient.
type GradientDone struct {
	Step  int64  `json:"step"`
	Bytes int64  `json:"bytes"`
	Err   string `json:"err,omitempty"`
}

// Empty is the payload of Restore and Status.
type Empty struct{}

// Restorable answers Restore.
type Restorable struct {
	Step int64  `json:"step"`
	Slot int    `json:"slot"`
	Tier int    `json:"tier"`
	Err  string `json:"err,omitempty"`
}

// Status answers Status: see PROTOCOL.md.
type Status struct {
	Committed  int64  `json:"committed"`
	Replicated int64  `json:"replicated"`
	G          int64  `json:"g"`
	Stages     int64  `json:"stages"`
	WaitNS     int64  `json:"wait_ns"`
	Holders    []int  `json:"holders"`
	Err        string `json:"err,omitempty"`
}

// Replay returns h as replay's.
func (h *Hyper) Replay() replay.Hyper {
	return replay.Hyper{LR: h.LR, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, WeightDecay: h.WeightDecay, T: h.T}
}

// Check validates the optimizer declaration of a hello with regions and a
// gradient buffer of gradient elements: the region exists and is
// replicated (not params); N ≥ 1; W, M and V are 4-aligned byte offsets of
// N float32 each inside the region, not overlapping; the gradient buffer
// holds N elements.
func (o *Optimizer) Check(regions []Region, gradient int64) error {
	i := slices.IndexFunc(regions, func(r Region) bool { return r.Name == o.Region })
	switch {
	case i < 0:
		return fmt.Errorf("optimizer region %q is not declared", wire.Truncate(o.Region))
	case o.Region == "params":
		return errors.New("optimizer region \"params\" is not replicated (it is restored from a data-parallel peer)")
	case o.N < 1 || o.N > MaxGradient:
		return fmt.Errorf("optimizer of %d elements, want 1 to 2^31", o.N)
	case gradient < o.N:
		return fmt.Errorf("a gradient buffer of %d elements for an optimizer of %d", gradient, o.N)
	}
	if o.Reduced != nil {
		if err := o.Reduced.Check(o.N); err != nil {
			return err
		}
	}
	size := regions[i].Size
	offs := [3]int64{o.W, o.M, o.V}
	for k, off := range offs {
		if off < 0 || off%4 != 0 || off > size-4*o.N {
			return fmt.Errorf("optimizer %c at byte offset %d: want a multiple of 4 with %d elements inside region %q of %d bytes", "WMV"[k], off, o.N, o.Region, size)
		}
		for j, p := range offs[:k] {
			if off < p+4*o.N && p < off+4*o.N {
				return fmt.Errorf("optimizer %c (offset %d) and %c (offset %d) overlap with %d elements each", "WMV"[j], p, "WMV"[k], off, o.N)
			}
		}
	}
	return nil
}

// CheckStep validates a step number: 0 to MaxStep.
func CheckStep(s int64) error {
	if s < 0 || s > MaxStep {
		return fmt.Errorf("step %d out of range [0, 2^53)", s)
	}
	return nil
}

// Check validates a ProtectHello from the rank.
func (h *ProtectHello) Check() error {
	if h.Version != Version {
		return fmt.Errorf("protect hello: protocol version %d, this service speaks %d", h.Version, Version)
	}
	if len(h.Regions) < 1 || len(h.Regions) > MaxRegions {
		return fmt.Errorf("protect hello: %d regions, want 1 to %d", len(h.Regions), MaxRegions)
	}
	seen := map[string]bool{}
	for _, r := range h.Regions {
		switch {
		case !ckpt.ValidRegionName(r.Name):
			return fmt.Errorf("protect hello: bad region name %q: want [a-z][a-z0-9_-]{0,31}", wire.Truncate(r.Name))
		case r.Name == GradientRegion:
			return fmt.Errorf("protect hello: region name %q is reserved", r.Name)
		case seen[r.Name]:
			return fmt.Errorf("protect hello: region %q declared twice", r.Name)
		case r.Size < 0 || r.Size > MaxRegionSize:
			return fmt.Errorf("protect hello: region %q of %d bytes, want 0 to 2^40", r.Name, r.Size)
		}
		seen[r.Name] = true
	}
	if h.Gradient < 0 || h.Gradient > MaxGradient {
		return fmt.Errorf("protect hello: gradient of %d elements, want 0 to 2^31", h.Gradient)
	}
	return nil
}

// Reduced declares that a rank's shard gradient is elements [Off,
// Off+Optimizer.N) of a reduced gradient of N elements which every
// data-parallel peer of the rank holds, bitwise, after each step (pure
// data parallelism with a deterministic allreduce).
type Reduced struct {
	N   int64 `json:"n"`
	Off int64 `json:"off"`
}

// Check validates r for a shard of n elements.
func (r *Reduced) Check(n int64) error {
	if r.N < 1 || r.N > MaxGradient || r.Off < 0 || r.Off > r.N-n {
		return fmt.Errorf("reduced gradient of %d elements with the shard at %d: want a shard of %d elements inside 1 to 2^31", r.N, r.Off, n)
	}
	return nil
}

// DepositPlan is what a rank that declared Optimizer.Reduced writes each
// step for the holders on its host: the ranges of the full reduced
// gradient, into the deposit area of its gradient buffer's half of the
// step (GradientFile.Deposit). Version 0 is the empty plan.
type DepositPlan struct {
	Version uint64         `json:"v"`
	Ranges  []DepositRange `json:"ranges,omitempty"`
}

// DepositRange is the elements [Lo, Hi) of the full reduced gradient.
type DepositRange struct {
	Lo int64 `json:"lo"`
	Hi int64 `json:"hi"`
}

// Equal reports whether o and p declare the same optimizer.
func (o *Optimizer) Equal(p *Optimizer) bool {
	a, b := *o, *p
	ra, rb := a.Reduced, b.Reduced
	a.Reduced, b.Reduced = nil, nil
	return a == b && (ra == nil) == (rb == nil) && (ra == nil || *ra == *rb)
}

// Clone returns a deep copy of o.
func (o *Optimizer) Clone() *Optimizer {
	c := *o
	if o.Reduced != nil {
		r := *o.Reduced
		c.Reduced = &r
	}
	return &c
}
