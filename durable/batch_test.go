package durable

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// appendSteps appends rank's batch of steps a to b of diffRecord.
func appendSteps(t *testing.T, dir string, rank int, a, b int64) {
	t.Helper()
	var recs [][]byte
	for st := a; st <= b; st++ {
		recs = append(recs, diffRecord(rank, st))
	}
	if err := AppendBatch(dir, rank, a, b, recs); err != nil {
		t.Fatal(err)
	}
}

func TestReadBatches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		batches [][2]int64
		damage  string // a batch file to corrupt
		from    int64
		last    int64 // the last step returned (from if none)
		stop    error
	}{
		{"none", nil, "", 0, 0, nil},
		{"contiguous", [][2]int64{{1, 4}, {5, 5}, {6, 9}}, "", 0, 9, nil},
		{"from inside", [][2]int64{{1, 4}, {5, 9}}, "", 2, 9, nil},
		{"from the end", [][2]int64{{1, 4}}, "", 4, 4, nil},
		{"gap", [][2]int64{{1, 4}, {6, 9}}, "", 0, 4, ErrGap},
		{"gap first", [][2]int64{{3, 4}}, "", 0, 0, ErrGap},
		{"before from only", [][2]int64{{1, 4}}, "", 7, 7, nil},
		{"overlap", [][2]int64{{1, 6}, {4, 9}}, "", 0, 9, nil},
		{"nested", [][2]int64{{1, 9}, {3, 5}}, "", 0, 9, nil},
		{"bad batch", [][2]int64{{1, 4}, {5, 7}, {8, 9}}, diffName(5, 7), 0, 4, ErrCorrupt},
		{"bad batch, the overlapping one read", [][2]int64{{1, 4}, {5, 7}, {5, 9}}, diffName(5, 9), 0, 7, ErrCorrupt},
		{"good batch first", [][2]int64{{1, 4}, {5, 7}, {5, 9}}, diffName(5, 7), 0, 9, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, b := range tc.batches {
				appendSteps(t, dir, 2, b[0], b[1])
			}
			if tc.damage != "" {
				p := filepath.Join(rankDir(dir, 2), tc.damage)
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				b[len(b)-1] ^= 1
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			recs, stop := ReadBatches(dir, 2, tc.from)
			if tc.stop == nil && stop != nil || tc.stop != nil && !errors.Is(stop, tc.stop) {
				t.Errorf("stop = %v, want %v", stop, tc.stop)
			}
			if got := int64(len(recs)); got != tc.last-tc.from {
				t.Fatalf("%d records, want %d (steps %d to %d)", got, tc.last-tc.from, tc.from+1, tc.last)
			}
			for i, r := range recs {
				st := tc.from + 1 + int64(i)
				if r.Step != st || string(r.Data) != string(diffRecord(2, st)) {
					t.Errorf("record %d: step %d %q, want step %d", i, r.Step, r.Data, st)
				}
			}
		})
	}
}

func TestAppendBatchBadArgs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name        string
		rank        int
		first, last int64
		n           int
	}{
		{"negative rank", -1, 1, 1, 1},
		{"negative step", 0, -1, 1, 3},
		{"last before first", 0, 5, 4, 0},
		{"too few records", 0, 1, 3, 2},
		{"too many records", 0, 1, 3, 4},
	} {
		if err := AppendBatch(dir, tc.rank, tc.first, tc.last, make([][]byte, tc.n)); err == nil {
			t.Errorf("%s: AppendBatch succeeded", tc.name)
		}
	}
	// A batch of one empty record is fine, and so is writing it again.
	for range 2 {
		if err := AppendBatch(dir, 0, 7, 7, [][]byte{{}}); err != nil {
			t.Fatal(err)
		}
	}
	recs, stop := ReadBatches(dir, 0, 6)
	if len(recs) != 1 || recs[0].Step != 7 || len(recs[0].Data) != 0 || stop != nil {
		t.Errorf("ReadBatches = %+v, %v", recs, stop)
	}
}

// TestHugeBatchFiles: a batch file far larger than anything written
// (sparse: a torn or hostile file, or a record header claiming 1 GiB)
// is reported corrupt by ReadBatches and Verify, which read it without
// allocating its size.
func TestHugeBatchFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 1 GiB of a sparse file")
	}
	const claimed = 1 << 30
	for _, tc := range []struct {
		name string
		make func(t *testing.T, p string) // the batch file of steps 11 to 11
	}{
		{"zeros", func(t *testing.T, p string) { sparse(t, p, nil, 16<<30) }},
		{"too large", func(t *testing.T, p string) { sparse(t, p, nil, maxBatchFile+1) }},
		{"a record of 1 GiB", func(t *testing.T, p string) {
			b := rankBatchBytes(t, 0, 11, [][]byte{[]byte("eleven")})
			b = b[:batchHdr+recordHdr]
			le.PutUint32(b[batchHdr+8:], claimed) // the record's length; its CRC is wrong
			sparse(t, p, b, batchHdr+recordHdr+claimed)
		}},
		{"1 GiB after the last record", func(t *testing.T, p string) {
			sparse(t, p, rankBatchBytes(t, 0, 11, [][]byte{[]byte("eleven")}), claimed)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := newDir(t, 1)
			appendSteps(t, dir, 0, 1, 10)
			p := filepath.Join(rankDir(dir, 0), diffName(11, 11))
			tc.make(t, p)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			recs, stop := ReadBatches(dir, 0, 0)
			if len(recs) != 10 || !errors.Is(stop, ErrCorrupt) {
				t.Errorf("ReadBatches: %d records, stop %v; want 10 and ErrCorrupt", len(recs), stop)
			}
			probs, err := Verify(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(probs) != 1 || probs[0].Path != p || !errors.Is(probs[0].Err, ErrCorrupt) {
				t.Errorf("Verify: %v, want %s corrupt", probs, p)
			}
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > 256<<20 {
				t.Errorf("reading the batch allocated %d MiB", n>>20)
			}
		})
	}
}

// sparse writes b at the start of a new file p, which it then extends to
// size bytes with a hole.
func sparse(t *testing.T, p string, b []byte, size int64) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
}
