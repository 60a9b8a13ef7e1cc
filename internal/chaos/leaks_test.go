package chaos

import (
	"path/filepath"
	"strings"
	"testing"
)

// gordumpFixture is one of internal/gordump's goroutine dumps (real
// gorun dumps: clean, and with a leaked launcher lane), shared rather
// than copied.
func gordumpFixture(name string) string {
	return filepath.Join("..", "gordump", "testdata", name)
}

// TestLauncherGoroutines reads the launcher's goroutine dump as checkLeaks
// does: gorun's goroutines left in it are leaks, each with its stack; a
// missing dump is one unless the harness killed the launcher.
func TestLauncherGoroutines(t *testing.T) {
	for _, tt := range []struct {
		name   string
		dump   string // a path, "" for none
		killed bool
		hung   string
		want   []string // what each leak says, in order
	}{
		{"clean", gordumpFixture("clean.txt"), false, "", nil},
		{"leaked", gordumpFixture("leaked.txt"), false, "", []string{"launcher.(*lane).run", "os/exec.(*Cmd).Wait"}},
		{"leaked, then killed", gordumpFixture("leaked.txt"), true, "", []string{"launcher.(*lane).run", "os/exec.(*Cmd).Wait"}},
		{"no dump", "", false, "", []string{"wrote no goroutine dump"}},
		{"no dump, SIGKILLed", "", true, "", nil},
		{"no dump, SIGQUIT", "", false, "gorun ran past 3m0s", nil},
		{"not a dump", filepath.Join("testdata", "mpisteps.c"), false, "", []string{"not a goroutine dump"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := &Job{Goroutines: filepath.Join("testdata", "absent"), killed: tt.killed, hung: tt.hung}
			if tt.dump != "" {
				j.Goroutines = tt.dump
			}
			got := launcherGoroutines(j)
			if len(got) != len(tt.want) {
				t.Fatalf("%d leaks, want %d: %q", len(got), len(tt.want), got)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("leak %d is %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
