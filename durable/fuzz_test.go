package durable

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"unsafe"
)

// Every parser of what is read from the directory gets arbitrary bytes:
// it must return an error or a value that encodes back to the same
// bytes, and never panic. Seeds are in testdata/fuzz/<FuzzName>
// (TestWriteSeeds writes them with GORUN_DURABLE_WRITE_SEEDS=1) and
// added below.

func headerSeeds() [][]byte {
	l, _ := newLayout(testChunk, testRegions)
	return [][]byte{
		encodeHeader(&header{state: stateFree, rank: 3, l: l}),
		encodeHeader(&header{state: stateComplete, rank: 3, step: 120, version: 7, table: 0xdeadbeef, l: l}),
	}
}

func FuzzParseHeader(f *testing.F) {
	for _, s := range headerSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b, 3, "fuzz")
		if err != nil {
			return
		}
		if got := encodeHeader(h); !bytes.Equal(got, b) {
			t.Errorf("a header parsed and encoded differs from the input")
		}
		if h.l.size < h.l.tableEnd || h.l.tableEnd < hdrSize+4*h.l.chunks {
			t.Errorf("a bad layout was accepted: %+v", h.l)
		}
	})
}

func pointerSeeds() [][]byte {
	return [][]byte{
		encodePointer(magicPointer, pointer{rank: 3, file: 2, step: 40, version: 9, hdrCRC: 0x1234}),
		encodePointer(magicMarker, pointer{rank: 3, file: 0, step: 0, version: 1}),
	}
}

func FuzzParsePointer(f *testing.F) {
	for _, s := range pointerSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, magic := range [][4]byte{magicPointer, magicMarker} {
			p, err := parsePointer(b, magic, 3, "fuzz")
			if err == nil && !bytes.Equal(encodePointer(magic, p), b) {
				t.Errorf("a pointer parsed and encoded differs from the input")
			}
		}
	})
}

func commitSeeds() [][]byte { return [][]byte{encodeCommit(0), encodeCommit(1 << 40)} }

func FuzzParseCommit(f *testing.F) {
	for _, s := range commitSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		step, err := parseCommit(b, "fuzz")
		if err == nil && !bytes.Equal(encodeCommit(step), b) {
			t.Errorf("a commit record parsed and encoded differs from the input")
		}
	})
}

// batchBytes returns the bytes AppendBatch writes for rank 3's records
// of steps a on.
func batchBytes(t testing.TB, a int64, recs [][]byte) []byte {
	return rankBatchBytes(t, 3, a, recs)
}

// rankBatchBytes returns the bytes AppendBatch writes for rank's records
// of steps a on.
func rankBatchBytes(t testing.TB, rank int, a int64, recs [][]byte) []byte {
	dir := t.TempDir()
	b := a + int64(len(recs)) - 1
	if err := AppendBatch(dir, rank, a, b, recs); err != nil {
		t.Fatal(err)
	}
	buf, err := os.ReadFile(filepath.Join(rankDir(dir, rank), diffName(a, b)))
	if err != nil {
		t.Fatal(err)
	}
	return buf
}

func batchSeeds(t testing.TB) [][]byte {
	return [][]byte{
		batchBytes(t, 11, [][]byte{[]byte("eleven"), {}, []byte("thirteen")}),
		batchBytes(t, 0, [][]byte{{1}}),
	}
}

func FuzzParseBatch(f *testing.F) {
	for _, s := range batchSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 32 {
			return
		}
		// The name gives the steps; take them from the bytes, as a
		// file named after its header would be.
		a, z := int64(le.Uint64(b[16:])), int64(le.Uint64(b[24:]))
		if a < 0 || z < a {
			return
		}
		recs, err := parseBatch(b, 3, a, z, "fuzz")
		if err != nil {
			return
		}
		if int64(len(recs)) != z-a+1 {
			t.Fatalf("%d records for steps %d to %d", len(recs), a, z)
		}
		var data [][]byte
		for _, r := range recs {
			data = append(data, r.Data)
		}
		if got := batchBytes(t, a, data); !bytes.Equal(got, b) {
			t.Errorf("a batch parsed and written again differs from the input")
		}
	})
}

