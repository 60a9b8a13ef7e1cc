package comm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// testSegment is the pipelining segment of the tests' worlds: small, so
// that modest vectors span many segments and chunks.
const testSegment = 1024

// collLengths are the vector lengths every collective is tried with in a
// world of n ranks: empty, one element, odd, n±1, and many segments.
func collLengths(n int) []int {
	return []int{0, 1, 7, max(n-1, 0), n + 1, 3*testSegment/4*n + 5}
}

// inputs returns every rank's vector of length l, drawn from seed, with
// magnitudes spread wide enough that the order of a float sum matters.
func inputs(seed uint64, n, l int) [][]float64 {
	rng := rand.New(rand.NewPCG(seed, uint64(n*1000+l)))
	x := make([][]float64, n)
	for r := range x {
		x[r] = make([]float64, l)
		for i := range x[r] {
			x[r][i] = (rng.Float64() - 0.5) * math.Pow(10, float64(rng.IntN(12)-6))
		}
	}
	return x
}

// ringSum is the serial reference of Allreduce: chunk c of the vector is
// summed starting from rank c, along the ring, as the ring algorithm does
// (the documented order that makes the result deterministic).
func ringSum[T float32 | float64 | int64](x [][]T) []T {
	n, l := len(x), len(x[0])
	out := make([]T, l)
	for c := range n {
		for i := c * l / n; i < (c+1)*l/n; i++ {
			acc := x[c][i]
			for k := 1; k < n; k++ {
				acc += x[(c+k)%n][i]
			}
			out[i] = acc
		}
	}
	return out
}

func convert[T float32 | float64 | int64](x [][]float64, f func(float64) T) [][]T {
	out := make([][]T, len(x))
	for r := range x {
		out[r] = make([]T, len(x[r]))
		for i, v := range x[r] {
			out[r][i] = f(v)
		}
	}
	return out
}

func clone2[T any](x [][]T) [][]T {
	out := make([][]T, len(x))
	for r := range x {
		out[r] = append([]T{}, x[r]...)
	}
	return out
}

// checkAllreduce runs allreduce on every rank with in[rank] and checks that
// every rank holds bitwise the reference result.
func checkAllreduce[T float32 | float64 | int64](t *testing.T, comms []*Comm, in [][]T, allreduce func(*Comm, context.Context, []T) error, bits func(T) uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	x := clone2(in)
	mustAll(t, onAll(comms, func(c *Comm) error { return allreduce(c, ctx, x[c.Rank()]) }))
	want := ringSum(in)
	for r := range x {
		for i := range want {
			if bits(x[r][i]) != bits(want[i]) {
				t.Fatalf("rank %d element %d of %d: got %v, want %v", r, i, len(want), x[r][i], want[i])
			}
		}
	}
}

func TestAllreduce(t *testing.T) { forLinks(t, testAllreduce) }

func testAllreduce(t *testing.T, unix bool) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := newWorld(t, n, worldOpts{segment: testSegment, unix: unix})
			for _, l := range collLengths(n) {
				in := inputs(1, n, l)
				t.Run(fmt.Sprintf("float32/len=%d", l), func(t *testing.T) {
					x := convert(in, func(v float64) float32 { return float32(v) })
					checkAllreduce(t, comms, x, (*Comm).AllreduceFloat32, func(v float32) uint64 { return uint64(math.Float32bits(v)) })
					// Against the plain serial sum, too: equal up to rounding.
					serial, mag := make([]float64, l), make([]float64, l)
					for r := range x {
						for i, v := range x[r] {
							serial[i] += float64(v)
							mag[i] += math.Abs(float64(v))
						}
					}
					ref := ringSum(x)
					for i := range serial {
						if d := math.Abs(float64(ref[i]) - serial[i]); d > 1e-6*float64(n)*mag[i] {
							t.Fatalf("element %d: ring %v, serial %v", i, ref[i], serial[i])
						}
					}
				})
				t.Run(fmt.Sprintf("float64/len=%d", l), func(t *testing.T) {
					checkAllreduce(t, comms, in, (*Comm).AllreduceFloat64, math.Float64bits)
				})
				t.Run(fmt.Sprintf("int64/len=%d", l), func(t *testing.T) {
					x := convert(in, func(v float64) int64 { return int64(v * (1 << 40)) })
					x[0] = append(x[0][:0:0], x[0]...)
					if l > 0 {
						x[0][0] = math.MaxInt64 // wraps, exactly, modulo 2⁶⁴
					}
					checkAllreduce(t, comms, x, (*Comm).AllreduceInt64, func(v int64) uint64 { return uint64(v) })
					// Integer sums do not depend on the order.
					ref := ringSum(x)
					for i := range l {
						var s int64
						for r := range x {
							s += x[r][i]
						}
						if ref[i] != s {
							t.Fatalf("element %d: %d != %d", i, ref[i], s)
						}
					}
				})
			}
		})
	}
}

