package keeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/crc32c"
)

// ecStripe is a stripe of K members' states and its M parity rows, the
// parity built as the parity hosts build it: each member's shares
// (ckpt.Codec.Share) XORed into the rows (ckpt.Accumulate).
type ecStripe struct {
	k, m    int
	codec   *ckpt.Codec
	regions []map[string][]byte // by member: region bytes by name
	tables  [][]tableEntry      // by member, in shard order
	shards  [][]byte            // data members (their own length), then parity rows (L)
	L       int64
}

// newECStripe builds a stripe whose member x has the regions of sizes(x)
// (named "optimizer", "meta", "extra", in that order), of random bytes.
func newECStripe(t testing.TB, k, m int, sizes func(x int) []int64) *ecStripe {
	t.Helper()
	codec, err := ckpt.NewCodec(k, m)
	if err != nil {
		t.Fatal(err)
	}
	st := &ecStripe{k: k, m: m, codec: codec, shards: make([][]byte, k+m)}
	names := []string{"optimizer", "meta", "extra"}
	rng := rand.New(rand.NewPCG(uint64(k), uint64(m)))
	for x := range k {
		regs := map[string][]byte{}
		var tbl []tableEntry
		var shard []byte
		for i, n := range sizes(x) {
			b := make([]byte, n)
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			regs[names[i]] = b
			tbl = append(tbl, tableEntry{name: names[i], size: n, sum: crc32c.Checksum(b)})
			shard = append(shard, b...)
		}
		st.regions = append(st.regions, regs)
		st.tables = append(st.tables, tbl)
		st.shards[x] = shard
		st.L = max(st.L, int64(len(shard)))
	}
	for j := range m {
		st.shards[k+j] = make([]byte, st.L)
	}
	for x := range k {
		shares := make([][]byte, m)
		for j := range shares {
			shares[j] = make([]byte, len(st.shards[x]))
		}
		if err := codec.Share(st.shards[x], x, shares); err != nil {
			t.Fatal(err)
		}
		for j := range m {
			ckpt.Accumulate(st.shards[k+j], shares[j])
		}
	}
	return st
}

// unequalSizes: members of different lengths, regions of odd sizes.
func unequalSizes(x int) []int64 { return []int64{int64(2999 + 1237*x), int64(17 + 6*x)} }

// memSource is a shard in memory, which can damage what it serves,
// fail, or block until its read's context ends.
type memSource struct {
	b      []byte
	flips  []int64 // bytes of the shard served with 0x5a XORed in
	failAt int32   // from this call on (1-based), readShard fails; 0: never
	// blockAt: from this call on, readShard signals blocked and waits
	// for its context to end.
	blockAt int32
	blocked chan struct{}
	calls   atomic.Int32
	active  *atomic.Int32 // reads under way, over every source of a decode
}

var errTestSource = errors.New("test source fails")

