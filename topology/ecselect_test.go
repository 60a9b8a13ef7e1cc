package topology

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// ecRefSelect is SelectDataNodes by brute force: for each data group in
// order, the overlap with every node computed directly, the best untaken
// node by overlap then index.
func ecRefSelect(origin []int, k int) []int {
	w := 0
	for _, c := range origin {
		w += c
	}
	size := w / k
	taken := make([]bool, len(origin))
	var data []int
	for j := range k {
		lo, hi := j*size, (j+1)*size
		best, bestOv := -1, -1
		start := 0
		for i, c := range origin {
			ov := max(0, min(start+c, hi)-max(start, lo))
			start += c
			if !taken[i] && ov > bestOv {
				best, bestOv = i, ov
			}
		}
		taken[best] = true
		data = append(data, best)
	}
	return data
}

// ecSelectCases are the table cases of SelectDataNodes; they seed
// FuzzSelectDataNodes too. want nil means an error containing msg.
var ecSelectCases = []struct {
	name   string
	origin []int
	k      int
	want   []int
	msg    string
}{
	{"Fig. 9", []int{2, 2, 2}, 2, []int{0, 2}, ""},
	{"Fig. 6", []int{1, 1, 1, 1}, 2, []int{0, 2}, ""},
	{"k = n, one worker per node", []int{1, 1, 1, 1, 1}, 5, []int{0, 1, 2, 3, 4}, ""},
	{"k = n, uneven", []int{3, 1, 1, 3}, 4, []int{0, 1, 2, 3}, ""},
	{"k = 1", []int{1, 5, 2}, 1, []int{1}, ""},
	{"one node with all workers", []int{0, 0, 6, 0}, 2, []int{2, 0}, ""},
	{"one node with all workers, k = n", []int{4, 0, 0, 0}, 4, []int{0, 1, 2, 3}, ""},
	{"tie goes to the lower node", []int{2, 2}, 1, []int{0}, ""},
	{"best node taken: next best", []int{1, 4, 1}, 2, []int{1, 2}, ""},
	{"empty nodes between", []int{0, 3, 0, 3, 0}, 3, []int{1, 3, 0}, ""},
	{"uneven", []int{3, 1, 4, 1, 5, 9, 2, 5}, 3, []int{2, 5, 7}, ""},
	{"k > n, W divisible by k", []int{1, 7}, 4, nil, "k = 4 data nodes but only 2 nodes"},
	{"k = 0", []int{1, 1}, 0, nil, "k = 0 data nodes; need at least 1"},
	{"k < 0", []int{1, 1}, -3, nil, "k = -3 data nodes"},
	{"k > n", []int{2, 2}, 3, nil, "k = 3 data nodes but only 2 nodes"},
	{"no nodes", nil, 1, nil, "k = 1 data nodes but only 0 nodes"},
	{"W = 0", []int{0, 0, 0}, 1, nil, "the 3 nodes have no workers"},
	{"W % k != 0", []int{2, 1, 2}, 2, nil, "5 workers cannot be cut into 2 equal data groups"},
	{"negative count", []int{2, -1, 3}, 2, nil, "node 1 has -1 workers"},
	{"overflow", []int{math.MaxInt, 1}, 1, nil, "overflows at node 1"},
}

func TestSelectDataNodes(t *testing.T) {
	for _, tt := range ecSelectCases {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SelectDataNodes(tt.origin, tt.k)
			if tt.want == nil {
				if err == nil || !errors.Is(err, ErrECGroups) || !strings.Contains(err.Error(), tt.msg) {
					t.Fatalf("SelectDataNodes = %v, %v; want ErrECGroups containing %q", got, err, tt.msg)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("SelectDataNodes = %v, %v; want %v", got, err, tt.want)
			}
			if ref := ecRefSelect(tt.origin, tt.k); !slices.Equal(got, ref) {
				t.Fatalf("reference disagrees: %v", ref)
			}
		})
	}
}

// TestSelectDataNodesRandom compares SelectDataNodes with the brute-force
// reference on seeded random inputs, uneven and with empty nodes.
func TestSelectDataNodesRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 88544))
	shapes := []struct {
		name          string
		maxN, maxSize int
		zeros         bool
	}{
		{"small", 6, 4, false},
		{"small with empty nodes", 6, 4, true},
		{"medium", 40, 10, false},
		{"wide", 200, 3, true},
		{"big nodes", 12, 100, false},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			for iter := range 2000 {
				n := 1 + rng.IntN(sh.maxN)
				origin := make([]int, n)
				w := 0
				for i := range origin {
					lo := 1
					if sh.zeros && rng.IntN(3) == 0 {
						lo = 0
					}
					origin[i] = lo + rng.IntN(sh.maxSize)
					if lo == 0 && rng.IntN(2) == 0 {
						origin[i] = 0
					}
					w += origin[i]
				}
				if w == 0 {
					origin[0], w = 1, 1
				}
				var ks []int // every valid k
				for k := 1; k <= n; k++ {
					if w%k == 0 {
						ks = append(ks, k)
					}
				}
				if rng.IntN(3) == 0 { // make k = n or another large k valid
					k := 1 + rng.IntN(n)
					origin[n-1] += (k - w%k) % k
					w = (w + k - 1) / k * k
					ks = []int{k}
				}
				k := ks[rng.IntN(len(ks))]
				got, err := SelectDataNodes(origin, k)
				want := ecRefSelect(origin, k)
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("iter %d: SelectDataNodes(%v, %d) = %v, %v; reference %v", iter, origin, k, got, err, want)
				}
			}
		})
	}
}

// ecDecodeOrigin turns fuzz bytes into worker counts (-128..127).
func ecDecodeOrigin(data []byte) []int {
	origin := make([]int, len(data))
	for i, b := range data {
		origin[i] = int(int8(b))
	}
	return origin
}

// FuzzSelectDataNodes checks that SelectDataNodes never panics and, when
// it succeeds, returns k distinct nodes in range, the brute-force
// reference's answer.
func FuzzSelectDataNodes(f *testing.F) {
	for _, tt := range ecSelectCases {
		var data []byte
		ok := true
		for _, c := range tt.origin {
			if c < math.MinInt8 || c > math.MaxInt8 {
				ok = false
			}
			data = append(data, byte(int8(c)))
		}
		if ok {
			f.Add(data, tt.k)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, k int) {
		if len(data) > 512 {
			data = data[:512]
		}
		origin := ecDecodeOrigin(data)
		got, err := SelectDataNodes(origin, k)
		if err != nil {
			if !errors.Is(err, ErrECGroups) {
				t.Fatalf("error %q does not wrap ErrECGroups", err)
			}
			return
		}
		if len(got) != k {
			t.Fatalf("%d nodes, want %d", len(got), k)
		}
		seen := make([]bool, len(origin))
		for _, i := range got {
			if i < 0 || i >= len(origin) || seen[i] {
				t.Fatalf("nodes %v: %d out of range or repeated", got, i)
			}
			seen[i] = true
		}
		if want := ecRefSelect(origin, k); !slices.Equal(got, want) {
			t.Fatalf("SelectDataNodes(%v, %d) = %v; reference %v", origin, k, got, want)
		}
	})
}
