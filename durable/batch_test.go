package durable

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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

// readBatches is ScanBatches to the end of the log, the records kept
// (copied: a scan reuses its buffers).
func readBatches(dir string, rank int, from int64) ([]Record, error) {
	var out []Record
	stop := ScanBatches(dir, rank, from, math.MaxInt64, func(recs []Record) error {
		for _, r := range recs {
			out = append(out, Record{r.Step, bytes.Clone(r.Data)})
		}
		return nil
	})
	return out, stop
}

// damage flips a bit of the last byte of rank's batch file name.
func damage(t *testing.T, dir string, rank int, name string) {
	t.Helper()
	p := filepath.Join(rankDir(dir, rank), name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestScanBatches: the records after from, up to upTo, contiguous, one
// call per batch, stopping at a gap or a batch that does not verify;
// none of a batch that begins after upTo, which is never opened (a bad
// one there changes nothing).
func TestScanBatches(t *testing.T) {
	const all = math.MaxInt64
	for _, tc := range []struct {
		name    string
		batches [][2]int64
		damage  string // a batch file to corrupt
		from    int64
		upTo    int64
		calls   [][2]int64 // the steps of each call's records
		stop    error
	}{
		{"none", nil, "", 0, all, nil, nil},
		{"contiguous", [][2]int64{{1, 4}, {5, 5}, {6, 9}}, "", 0, all, [][2]int64{{1, 4}, {5, 5}, {6, 9}}, nil},
		{"from inside", [][2]int64{{1, 4}, {5, 9}}, "", 2, all, [][2]int64{{3, 4}, {5, 9}}, nil},
		{"from the end", [][2]int64{{1, 4}}, "", 4, all, nil, nil},
		{"gap", [][2]int64{{1, 4}, {6, 9}}, "", 0, all, [][2]int64{{1, 4}}, ErrGap},
		{"gap first", [][2]int64{{3, 4}}, "", 0, all, nil, ErrGap},
		{"before from only", [][2]int64{{1, 4}}, "", 7, all, nil, nil},
		{"overlap", [][2]int64{{1, 6}, {4, 9}}, "", 0, all, [][2]int64{{1, 6}, {7, 9}}, nil},
		{"nested", [][2]int64{{1, 9}, {3, 5}}, "", 0, all, [][2]int64{{1, 9}}, nil},
		{"bad batch", [][2]int64{{1, 4}, {5, 7}, {8, 9}}, diffName(5, 7), 0, all, [][2]int64{{1, 4}}, ErrCorrupt},
		{"bad batch, the overlapping one read", [][2]int64{{1, 4}, {5, 7}, {5, 9}}, diffName(5, 9), 0, all, [][2]int64{{1, 4}, {5, 7}}, ErrCorrupt},
		{"good batch first", [][2]int64{{1, 4}, {5, 7}, {5, 9}}, diffName(5, 7), 0, all, [][2]int64{{1, 4}, {5, 9}}, nil},

		{"up to a batch's end", [][2]int64{{1, 4}, {5, 8}, {9, 12}}, "", 0, 8, [][2]int64{{1, 4}, {5, 8}}, nil},
		{"up to inside a batch", [][2]int64{{1, 4}, {5, 8}, {9, 12}}, "", 0, 6, [][2]int64{{1, 4}, {5, 6}}, nil},
		{"up to the first step", [][2]int64{{1, 4}, {5, 8}}, "", 0, 1, [][2]int64{{1, 1}}, nil},
		{"up to from", [][2]int64{{1, 4}}, "", 3, 3, nil, nil},
		{"from and up to inside one batch", [][2]int64{{1, 9}}, "", 3, 6, [][2]int64{{4, 6}}, nil},
		{"past the log's end", [][2]int64{{1, 4}}, "", 0, 20, [][2]int64{{1, 4}}, nil},
		{"a bad batch after upTo is not read", [][2]int64{{1, 4}, {5, 8}, {9, 12}}, diffName(9, 12), 0, 8, [][2]int64{{1, 4}, {5, 8}}, nil},
		{"a gap after upTo is not one", [][2]int64{{1, 4}, {7, 8}}, "", 0, 4, [][2]int64{{1, 4}}, nil},
		{"a bad batch straddling upTo stops", [][2]int64{{1, 4}, {5, 8}}, diffName(5, 8), 0, 6, [][2]int64{{1, 4}}, ErrCorrupt},
		{"overlap to upTo, the longer batch bad", [][2]int64{{1, 4}, {5, 12}, {5, 8}}, diffName(5, 12), 0, 7, [][2]int64{{1, 4}, {5, 7}}, nil},
		{"overlap to upTo, the shorter batch short of it", [][2]int64{{1, 4}, {5, 6}, {5, 12}}, "", 0, 7, [][2]int64{{1, 4}, {5, 7}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, b := range tc.batches {
				appendSteps(t, dir, 2, b[0], b[1])
			}
			if tc.damage != "" {
				damage(t, dir, 2, tc.damage)
			}
			var calls [][2]int64
			stop := ScanBatches(dir, 2, tc.from, tc.upTo, func(recs []Record) error {
				if len(recs) == 0 {
					t.Fatal("a call without records")
				}
				calls = append(calls, [2]int64{recs[0].Step, recs[len(recs)-1].Step})
				for i, r := range recs {
					if st := recs[0].Step + int64(i); r.Step != st || string(r.Data) != string(diffRecord(2, st)) {
						t.Errorf("record %d: step %d %q, want step %d", i, r.Step, r.Data, st)
					}
				}
				return nil
			})
			if tc.stop == nil && stop != nil || tc.stop != nil && !errors.Is(stop, tc.stop) {
				t.Errorf("stop = %v, want %v", stop, tc.stop)
			}
			if !slices.Equal(calls, tc.calls) {
				t.Errorf("calls of steps %v, want %v", calls, tc.calls)
			}
		})
	}
}

// TestScanBatchesFn: fn's error ends the scan and is returned as it is;
// bad arguments are refused.
func TestScanBatchesFn(t *testing.T) {
	dir := t.TempDir()
	appendSteps(t, dir, 0, 1, 4)
	appendSteps(t, dir, 0, 5, 8)
	mine := errors.New("mine")
	n := 0
	err := ScanBatches(dir, 0, 0, math.MaxInt64, func([]Record) error { n++; return mine })
	if err != mine || n != 1 {
		t.Errorf("ScanBatches = %v after %d calls, want fn's error after 1", err, n)
	}
	for _, a := range [][2]int64{{-2, 5}, {5, 4}} {
		if err := ScanBatches(dir, 0, a[0], a[1], func([]Record) error { return nil }); err == nil {
			t.Errorf("ScanBatches(%d, %d) accepted", a[0], a[1])
		}
	}
	if err := ScanBatches(dir, -1, 0, 5, func([]Record) error { return nil }); err == nil {
		t.Error("ScanBatches of rank -1 accepted")
	}
}

// TestScanBatchesHoldsOneBatch: a scan reuses its buffers from batch to
// batch, whether a batch file is read whole (up to 64 MiB) or record by
// record: what it allocates is about one batch, not the log.
func TestScanBatchesHoldsOneBatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		batches int
		records int
		size    int // of a record
	}{
		{"files read whole", 32, 4, 256 << 10},                      // 32 MiB of 1 MiB files
		{"files read record by record", 4, 2, wholeBatch/2 + 1<<20}, // 4 files of 66 MiB
		{"records checked in pieces", 3, 1, streamRecord + 1<<20},   // records of 65 MiB
	} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.size > 1<<20 {
				t.Skip("writes and reads 200 MiB or more")
			}
			dir := t.TempDir()
			data := bytes.Repeat([]byte{7}, tc.size)
			recs := make([][]byte, tc.records)
			for i := range recs {
				recs[i] = data
			}
			for k := range tc.batches {
				a := int64(1 + k*tc.records)
				if err := AppendBatch(dir, 0, a, a+int64(tc.records)-1, recs); err != nil {
					t.Fatal(err)
				}
			}
			batch := uint64(tc.records * tc.size)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			n := 0
			err := ScanBatches(dir, 0, 0, math.MaxInt64, func(rs []Record) error {
				for _, r := range rs {
					if !bytes.Equal(r.Data, data) {
						t.Fatalf("step %d: wrong data", r.Step)
					}
				}
				n += len(rs)
				return nil
			})
			runtime.ReadMemStats(&after)
			if err != nil || n != tc.batches*tc.records {
				t.Fatalf("ScanBatches: %d records, %v; want %d", n, err, tc.batches*tc.records)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > batch+batch/2+2<<20 {
				t.Errorf("a scan of %d batches of %d KiB allocated %d KiB", tc.batches, batch>>10, got>>10)
			}
		})
	}
}

