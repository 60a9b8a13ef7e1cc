package durable

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// corruptDir makes a directory of one rank with a committed version of
// step 10 and a batch of steps 11 to 13, and returns the paths of its
// files by role.
func corruptDir(t *testing.T) (dir string, files map[string]string) {
	t.Helper()
	dir = newDir(t, 1)
	s := openTest(t, dir, 0, Options{Concurrency: 1})
	save(t, s, 10)
	if err := Commit(dir, 10); err != nil {
		t.Fatal(err)
	}
	if err := AppendBatch(dir, 0, 11, 13, [][]byte{[]byte("eleven"), {}, []byte("thirteen")}); err != nil {
		t.Fatal(err)
	}
	v, _ := s.Latest()
	s.Close()
	rd := rankDir(dir, 0)
	return dir, map[string]string{
		"base":     v.File,
		"latest":   filepath.Join(rd, latestName),
		"marker":   filepath.Join(rd, doneName(10)),
		"commit":   filepath.Join(dir, committedName),
		"batch":    filepath.Join(rd, diffName(11, 13)),
		"manifest": filepath.Join(dir, manifestName),
	}
}

// caught checks that the damage to file is found: by Verify, with the
// first bad byte range starting at or before off (and, if inRange, ending
// after it), and by the reader of that file.
func caught(t *testing.T, dir, role, path string, off int64, inRange bool) {
	t.Helper()
	probs, err := Verify(context.Background(), dir)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	found := false
	for _, p := range probs {
		if p.Path != path {
			continue
		}
		found = true
		if _, ok := errors.AsType[*CorruptError](p.Err); ok && (p.Off > off || inRange && p.End <= off) {
			t.Errorf("Verify: %s: bad range [%d, %d) does not hold byte %d: %v", role, p.Off, p.End, off, p.Err)
		}
	}
	if !found {
		t.Errorf("Verify found nothing wrong with the %s (problems: %v)", role, probs)
	}
	var rerr error
	switch role {
	case "base":
		rerr = Load(context.Background(), dir, 0, 10, buffers(testRegions))
	case "latest":
		// Open ignores a bad pointer (Verify reports it); the data
		// are found by their headers.
		s := openTest(t, dir, 0, Options{Concurrency: 1})
		if _, ok := s.Latest(); ok {
			t.Error("Open took a bad pointer")
		}
		s.Close()
		rerr = ErrCorrupt
	case "marker":
		if m, err := Markers(dir, 1, 10); err != nil || m[0] {
			t.Errorf("Markers counts a bad marker: %v, %v", m, err)
		}
		rerr = ErrCorrupt
	case "commit":
		_, rerr = ReadCommitted(dir)
	case "batch":
		recs, stop := readBatches(dir, 0, 10)
		if len(recs) != 0 {
			t.Errorf("ScanBatches returned %d records of a bad batch", len(recs))
		}
		rerr = stop
	case "manifest":
		_, rerr = ReadManifest(dir)
	}
	if !errors.Is(rerr, ErrCorrupt) {
		t.Errorf("the reader of the %s: %v, want ErrCorrupt", role, rerr)
	}
}

// TestBitFlips flips one bit at offsets in every kind of file.
func TestBitFlips(t *testing.T) {
	l, err := newLayout(testChunk, testRegions)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		role string
		offs []int64
	}{
		{"base", []int64{
			0, 4, 6, 8, 12, 16, 24, 32, 40, 44, 50, 64, 95, 96 + 3, 2000, hdrCRCOff, // the header
			hdrSize, hdrSize + 4*3 + 1, hdrSize + 4*l.chunks - 1, // the chunk table
			l.dataOff[0], l.dataOff[0] + 3*testChunk - 1, l.dataOff[1] + 2*testChunk + 5, l.dataOff[3] + 99, // the data
			hdrSize + 4*l.chunks, l.tableEnd - 1, // the zeros after the chunk table
			l.dataOff[1] + testRegions[1].Size, l.dataOff[2] - 1, l.dataOff[3] + 100, l.size - 1, // the zeros after the regions
		}},
		{"latest", []int64{0, 4, 8, 12, 16, 24, 32, 36, 39}},
		{"marker", []int64{0, 5, 8, 12, 16, 24, 32, 39}},
		{"commit", []int64{0, 4, 8, 15, 16, 20, 23}},
		{"batch", []int64{0, 4, 8, 12, 16, 24, 32, 36, batchHdr, batchHdr + 8, batchHdr + 12, batchHdr + 16, batchHdr + 16 + 6 + 16 + 16 + 7}},
		{"manifest", []int64{0, 4, 8, 12, 16, 30}},
	}
	for _, tc := range cases {
		for _, off := range tc.offs {
			t.Run(fmt.Sprintf("%s@%d", tc.role, off), func(t *testing.T) {
				dir, files := corruptDir(t)
				p := files[tc.role]
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if off >= int64(len(b)) {
					t.Fatalf("offset %d is past the %s's %d bytes", off, tc.role, len(b))
				}
				b[off] ^= 0x10
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
				caught(t, dir, tc.role, p, off, true)
			})
		}
	}
}

// TestTruncation cuts every kind of file short.
func TestTruncation(t *testing.T) {
	l, err := newLayout(testChunk, testRegions)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		role  string
		sizes []int64
	}{
		{"base", []int64{0, 1, hdrSize - 1, hdrSize, hdrSize + 10, l.tableEnd, l.dataOff[1] + 7, l.size - 1}},
		{"latest", []int64{0, 8, 39}},
		{"marker", []int64{0, 20, 39}},
		{"commit", []int64{0, 23}},
		{"batch", []int64{0, 39, 40, 50, batchHdr + 16 + 6 + 16 + 16 + 8 - 1}},
		{"manifest", []int64{0, 15, 16, 40}},
	}
	for _, tc := range cases {
		for _, size := range tc.sizes {
			t.Run(fmt.Sprintf("%s@%d", tc.role, size), func(t *testing.T) {
				dir, files := corruptDir(t)
				p := files[tc.role]
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if size >= fi.Size() {
					t.Fatalf("size %d is not shorter than the %s's %d bytes", size, tc.role, fi.Size())
				}
				if err := os.Truncate(p, size); err != nil {
					t.Fatal(err)
				}
				caught(t, dir, tc.role, p, size, false)
			})
		}
	}
}
