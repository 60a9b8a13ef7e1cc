package wire_test

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// bySlot returns the ranks of host h when hosts×per ranks are mapped by
// slot: h*per, h*per+1, ….
func bySlot(h, per int) []int {
	r := make([]int, per)
	for l := range r {
		r[l] = h*per + l
	}
	return r
}

// byNode returns the ranks of host h when ranks are dealt round robin over
// hosts: h, h+hosts, h+2*hosts, ….
func byNode(h, hosts, per int) []int {
	r := make([]int, per)
	for l := range r {
		r[l] = h + l*hosts
	}
	return r
}

// rr is a RankRange, short enough for tables.
func rr(first, count, stride int) wire.RankRange {
	return wire.RankRange{First: first, Count: count, Stride: stride}
}

func TestCompressRanks(t *testing.T) {
	tests := []struct {
		name  string
		ranks []int
		world int
		want  wire.RankSet // nil: do not check the exact ranges
	}{
		{"empty", nil, 1, nil},
		{"single", []int{7}, 8, wire.RankSet{{First: 7, Count: 1, Stride: 1}}},
		{"slot-like", bySlot(3, 8), 32, wire.RankSet{{First: 24, Count: 8, Stride: 1}}},
		{"node-like", byNode(5, 1024, 8), 8192, wire.RankSet{{First: 5, Count: 8, Stride: 1024}}},
		{"pair", []int{0, 10}, 11, wire.RankSet{{First: 0, Count: 2, Stride: 10}}},
		{"irregular", []int{5, 1, 2, 3, 9}, 10, wire.RankSet{
			{First: 5, Count: 1, Stride: 1},
			{First: 1, Count: 3, Stride: 1},
			{First: 9, Count: 1, Stride: 1},
		}},
		{"descending", []int{3, 2, 1}, 4, wire.RankSet{
			{First: 3, Count: 1, Stride: 1},
			{First: 2, Count: 1, Stride: 1},
			{First: 1, Count: 1, Stride: 1},
		}},
		{"two strides", []int{0, 1, 2, 3, 5, 7, 9}, 10, wire.RankSet{
			{First: 0, Count: 4, Stride: 1},
			{First: 5, Count: 3, Stride: 2},
		}},
		{"zero", []int{0}, 1, wire.RankSet{{First: 0, Count: 1, Stride: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := wire.CompressRanks(tc.ranks)
			if tc.want != nil && !reflect.DeepEqual(s, tc.want) {
				t.Errorf("CompressRanks(%v) = %v, want %v", tc.ranks, s, tc.want)
			}
			if s.Len() != len(tc.ranks) {
				t.Errorf("Len() = %d, want %d", s.Len(), len(tc.ranks))
			}
			got, err := s.Expand(tc.world)
			if err != nil {
				t.Fatalf("Expand(%d) of %v: %v", tc.world, s, err)
			}
			if !slices.Equal(got, tc.ranks) {
				t.Errorf("Expand(%d) = %v, want %v", tc.world, got, tc.ranks)
			}
		})
	}
}

// TestCompressRanksRandom round-trips random subsets of a world in random
// orders, sorted and shuffled.
func TestCompressRanksRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		world := 1 + rng.IntN(200)
		ranks := rng.Perm(world)[:rng.IntN(world+1)]
		if i%2 == 0 {
			slices.Sort(ranks)
		}
		s := wire.CompressRanks(ranks)
		got, err := s.Expand(world)
		if err != nil {
			t.Fatalf("Expand(%d) of CompressRanks(%v) = %v: %v", world, ranks, s, err)
		}
		if !slices.Equal(got, ranks) {
			t.Fatalf("CompressRanks(%v) = %v expands to %v", ranks, s, got)
		}
		for _, r := range s {
			if r.Count < 1 || r.Stride < 1 {
				t.Fatalf("CompressRanks(%v) made range %v", ranks, r)
			}
		}
	}
}

