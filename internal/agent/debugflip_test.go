package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/keeper"
	"github.com/gorun/gorun/protect"
)

// TestDebugFlipHook: with GORUN_DEBUG_FLIP_REPLICAS=FILE, SIGUSR2 makes
// the agent flip its host's replicas and write what it did to FILE ("done"
// with the count in full mode, "refused" in diff mode); unset, the hook
// installs nothing, and the launcher host's in-process agent never
// installs it. The flip itself and its detection on restore are
// rank's TestFlipReplicaRestore.
func TestDebugFlipHook(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  bool
		// inProcess: the launcher host's agent, running inside gorun
		// (Config.Dial set), which must not take gorun's SIGUSR2.
		inProcess bool
		mode      protect.ProtectMode
		want      string // FILE's content after one SIGUSR2
	}{
		{"unset", false, false, protect.ModeFull, ""},
		{"in-process agent", true, true, protect.ModeFull, ""},
		{"full mode", true, false, protect.ModeFull, "done 3 0\n"},
		{"diff mode", true, false, protect.ModeDiff, "refused 3: " + keeper.ErrFlipMode.Error() + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "flips")
			if tc.set {
				t.Setenv(debugFlipEnv, file)
			} else {
				t.Setenv(debugFlipEnv, "")
			}
			cfg := Config{Job: "flip", Host: 3}
			if tc.inProcess {
				cfg.Dial = func(context.Context, control.ControlOptions) (*control.Control, error) {
					return nil, errors.New("not dialed")
				}
			}
			a := &agent{cfg: cfg, log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))}
			h, err := keeper.New(keeper.Config{Job: "flip", Host: 3, Hosts: 4, HostOf: func(int) int { return 0 }, Log: a.log, Mode: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			p := &protection{a: a, host: h, stop: make(chan struct{})}
			p.startDebugFlip()
			if tc.want == "" {
				if p.flipDone != nil {
					t.Fatal("the hook started a goroutine")
				}
				return
			}
			// Only this test's handler may see the signal: the process
			// has it, as an agent would.
			if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
				t.Fatal(err)
			}
			var got string
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(got, "\n") && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				b, _ := os.ReadFile(file)
				got = string(b)
			}
			close(p.stop)
			<-p.flipDone
			if got != tc.want {
				t.Errorf("%s holds %q, want %q", file, got, tc.want)
			}
		})
	}
}
