//go:build linux

package cascade_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/cascade"
	"github.com/gorun/gorun/internal/difflog/difflogtest"
	"github.com/gorun/gorun/replay"
)

// watchOpens watches dir for files opened in it (inotify IN_OPEN) and
// returns a function that returns the names opened since, in order.
// Events are queued when a file is opened, so what a call that returned
// opened is there at once.
func watchOpens(t *testing.T, dir string) func() []string {
	t.Helper()
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		t.Skipf("no inotify here (%v): cannot see which files are opened", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_OPEN); err != nil {
		t.Fatalf("inotify %s: %v", dir, err)
	}
	return func() []string {
		var names []string
		buf := make([]byte, 64<<10)
		for {
			n, err := syscall.Read(fd, buf)
			if errors.Is(err, syscall.EAGAIN) {
				return names
			}
			if err != nil {
				t.Fatalf("inotify: %v", err)
			}
			for off := 0; off+syscall.SizeofInotifyEvent <= n; {
				ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
				if ev.Mask&syscall.IN_Q_OVERFLOW != 0 {
					t.Fatal("inotify: queue overflow")
				}
				name := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(ev.Len)]
				names = append(names, string(bytes.TrimRight(name, "\x00")))
				off += syscall.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// batchesOpened returns the batch files (diff.*) among names.
func batchesOpened(names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "diff.") {
			out = append(out, n)
		}
	}
	return out
}

// TestLoadReadsUpToTarget: Load to a step inside the log (at and between
// batch boundaries) gives the owner's state at it, as before, and opens
// no batch file after it: one of garbage right after the target's batch
// does not make it fail, while Reach, which reads the whole log, stops
// there and says so.
func TestLoadReadsUpToTarget(t *testing.T) {
	const base, reach, batch = 4, 28, 4 // batches 5-8, 9-12, ..., 25-28
	o := difflogtest.NewOwner(21, 2000, 3, replay.Options{Lossless: true}, false)
	o.Advance(reach)
	rs := regionsOf(o)
	for _, target := range []int64{4, 5, 6, 8, 9, 11, 12, 13, 20, 24} {
		t.Run(fmt.Sprint(target), func(t *testing.T) {
			dir := t.TempDir()
			saveBase(t, dir, o, base)
			appendLog(t, dir, o, base+1, reach, batch)
			// The first batch after the target's, garbage.
			after := base + 1 + (target-base+batch-1)/batch*batch
			if target == base {
				after = base + 1
			}
			garbage := fmt.Sprintf("diff.%d-%d", after, after+batch-1)
			if err := os.WriteFile(filepath.Join(dir, "r3", garbage), []byte("not a batch"), 0o600); err != nil {
				t.Fatal(err)
			}
			opened := watchOpens(t, filepath.Join(dir, "r3"))
			dst := buffers(rs)
			got, err := cascade.Load(context.Background(), dir, testRank, rs, base, target, dst, replay.ReplayOptions{})
			if err != nil {
				t.Fatalf("Load to %d: %v", target, err)
			}
			wantT := 0
			if target > base {
				wantT = o.Record(target).Diff.Hyper.T
			}
			if got.Replayed != int(target-base) || !got.Exact || got.AdamT != wantT {
				t.Errorf("Load: %+v, want %d replayed, exact, Adam step %d", got, target-base, wantT)
			}
			checkState(t, o, target, dst)
			for _, name := range batchesOpened(opened()) {
				var a, b int64
				if _, err := fmt.Sscanf(name, "diff.%d-%d", &a, &b); err != nil || a > target {
					t.Errorf("Load to %d opened %s", target, name)
				}
			}

			sp, stop := cascade.Reach(dir, testRank, rs, base)
			if want := (cascade.Span{From: base, To: after - 1}); sp != want || !errors.Is(stop, durable.ErrCorrupt) || !strings.Contains(stop.Error(), garbage) {
				t.Errorf("Reach: %+v, %v; want %+v and %s corrupt", sp, stop, want, garbage)
			}
			if _, err := cascade.Load(context.Background(), dir, testRank, rs, base, after, buffers(rs), replay.ReplayOptions{}); !errors.Is(err, cascade.ErrDisk) || !errors.Is(err, durable.ErrCorrupt) {
				t.Errorf("Load to %d, inside the garbage: %v, want ErrDisk and durable.ErrCorrupt", after, err)
			}
		})
	}
}