func TestExpandRejects(t *testing.T) {
	const big = math.MaxInt/2 + 1 // 1<<62 on 64-bit platforms
	tests := []struct {
		name  string
		set   wire.RankSet
		world int
	}{
		{"more ranks than world", wire.RankSet{rr(0, 4, 1), rr(0, 4, 1)}, 6},
		{"negative first", wire.RankSet{rr(-1, 2, 1)}, 8},
		{"zero count", wire.RankSet{rr(0, 0, 1)}, 8},
		{"negative count", wire.RankSet{rr(0, -3, 1)}, 8},
		{"zero stride", wire.RankSet{rr(0, 2, 0)}, 8},
		{"zero stride single", wire.RankSet{rr(0, 1, 0)}, 8},
		{"negative stride", wire.RankSet{rr(5, 2, -1)}, 8},
		{"first is world", wire.RankSet{rr(8, 1, 1)}, 8},
		{"last is world", wire.RankSet{rr(0, 5, 2)}, 8},
		{"second range past world", wire.RankSet{rr(0, 2, 1), rr(6, 3, 1)}, 8},
		{"empty world", wire.RankSet{rr(0, 1, 1)}, 0},
		{"negative world", wire.RankSet{rr(0, 1, 1)}, -1},
		{"overflowing last rank", wire.RankSet{rr(1, big, big)}, 8},
		{"overflowing last rank, huge world", wire.RankSet{rr(1, big, big)}, math.MaxInt},
		{"stride overflows", wire.RankSet{rr(1, 2, math.MaxInt)}, math.MaxInt},
		{"count overflows total", wire.RankSet{rr(0, 1, 1), rr(0, math.MaxInt, 1)}, 10},
		{"count overflows total, huge world", wire.RankSet{rr(0, 1, 1), rr(1, math.MaxInt, 1)}, math.MaxInt},
		{"first max int", wire.RankSet{rr(math.MaxInt, 1, 1)}, math.MaxInt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			got, err := tc.set.Expand(tc.world)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, wire.ErrBadRankSet) {
				t.Fatalf("Expand(%d) of %v = %v, %v; want ErrBadRankSet", tc.world, tc.set, got, err)
			}
			if got != nil {
				t.Errorf("Expand returned %v with its error", got)
			}
			// Other goroutines may allocate a little; a range expanded
			// before its check would allocate gigabytes.
			if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
				t.Errorf("rejecting %v allocated %d bytes", tc.set, d)
			}
		})
	}
}

// TestExpandDoesNotCheckDuplicates pins down the split of duties: Expand
// checks bounds and the count, EpochTable.Validate checks duplicates.
func TestExpandDoesNotCheckDuplicates(t *testing.T) {
	s := wire.RankSet{rr(0, 3, 1), rr(0, 3, 1)}
	got, err := s.Expand(6)
	if err != nil || !slices.Equal(got, []int{0, 1, 2, 0, 1, 2}) {
		t.Fatalf("Expand(6) of %v = %v, %v", s, got, err)
	}
}

func TestExpandEmpty(t *testing.T) {
	for _, s := range []wire.RankSet{nil, {}} {
		got, err := s.Expand(0)
		if err != nil || len(got) != 0 {
			t.Errorf("Expand(0) of %#v = %v, %v; want no ranks", s, got, err)
		}
	}
}

func TestRankRangeJSON(t *testing.T) {
	r := wire.RankRange{First: 5, Count: 8, Stride: 1024}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "[5,8,1024]" {
		t.Errorf("Marshal(%v) = %s, want [5,8,1024]", r, b)
	}
	var got wire.RankRange
	if err := json.Unmarshal(b, &got); err != nil || got != r {
		t.Errorf("Unmarshal(%s) = %v, %v; want %v", b, got, err, r)
	}
	for _, in := range []string{`{"First":1}`, `[1,2,"x"]`, `[1.5,1,1]`, `"1,2,3"`} {
		if err := json.Unmarshal([]byte(in), &got); err == nil {
			t.Errorf("Unmarshal(%s) succeeded with %v", in, got)
		}
	}
}
