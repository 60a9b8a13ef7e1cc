package difflog_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gorun/gorun/internal/crc32c"
	"github.com/gorun/gorun/internal/difflog"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/replay"
)

// TestRecordRoundTrip encodes the differentials of a simulated rank with
// every codec and decodes them back: every field as encoded, the seal the
// owner's, the gradient decodable to the tensor encoded.
func TestRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		codec replay.Options
	}{
		{"raw", 1000, replay.Options{Lossless: true}},
		{"raw one element", 1, replay.Options{Lossless: true}},
		{"int8", 5000, replay.Options{}},
		{"topk", 200_000, replay.Options{K: 0.05}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := difflogtest.NewOwner(1, tc.n, 7, tc.codec, false)
			o.Advance(3)
			for s := int64(1); s <= 3; s++ {
				want := o.Record(s)
				b, err := difflog.Encode(nil, want)
				if err != nil {
					t.Fatal(err)
				}
				if len(b) != want.Size() || len(b)%8 != 0 {
					t.Fatalf("step %d: %d bytes, Size says %d (multiple of 8 wanted)", s, len(b), want.Size())
				}
				got, tensor, err := difflog.DecodeTensor(b)
				if err != nil {
					t.Fatalf("step %d: %v", s, err)
				}
				if !got.Sealed() {
					t.Errorf("step %d: the seal does not verify", s)
				}
				if got.Diff.Step != s || got.Diff.Hyper != want.Diff.Hyper || got.Diff.Sum != want.Diff.Sum ||
					got.Optimizer != want.Optimizer || !slices.Equal(got.Regions, want.Regions) ||
					!bytes.Equal(got.Diff.Record, want.Diff.Record) ||
					!maps.EqualFunc(got.Diff.Other, want.Diff.Other, bytes.Equal) {
					t.Errorf("step %d: decoded %+v, want %+v", s, got, want)
				}
				if tensor.Len != tc.n {
					t.Errorf("step %d: a tensor of %d elements, want %d", s, tensor.Len, tc.n)
				}
			}
		})
	}
}

// TestEncodeRefuses: Encode checks the record as Decode would, and
// appends nothing when it refuses.
func TestEncodeRefuses(t *testing.T) {
	o := difflogtest.NewOwner(2, 100, 1, replay.Options{Lossless: true}, false)
	o.Advance(1)
	for _, tc := range []struct {
		name string
		edit func(r *difflog.Record)
	}{
		{"negative step", func(r *difflog.Record) { r.Diff.Step = -1 }},
		{"step past 2^53", func(r *difflog.Record) { r.Diff.Step = 1 << 53 }},
		{"bad hyper", func(r *difflog.Record) { r.Diff.Hyper.T = 0 }},
		{"no regions", func(r *difflog.Record) { r.Regions = nil }},
		{"17 regions", func(r *difflog.Record) {
			for i := range 15 {
				name := "r" + string(rune('a'+i))
				r.Regions = append(r.Regions, difflog.Region{Name: name})
				r.Diff.Other[name] = nil
			}
		}},
		{"bad name", func(r *difflog.Record) { r.Regions[1].Name = "Meta"; r.Diff.Other["Meta"] = r.Diff.Other["meta"] }},
		{"name twice", func(r *difflog.Record) { r.Regions = append(r.Regions, r.Regions[1]) }},
		{"other bytes short", func(r *difflog.Record) { r.Diff.Other["meta"] = r.Diff.Other["meta"][1:] }},
		{"other bytes missing", func(r *difflog.Record) { delete(r.Diff.Other, "meta") }},
		{"extra other bytes", func(r *difflog.Record) { r.Diff.Other["x"] = nil }},
		{"optimizer not in table", func(r *difflog.Record) { r.Optimizer.Region = "nope" }},
		{"N zero", func(r *difflog.Record) { r.Optimizer.N = 0 }},
		{"W outside", func(r *difflog.Record) { r.Optimizer.WOff = r.Regions[0].Size }},
		{"W unaligned", func(r *difflog.Record) { r.Optimizer.WOff = 2 }},
		{"M overlaps W", func(r *difflog.Record) { r.Optimizer.MOff = r.Optimizer.WOff + 4 }},
		{"no gradient", func(r *difflog.Record) { r.Diff.Record = nil }},
		{"huge region", func(r *difflog.Record) { r.Regions[1].Size = difflog.MaxRegionSize + 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := *o.Record(1)
			r.Regions = slices.Clone(r.Regions)
			r.Diff.Other = maps.Clone(r.Diff.Other)
			tc.edit(&r)
			prefix := []byte("keep")
			b, err := difflog.Encode(prefix, &r)
			if !errors.Is(err, difflog.ErrBadRecord) {
				t.Fatalf("Encode: %v, want ErrBadRecord", err)
			}
			if string(b) != "keep" {
				t.Errorf("Encode appended %d bytes on an error", len(b)-4)
			}
		})
	}
}