// TestAllreduceDeterministic: two runs on two worlds give bitwise the same
// result, on every rank, with inputs for which the order of the sum shows.
func TestAllreduceDeterministic(t *testing.T) {
	const n, l = 5, 50_000
	in := convert(inputs(7, n, l), func(v float64) float32 { return float32(v) })
	// Two runs over TCP links and two over Unix sockets with shared
	// memory: the links must not change a bit either.
	var runs [4][][]float32
	for run := range runs {
		comms := newWorld(t, n, worldOpts{segment: 4096, unix: run >= 2})
		x := clone2(in)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		mustAll(t, onAll(comms, func(c *Comm) error { return c.AllreduceFloat32(ctx, x[c.Rank()]) }))
		cancel()
		runs[run] = x
	}
	for run, x := range runs {
		for r := range x {
			for i := range x[r] {
				if math.Float32bits(x[r][i]) != math.Float32bits(runs[0][0][i]) {
					t.Fatalf("run %d rank %d element %d: %v, run 0 rank 0: %v", run, r, i, x[r][i], runs[0][0][i])
				}
			}
		}
	}
	// The inputs are such that another order of the sum gives other bits,
	// so the check above is not vacuous.
	differs := false
	for i := range l {
		var s float32
		for r := n - 1; r >= 0; r-- {
			s += in[r][i]
		}
		differs = differs || math.Float32bits(s) != math.Float32bits(runs[0][0][i])
	}
	if !differs {
		t.Fatal("the inputs do not exercise the order of the sum")
	}
}

func TestBroadcast(t *testing.T) {
	sizes := []int{0, 1, 1000, bcastTreeMax, bcastTreeMax + 1, 700_003}
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := newWorld(t, n, worldOpts{segment: 64 << 10})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, size := range sizes {
				for root := range n {
					data := pattern(root+size, size)
					got := make([][]byte, n)
					mustAll(t, onAll(comms, func(c *Comm) error {
						var b []byte
						if c.Rank() == root {
							b = data
						}
						var err error
						got[c.Rank()], err = c.Broadcast(ctx, root, b)
						return err
					}))
					for r, g := range got {
						if !bytes.Equal(g, data) {
							t.Fatalf("size %d root %d: rank %d got %d bytes, wrong", size, root, r, len(g))
						}
					}
				}
			}
		})
	}
}

func TestAllgather(t *testing.T) {
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := newWorld(t, n, worldOpts{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, base := range []int{0, 1, 1000, 300_000} {
				size := func(r int) int { return base * (r % 3) / 2 } // some ranks send nothing
				got := make([][][]byte, n)
				mustAll(t, onAll(comms, func(c *Comm) error {
					mine := pattern(c.Rank(), size(c.Rank()))
					var err error
					got[c.Rank()], err = c.Allgather(ctx, mine)
					return err
				}))
				for r := range n {
					if len(got[r]) != n {
						t.Fatalf("rank %d got %d blocks", r, len(got[r]))
					}
					for from, b := range got[r] {
						if !bytes.Equal(b, pattern(from, size(from))) {
							t.Fatalf("base %d: rank %d's block from rank %d is wrong (%d bytes)", base, r, from, len(b))
						}
					}
				}
			}
		})
	}
}

func TestBarrier(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			comms := newWorld(t, n, worldOpts{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			const rounds = 20
			var arrived [rounds]atomic.Int32
			mustAll(t, onAll(comms, func(c *Comm) error {
				for i := range rounds {
					arrived[i].Add(1)
					if err := c.Barrier(ctx); err != nil {
						return err
					}
					if got := arrived[i].Load(); got != int32(n) {
						return fmt.Errorf("round %d: left the barrier when %d of %d had arrived", i, got, n)
					}
				}
				return nil
			}))
		})
	}
}

// TestCollectivesMixed runs every collective back to back on the same links,
// with point-to-point traffic in between, which must not mix with them.
func TestCollectivesMixed(t *testing.T) {
	for _, unix := range []bool{false, true} {
		t.Run(fmt.Sprintf("unix=%v", unix), func(t *testing.T) { testCollectivesMixed(t, unix) })
	}
}