// FuzzScanBatchRecords: the path that reads a batch file record by record
// (a file over 64 MiB: scanBatch through a ReaderAt, into batchBufs'
// buffers: take, fits, release, recycle, the verified shortcut) gives
// the verdict and the records of the path that reads it whole, for any
// bytes, any steps lo to hi (hi < lo: Verify) and any buffers the scan
// holds from the batch before; a second scan with the buffers the first
// left (recycled if it verified, released if not) does too; and every
// record handed over is cut to its length (appending to it cannot write
// into a buffer's rest), and no buffer the scan holds loses capacity.
// The records are small: the thresholds of large records (64 MiB, read
// in pieces of 1 MiB) are small too (batchReader.small, from the input).
func FuzzScanBatchRecords(f *testing.F) {
	for _, s := range batchSeeds(f) {
		f.Add(s, uint8(0), int8(5), uint16(0), uint16(0), uint16(0), uint8(0))
		f.Add(s, uint8(1), int8(0), uint16(8), uint16(100), uint16(4), uint8(3))
		f.Add(s, uint8(0), int8(-1), uint16(3), uint16(0), uint16(100), uint8(1))
		f.Add(s, uint8(0), int8(4), uint16(9), uint16(0), uint16(7), uint8(5))
	}
	f.Fuzz(func(t *testing.T, b []byte, dlo uint8, dhi int8, free1, free2, verified uint16, small uint8) {
		if len(b) < 32 {
			return
		}
		a, z := int64(le.Uint64(b[16:])), int64(le.Uint64(b[24:]))
		if a < 0 || z < a || a > math.MaxInt64-512 {
			return
		}
		lo := a + int64(dlo)
		hi := lo + int64(dhi)
		whole, werr := scanBatch(&batchReader{buf: b, size: int64(len(b)), path: "fuzz"}, 3, a, z, lo, hi)
		check := func(name string, recs []Record, err error) {
			t.Helper()
			if (err == nil) != (werr == nil) {
				t.Fatalf("%s: %v; read whole: %v", name, err, werr)
			}
			if len(recs) != len(whole) {
				t.Fatalf("%s: %d records; read whole: %d", name, len(recs), len(whole))
			}
			for i, r := range recs {
				if r.Step != whole[i].Step || !bytes.Equal(r.Data, whole[i].Data) {
					t.Fatalf("%s: record %d (step %d) differs from the one read whole", name, i, r.Step)
				}
				if cap(r.Data) != len(r.Data) {
					t.Fatalf("%s: record of step %d: %d bytes of a buffer of %d handed over", name, r.Step, len(r.Data), cap(r.Data))
				}
			}
		}
		bufs := &batchBufs{free: [][]byte{make([]byte, 0, free1%4096), make([]byte, 3, free2%4096+3)}, verified: int64(verified % 4096)}
		for i := range 2 {
			// The capacities of the buffers the scan holds before.
			caps := map[*byte]int{}
			for _, fb := range bufs.free {
				caps[unsafe.SliceData(fb[:cap(fb)])] = cap(fb)
			}
			r := &batchReader{f: bytes.NewReader(b), size: int64(len(b)), path: "fuzz", bufs: bufs, small: int64(small)}
			recs, err := scanBatch(r, 3, a, z, lo, hi)
			check(fmt.Sprintf("scan %d record by record", i), recs, err)
			if err == nil {
				bufs.recycle()
			} else {
				bufs.release()
			}
			if len(bufs.used) != 0 {
				t.Fatalf("%d buffers still used after the batch", len(bufs.used))
			}
			for _, fb := range bufs.free {
				if c, ok := caps[unsafe.SliceData(fb[:cap(fb)])]; ok && cap(fb) != c {
					t.Fatalf("scan %d: a buffer of %d bytes came back with %d", i, c, cap(fb))
				}
			}
		}
		recs, err := scanBatch(&batchReader{f: bytes.NewReader(b), size: int64(len(b)), path: "fuzz", small: int64(small)}, 3, a, z, lo, hi)
		check("record by record without buffers", recs, err)
	})
}

func manifestSeeds() [][]byte {
	b, _ := encodeManifest(testManifest())
	m := testManifest()
	m.World, m.Regions = 1, m.Regions[:1]
	c, _ := encodeManifest(m)
	return [][]byte{b, c}
}

func FuzzParseManifest(f *testing.F) {
	for _, s := range manifestSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest(b, "fuzz")
		if err != nil {
			return
		}
		if err := m.check(); err != nil {
			t.Errorf("parseManifest accepted a bad manifest: %v", err)
		}
		if _, err := encodeManifest(m); err != nil {
			t.Errorf("a manifest parsed cannot be encoded: %v", err)
		}
	})
}

// TestWriteSeeds writes the fuzz seeds into testdata/fuzz when
// GORUN_DURABLE_WRITE_SEEDS=1, and otherwise checks that they are there.
func TestWriteSeeds(t *testing.T) {
	seeds := map[string][][]byte{
		"FuzzParseHeader":   headerSeeds(),
		"FuzzParsePointer":  pointerSeeds(),
		"FuzzParseCommit":   commitSeeds(),
		"FuzzParseBatch":    batchSeeds(t),
		"FuzzParseManifest": manifestSeeds(),
	}
	write := os.Getenv("GORUN_DURABLE_WRITE_SEEDS") == "1"
	for name, ss := range seeds {
		for i, s := range ss {
			p := filepath.Join("testdata", "fuzz", name, fmt.Sprintf("seed%d", i))
			content := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", s)
			if write {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, content, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, content) {
				t.Errorf("%s is missing or stale (%v): run this test with GORUN_DURABLE_WRITE_SEEDS=1", p, err)
			}
		}
	}
}
