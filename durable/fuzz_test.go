package durable

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
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
