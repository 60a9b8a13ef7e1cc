package topology

import (
	"errors"
	"fmt"
)

// ErrBadLayout: a parallel layout that does not fit the world (sizes
// below 1, or TP × PP not dividing the number of ranks).
var ErrBadLayout = errors.New("topology: bad parallel layout")

// Layout is a 3D-parallel layout of a world of ranks: World = TP × PP × DP,
// numbered in Megatron-LM's order, tensor-parallel index fastest, then
// data-parallel, then pipeline:
//
//	rank = tp + TP·(dp + DP·pp)
//
// so a tensor-parallel group is TP consecutive ranks (one host's GPUs,
// under the usual mapping by slot), and the ranks that hold the same model
// shard (equal tp and pp) form a data-parallel group.
type Layout struct {
	TP, PP, DP int
}

// Coord is a rank's position in a Layout.
type Coord struct {
	TP, PP, DP int
}

// NewLayout returns the layout of world ranks with tensor-parallel size tp
// and pipeline-parallel size pp; DP = world / (tp·pp). The error, wrapping
// ErrBadLayout, says what does not fit.
func NewLayout(world, tp, pp int) (Layout, error) {
	switch {
	case world < 1:
		return Layout{}, fmt.Errorf("%w: %d ranks", ErrBadLayout, world)
	case tp < 1:
		return Layout{}, fmt.Errorf("%w: tensor-parallel size %d; need at least 1", ErrBadLayout, tp)
	case pp < 1:
		return Layout{}, fmt.Errorf("%w: pipeline-parallel size %d; need at least 1", ErrBadLayout, pp)
	case tp > world || pp > world || tp*pp > world:
		return Layout{}, fmt.Errorf("%w: tensor-parallel %d × pipeline-parallel %d is more than the %d ranks", ErrBadLayout, tp, pp, world)
	case world%(tp*pp) != 0:
		return Layout{}, fmt.Errorf("%w: %d ranks are not a multiple of tensor-parallel %d × pipeline-parallel %d = %d", ErrBadLayout, world, tp, pp, tp*pp)
	}
	return Layout{TP: tp, PP: pp, DP: world / (tp * pp)}, nil
}

// World is the number of ranks, TP × PP × DP.
func (l Layout) World() int { return l.TP * l.PP * l.DP }

// Coord returns rank's coordinate. rank must be in [0, World()).
func (l Layout) Coord(rank int) Coord {
	return Coord{TP: rank % l.TP, DP: rank / l.TP % l.DP, PP: rank / (l.TP * l.DP)}
}

// Rank is the rank at c, the inverse of Coord.
func (l Layout) Rank(c Coord) int { return c.TP + l.TP*(c.DP+l.DP*c.PP) }

// DPGroup returns the data-parallel group of rank, in data-parallel
// order: the ranks with rank's tp and pp, the ring along which its
// optimizer shard is replicated (DEADPOOL §V-B).
func (l Layout) DPGroup(rank int) []int {
	c := l.Coord(rank)
	g := make([]int, l.DP)
	for d := range g {
		c.DP = d
		g[d] = l.Rank(c)
	}
	return g
}

// DPGroups returns every data-parallel group, indexed by pp·TP + tp.
func (l Layout) DPGroups() [][]int {
	gs := make([][]int, 0, l.TP*l.PP)
	for pp := range l.PP {
		for tp := range l.TP {
			gs = append(gs, l.DPGroup(l.Rank(Coord{TP: tp, PP: pp})))
		}
	}
	return gs
}

func (l Layout) String() string {
	return fmt.Sprintf("tp=%d pp=%d dp=%d", l.TP, l.PP, l.DP)
}
