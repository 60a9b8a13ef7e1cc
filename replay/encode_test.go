package replay

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"
	"unsafe"
)

// oldRecord is the encoding AppendRecord replaces: CompressInto, then
// AppendBinary onto a copy of prefix.
func oldRecord(t testing.TB, prefix []byte, step uint64, id uint32, x []float32, opt Options) []byte {
	t.Helper()
	var tn Tensor
	if err := CompressInto(&tn, id, x, opt); err != nil {
		t.Fatal(err)
	}
	r := Record{Step: step, Tensors: []*Tensor{&tn}}
	b, err := r.AppendBinary(slices.Clone(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// misaligned returns a copy of x whose first element is off bytes past an
// 8-byte boundary (off in [0, 8)): float32s at any address, as a view of
// a byte buffer may give.
func misaligned(x []float32, off int) []float32 {
	buf := make([]uint64, (4*len(x)+off)/8+2)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 8*len(buf))[off:]
	if len(x) == 0 {
		return nil
	}
	y := unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(x))
	copy(y, x)
	return y
}

var encodeOpts = []struct {
	name string
	opt  Options
}{
	{"raw", Options{Lossless: true}},
	{"int8", Options{Threshold: math.MaxInt}},
	{"int8-block7", Options{Threshold: math.MaxInt, BlockSize: 7}},
	{"topk", Options{Threshold: 1, K: 0.05, Seed: 3}},
	{"topk-all", Options{Threshold: 1, K: 1}},
	{"default", Options{}}, // int8 below 100 000 elements, topk above
}

// TestAppendRecordMatchesOld: AppendRecord gives the bytes of CompressInto
// + AppendBinary for every codec, element count (empty, one, odd, across
// and exactly on the raw path's block boundaries, past the default
// threshold), alignment of x, prefix of the buffer and capacity (none,
// too small, exact, larger), on little-endian and converting paths; the
// result decodes back to x (Raw) or to what the old path's tensor
// decodes to; the prefix is left alone; a buffer large enough is used in
// place.
func TestAppendRecordMatchesOld(t *testing.T) {
	const blk = encodeBlock / 4
	sizes := []int{0, 1, 2, 3, 7, 255, 257, 1001, blk - 1, blk, blk + 1, 3*blk + 5}
	if !raceEnabled {
		sizes = append(sizes, 100_003)
	}
	for _, le := range []bool{true, false} {
		for _, o := range encodeOpts {
			for _, n := range sizes {
				for _, align := range []int{0, 4, 1, 3} {
					for _, prefix := range []int{0, 5, 8} {
						for _, capKind := range []string{"nil", "small", "exact", "large"} {
							if (!le || capKind != "exact") && (align%4 != 0 || prefix == 5) && n > 1001 {
								continue // the combinations: enough of them for large n
							}
							name := fmt.Sprintf("le=%v/%s/n=%d/align=%d/prefix=%d/%s", le, o.name, n, align, prefix, capKind)
							checkAppendRecord(t, name, le, o.opt, n, align, prefix, capKind)
						}
					}
				}
			}
		}
	}
}

func checkAppendRecord(t *testing.T, name string, isLE bool, opt Options, n, align, prefix int, capKind string) {
	t.Helper()
	hostLE = isLE
	defer func() { hostLE = true }()
	x := misaligned(genData(mixedDist, n, uint64(n)+7), align)
	step, id := uint64(n)*31+1, uint32(n)^0xabc
	pre := make([]byte, prefix)
	for i := range pre {
		pre[i] = byte(0xe0 + i)
	}
	want := oldRecord(t, pre, step, id, x, opt)
	recLen := len(want) - prefix
	var b []byte
	switch capKind {
	case "small":
		b = append(make([]byte, 0, prefix+recLen/2), pre...)
	case "exact":
		b = append(make([]byte, 0, prefix+recLen), pre...)
	case "large":
		b = append(make([]byte, 0, prefix+recLen+100), pre...)
	default:
		b = slices.Clone(pre)
	}
	// Garbage where the record goes: the encoder must write every byte.
	full := b[:cap(b)]
	for i := prefix; i < len(full); i++ {
		full[i] = 0xa5
	}
	var e Encoder
	got, err := e.AppendRecord(b, step, id, x, opt)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: %d bytes, want %d; first difference at byte %d", name, len(got), len(want), i)
	}
	if (capKind == "exact" || capKind == "large") && unsafe.SliceData(got) != unsafe.SliceData(b) {
		t.Fatalf("%s: the record did not go into the caller's buffer of capacity %d", name, cap(b))
	}
	rec := slices.Clone(got[prefix:]) // aligned, for the in-place views
	r, err := DecodeRecord(rec)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if len(r.Tensors) != 1 || r.Step != step || r.Tensors[0].ID != id || r.Tensors[0].Len != n {
		t.Fatalf("%s: decoded %+v", name, r)
	}
	dec := make([]float32, n)
	if err := r.Tensors[0].Decompress(dec); err != nil {
		t.Fatal(err)
	}
	if opt.Lossless && !slices.Equal(f32bits(dec), f32bits(x)) {
		t.Fatalf("%s: the raw record does not decode to x bit for bit", name)
	}
}