// fixCRC recomputes an encoded record's CRC32C (at 96+48R) after an edit,
// so that the edit reaches the checks behind it.
func fixCRC(b []byte) []byte {
	nr := int(b[5])
	tableEnd := 96 + 48*nr
	glen := int(binary.LittleEndian.Uint64(b[88:]))
	var others int
	for i := range nr {
		if i != int(b[6]) {
			others += int(binary.LittleEndian.Uint64(b[96+48*i+32:]))
		}
	}
	if glen < 0 || others < 0 || tableEnd+8+glen+others > len(b) || tableEnd+8+glen+others < 0 {
		return b // lengths the edit made impossible: Decode refuses them before the CRC
	}
	crc := crc32c.Checksum(b[:tableEnd])
	crc = crc32c.Update(crc, b[tableEnd+8+glen:tableEnd+8+glen+others])
	binary.LittleEndian.PutUint32(b[tableEnd:], crc)
	return b
}

// TestDecodeRefuses edits a valid encoding field by field (with the CRC
// fixed where the edit should be caught by a check behind it) and
// expects Decode to refuse each, naming what is wrong.
func TestDecodeRefuses(t *testing.T) {
	o := difflogtest.NewOwner(3, 64, 1, replay.Options{Lossless: true}, false)
	o.Advance(1)
	valid := o.Encoded(1)
	if _, err := difflog.Decode(valid); err != nil {
		t.Fatal(err)
	}
	tableEnd := 96 + 48*2
	put64 := func(off int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint64(b[off:], v); return fixCRC(b) }
	}
	for _, tc := range []struct {
		name string
		edit func(b []byte) []byte
		msg  string
	}{
		{"empty", func(b []byte) []byte { return nil }, "shorter than the header"},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, "magic"},
		{"version", func(b []byte) []byte { b[4] = 2; return b }, "format version"},
		{"reserved header", func(b []byte) []byte { b[7] = 1; return b }, "reserved"},
		{"no regions", func(b []byte) []byte { b[5] = 0; return b }, "regions"},
		{"17 regions", func(b []byte) []byte { b[5] = 17; return b }, "regions"},
		{"optimizer index out", func(b []byte) []byte { b[6] = 2; return b }, "optimizer at"},
		{"table cut", func(b []byte) []byte { return b[:tableEnd] }, "shorter than the header and table"},
		{"crc", func(b []byte) []byte { b[tableEnd] ^= 1; return b }, "CRC32C"},
		{"other bytes flipped", func(b []byte) []byte { b[len(b)-1-7] ^= 1; return b }, ""},
		{"step", put64(8, 1<<53), "step"},
		{"N", put64(16, 0), "optimizer of 0"},
		{"W offset", put64(24, 1<<41), "out of range"},
		{"V overlaps", func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[40:], binary.LittleEndian.Uint64(b[32:]))
			return fixCRC(b)
		}, "overlap"},
		{"T zero", put64(72, 0), "Adam step count"},
		{"beta1 one", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[52:], math.Float32bits(1))
			return fixCRC(b)
		}, "beta"},
		{"gradient length zero", put64(88, 0), "gradient of 0"},
		{"gradient length huge", put64(88, 1<<62), "for a gradient of"},
		{"name unpadded", func(b []byte) []byte { b[96+48+31] = 'x'; return fixCRC(b) }, "zero-padded"},
		{"name invalid", func(b []byte) []byte { b[96+48] = 'M'; return fixCRC(b) }, "name"},
		{"name twice", func(b []byte) []byte {
			copy(b[96+48:96+48+32], b[96:96+32])
			return fixCRC(b)
		}, "twice"},
		{"region size huge", put64(96+48+32, 1<<41), "out of range"},
		{"region size other", put64(96+48+32, 65), "bytes after the table"},
		{"entry reserved", func(b []byte) []byte { b[96+48+47] = 1; return fixCRC(b) }, "reserved"},
		{"reserved after table", func(b []byte) []byte { b[tableEnd+4] = 1; return b }, "reserved"},
		{"one byte more", func(b []byte) []byte { return append(b, 0) }, ""},
		{"8 bytes more", func(b []byte) []byte { return append(b, make([]byte, 8)...) }, "bytes after the table"},
		{"padding not zero", func(b []byte) []byte {
			// A meta region of 61 bytes: the record ends with 3 bytes of padding.
			r := *o.Record(1)
			r.Regions = slices.Clone(r.Regions)
			r.Regions[1].Size = 61
			r.Diff.Other = map[string][]byte{"meta": r.Diff.Other["meta"][:61]}
			nb, err := difflog.Encode(nil, &r)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := difflog.Decode(nb); err != nil {
				t.Fatal(err)
			}
			nb[len(nb)-1] = 1
			return nb
		}, "padding"},
		{"gradient flipped", func(b []byte) []byte { b[tableEnd+8+20] ^= 1; return b }, "gradient"},
		{"gradient of another step", func(b []byte) []byte {
			o2 := difflogtest.NewOwner(3, 64, 1, replay.Options{Lossless: true}, false)
			o2.Advance(2)
			r := *o.Record(1)
			r.Diff.Record = o2.Record(2).Diff.Record
			nb, err := difflog.Encode(nil, &r)
			if err != nil {
				t.Fatal(err)
			}
			return nb
		}, "of step 2"},
		{"gradient of other N", func(b []byte) []byte {
			o2 := difflogtest.NewOwner(3, 60, 1, replay.Options{Lossless: true}, false)
			o2.Advance(1)
			r := *o.Record(1)
			r.Diff.Record = o2.Record(1).Diff.Record
			nb, err := difflog.Encode(nil, &r)
			if err != nil {
				t.Fatal(err)
			}
			return nb
		}, "60 elements"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.edit(slices.Clone(valid))
			_, err := difflog.Decode(b)
			if !errors.Is(err, difflog.ErrBadRecord) {
				t.Fatalf("Decode: %v, want ErrBadRecord", err)
			}
			if tc.msg != "" && !bytes.Contains([]byte(err.Error()), []byte(tc.msg)) {
				t.Errorf("Decode: %v, want it to say %q", err, tc.msg)
			}
		})
	}
}

