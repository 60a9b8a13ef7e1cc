package wire

import (
	"encoding/json"
	"errors"
	"fmt"
)

// RankRange is the arithmetic sequence First, First+Stride, … of Count ranks.
// It encodes in JSON as [first,count,stride] so a table of thousands of
// ranks mapped by slot or by node stays a few bytes per host.
type RankRange struct {
	First, Count, Stride int
}

// MarshalJSON encodes r as [first,count,stride].
func (r RankRange) MarshalJSON() ([]byte, error) {
	return json.Marshal([3]int{r.First, r.Count, r.Stride})
}

// UnmarshalJSON decodes [first,count,stride].
func (r *RankRange) UnmarshalJSON(b []byte) error {
	var a [3]int
	if err := json.Unmarshal(b, &a); err != nil {
		return fmt.Errorf("wire: rank range: %w", err)
	}
	r.First, r.Count, r.Stride = a[0], a[1], a[2]
	return nil
}

// RankSet is an ordered list of ranks stored as ranges.
type RankSet []RankRange

// CompressRanks encodes ranks, in the order given, as a RankSet.
func CompressRanks(ranks []int) RankSet {
	var s RankSet
	for i := 0; i < len(ranks); {
		r := RankRange{First: ranks[i], Count: 1, Stride: 1}
		if i+1 < len(ranks) && ranks[i+1] > ranks[i] {
			r.Stride = ranks[i+1] - ranks[i]
			j := i + 1
			for j < len(ranks) && ranks[j] == ranks[j-1]+r.Stride {
				j++
			}
			r.Count = j - i
		}
		s = append(s, r)
		i += r.Count
	}
	return s
}

// Len is the number of ranks in s; it does not validate s.
func (s RankSet) Len() int {
	n := 0
	for _, r := range s {
		n += r.Count
	}
	return n
}

// ErrBadRankSet reports a rank set that is malformed or out of range.
var ErrBadRankSet = errors.New("wire: bad rank set")

// check validates every range of s against world without expanding it.
func (s RankSet) check(world int) error {
	for _, r := range s {
		if r.Count < 1 || r.Stride < 1 || r.First < 0 {
			return fmt.Errorf("%w: range %v", ErrBadRankSet, [3]int{r.First, r.Count, r.Stride})
		}
		// last = First + (Count-1)*Stride must be < world, without overflow.
		if r.First >= world || (r.Count-1) > (world-1-r.First)/r.Stride {
			return fmt.Errorf("%w: range %v exceeds world size %d", ErrBadRankSet, [3]int{r.First, r.Count, r.Stride}, world)
		}
	}
	return nil
}

// Expand returns the ranks of s in order, checking that every rank is in
// [0, world) and that s holds at most world ranks.
func (s RankSet) Expand(world int) ([]int, error) {
	if err := s.check(world); err != nil {
		return nil, err
	}
	total := 0
	for _, r := range s {
		if r.Count > world-total { // never overflows: 0 <= total <= world
			return nil, fmt.Errorf("%w: more than %d ranks", ErrBadRankSet, world)
		}
		total += r.Count
	}
	out := make([]int, 0, total)
	for _, r := range s {
		for k := 0; k < r.Count; k++ {
			out = append(out, r.First+k*r.Stride)
		}
	}
	return out, nil
}
