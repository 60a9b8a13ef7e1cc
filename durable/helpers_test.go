package durable

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/gorun/gorun/internal/crc32c"
)

// testRegions are small regions of awkward sizes: a chunk of 8 KiB cuts
// "params" into 2 full chunks and a short one, "meta" is shorter than a
// chunk, and "empty" has none.
var testRegions = []Region{
	{Name: "optimizer", Size: 3 * 8192},
	{Name: "params", Size: 2*8192 + 1000},
	{Name: "empty", Size: 0},
	{Name: "meta", Size: 100},
}

const testChunk = 8192

// testData returns the regions' bytes for (rank, step), a fixed
// pseudo-random function of them, and their CRC32Cs.
func testData(regions []Region, rank int, step int64) ([][]byte, []uint32) {
	r := rand.New(rand.NewPCG(uint64(rank)<<32|uint64(step), 0x5eed))
	src := make([][]byte, len(regions))
	sums := make([]uint32, len(regions))
	for i, reg := range regions {
		src[i] = make([]byte, reg.Size)
		for j := range src[i] {
			src[i][j] = byte(r.Uint32())
		}
		sums[i] = crc32c.Checksum(src[i])
	}
	return src, sums
}

// testLogger writes through the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// openTest opens rank's store in dir with testRegions and small chunks.
func openTest(t testing.TB, dir string, rank int, opt Options) *Store {
	t.Helper()
	if opt.ChunkSize == 0 {
		opt.ChunkSize = testChunk
	}
	if opt.Logger == nil {
		opt.Logger = testLogger(t)
	}
	s, err := Open(dir, rank, testRegions, opt)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// save saves (rank, step)'s test data.
func save(t testing.TB, s *Store, step int64) {
	t.Helper()
	src, sums := testData(s.regions, s.rank, step)
	if err := s.Save(context.Background(), step, src, sums, nil); err != nil {
		t.Fatalf("Save(%d): %v", step, err)
	}
}

// buffers returns empty buffers for regions.
func buffers(regions []Region) [][]byte {
	dst := make([][]byte, len(regions))
	for i, r := range regions {
		dst[i] = make([]byte, r.Size)
	}
	return dst
}

// checkLoad loads rank's step from dir and checks it is the test data,
// bit for bit.
func checkLoad(t testing.TB, dir string, rank int, step int64) {
	t.Helper()
	dst := buffers(testRegions)
	if err := Load(context.Background(), dir, rank, step, dst); err != nil {
		t.Fatalf("Load(rank %d, step %d): %v", rank, step, err)
	}
	want, _ := testData(testRegions, rank, step)
	for i := range want {
		if !bytes.Equal(dst[i], want[i]) {
			t.Fatalf("Load(rank %d, step %d): region %q differs from what was saved", rank, step, testRegions[i].Name)
		}
	}
}

// checkVerify runs Verify and fails on any problem.
func checkVerify(t testing.TB, dir string) {
	t.Helper()
	probs, err := Verify(context.Background(), dir)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	for _, p := range probs {
		t.Errorf("Verify: %s [%d, %d): %v", p.Path, p.Off, p.End, p.Err)
	}
}

// createTestManifest writes a manifest of world ranks of testRegions.
func createTestManifest(t testing.TB, dir string, world int) {
	t.Helper()
	m := &Manifest{Job: "job1", World: world, Protect: "full", Codec: "none", Every: 10, Command: "cmd"}
	for range world {
		m.Regions = append(m.Regions, testRegions)
	}
	if err := CreateManifest(dir, m); err != nil {
		t.Fatalf("CreateManifest: %v", err)
	}
}

// hookAt returns a test hook returning err at point (and arg, for
// "chunk"), once. The writer goroutines call it concurrently.
func hookAt(point string, arg int64, err error) func(string, int64) error {
	var done atomic.Bool
	return func(p string, a int64) error {
		if p == point && (p != "chunk" || a == arg) && done.CompareAndSwap(false, true) {
			return err
		}
		return nil
	}
}

func isNoVersion(err error) bool { return errors.Is(err, ErrNoVersion) }

// newDir returns a job directory with a manifest of world ranks.
func newDir(t testing.TB, world int) string {
	t.Helper()
	dir := t.TempDir()
	createTestManifest(t, dir, world)
	return dir
}
