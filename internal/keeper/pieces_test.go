package keeper

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"testing"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/diffstore"
	"github.com/gorun/gorun/protect"
	"github.com/gorun/gorun/replay"
)

// TestCRC32CCombine: ckpt.CombineCRC32C of the CRC32Cs of a and b is hash/crc32's
// CRC32C of a followed by b, for random data cut at random points
// (including empty halves), and xPow8n moves a CRC past n zero bytes.
func TestCRC32CCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 1<<16)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	crc := func(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
	for range 2000 {
		n := rng.IntN(len(data) + 1)
		cut := rng.IntN(n + 1)
		a, b := data[:cut], data[cut:n]
		if got, want := ckpt.CombineCRC32C(crc(a), crc(b), int64(len(b))), crc(data[:n]); got != want {
			t.Fatalf("combine of %d and %d bytes: %08x, want %08x", len(a), len(b), got, want)
		}
	}
	// Three parts, combined left to right and right to left.
	for range 200 {
		i, j := rng.IntN(len(data)), rng.IntN(len(data))
		i, j = min(i, j), max(i, j)
		a, b, c := data[:i], data[i:j], data[j:]
		l := ckpt.CombineCRC32C(ckpt.CombineCRC32C(crc(a), crc(b), int64(len(b))), crc(c), int64(len(c)))
		r := ckpt.CombineCRC32C(crc(a), ckpt.CombineCRC32C(crc(b), crc(c), int64(len(c))), int64(len(b)+len(c)))
		if want := crc(data); l != want || r != want {
			t.Fatalf("combine of %d, %d and %d bytes: %08x and %08x, want %08x", len(a), len(b), len(c), l, r, want)
		}
	}
	// Long lengths: the CRC32C of 3 MiB of zeros after data.
	zeros := make([]byte, 3<<20+5)
	if got, want := ckpt.CombineCRC32C(crc(data), crc(zeros), int64(len(zeros))), crc(append(slices.Clone(data), zeros...)); got != want {
		t.Fatalf("combine with %d zeros: %08x, want %08x", len(zeros), got, want)
	}
}

// TestCoverOutOfOrder: a cover fed a region's pieces in any order knows
// the region's CRC32C when, and only when, every byte passed.
func TestCoverOutOfOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		size := rng.IntN(5000)
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		type piece struct{ off, n int }
		var ps []piece
		for off := 0; off < size; {
			n := min(size-off, 1+rng.IntN(size/4+1))
			ps = append(ps, piece{off, n})
			off += n
		}
		rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
		cv := cover{size: int64(size)}
		for i, p := range ps {
			if cv.whole() {
				t.Fatalf("a region of %d bytes whole after %d of %d pieces", size, i, len(ps))
			}
			if err := cv.add(int64(p.off), int64(p.n), crc32.Checksum(data[p.off:p.off+p.n], castagnoli)); err != nil {
				t.Fatalf("piece %+v of a region of %d bytes: %v", p, size, err)
			}
		}
		if !cv.whole() || cv.sum() != crc32.Checksum(data, castagnoli) {
			t.Fatalf("a region of %d bytes in %d pieces: whole %v, CRC32C %08x, want %08x", size, len(ps), cv.whole(), cv.sum(), crc32.Checksum(data, castagnoli))
		}
	}
}

// TestCoverRefuses: a piece that is empty, outside its region or over
// bytes that passed is refused (errPiece) and changes nothing; so is a
// piece that would leave the region in more than maxSpans ranges.
func TestCoverRefuses(t *testing.T) {
	fresh := func() *cover {
		cv := &cover{size: 100}
		for _, p := range [][2]int64{{10, 10}, {40, 20}} {
			if err := cv.add(p[0], p[1], 0); err != nil {
				t.Fatal(err)
			}
		}
		return cv
	}
	for _, tc := range []struct {
		name   string
		off, n int64
	}{
		{"empty", 0, 0},
		{"negative length", 0, -1},
		{"negative offset", -4, 8},
		{"past the end", 96, 8},
		{"after the end", 101, 1},
		{"huge offset", math.MaxInt64, 1},
		{"huge length", 1, math.MaxInt64},
		{"over the start of a range", 5, 6},
		{"over the end of a range", 19, 2},
		{"inside a range", 42, 2},
		{"the same range", 40, 20},
		{"around a range", 30, 40},
		{"over two ranges", 15, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cv := fresh()
			before := slices.Clone(cv.spans)
			if err := cv.add(tc.off, tc.n, 0); !errors.Is(err, errPiece) {
				t.Fatalf("add(%d, %d): %v, want errPiece", tc.off, tc.n, err)
			}
			if !slices.Equal(cv.spans, before) || cv.n != 30 {
				t.Fatalf("a refused piece changed the cover: %+v (%d bytes)", cv.spans, cv.n)
			}
		})
	}
	cv := cover{size: 4 * (maxSpans + 1)}
	for i := range int64(maxSpans) {
		if err := cv.add(4*i, 2, 0); err != nil {
			t.Fatalf("range %d: %v", i, err)
		}
	}
	if err := cv.add(4*maxSpans, 2, 0); !errors.Is(err, errPiece) {
		t.Fatalf("range %d: %v, want errPiece", maxSpans+1, err)
	}
	if err := cv.add(2, 2, 0); err != nil { // joins two ranges: fewer
		t.Fatalf("a piece that joins two ranges: %v", err)
	}
}

