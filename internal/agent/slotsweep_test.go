package agent

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/internal/control"
	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/wire"
)

// TestAgentEndSweepsJobSlots: a spare that never made slot files, ending
// the job after every host with ranks was lost (their agents killed on
// the same /dev/shm), removes the slot files and lock file they left,
// when nobody holds the job's lock any more; a live claim of the job
// keeps them; another job's files stay, unclaimed ones too. The end's
// sweep of MPICH's segment files (which may wait up to mpichMinAge for a
// young one) comes after the slot files' (it came before: the launcher's
// exit wait could kill the agent before the slot files went).
func TestAgentEndSweepsJobSlots(t *testing.T) {
	for _, tc := range []struct {
		name string
		held bool // another agent of the job still holds its claim
	}{
		{"dead holders", false},
		{"live claim", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TMPDIR", t.TempDir())
			slots := t.TempDir()
			opt := ckpt.Options{Dir: slots}
			job := uniqueJob("slotsweep")
			regions := []ckpt.Region{{Name: "params", Size: 4096}}
			// dead leaves job's files as a killed agent does: made
			// under a claim, whose lock the kernel dropped.
			dead := func(job string) []string {
				t.Helper()
				lock := filepath.Join(slots, "gorun-"+job+".lock")
				if err := os.WriteFile(lock, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				for r := range 2 {
					s, err := ckpt.Create(job, r, regions, opt)
					if err != nil {
						t.Fatal(err)
					}
					s.Close()
				}
				files, err := filepath.Glob(filepath.Join(slots, "gorun-"+job+".*"))
				if err != nil || len(files) < 3 {
					t.Fatalf("job %s's files: %v (%v)", job, files, err)
				}
				return files
			}
			before := dead("endedjob")
			shm := t.TempDir()
			var logs gortest.SyncBuffer
			j := startSwapJob(t, job, []control.RendezvousHost{{Name: "h0", Ranks: []int{0}}, {Name: "h1", Spare: true}}, 1,
				swapOpts{with: func(c *Config) {
					c.shmDir, c.slotDir = shm, slots
					if c.Host == 1 {
						c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
					}
				}})
			j.until("the spare's first epoch", func(e *wire.Event) bool { return e.Kind == wire.EventEpoch })
			// The start's sweep runs beside the launch: once it removed
			// the ended job's files, what the test makes is not in it.
			for {
				if _, err := os.Lstat(before[0]); errors.Is(err, os.ErrNotExist) {
					break
				}
				select {
				case <-j.ctx.Done():
					t.Fatal("the agent's start did not sweep an ended job's slot files")
				case <-time.After(5 * time.Millisecond):
				}
			}
			own, other := dead(job), dead("otherjob")
			mpich := makeShmFile(t, shm, "mpich_shar_tmpEndSw1", time.Minute) // after the start's sweep
			if tc.held {
				c, err := ckpt.ClaimJob(job, opt)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Release()
			}
			j.send(&wire.Control{Op: wire.OpKill})
			j.send(&wire.Control{Op: wire.OpExit})
			j.waitExit(t)
			for _, f := range own {
				if _, err := os.Lstat(f); tc.held != (err == nil) {
					t.Errorf("%s: %v; the job's lock held: %v", f, err, tc.held)
				}
			}
			for _, f := range other {
				if _, err := os.Lstat(f); err != nil {
					t.Errorf("the ending agent swept another job's file: %v", err)
				}
			}
			if _, err := os.Lstat(mpich); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the unused MPICH file: %v; want it removed by the end's sweep", err)
			}
			if tc.held {
				return
			}
			out := logs.String()
			slotsAt := strings.Index(out, "removed the protected state the job's ended agents left")
			mpichAt := strings.Index(out, "removed MPICH shared-memory files no process uses")
			if slotsAt < 0 || mpichAt < slotsAt {
				t.Errorf("the spare's end swept the slot files at %d, MPICH's files at %d of its log: want the slot files first", slotsAt, mpichAt)
			}
		})
	}
}
