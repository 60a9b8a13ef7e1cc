package replay

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// testRecord has tensors of every codec, empty ones, odd sizes (so that
// every kind of padding occurs) and a chunked TopK (chunks of 1000: call
// withMaxChunk first, or not, for one chunk).
func testRecord(t testing.TB) *Record {
	t.Helper()
	tn := func(id uint32, d dist, n int, opt Options) *Tensor {
		return mustCompress(t, id, genData(d, n, uint64(id)), opt)
	}
	return &Record{Step: 1234567, Tensors: []*Tensor{
		tn(1, mixedDist, 11, Options{Lossless: true}),                  // 44 bytes: padding after
		tn(2, normalDist, 600, Options{}),                              // int8, 3 blocks: padding after the scales
		tn(3, normalDist, 3100, Options{Threshold: 1, K: 0.01}),        // topk, 31 entries: padding after the indices
		tn(4, normalDist, 0, Options{}),                                // empty int8
		tn(5, normalDist, 0, Options{Lossless: true}),                  // empty raw
		{ID: 6, Codec: TopK},                                           // empty topk (Compress makes Int8 of empty tensors)
		tn(7, mixedDist, 1000, Options{Threshold: 1, K: 0.05}),         // topk with non-finite values
		tn(8, normalDist, 77, Options{Threshold: 1000, BlockSize: 10}), // int8 with a short last block
	}}
}

func encode(t testing.TB, r *Record) []byte {
	t.Helper()
	b, err := r.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sameTensors checks that two records hold the same tensors, value for
// value once decompressed.
func sameRecords(t *testing.T, got, want *Record) {
	t.Helper()
	if got.Step != want.Step || len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("step %d with %d tensors, want %d with %d", got.Step, len(got.Tensors), want.Step, len(want.Tensors))
	}
	for i, w := range want.Tensors {
		g := got.Tensors[i]
		if g.ID != w.ID || g.Codec != w.Codec || g.Len != w.Len || g.Kept() != w.Kept() || g.PayloadBytes() != w.PayloadBytes() {
			t.Fatalf("tensor %d: %d %v len %d kept %d, want %d %v len %d kept %d", i, g.ID, g.Codec, g.Len, g.Kept(), w.ID, w.Codec, w.Len, w.Kept())
		}
		gv, wv := decompressed(t, g), decompressed(t, w)
		for j := range wv {
			if math.Float32bits(gv[j]) != math.Float32bits(wv[j]) {
				t.Fatalf("tensor %d element %d: %#08x, want %#08x", i, j, math.Float32bits(gv[j]), math.Float32bits(wv[j]))
			}
		}
	}
}

func fixCRC(b []byte) {
	le.PutUint32(b[len(b)-crcSize:], crc32.Checksum(b[:len(b)-crcSize], castagnoli))
}

func TestRecordRoundTrip(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		if chunked {
			withMaxChunk(t, 1000)
		}
		r := testRecord(t)
		b := encode(t, r)
		if len(b)%8 != 0 || string(b[:4]) != "GRDF" {
			t.Fatalf("record of %d bytes starting %q", len(b), b[:4])
		}
		d, err := DecodeRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		sameRecords(t, d, r)
		if chunked && len(d.Tensors[2].chunks) != 4 {
			t.Fatalf("the chunked topk has %d chunks, want 4", len(d.Tensors[2].chunks))
		}
		if again := encode(t, d); !bytes.Equal(again, b) {
			t.Fatal("re-encoding a decoded record changed its bytes")
		}

		// Unaligned: decoded from a copy at an odd address, and appended
		// after a prefix.
		buf := make([]byte, len(b)+1)
		copy(buf[1:], b)
		d, err = DecodeRecord(buf[1:])
		if err != nil {
			t.Fatal(err)
		}
		sameRecords(t, d, r)
		withPrefix, err := r.AppendBinary([]byte("abc"))
		if err != nil {
			t.Fatal(err)
		}
		if string(withPrefix[:3]) != "abc" || !bytes.Equal(withPrefix[3:], b) {
			t.Fatal("AppendBinary after a prefix differs")
		}
		if d, err = DecodeRecord(withPrefix[3:]); err != nil {
			t.Fatal(err)
		}
		sameRecords(t, d, r)
	}
	// An empty record.
	b := encode(t, &Record{Step: 9})
	if len(b) != minRecordSize {
		t.Fatalf("empty record of %d bytes, want %d", len(b), minRecordSize)
	}
	if d, err := DecodeRecord(b); err != nil || d.Step != 9 || len(d.Tensors) != 0 {
		t.Fatalf("empty record: %+v, %v", d, err)
	}
}