// Regions of the FuzzPieces answer, and their bytes: fuzzPieceByte.
var fuzzPieceTable = []tableEntry{{name: "a", size: 37}, {name: "empty"}, {name: "c", size: 100}}

func fuzzPieceByte(region, i int) byte { return byte(i*7 + region*31 + 1) }

func fuzzPieceRegions() [][]byte {
	rs := make([][]byte, len(fuzzPieceTable))
	for r, e := range fuzzPieceTable {
		rs[r] = make([]byte, e.size)
		for i := range rs[r] {
			rs[r][i] = fuzzPieceByte(r, i)
		}
	}
	return rs
}

// piecesOf returns an answer's pieces carrying regions, cut into pieces
// of random sizes, in a random order.
func piecesOf(rng *rand.Rand, regions [][]byte) []byte {
	type piece struct {
		r   int
		off int
		b   []byte
	}
	var ps []piece
	for r, b := range regions {
		for off := 0; off < len(b); {
			n := min(len(b)-off, 1+rng.IntN(len(b)/2+1))
			ps = append(ps, piece{r, off, b[off : off+n]})
			off += n
		}
	}
	rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	var out []byte
	for _, p := range ps {
		out = appendPieceHdr(out, p.r, int64(p.off), len(p.b))
		out = append(out, p.b...)
	}
	return out
}