func testCollectivesMixed(t *testing.T, unix bool) {
	const n = 4
	comms := newWorld(t, n, worldOpts{segment: testSegment, unix: unix})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mustAll(t, onAll(comms, func(c *Comm) error {
		next, prev := (c.Rank()+1)%n, (c.Rank()+n-1)%n
		for i := range 10 {
			if err := c.Send(ctx, next, pattern(i, 5000)); err != nil {
				return err
			}
			x := []int64{int64(c.Rank()), 1, int64(i)}
			if err := c.AllreduceInt64(ctx, x); err != nil {
				return err
			}
			if x[0] != n*(n-1)/2 || x[1] != n || x[2] != int64(n*i) {
				return fmt.Errorf("allreduce %v", x)
			}
			b, err := c.Broadcast(ctx, i%n, []byte(fmt.Sprint(i)))
			if err != nil || string(b) != fmt.Sprint(i) {
				return fmt.Errorf("broadcast %q, %v", b, err)
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			all, err := c.Allgather(ctx, []byte{byte(c.Rank())})
			if err != nil {
				return err
			}
			for r, b := range all {
				if len(b) != 1 || b[0] != byte(r) {
					return fmt.Errorf("allgather %v", all)
				}
			}
			m, err := c.Recv(ctx, prev)
			if err != nil || !bytes.Equal(m, pattern(i, 5000)) {
				return fmt.Errorf("recv: %d bytes, %v", len(m), err)
			}
		}
		return nil
	}))
}

// TestCollectiveMismatch: ranks that disagree fail, instead of hanging or
// computing garbage.
func TestCollectiveMismatch(t *testing.T) {
	tests := []struct {
		name string
		f    func(c *Comm, ctx context.Context) error
	}{
		{"different collectives", func(c *Comm, ctx context.Context) error {
			if c.Rank() == 1 {
				return c.Barrier(ctx)
			}
			return c.AllreduceFloat64(ctx, make([]float64, 10))
		}},
		{"different lengths", func(c *Comm, ctx context.Context) error {
			return c.AllreduceFloat32(ctx, make([]float32, 10+c.Rank()/2))
		}},
		{"different types", func(c *Comm, ctx context.Context) error {
			if c.Rank() == 2 {
				return c.AllreduceInt64(ctx, make([]int64, 10))
			}
			return c.AllreduceFloat64(ctx, make([]float64, 10))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			comms := newWorld(t, 3, worldOpts{log: io.Discard})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errs := within(t, 10*time.Second, func() []error {
				return onAll(comms, func(c *Comm) error { return tt.f(c, ctx) })
			})
			for r, err := range errs {
				if err == nil {
					t.Errorf("rank %d: no error", r)
				}
			}
			// The world's collectives are done for; point-to-point works.
			if err := comms[0].Barrier(ctx); err == nil {
				t.Error("a collective succeeded after a failed one")
			}
			if err := comms[0].Send(ctx, 1, []byte("ok")); err != nil {
				t.Fatal(err)
			}
			if b, err := comms[1].Recv(ctx, 0); err != nil || string(b) != "ok" {
				t.Fatalf("Recv = %q, %v", b, err)
			}
		})
	}
}

// TestWorldOfOne: the collectives of a single rank are local.
func TestWorldOfOne(t *testing.T) {
	c, err := NewComm(context.Background(), CommConfig{Rank: 0, Size: 1, Job: "j", Key: testKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	x := []float32{1, 2, 3}
	if err := c.AllreduceFloat32(ctx, x); err != nil || x[2] != 3 {
		t.Fatalf("Allreduce: %v %v", x, err)
	}
	if b, err := c.Broadcast(ctx, 0, []byte("b")); err != nil || string(b) != "b" {
		t.Fatalf("Broadcast: %q %v", b, err)
	}
	if all, err := c.Allgather(ctx, []byte("g")); err != nil || len(all) != 1 || string(all[0]) != "g" {
		t.Fatalf("Allgather: %q %v", all, err)
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Rank() != 0 || c.Size() != 1 || c.Epoch() != 0 {
		t.Fatal("accessors")
	}
	if err := c.Send(ctx, 0, nil); err == nil {
		t.Fatal("Send to self succeeded")
	}
}

func TestConfigErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, cfg := range []CommConfig{
		{Rank: 0, Size: 0},
		{Rank: 2, Size: 2, Addrs: []string{"a", "b"}},
		{Rank: 0, Size: 2, Addrs: []string{"a"}},
		{Rank: 0, Size: 2, Addrs: []string{"a", "b"}}, // no listener
	} {
		if c, err := NewComm(context.Background(), cfg); err == nil {
			c.Close()
			t.Errorf("NewComm(%+v) succeeded", cfg)
		}
	}
}

func TestReduceKernels(t *testing.T) {
	for _, l := range []int{0, 1, 3, 4, 5, 7, 8, 9, 17, 64} {
		a, b := make([]float32, l), make([]float32, l)
		c, d := make([]int64, l), make([]int64, l)
		e, f := make([]float64, l), make([]float64, l)
		for i := range l {
			a[i], b[i] = float32(i), float32(2*i)
			c[i], d[i] = int64(i), int64(3*i)
			e[i], f[i] = float64(i), 0.5
		}
		add(a, b)
		add(c, d)
		add(e, f)
		for i := range l {
			if a[i] != float32(3*i) || c[i] != int64(4*i) || e[i] != float64(i)+0.5 {
				t.Fatalf("len %d element %d: %v %v %v", l, i, a[i], c[i], e[i])
			}
		}
	}
}

// forLinks runs test over TCP links (ranks of different hosts) and over
// Unix sockets with shared-memory rings (ranks of one host).
func forLinks(t *testing.T, test func(t *testing.T, unix bool)) {
	for _, unix := range []bool{false, true} {
		name := "link=tcp"
		if unix {
			name = "link=unix"
		}
		t.Run(name, func(t *testing.T) { test(t, unix) })
	}
}