// TestDecodeEveryBitFlip flips every bit of an encoding in turn: Decode
// refuses each (the CRC32Cs cover every byte, and the padding is checked).
func TestDecodeEveryBitFlip(t *testing.T) {
	o := difflogtest.NewOwner(4, 8, 1, replay.Options{Lossless: true}, false)
	o.Advance(1)
	valid := o.Encoded(1)
	for i := range 8 * len(valid) {
		b := slices.Clone(valid)
		b[i/8] ^= 1 << (i % 8)
		if _, err := difflog.Decode(b); err == nil {
			t.Fatalf("bit %d of byte %d flipped: decoded", i%8, i/8)
		}
	}
	for n := range len(valid) {
		if _, err := difflog.Decode(valid[:n]); err == nil {
			t.Fatalf("cut to %d bytes of %d: decoded", n, len(valid))
		}
	}
}

// FuzzDecode: Decode never panics, and what it accepts encodes back to
// the same bytes. Seeds: testdata/fuzz/FuzzDecode (valid records of each
// codec, written by TestWriteFuzzSeeds with -update-seeds) and a few
// valid records made here.
func FuzzDecode(f *testing.F) {
	for i, codec := range []replay.Options{{Lossless: true}, {}, {K: 0.5, Threshold: 10}} {
		o := difflogtest.NewOwner(uint64(i), 16, 3, codec, false)
		o.Advance(2)
		f.Add(o.Encoded(2))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := difflog.Decode(b)
		if err != nil {
			if !errors.Is(err, difflog.ErrBadRecord) {
				t.Fatalf("an error not wrapping ErrBadRecord: %v", err)
			}
			return
		}
		again, err := difflog.Encode(nil, r)
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoded differs")
		}
	})
}

// TestFuzzSeedsDecode: the seed corpus in testdata holds records that
// decode (the fuzzer mutates from valid ones). With GORUN_WRITE_SEEDS=1
// it writes them.
func TestFuzzSeedsDecode(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	if os.Getenv("GORUN_WRITE_SEEDS") == "1" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, tc := range []struct {
			name  string
			codec replay.Options
		}{{"raw", replay.Options{Lossless: true}}, {"int8", replay.Options{}}, {"topk", replay.Options{K: 0.25, Threshold: 10}}} {
			o := difflogtest.NewOwner(uint64(10+i), 12, 5, tc.codec, i == 2)
			o.Advance(1)
			body := "go test fuzz v1\n[]byte(" + quote(o.Encoded(1)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, tc.name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	seeds, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(seeds) == 0 {
		t.Fatalf("no seeds in %s: %v", dir, err)
	}
}

// quote writes b as a Go string literal of hex escapes.
func quote(b []byte) string {
	const hex = "0123456789abcdef"
	out := []byte{'"'}
	for _, c := range b {
		out = append(out, '\\', 'x', hex[c>>4], hex[c&15])
	}
	return string(append(out, '"'))
}