// FuzzPieces feeds arbitrary bytes to readPieces as the pieces of an
// answer with fuzzPieceTable's regions, whose CRC32Cs are those of
// fuzzPieceByte's bytes. It never panics, and it agrees with a model that
// parses the same bytes with a bitmap of the bytes seen: if a piece names
// no region of the table, is empty, falls outside its region or over
// bytes already seen, readPieces refuses it (errPiece); if a region, once
// all of its bytes arrived, does not match its CRC32C, or the input ends
// before every byte arrived, it fails; else it succeeds with the bytes of
// the pieces, having read no byte past the last piece.
func FuzzPieces(f *testing.F) {
	want := fuzzPieceRegions()
	t := slices.Clone(fuzzPieceTable)
	for i := range t {
		t[i].sum = crc32.Checksum(want[i], castagnoli)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 4 {
		f.Add(piecesOf(rng, want))
	}
	ok := piecesOf(rng, want)
	f.Add(ok[:len(ok)-1])                                                                                 // one byte short
	f.Add(append(slices.Clone(ok), 0))                                                                    // one byte more: never read
	f.Add(append(appendPieceHdr(nil, 0, 0, 4), 1, 8, 15, 22))                                             // a prefix, then nothing
	f.Add(append(appendPieceHdr(nil, 3, 0, 1), 0))                                                        // no region 3
	f.Add(append(appendPieceHdr(nil, 1, 0, 1), 0))                                                        // the empty region
	f.Add(append(appendPieceHdr(nil, 0, 36, 2), 0, 0))                                                    // past the end
	f.Add(appendPieceHdr(nil, 2, 0, 0))                                                                   // empty piece
	f.Add(append(append(appendPieceHdr(nil, 0, 0, 2), 1, 8), append(appendPieceHdr(nil, 0, 1, 1), 8)...)) // overlap
	wrong := append(appendPieceHdr(nil, 0, 0, 37), make([]byte, 37)...)
	f.Add(append(wrong, appendPieceHdr(nil, 3, 0, 1)...)) // a region whole with other bytes, then no region 3
	f.Fuzz(func(tt *testing.T, in []byte) {
		// The model.
		seen := make([][]bool, len(t))
		model := make([][]byte, len(t))
		left, whole := make([]int64, len(t)), int64(0)
		for i, e := range t {
			seen[i], model[i], left[i] = make([]bool, e.size), make([]byte, e.size), e.size
			whole += e.size
		}
		badPiece, badCRC, truncated := false, false, false
		pos := 0
	parse:
		for whole > 0 {
			if len(in)-pos < pieceHdrSize {
				truncated = true
				break
			}
			r := int(binary.BigEndian.Uint16(in[pos:]))
			off := binary.BigEndian.Uint64(in[pos+2:])
			n := uint64(binary.BigEndian.Uint32(in[pos+10:]))
			pos += pieceHdrSize
			if r >= len(t) || n == 0 || off >= uint64(t[r].size) || n > uint64(t[r].size)-off {
				badPiece = true
				break
			}
			for i := off; i < off+n; i++ {
				if seen[r][i] {
					badPiece = true
					break parse
				}
			}
			if uint64(len(in)-pos) < n {
				truncated = true
				break
			}
			for i := off; i < off+n; i++ {
				seen[r][i], model[r][i] = true, in[pos]
				pos++
			}
			left[r] -= int64(n)
			whole -= int64(n)
			if left[r] == 0 && crc32.Checksum(model[r], castagnoli) != t[r].sum {
				badCRC = true
				break
			}
		}

		dst := make([][]byte, len(t))
		for i, e := range t {
			dst[i] = make([]byte, e.size)
		}
		rd := bytes.NewReader(in)
		err := readPieces(rd, t, dst, 7)
		switch {
		case badPiece:
			if !errors.Is(err, errPiece) {
				tt.Fatalf("a piece that does not fit: %v, want errPiece", err)
			}
		case badCRC, truncated:
			if err == nil || errors.Is(err, errPiece) {
				tt.Fatalf("a region that does not match its CRC32C (%v) or an answer that ends early (%v): %v", badCRC, truncated, err)
			}
		default:
			if err != nil {
				tt.Fatalf("pieces that fit and match refused: %v", err)
			}
			if consumed := len(in) - rd.Len(); consumed != pos {
				tt.Fatalf("read %d bytes, the pieces are %d", consumed, pos)
			}
			for i := range dst {
				if !bytes.Equal(dst[i], model[i]) {
					tt.Fatalf("region %d: %x, want %x", i, dst[i], model[i])
				}
			}
		}
	})
}

// pieceOwner is an owner rank of a random layout for
// TestPropertyPiecesAnswer: its optimizer region holds a header of hdr
// bytes, then W, M and V in the order perm, each followed by gap bytes;
// its regions are in the order regs.
type pieceOwner struct {
	n, hdr, gap int
	perm        [3]int
	regs        []diffstore.Region
	w, m, v     []float32
	rng         *rand.Rand
	states      map[int64]map[string][]byte
}

func (o *pieceOwner) off(k int) int { return o.hdr + o.perm[k]*(4*o.n+o.gap) }

func (o *pieceOwner) optSize() int64 { return int64(o.hdr + 3*(4*o.n+o.gap)) }

// snapshot returns the owner's regions at step.
func (o *pieceOwner) snapshot(step int64) map[string][]byte {
	opt := make([]byte, o.optSize())
	for i := range opt {
		opt[i] = byte(i) | 0x40 // header and gaps: constant
	}
	for k, x := range [][]float32{o.w, o.m, o.v} {
		copy(opt[o.off(k):], protect.Float32Bytes(x))
	}
	m := map[string][]byte{"optimizer": opt}
	for _, r := range o.regs {
		if r.Name != "optimizer" {
			b := make([]byte, r.Size)
			for i := range b {
				b[i] = byte(step*13 + int64(i))
			}
			m[r.Name] = b
		}
	}
	return m
}

// table returns the owner's committed table of step, in the regions'
// order.
func (o *pieceOwner) table(step int64) []tableEntry {
	t := make([]tableEntry, len(o.regs))
	for i, r := range o.regs {
		t[i] = tableEntry{name: r.Name, size: r.Size, sum: crc32.Checksum(o.states[step][r.Name], castagnoli)}
	}
	return t
}

// TestPropertyPiecesAnswer: a diff-mode holder's pieces answer to a get
// (getDiff, as the link serves it), read by the restoring side
// (readFetched, as fetch reads it), gives the owner's committed bytes at
// every step the holder holds, whatever the layout: W, M and V in any
// order, with or without a header and bytes between them, the optimizer
// region first, last or between the others, states of one window or of
// many (pieceChunk small), folds.
func TestPropertyPiecesAnswer(t *testing.T) {
	defer func(c int) { pieceChunk = c }(pieceChunk)
	perms := [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	for seed := uint64(1); seed <= 12; seed++ {
		rng := rand.New(rand.NewPCG(seed, 15))
		o := &pieceOwner{n: 1 + rng.IntN(2000), hdr: 4 * rng.IntN(3), gap: 4 * rng.IntN(3), perm: perms[rng.IntN(len(perms))], rng: rng, states: map[int64]map[string][]byte{}}
		o.regs = []diffstore.Region{{Name: "optimizer", Size: o.optSize()}, {Name: "meta", Size: int64(rng.IntN(100))}, {Name: "extra", Size: int64(1 + rng.IntN(300))}}
		rng.Shuffle(len(o.regs), func(i, j int) { o.regs[i], o.regs[j] = o.regs[j], o.regs[i] })
		pieceChunk = []int{4, 4 * (1 + rng.IntN(o.n)), 1 + rng.IntN(int(o.optSize())), diffstore.DefaultChunk}[rng.IntN(4)]
		name := fmt.Sprintf("seed=%d/n=%d/perm=%v/hdr=%d/gap=%d/chunk=%d", seed, o.n, o.perm, o.hdr, o.gap, pieceChunk)
		t.Run(name, func(t *testing.T) {
			o.w, o.m, o.v = make([]float32, o.n), make([]float32, o.n), make([]float32, o.n)
			for i := range o.w {
				o.w[i] = float32(rng.NormFloat64())
			}
			ds, err := diffstore.New(o.regs, diffstore.Optimizer{Region: "optimizer", N: int64(o.n), WOff: int64(o.off(0)), MOff: int64(o.off(1)), VOff: int64(o.off(2))})
			if err != nil {
				t.Fatal(err)
			}
			o.states[0] = o.snapshot(0)
			bw, err := ds.BeginBase(0)
			if err != nil {
				t.Fatal(err)
			}
			sums := map[string]uint32{}
			for name, b := range o.states[0] {
				if err := bw.Write(name, 0, b); err != nil {
					t.Fatal(err)
				}
				sums[name] = crc32.Checksum(b, castagnoli)
			}
			if err := bw.Commit(0, sums); err != nil {
				t.Fatal(err)
			}
			or := &ownerReplica{rank: 0, cur: ds, sums: map[int64][]tableEntry{0: o.table(0)}}
			st := &replicaStore{h: &Keeper{log: slog.New(slog.DiscardHandler)}, owners: map[int]*ownerReplica{0: or}}
			const last = 8
			for step := int64(1); step <= last; step++ {
				g := make([]float32, o.n)
				for i := range g {
					g[i] = float32(rng.NormFloat64())
				}
				h := replay.Hyper{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01 * float32(step%2), T: int(step)}
				replay.Step(o.w, o.m, o.v, g, h.Consts())
				o.states[step] = o.snapshot(step)
				tn, err := replay.Compress(0, g, replay.Options{Lossless: true})
				if err != nil {
					t.Fatal(err)
				}
				rec, err := (&replay.Record{Step: uint64(step), Tensors: []*replay.Tensor{tn}}).AppendBinary(nil)
				if err != nil {
					t.Fatal(err)
				}
				d := diffstore.Diff{Step: step, Hyper: h, Record: rec, Other: maps.Clone(o.states[step])}
				delete(d.Other, "optimizer")
				d.Seal()
				if err := ds.Append(d); err != nil {
					t.Fatalf("Append(%d): %v", step, err)
				}
				or.mu.Lock()
				or.sums[step] = o.table(step)
				or.mu.Unlock()
			}
			if fold := rng.Int64N(4); fold > 0 {
				if err := ds.Fold(fold, replay.ReplayOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			first, _, _ := ds.Range()
			for step := first; step <= last; step++ {
				got, err := getPieces(t, st, step, o.regs)
				if err != nil {
					t.Fatalf("get of step %d: %v", step, err)
				}
				for name, b := range o.states[step] {
					if !bytes.Equal(got[name], b) {
						t.Fatalf("get of step %d: region %s differs from the owner's commit", step, name)
					}
				}
			}
		})
	}
}

// getPieces runs a get of owner 0's step from st's holder over a pipe:
// getDiff on one end, readFetched on the other, into regions of regs'
// sizes.
func getPieces(t *testing.T, st *replicaStore, step int64, regs []diffstore.Region) (map[string][]byte, error) {
	t.Helper()
	server, client := net.Pipe()
	h := linkHdr{kind: kindGet, owner: 0, holder: 1, step: step}
	served := make(chan error, 1)
	go func() {
		defer server.Close()
		served <- st.getDiff(server, h)
	}()
	got := map[string][]byte{}
	for _, r := range regs {
		got[r.Name] = make([]byte, r.Size)
	}
	err := readFetched(client, h, maps.Clone(got))
	if err == nil {
		if n, _ := io.Copy(io.Discard, client); n != 0 {
			err = fmt.Errorf("%d bytes after the answer", n)
		}
	}
	client.Close()
	if serr := <-served; serr != nil && err == nil {
		err = fmt.Errorf("getDiff: %w", serr)
	}
	return got, err
}