// TestScanBatchesVaryingSizes: batches read record by record whose
// records' sizes vary a little from batch to batch (larger, smaller,
// larger) reuse the buffers of the first: a buffer handed out for a
// smaller record keeps its capacity for a larger one after (review of
// 31c5b02: it was cut to the smaller size, and the next larger batch
// allocated its records again).
func TestScanBatchesVaryingSizes(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and reads 264 MiB")
	}
	const big = wholeBatch/2 + 1<<20 // two records make a file read record by record
	dir := t.TempDir()
	sizes := []int{big + 4096, big, big + 4096, big}
	for k, n := range sizes {
		rec := bytes.Repeat([]byte{byte(k)}, n)
		if err := AppendBatch(dir, 0, int64(2*k+1), int64(2*k+2), [][]byte{rec, rec}); err != nil {
			t.Fatal(err)
		}
	}
	batch := uint64(2 * (big + 4096))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := 0
	err := ScanBatches(dir, 0, 0, math.MaxInt64, func(rs []Record) error {
		for _, r := range rs {
			if k := int(r.Step-1) / 2; len(r.Data) != sizes[k] || r.Data[0] != byte(k) || r.Data[len(r.Data)-1] != byte(k) {
				t.Fatalf("step %d: wrong data", r.Step)
			}
		}
		n += len(rs)
		return nil
	})
	runtime.ReadMemStats(&after)
	if err != nil || n != 2*len(sizes) {
		t.Fatalf("ScanBatches: %d records, %v", n, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > batch+batch/4+2<<20 {
		t.Errorf("a scan of %d batches of about %d MiB allocated %d MiB", len(sizes), batch>>20, got>>20)
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
	recs, stop := readBatches(dir, 0, 6)
	if len(recs) != 1 || recs[0].Step != 7 || len(recs[0].Data) != 0 || stop != nil {
		t.Errorf("ScanBatches = %+v, %v", recs, stop)
	}
}

// TestHugeBatchFiles: a batch file far larger than anything written
// (sparse: a torn or hostile file, or a record header claiming 1 GiB)
// is reported corrupt by ScanBatches and Verify, which read it without
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
			recs, stop := readBatches(dir, 0, 0)
			if len(recs) != 10 || !errors.Is(stop, ErrCorrupt) {
				t.Errorf("ScanBatches: %d records, stop %v; want 10 and ErrCorrupt", len(recs), stop)
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

// TestScanBatchesBadBigRecord: a record of more than 64 MiB that does
// not verify costs a scan no more than a good record of its size did
// (read at once if it claims no more than one that verified, checked in
// pieces first if it claims more).
func TestScanBatchesBadBigRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 200 MiB and reads 1 GiB of a sparse file")
	}
	const big = streamRecord + 1<<20
	for _, tc := range []struct {
		name  string
		claim int64 // the bad record's length
	}{
		{"as large as a good one", big},
		{"1 GiB", 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			good := bytes.Repeat([]byte{3}, big)
			if err := AppendBatch(dir, 0, 1, 1, [][]byte{good}); err != nil {
				t.Fatal(err)
			}
			// Steps 2 and 3: a good record, then a bad one of claim
			// bytes.
			b := rankBatchBytes(t, 0, 2, [][]byte{good, good})
			off := batchHdr + recordHdr + big
			if tc.claim == big {
				b[off+recordHdr+100] ^= 1
			} else {
				b = b[:off+recordHdr]
				le.PutUint32(b[off+8:], uint32(tc.claim))
			}
			p := filepath.Join(rankDir(dir, 0), diffName(2, 3))
			sparse(t, p, b, int64(off+recordHdr)+tc.claim)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			recs, stop := readBatches(dir, 0, 0)
			runtime.ReadMemStats(&after)
			if len(recs) != 1 || !errors.Is(stop, ErrCorrupt) {
				t.Errorf("ScanBatches: %d records, %v; want 1 and %s corrupt", len(recs), stop, p)
			}
			// The test's copy of step 1, the scan's two buffers and a
			// third for the bad record read at once.
			if got := after.TotalAlloc - before.TotalAlloc; got > 4*big+4<<20 {
				t.Errorf("the scan allocated %d MiB", got>>20)
			}
		})
	}
}