// TestAppendRecordTwiceInOneBuffer: an Encoder reused for another step
// and codec into the same buffer gives each time the old path's bytes
// (its scratch tensor carries nothing over).
func TestAppendRecordTwiceInOneBuffer(t *testing.T) {
	var e Encoder
	buf := make([]byte, 0, 1<<20)
	for i, o := range []Options{{Threshold: 1, K: 0.1}, {Lossless: true}, {Threshold: math.MaxInt}, {Threshold: 1, K: 0.02}, {Lossless: true}} {
		x := genData(normalDist, 5000+i*333, uint64(i))
		got, err := e.AppendRecord(buf[:0], uint64(i), 1, x, o)
		if err != nil {
			t.Fatal(err)
		}
		if want := oldRecord(t, nil, uint64(i), 1, x, o); !bytes.Equal(got, want) {
			t.Fatalf("encoding %d (%+v) differs from the old path", i, o)
		}
		buf = got
	}
}

// TestAppendRecordBadOptions: bad Options are refused as CompressInto
// refuses them, and the buffer comes back unchanged.
func TestAppendRecordBadOptions(t *testing.T) {
	var e Encoder
	b := []byte{1, 2, 3}
	for _, o := range []Options{{K: -1}, {Threshold: -1}, {BlockSize: -5}, {K: math.NaN()}} {
		got, err := e.AppendRecord(b, 1, 1, []float32{1, 2}, o)
		if err == nil {
			t.Errorf("%+v: no error", o)
		}
		if !bytes.Equal(got, b) || len(got) != 3 {
			t.Errorf("%+v: the buffer changed to %v", o, got)
		}
	}
}

// TestAppendRecordNoAlloc: into a buffer large enough, encoding allocates
// nothing, for every codec, once the Encoder's scratch has grown.
func TestAppendRecordNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	x := genData(normalDist, 300_000, 1)
	buf := make([]byte, 0, 8*len(x)+1024) // TopK with K = 1 takes 6 bytes per element
	for _, o := range encodeOpts {
		var e Encoder
		if _, err := e.AppendRecord(buf, 1, 1, x, o.opt); err != nil {
			t.Fatal(err)
		}
		if a := testing.AllocsPerRun(5, func() {
			if _, err := e.AppendRecord(buf, 2, 1, x, o.opt); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Errorf("%s: %v allocations per record", o.name, a)
		}
	}
}

func FuzzAppendRecord(f *testing.F) {
	f.Add([]byte{}, uint64(0), uint32(0), uint8(0), uint8(0), uint16(0))
	f.Add(bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, 37), uint64(9), uint32(3), uint8(1), uint8(3), uint16(5))
	f.Add(bytes.Repeat([]byte{1, 2, 0xc0, 0x7f, 0, 0, 0x80, 0xff}, 300), uint64(1<<40), uint32(1<<31), uint8(2), uint8(1), uint16(2))
	f.Add(bytes.Repeat([]byte{9, 8, 7, 6, 5}, 1000), uint64(7), uint32(7), uint8(4), uint8(6), uint16(11))
	f.Fuzz(func(t *testing.T, data []byte, step uint64, id uint32, codec, align uint8, prefix uint16) {
		x := make([]float32, len(data)/4)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		x = misaligned(x, int(align%8))
		var opt Options
		switch codec % 5 {
		case 0:
			opt = Options{Lossless: true}
		case 1:
			opt = Options{Threshold: math.MaxInt, BlockSize: 1 + int(prefix%300)}
		case 2:
			opt = Options{Threshold: 1, K: 0.01 + float64(codec%50)/50, Seed: step}
		case 3:
			opt = Options{Threshold: 1 + int(prefix%64)}
		default:
			opt = Options{K: 2} // refused
		}
		pre := bytes.Repeat([]byte{0xee}, int(prefix%17))
		var e Encoder
		got, err := e.AppendRecord(slices.Clone(pre), step, id, x, opt)
		if codec%5 == 4 {
			if err == nil || !bytes.Equal(got, pre) {
				t.Fatalf("bad options: %v, %d bytes", err, len(got))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if want := oldRecord(t, pre, step, id, x, opt); !bytes.Equal(got, want) {
			t.Fatalf("%d bytes, want %d: differ from CompressInto + AppendBinary", len(got), len(want))
		}
		if _, err := DecodeRecord(slices.Clone(got[len(pre):])); err != nil {
			t.Fatal(err)
		}
	})
}