// inside says whether p points into b.
func inside(p unsafe.Pointer, b []byte) bool {
	a, lo := uintptr(p), uintptr(unsafe.Pointer(&b[0]))
	return a >= lo && a < lo+uintptr(len(b))
}

// TestRecordViews: from an aligned buffer the payloads are views into it
// (no copy); from an unaligned one, into an aligned copy.
func TestRecordViews(t *testing.T) {
	r := &Record{Tensors: []*Tensor{
		mustCompress(t, 1, genData(normalDist, 1000, 1), Options{Lossless: true}),
		mustCompress(t, 2, genData(normalDist, 1000, 1), Options{}),
		mustCompress(t, 3, genData(normalDist, 10000, 1), Options{Threshold: 1}),
	}}
	b := encode(t, r)
	ptrs := func(d *Record) []unsafe.Pointer {
		return []unsafe.Pointer{
			unsafe.Pointer(&d.Tensors[0].raw[0]), unsafe.Pointer(&d.Tensors[1].scales[0]), unsafe.Pointer(&d.Tensors[1].q[0]),
			unsafe.Pointer(&d.Tensors[2].idx[0]), unsafe.Pointer(&d.Tensors[2].vals[0]),
		}
	}
	if uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
		t.Fatal("make gave an unaligned buffer")
	}
	d, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range ptrs(d) {
		if !inside(p, b) {
			t.Errorf("aligned record: payload %d is not a view into the record", i)
		}
	}
	buf := make([]byte, len(b)+4)
	u := buf[4:]
	copy(u, b)
	if d, err = DecodeRecord(u); err != nil {
		t.Fatal(err)
	}
	for i, p := range ptrs(d) {
		if inside(p, u) {
			t.Errorf("unaligned record: payload %d views the unaligned bytes", i)
		}
		if uintptr(p)%4 != 0 {
			t.Errorf("unaligned record: payload %d at an unaligned address", i)
		}
	}
	sameRecords(t, d, r)
}

// TestRecordConvertingPath runs the big-endian paths (element by element
// conversion) on this machine: same bytes, same tensors.
func TestRecordConvertingPath(t *testing.T) {
	withMaxChunk(t, 1000)
	r := testRecord(t)
	want := encode(t, r)
	hostLE = false
	defer func() { hostLE = true }()
	b := encode(t, r)
	if !bytes.Equal(b, want) {
		t.Fatal("the converting encoder gives other bytes")
	}
	d, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if inside(unsafe.Pointer(&d.Tensors[0].raw[0]), b) {
		t.Fatal("converted payload is a view")
	}
	sameRecords(t, d, r)
	if again := encode(t, d); !bytes.Equal(again, b) {
		t.Fatal("re-encoding changed the bytes")
	}
}

func TestRecordAppendErrors(t *testing.T) {
	good := mustCompress(t, 1, []float32{1, 2, 3}, Options{})
	badLen := mustCompress(t, 1, []float32{1, 2, 3}, Options{Lossless: true})
	badLen.Len = 4
	for name, r := range map[string]*Record{
		"nil tensor":    {Tensors: []*Tensor{good, nil}},
		"no payload":    {Tensors: []*Tensor{{ID: 1, Codec: Raw, Len: 3}}},
		"unknown codec": {Tensors: []*Tensor{{ID: 1, Codec: 7}}},
		"zero tensor":   {Tensors: []*Tensor{{}}},
		"changed len":   {Tensors: []*Tensor{badLen}},
		"topk no chunk": {Tensors: []*Tensor{{Codec: TopK, Len: 5}}},
		"int8 no block": {Tensors: []*Tensor{{Codec: Int8}}},
	} {
		prefix := []byte("xy")
		if b, err := r.AppendBinary(prefix); err == nil || string(b) != "xy" {
			t.Errorf("%s: AppendBinary gave %d bytes, error %v; want an error and b unchanged", name, len(b), err)
		}
	}
	var nilRec *Record
	if _, err := nilRec.AppendBinary(nil); err == nil {
		t.Error("nil record encoded")
	}
}

