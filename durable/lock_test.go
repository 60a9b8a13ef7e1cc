package durable

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenLocked: one rank's store is open in one place at a time. A
// second Open of the rank (another host that took the rank over while
// the old one still writes) fails with ErrLocked and touches nothing:
// the first store's temporary files stay, and it still saves. Once the
// first is closed, the rank opens again.
func TestOpenLocked(t *testing.T) {
	dir := newDir(t, 2)
	s := openTest(t, dir, 0, Options{Concurrency: 1})
	save(t, s, 1)
	// A temporary file of the first store's, as if it were inside an
	// atomic replacement.
	tmp := filepath.Join(rankDir(dir, 0), tempName(doneName(2)))
	if err := os.WriteFile(tmp, []byte("half a marker"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, 0, testRegions, Options{Concurrency: 1, ChunkSize: testChunk, Logger: testLogger(t)})
	if err == nil {
		s2.Close()
		t.Fatal("a second Open of rank 0 succeeded while the first store is open")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("a second Open of rank 0: %v, want ErrLocked", err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("the failed Open removed the open store's temporary file: %v", err)
	}
	// Another rank is not locked by it.
	openTest(t, dir, 1, Options{Concurrency: 1})
	save(t, s, 2)
	checkLoad(t, dir, 0, 2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3 := openTest(t, dir, 0, Options{Concurrency: 1})
	if v, ok := s3.Latest(); !ok || v.Step != 2 {
		t.Fatalf("Latest after reopening = %+v, %v; want step 2", v, ok)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the temporary file survived the reopening: %v", err)
	}
	checkVerify(t, dir)
}
