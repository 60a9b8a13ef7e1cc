package gordump

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestLeftover(t *testing.T) {
	for _, tt := range []struct {
		file string
		want []int // the leftover goroutines' ids
	}{
		// gorun's own dump at its exit: its main goroutine (which took
		// it) and os/signal's loop.
		{"clean.txt", nil},
		// The same with a launcher output lane left, and a goroutine
		// running only the standard library's code, created by gorun's.
		{"leaked.txt", []int{41, 59}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			dump, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			left, err := Leftover(dump)
			if err != nil {
				t.Fatal(err)
			}
			var ids []int
			for _, g := range left {
				ids = append(ids, g.ID)
			}
			if !slices.Equal(ids, tt.want) {
				t.Errorf("leftover goroutines %v, want %v", ids, tt.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	dump, err := os.ReadFile(filepath.Join("testdata", "leaked.txt"))
	if err != nil {
		t.Fatal(err)
	}
	gs, err := Parse(dump)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 4 {
		t.Fatalf("%d goroutines, want 4", len(gs))
	}
	g := gs[2]
	want := []string{"github.com/gorun/gorun/launcher.(*lane).run", "github.com/gorun/gorun/launcher.newLane"}
	if g.ID != 41 || g.State != "chan receive" || !slices.Equal(g.Funcs, want) {
		t.Errorf("goroutine %d [%s] %q, want 41 [chan receive] %q", g.ID, g.State, g.Funcs, want)
	}
	if gs[3].State != "select, 2 minutes" {
		t.Errorf("state %q", gs[3].State)
	}
	for _, bad := range []string{"", "hello\n", "goroutine x [running]:\nmain.main()\n"} {
		if _, err := Parse([]byte(bad)); !errors.Is(err, ErrFormat) {
			t.Errorf("Parse(%q): %v, want ErrFormat", bad, err)
		}
	}
}

// Write waits for a goroutine of gorun's that is ending, and dumps one
// that does not end once its wait has passed.
func TestWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump")
	release := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		<-release
	}()
	// The goroutine ends once Write has seen it and waits.
	waits := 0
	waiting = func() {
		if waits++; waits == 1 {
			close(release)
		}
	}
	defer func() { waiting = nil }()
	if err := Write(path, time.Minute); err != nil {
		t.Fatal(err)
	}
	<-ended
	if waits == 0 {
		t.Fatal("Write never waited")
	}
	if left := leftoverIn(t, path); len(left) != 0 {
		t.Errorf("Write did not wait for an ending goroutine: %v", left)
	}

	stop := make(chan struct{})
	defer close(stop)
	go func() { <-stop }()
	if err := Write(path, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if left := leftoverIn(t, path); len(left) != 1 {
		t.Errorf("%d leftover goroutines dumped, want the one still running", len(left))
	}
}

func leftoverIn(t *testing.T, path string) []Goroutine {
	t.Helper()
	dump, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	left, err := Leftover(dump)
	if err != nil {
		t.Fatal(err)
	}
	return left
}
