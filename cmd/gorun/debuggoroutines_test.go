package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gorun/gorun/internal/gordump"
)

// With GORUN_DEBUG_GOROUTINES, gorun run writes its goroutine dump at its
// exit, whether the job ran or gorun refused it, and no goroutine of
// gorun's is left in it (the chaos suite's check, on a local job).
func TestDebugGoroutines(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		code int
	}{
		{"job", []string{"-np", "2", "--oversubscribe", "sh", "-c", "echo hi"}, 0},
		{"refused", []string{"-np", "2", "--redundancy", "nonsense", "true"}, exitUsage},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "goroutines")
			cmd := exec.Command(gorunBin, tt.args...)
			cmd.Env = append(os.Environ(), debugGoroutinesEnv+"="+path)
			out, err := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tt.code {
				t.Fatalf("exit %d (%v), want %d:\n%s", code, err, tt.code, out)
			}
			dump, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("no dump: %v", err)
			}
			left, err := gordump.Leftover(dump)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range left {
				t.Errorf("a goroutine of gorun's left at its exit:\n%s", g.Stack)
			}
		})
	}
}
