package ckpt

import (
	"errors"
	"hash/crc32"
	"testing"
)

// TestClear: every committed step is discarded, any step may be staged
// next, and a Staged in flight is abandoned.
func TestClear(t *testing.T) {
	s, opt := create(t, testRegions)
	commit(t, s, 5)
	commit(t, s, 6)
	st, err := s.Stage(7)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Clear(); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(); err == nil {
		t.Fatal("a Staged survived Clear")
	}
	for _, sl := range []*Slots{s, reopen(t, opt)} {
		if _, err := sl.Newest(); !errors.Is(err, ErrEmpty) {
			t.Fatalf("Newest after Clear: %v, want ErrEmpty", err)
		}
	}
	commit(t, s, 0)
	checkNewest(t, s, 0, -1, false)
}

// TestSums: Commit's CRC32Cs are those of the bytes committed.
func TestSums(t *testing.T) {
	s, _ := create(t, testRegions)
	st, err := s.Stage(1)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sums() != nil {
		t.Fatal("Sums before Commit")
	}
	for i, v := range st.Views() {
		fill(1, i, v)
	}
	if err := st.Commit(); err != nil {
		t.Fatal(err)
	}
	sums := st.Sums()
	for i, r := range s.Regions() {
		if w := crc32.Checksum(want(1, i, r.Size), castagnoli); sums[i] != w {
			t.Fatalf("region %s: Sums %08x, want %08x", r.Name, sums[i], w)
		}
	}
}
