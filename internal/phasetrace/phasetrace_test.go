package phasetrace

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestWriteRead: the phases marked come back from the file in the order
// of their first marks, with "main" first and "exit" last, each phase's
// count and its first mark not after its last; a malformed file is an
// error.
func TestWriteRead(t *testing.T) {
	Start()
	t.Cleanup(func() {
		on.Store(false)
		mu.Lock()
		phases, order = map[string]*Phase{}, nil
		mu.Unlock()
	})
	Mark("b")
	for range 3 {
		Mark("a")
	}
	path := filepath.Join(t.TempDir(), "phases")
	if err := Write(path); err != nil {
		t.Fatal(err)
	}
	ps, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
		if p.First > p.Last {
			t.Errorf("%s: first %d after last %d", p.Name, p.First, p.Last)
		}
	}
	if want := []string{"main", "b", "a", "exit"}; !slices.Equal(names, want) {
		t.Fatalf("phases %q, want %q", names, want)
	}
	if ps[2].N != 3 || ps[1].N != 1 {
		t.Errorf("counts a=%d b=%d, want 3 and 1", ps[2].N, ps[1].N)
	}

	for _, bad := range []string{"main 1 2\n", "main x 2 1\n", "main 1 2 y\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(path); err == nil {
			t.Errorf("Read(%q) = nil error", bad)
		}
	}
}

// TestMarkOff: without Start, Mark records nothing.
func TestMarkOff(t *testing.T) {
	Mark("nothing")
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 0 {
		t.Fatalf("marked %q without Start", order)
	}
}

// TestWriteNoFollow: Write refuses a symbolic link at its path and leaves
// the file it points to as it was.
func TestWriteNoFollow(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "phases")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := Write(link); err == nil {
		t.Fatal("Write followed a symbolic link")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("the link's target holds %q", b)
	}
}