func (s *memSource) readShard(ctx context.Context, off int64, dst []byte) error {
	if s.active != nil {
		s.active.Add(1)
		defer s.active.Add(-1)
	}
	c := s.calls.Add(1)
	if s.blockAt > 0 && c >= s.blockAt {
		select {
		case s.blocked <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
	if s.failAt > 0 && c >= s.failAt {
		return fmt.Errorf("read %d: %w", c, errTestSource)
	}
	n := 0
	if off < int64(len(s.b)) {
		n = copy(dst, s.b[off:])
	}
	clear(dst[n:])
	for _, f := range s.flips {
		if f >= off && f < off+int64(len(dst)) {
			dst[f-off] ^= 0x5a
		}
	}
	return nil
}

// sources returns the stripe's shards as memSources, without those in
// unavailable; mod, if not nil, changes each before use.
func (st *ecStripe) sources(unavailable []int, active *atomic.Int32, mod func(i int, s *memSource)) ([]shardSource, []*memSource) {
	srcs := make([]shardSource, st.k+st.m)
	mems := make([]*memSource, st.k+st.m)
	for i, b := range st.shards {
		if slices.Contains(unavailable, i) {
			continue
		}
		s := &memSource{b: b, active: active}
		if mod != nil {
			mod(i, s)
		}
		srcs[i], mems[i] = s, s
	}
	return srcs, mems
}

// views returns staged views for member x's regions, filled with a
// pattern the decode must overwrite.
func (st *ecStripe) views(x int) map[string][]byte {
	v := map[string][]byte{}
	for name, b := range st.regions[x] {
		v[name] = bytes.Repeat([]byte{0xee}, len(b))
	}
	return v
}

// decode rebuilds member x from srcs and checks that no read is left
// running when it returns.
func (st *ecStripe) decode(t *testing.T, ctx context.Context, x int, srcs []shardSource, active *atomic.Int32, chunk int) (map[string][]byte, error) {
	t.Helper()
	views := st.views(x)
	err := decodeMember(ctx, ecDecode{codec: st.codec, lost: x, shard: st.L, sources: srcs, table: st.tables[x], views: views, chunk: chunk})
	if n := active.Load(); n != 0 {
		t.Fatalf("member %d: %d reads still running after the decode returned", x, n)
	}
	return views, err
}

// same reports whether views hold member x's regions bitwise.
func (st *ecStripe) same(x int, views map[string][]byte) error {
	for name, b := range st.regions[x] {
		if !bytes.Equal(views[name], b) {
			i := 0
			for i < len(b) && views[name][i] == b[i] {
				i++
			}
			return fmt.Errorf("member %d region %q differs from byte %d of %d", x, name, i, len(b))
		}
	}
	return nil
}

// subsets calls f with every subset of {0..n-1} of size lo..hi.
func subsets(n, lo, hi int, f func(s []int)) {
	var rec func(start int, s []int)
	rec = func(start int, s []int) {
		if len(s) >= lo && len(s) <= hi {
			f(s)
		}
		if len(s) == hi {
			return
		}
		for i := start; i < n; i++ {
			rec(i+1, append(s, i))
		}
	}
	rec(0, nil)
}

// TestECDecodeEverySubset: for each code, every set of at most M
// unavailable shards, each data member among them is rebuilt bitwise from
// the others; with M+1 unavailable, the decode fails with
// ErrUnrecoverable. Members of unequal lengths, regions of odd sizes,
// chunks smaller than the regions and not dividing them, and larger.
func TestECDecodeEverySubset(t *testing.T) {
	for _, c := range []struct{ k, m int }{{2, 1}, {2, 2}, {4, 2}, {8, 4}} {
		for _, chunk := range []int{1000, 1 << 20} {
			t.Run(fmt.Sprintf("%d+%d/chunk=%d", c.k, c.m, chunk), func(t *testing.T) {
				st := newECStripe(t, c.k, c.m, unequalSizes)
				var active atomic.Int32
				ctx := context.Background()
				decoded, refused := 0, 0
				subsets(c.k+c.m, 1, c.m+1, func(gone []int) {
					srcs, _ := st.sources(gone, &active, nil)
					for _, x := range gone {
						if x >= c.k {
							continue
						}
						views, err := st.decode(t, ctx, x, srcs, &active, chunk)
						if len(gone) <= c.m {
							if err != nil {
								t.Fatalf("shards %v unavailable: member %d: %v", gone, x, err)
							}
							if err := st.same(x, views); err != nil {
								t.Fatalf("shards %v unavailable: %v", gone, err)
							}
							decoded++
						} else {
							if !errors.Is(err, ErrUnrecoverable) {
								t.Fatalf("shards %v unavailable: member %d: got %v, want ErrUnrecoverable", gone, x, err)
							}
							refused++
						}
					}
				})
				t.Logf("%d decodes bitwise, %d refused", decoded, refused)
			})
		}
	}
}

// TestECDecodeDamagedSource: a source that serves wrong bytes is stepped
// around by another K-subset, region by region, and the result is still
// bitwise right; when every usable subset has a damaged source, the
// decode fails with ErrUnrecoverable.
func TestECDecodeDamagedSource(t *testing.T) {
	const k, m = 4, 2
	st := newECStripe(t, k, m, unequalSizes)
	optLen := int64(len(st.regions[0]["optimizer"]))
	p0, p1 := k, k+1
	for _, c := range []struct {
		name  string
		gone  []int           // unavailable besides member 0, the lost one
		flips map[int][]int64 // source → damaged bytes of its shard
		ok    bool
	}{
		{"parity row 0 damaged", nil, map[int][]int64{p0: {1}}, true},
		{"parity row 0 damaged at its last byte of member 0", nil, map[int][]int64{p0: {optLen + 16}}, true},
		{"data member 1 damaged", nil, map[int][]int64{1: {2500}}, true},
		{"damage in the second region only", nil, map[int][]int64{2: {optLen + 3}}, true},
		{"one source damaged in each region", nil, map[int][]int64{p0: {10}, 1: {optLen}}, true},
		{"damage past member 0's bytes is never read", nil, map[int][]int64{1: {optLen + 17 + 100}}, true},
		{"two damaged, every subset has one", nil, map[int][]int64{1: {5}, p0: {7}}, false},
		{"damaged, and no spare source", []int{p1}, map[int][]int64{p0: {1}}, false},
		{"every source damaged", nil, map[int][]int64{1: {1}, 2: {2}, 3: {3}, p0: {4}, p1: {5}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var active atomic.Int32
			srcs, _ := st.sources(append([]int{0}, c.gone...), &active, func(i int, s *memSource) { s.flips = c.flips[i] })
			views, err := st.decode(t, context.Background(), 0, srcs, &active, 1000)
			if !c.ok {
				if !errors.Is(err, ErrUnrecoverable) {
					t.Fatalf("got %v, want ErrUnrecoverable", err)
				}
				if !strings.Contains(err.Error(), "CRC32C") {
					t.Errorf("error %q does not say the CRC32Cs did not match", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := st.same(0, views); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestECDecodeSourceFails: a source whose read fails is dropped (never
// read again) and replaced; the decode succeeds while K sources remain,
// and fails with ErrUnrecoverable, saying why each was dropped, when
// fewer do.
func TestECDecodeSourceFails(t *testing.T) {
	const k, m = 4, 3
	st := newECStripe(t, k, m, unequalSizes)
	p0, p1, p2 := k, k+1, k+2
	for _, c := range []struct {
		name   string
		gone   []int
		failAt map[int]int32 // source → the call from which it fails
		ok     bool
	}{
		{"first source fails at once", nil, map[int]int32{1: 1}, true},
		{"a source fails mid-way", nil, map[int]int32{2: 3}, true},
		{"parity fails at its last chunk", nil, map[int]int32{p0: 4}, true},
		{"two fail, K remain", nil, map[int]int32{1: 2, p0: 3}, true},
		{"the replacement fails too", nil, map[int]int32{1: 2, p1: 1}, true},
		{"three fail", nil, map[int]int32{1: 2, 3: 1, p0: 3}, false},
		{"every source fails", nil, map[int]int32{1: 1, 2: 1, 3: 1, p0: 1, p1: 1, p2: 1}, false},
		{"one fails, no spare", []int{p1, p2}, map[int]int32{2: 2}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var active atomic.Int32
			srcs, mems := st.sources(append([]int{0}, c.gone...), &active, func(i int, s *memSource) { s.failAt = c.failAt[i] })
			views, err := st.decode(t, context.Background(), 0, srcs, &active, 1000)
			for i, f := range c.failAt {
				if n := mems[i].calls.Load(); n > f {
					t.Errorf("source %d read %d times after it failed at read %d", i, n-f, f)
				}
			}
			if !c.ok {
				if !errors.Is(err, ErrUnrecoverable) || !errors.Is(err, errTestSource) {
					t.Fatalf("got %v, want ErrUnrecoverable and the sources' errors", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := st.same(0, views); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestECDecodeCancel: a decode whose context ends while reads are under
// way returns the context's cause, not ErrUnrecoverable, once every read
// it started has returned.
func TestECDecodeCancel(t *testing.T) {
	st := newECStripe(t, 2, 2, unequalSizes)
	errStop := errors.New("stop")
	var active atomic.Int32
	blocked := make(chan struct{}, 1)
	// Source 1 blocks at its 3rd read: chunks 0 and 1 are in, and the
	// decode is rebuilding while it waits for chunk 2.
	srcs, _ := st.sources([]int{0}, &active, func(i int, s *memSource) {
		if i == 1 {
			s.blockAt, s.blocked = 3, blocked
		}
	})
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan error, 1)
	go func() {
		done <- decodeMember(ctx, ecDecode{codec: st.codec, lost: 0, shard: st.L, sources: srcs, table: st.tables[0], views: st.views(0), chunk: 1000})
	}()
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("the decode returned before its read blocked: %v", err)
	}
	cancel(errStop)
	err := <-done
	if n := active.Load(); n != 0 {
		t.Fatalf("%d reads still running after the decode returned", n)
	}
	if !errors.Is(err, errStop) || errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("got %v, want the context's cause", err)
	}
}

// TestECDecodeEmptyRegions: empty regions are checked against their
// committed CRC32C (that of nothing) and need no read.
func TestECDecodeEmptyRegions(t *testing.T) {
	st := newECStripe(t, 2, 1, func(x int) []int64 {
		if x == 0 {
			return []int64{0, 1001, 0}
		}
		return []int64{0, 0, 0}
	})
	for x := range 2 {
		var active atomic.Int32
		srcs, mems := st.sources([]int{x}, &active, nil)
		views, err := st.decode(t, context.Background(), x, srcs, &active, 100)
		if err != nil {
			t.Fatalf("member %d: %v", x, err)
		}
		if err := st.same(x, views); err != nil {
			t.Fatal(err)
		}
		if x == 1 {
			for i, s := range mems {
				if s != nil && s.calls.Load() != 0 {
					t.Errorf("member 1 has no bytes, yet source %d was read", i)
				}
			}
		}
	}
	// An empty region whose table has another CRC32C cannot be restored.
	st.tables[1][2].sum = 1
	var active atomic.Int32
	srcs, _ := st.sources([]int{1}, &active, nil)
	if _, err := st.decode(t, context.Background(), 1, srcs, &active, 100); !errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("empty region committed with CRC32C 1: got %v, want ErrUnrecoverable", err)
	}
}

// TestECDecodeArgs: a decode whose arguments do not fit together fails
// before it reads anything.
func TestECDecodeArgs(t *testing.T) {
	st := newECStripe(t, 2, 1, unequalSizes)
	base := func() ecDecode {
		srcs, _ := st.sources([]int{0}, nil, nil)
		return ecDecode{codec: st.codec, lost: 0, shard: st.L, sources: srcs, table: slices.Clone(st.tables[0]), views: st.views(0)}
	}
	for _, c := range []struct {
		name string
		mod  func(d *ecDecode)
		want string
	}{
		{"no codec", func(d *ecDecode) { d.codec = nil }, "no codec"},
		{"too few sources", func(d *ecDecode) { d.sources = d.sources[:2] }, "2 sources"},
		{"lost member is parity", func(d *ecDecode) { d.lost = 2 }, "lost member 2"},
		{"negative lost member", func(d *ecDecode) { d.lost = -1 }, "lost member -1"},
		{"view of another size", func(d *ecDecode) { d.views["meta"] = d.views["meta"][1:] }, `region "meta"`},
		{"view missing", func(d *ecDecode) { delete(d.views, "meta") }, `region "meta"`},
		{"view not in the table", func(d *ecDecode) { d.views["params"] = nil }, `view "params"`},
		{"region twice", func(d *ecDecode) { d.table = append(d.table, d.table[1]) }, "twice"},
		{"regions longer than the stripe", func(d *ecDecode) { d.shard = d.table[0].size }, "more than the stripe"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := base()
			c.mod(&d)
			err := decodeMember(context.Background(), d)
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, ErrUnrecoverable) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// TestECDecodeLostSourceUnread: the lost member's own source, if it is
// given, is never read (reading it is the direct restore, not a decode),
// even when another subset is needed.
func TestECDecodeLostSourceUnread(t *testing.T) {
	st := newECStripe(t, 2, 2, unequalSizes)
	var active atomic.Int32
	srcs, mems := st.sources(nil, &active, func(i int, s *memSource) {
		switch i {
		case 0:
			s.b = make([]byte, len(s.b)) // not member 0's bytes
		case 2:
			s.flips = []int64{3} // parity row 0: a second subset is needed
		}
	})
	views, err := st.decode(t, context.Background(), 0, srcs, &active, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.same(0, views); err != nil {
		t.Fatal(err)
	}
	if n := mems[0].calls.Load(); n != 0 {
		t.Fatalf("the lost member's own source was read %d times", n)
	}
}