// TestRecordCorruption: every kind of damage is rejected, with an error
// wrapping ErrBadRecord that names it. The checksum is fixed after each
// change (except where it is what is tested), so that the checks behind
// it are reached.
func TestRecordCorruption(t *testing.T) {
	withMaxChunk(t, 1000)
	r := testRecord(t)
	orig := encode(t, r)
	desc := func(b []byte, i int) []byte { return b[recordHeaderSize+descriptorSize*i:][:descriptorSize] }
	payload := func(b []byte, i int) []byte {
		d := desc(b, i)
		off := le.Uint64(d[32:])
		return b[off:][:le.Uint64(d[40:])]
	}
	// Tensor 1 is int8 (3 blocks), 2 topk (4 chunks, 31 entries).
	idx := func(b []byte, j int) []byte { return payload(b, 2)[4*16+4*j:] }
	for _, tc := range []struct {
		name   string
		mutate func(b []byte) []byte
		noFix  bool
		want   string
	}{
		{"too short", func(b []byte) []byte { return b[:20] }, true, "truncated"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-8] }, true, "truncated"},
		{"trailing bytes", func(b []byte) []byte { return append(b, make([]byte, 8)...) }, true, "trailing"},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, true, "bad magic"},
		{"version", func(b []byte) []byte { b[4] = 2; return b }, true, "unknown version"},
		{"reserved header", func(b []byte) []byte { b[6] = 1; return b }, false, "reserved header"},
		{"reserved header 2", func(b []byte) []byte { b[21] = 1; return b }, false, "reserved header"},
		{"length not a multiple of 8", func(b []byte) []byte {
			b = b[:len(b)-3]
			le.PutUint64(b[24:], uint64(len(b)))
			return b
		}, true, "multiple of 8"},
		{"payload bit flip", func(b []byte) []byte { payload(b, 0)[5] ^= 4; return b }, true, "CRC mismatch"},
		{"checksum bit flip", func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b }, true, "CRC mismatch"},
		{"too many tensors", func(b []byte) []byte { le.PutUint32(b[16:], 1<<30); return b }, false, "do not fit"},
		{"one tensor more", func(b []byte) []byte { le.PutUint32(b[16:], uint32(len(r.Tensors)+1)); return b }, false, ""},
		{"one tensor less", func(b []byte) []byte { le.PutUint32(b[16:], uint32(len(r.Tensors)-1)); return b }, false, "payload offset"},
		{"unknown codec", func(b []byte) []byte { desc(b, 0)[4] = 9; return b }, false, "unknown codec 9"},
		{"codec 0", func(b []byte) []byte { desc(b, 3)[4] = 0; return b }, false, "unknown codec 0"},
		{"reserved descriptor", func(b []byte) []byte { desc(b, 1)[7] = 1; return b }, false, "reserved descriptor"},
		{"raw param", func(b []byte) []byte { le.PutUint64(desc(b, 0)[16:], 1); return b }, false, "param"},
		{"raw count", func(b []byte) []byte { le.PutUint64(desc(b, 0)[24:], 12); return b }, false, "count"},
		{"raw len too large", func(b []byte) []byte {
			le.PutUint64(desc(b, 0)[8:], 1<<40)
			le.PutUint64(desc(b, 0)[24:], 1<<40)
			return b
		}, false, "does not fit"},
		{"len overflows int", func(b []byte) []byte { le.PutUint64(desc(b, 0)[8:], 1<<63); return b }, false, "overflows"},
		{"int8 block size 0", func(b []byte) []byte { le.PutUint64(desc(b, 1)[16:], 0); return b }, false, "block size 0"},
		{"int8 block size huge", func(b []byte) []byte { le.PutUint64(desc(b, 1)[16:], 1<<40); return b }, false, "above the maximum"},
		{"int8 block count", func(b []byte) []byte { le.PutUint64(desc(b, 1)[24:], 4); return b }, false, "blocks, want"},
		{"int8 block size changed", func(b []byte) []byte { le.PutUint64(desc(b, 1)[16:], 300); return b }, false, "blocks, want"},
		{"int8 len too large", func(b []byte) []byte { le.PutUint64(desc(b, 1)[8:], 1<<50); return b }, false, "does not fit"},
		{"payload offset", func(b []byte) []byte { le.PutUint64(desc(b, 1)[32:], le.Uint64(desc(b, 1)[32:])+8); return b }, false, "payload offset"},
		{"payload offset huge", func(b []byte) []byte { le.PutUint64(desc(b, 1)[32:], 1<<63); return b }, false, "payload offset"},
		{"payload length", func(b []byte) []byte { le.PutUint64(desc(b, 0)[40:], 48); return b }, false, "payload length"},
		{"payload length huge", func(b []byte) []byte { le.PutUint64(desc(b, 7)[40:], math.MaxUint64); return b }, false, "payload length"},
		{"payload past the end", func(b []byte) []byte {
			// The last tensor, int8 of 77: 99 elements would need 16+99 bytes.
			d := desc(b, 7)
			le.PutUint64(d[8:], 99)
			le.PutUint64(d[24:], 10)
			le.PutUint64(d[40:], 40+99)
			return b
		}, false, "past the checksum"},
		{"topk entries too many", func(b []byte) []byte { le.PutUint64(desc(b, 2)[24:], 1<<40); return b }, false, "does not fit"},
		{"topk chunks too many", func(b []byte) []byte { le.PutUint64(desc(b, 2)[16:], 1<<40); return b }, false, "does not fit"},
		{"topk len 0 with chunks", func(b []byte) []byte { le.PutUint64(desc(b, 2)[8:], 0); return b }, false, "topk of len 0"},
		{"topk chunks for len 0", func(b []byte) []byte { le.PutUint64(desc(b, 5)[16:], 1); return b }, false, "topk of len 0"},
		{"topk chunk too long", func(b []byte) []byte { le.PutUint64(desc(b, 2)[8:], 1<<32); return b }, false, "spans"},
		{"int8 scale negative", func(b []byte) []byte { payload(b, 1)[7] |= 0x80; return b }, false, "int8 scale 1"},
		{"int8 scale -0", func(b []byte) []byte { le.PutUint32(payload(b, 1)[4:], 0x80000000); return b }, false, "int8 scale 1"},
		{"int8 scale NaN", func(b []byte) []byte { le.PutUint32(payload(b, 1)[8:], 0x7fc00000); return b }, false, "int8 scale 2"},
		{"int8 scale Inf", func(b []byte) []byte { le.PutUint32(payload(b, 1), 0x7f800000); return b }, false, "int8 scale 0"},
		{"int8 scale too large", func(b []byte) []byte { le.PutUint32(payload(b, 1), math.Float32bits(math.MaxFloat32)); return b }, false, "int8 scale 0"},
		{"int8 padding", func(b []byte) []byte { payload(b, 1)[13] = 1; return b }, false, "padding after the scales"},
		{"topk first base", func(b []byte) []byte { le.PutUint64(payload(b, 2), 1); return b }, false, "base 1, want 0"},
		{"topk bases not ascending", func(b []byte) []byte { le.PutUint64(payload(b, 2)[32:], 1000); return b }, false, "not above"},
		{"topk base past len", func(b []byte) []byte { le.PutUint64(payload(b, 2)[48:], 3100); return b }, false, "past len"},
		{"topk chunk count more", func(b []byte) []byte { le.PutUint64(payload(b, 2)[8:], 100); return b }, false, "more than the 31 entries"},
		{"topk chunk count less", func(b []byte) []byte {
			p := payload(b, 2)
			le.PutUint64(p[8:], le.Uint64(p[8:])-1)
			return b
		}, false, "hold 30 entries"},
		{"topk indices not ascending", func(b []byte) []byte {
			i0, i1 := le.Uint32(idx(b, 0)), le.Uint32(idx(b, 1))
			le.PutUint32(idx(b, 0), i1)
			le.PutUint32(idx(b, 1), i0)
			return b
		}, false, "not ascending"},
		{"topk index repeated", func(b []byte) []byte { le.PutUint32(idx(b, 1), le.Uint32(idx(b, 0))); return b }, false, "not ascending"},
		{"topk index negative", func(b []byte) []byte { le.PutUint32(idx(b, 0), 0xffffffff); return b }, false, "outside the chunk"},
		{"topk index past chunk", func(b []byte) []byte {
			if le.Uint64(payload(b, 2)[8:]) == 0 {
				t.Fatal("test record's first topk chunk is empty")
			}
			le.PutUint32(idx(b, 0), 1000)
			return b
		}, false, "outside the chunk's [0, 1000)"},
		{"topk padding", func(b []byte) []byte { idx(b, 31)[0] = 1; return b }, false, "padding after the indices"},
		{"padding between payloads", func(b []byte) []byte { b[le.Uint64(desc(b, 0)[32:])+44] = 1; return b }, false, "padding before the payload"},
		{"padding before the checksum", func(b []byte) []byte {
			d := desc(b, len(r.Tensors)-1)
			end := le.Uint64(d[32:]) + le.Uint64(d[40:])
			if end == uint64(len(b)-crcSize) {
				t.Fatal("test record has no padding before the checksum")
			}
			b[end] = 1
			return b
		}, false, "padding before the checksum"},
		{"record longer than its payloads", func(b []byte) []byte {
			b = append(b, make([]byte, 8)...)
			le.PutUint64(b[24:], uint64(len(b)))
			return b
		}, false, "length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mutate(slices.Clone(orig))
			if !tc.noFix {
				fixCRC(b)
			}
			_, err := DecodeRecord(b)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error %v does not wrap ErrBadRecord", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
			t.Log(err)
		})
	}
	if _, err := DecodeRecord(orig); err != nil {
		t.Fatalf("the original no longer decodes: %v", err)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	old := maxChunk
	maxChunk = 100
	small := func(id uint32, d dist, n int, opt Options) *Tensor {
		return mustCompress(f, id, genData(d, n, uint64(id)), opt)
	}
	for _, r := range []*Record{
		{},
		{Step: 1, Tensors: []*Tensor{small(1, mixedDist, 5, Options{Lossless: true})}},
		{Step: 2, Tensors: []*Tensor{small(2, mixedDist, 40, Options{BlockSize: 16})}},
		{Step: 3, Tensors: []*Tensor{small(3, normalDist, 250, Options{Threshold: 1, K: 0.05})}},
		{Step: 4, Tensors: []*Tensor{small(4, mixedDist, 300, Options{Threshold: 1, K: 0.1}), small(5, normalDist, 0, Options{}), small(6, normalDist, 9, Options{Lossless: true})}},
	} {
		f.Add(encode(f, r))
	}
	maxChunk = old
	f.Add([]byte("GRDF"))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzDecode(t, b)
		// The same with a consistent length and checksum, to get past them.
		if len(b) >= minRecordSize && len(b)%8 == 0 {
			c := slices.Clone(b)
			le.PutUint64(c[24:], uint64(len(c)))
			fixCRC(c)
			fuzzDecode(t, c)
		}
	})
}

func fuzzDecode(t *testing.T, b []byte) {
	keep := slices.Clone(b)
	r, err := DecodeRecord(b)
	if !bytes.Equal(b, keep) {
		t.Fatal("DecodeRecord modified its input")
	}
	if err != nil {
		if !errors.Is(err, ErrBadRecord) {
			t.Fatalf("error %v does not wrap ErrBadRecord", err)
		}
		return
	}
	again, err := r.AppendBinary(nil)
	if err != nil {
		t.Fatalf("re-encoding an accepted record: %v", err)
	}
	if !bytes.Equal(again, b) {
		t.Fatalf("re-encoding an accepted record gives other bytes:\n%x\n%x", b, again)
	}
	for _, tn := range r.Tensors {
		if tn.Len <= 1<<16 {
			if err := tn.Decompress(make([]float32, tn.Len)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// A sparse tensor may claim a huge length: expand windows.
		dst := make([]float32, 1000)
		tn.ExpandRange(dst, 0)
		tn.ExpandRange(dst, tn.Len-len(dst))
		for _, c := range tn.chunks {
			tn.ExpandRange(dst[:min(len(dst), tn.Len-c.base)], c.base)
		}
	}
}
