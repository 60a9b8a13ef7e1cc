package keeper

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/ckpt"
	"github.com/gorun/gorun/protect"
)

// ownHost is a host of job "ownjob" keeping rank 1's slots in dir, alone
// (no links): two of them on one dir are two agents of a job sharing
// /dev/shm, as network namespace hosts do.
func ownHost(t *testing.T, dir string, host int) *Keeper {
	t.Helper()
	h, err := New(Config{
		Job: "ownjob", Host: host, Hosts: 2, Ranks: []int{1}, Dir: dir,
		HostOf: func(int) int { return host }, Peers: func(int) []int { return []int{1} },
		Mode: protect.ModeDiff, Diff: DiffConfig{Fold: 8, BaseEvery: 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// rankFiles returns the names of rank 1's files in dir.
func rankFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "gorun-ownjob.r1.") {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestRemoveFilesLeavesTakenOver: a host whose rank 1 a spare sharing its
// slot directory took over (chaos SEED=2026 ONLY=69: a partitioned host's
// agent ending after the spare rolled rank 1 back) removes only the files
// it made, not the rank's names: the spare's stay, whole, whether the
// host ends (RemoveFiles) or the rank leaves it (SetPlacement). Alone,
// the host removes its own. Rank 1's slots are made by a ProtectHello
// (with a gradient buffer) or by a Preload (a rollback from disk).
func TestRemoveFilesLeavesTakenOver(t *testing.T) {
	regions := []protect.Region{diffRegions[0], diffRegions[2]}
	make1 := map[string]func(t *testing.T, h *Keeper, step int64){
		"hello": func(t *testing.T, h *Keeper, _ int64) {
			_, ans, err := h.Session(1).Handle(context.Background(), protect.TypeProtectHello, diffHelloOf(t, diffRegions))
			if err != nil {
				t.Fatal(err)
			}
			if w := ans.(*protect.ProtectWelcome); w.Err != "" || w.Gradient == nil {
				t.Fatalf("ProtectHello: %q, gradient %+v", w.Err, w.Gradient)
			}
		},
		"preload": func(t *testing.T, h *Keeper, step int64) {
			if err := h.Preload(1, regions, step, func([][]byte) (int, error) { return 1, nil }); err != nil {
				t.Fatal(err)
			}
		},
	}
	for _, tc := range []struct {
		name  string
		make  string
		spare bool // a second host makes rank 1's slots after the first
		leave bool // the rank leaves the first host, which goes on
	}{
		{"hello/spare/host ends", "hello", true, false},
		{"hello/spare/rank leaves", "hello", true, true},
		{"hello/alone/host ends", "hello", false, false},
		{"preload/spare/host ends", "preload", true, false},
		{"preload/spare/rank leaves", "preload", true, true},
		{"preload/alone/rank leaves", "preload", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a := ownHost(t, dir, 0)
			make1[tc.make](t, a, 3)
			made := rankFiles(t, dir)
			if len(made) == 0 {
				t.Fatal("rank 1 has no files")
			}
			var b *Keeper
			if tc.spare {
				b = ownHost(t, dir, 1)
				make1[tc.make](t, b, 7)
				if got := rankFiles(t, dir); !slices.Equal(got, made) {
					t.Fatalf("the spare made %v, the host %v", got, made)
				}
			}
			if tc.leave {
				if err := a.SetPlacement(Placement{Ranks: []int{}, HostOf: []int{1, 1}, Epoch: 1, G: -1}); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				if err := a.RemoveFiles(); err != nil {
					t.Fatal(err)
				}
			}
			got := rankFiles(t, dir)
			if !tc.spare {
				if len(got) != 0 {
					t.Fatalf("the host left its own files %v", got)
				}
				return
			}
			if !slices.Equal(got, made) {
				t.Fatalf("the spare's files are %v after the first host removed its own, want %v", got, made)
			}
			// What stays is the spare's, whole: its step opens.
			s, err := ckpt.Open("ownjob", 1, nil, ckpt.Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if tc.make == "preload" {
				if _, err := s.At(7); err != nil {
					t.Errorf("the spare's step 7: %v", err)
				}
			}
			for _, f := range s.Files() {
				if _, err := os.Stat(filepath.Join(dir, filepath.Base(f.Path))); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestHelloWaitsForNamesLock: another agent of the job holds rank 1's
// names lock (its own claim, as when it is in RemoveOwned between its
// check and its removal). A ProtectHello must wait for it before it
// removes and makes rank 1's names (the gradient buffer among them),
// whether it makes the slots too or Preload made them (a rollback from
// disk on a spare).
func TestHelloWaitsForNamesLock(t *testing.T) {
	for _, preload := range []bool{false, true} {
		name := map[bool]string{false: "first hello", true: "hello after Preload"}[preload]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			b := ownHost(t, dir, 1)
			if preload {
				if err := b.Preload(1, diffRegions, 7, func([][]byte) (int, error) { return 1, nil }); err != nil {
					t.Fatal(err)
				}
			}
			other, err := ckpt.ClaimJob("ownjob", ckpt.Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Release()
			held, release, names := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			go func() { names <- other.Names(1, func() error { close(held); <-release; return nil }) }()
			<-held
			done := make(chan error, 1)
			go func() {
				_, ans, err := b.Session(1).Handle(context.Background(), protect.TypeProtectHello, diffHelloOf(t, diffRegions))
				if err == nil && ans.(*protect.ProtectWelcome).Err != "" {
					err = errors.New(ans.(*protect.ProtectWelcome).Err)
				}
				done <- err
			}()
			// The hello cannot end while the lock is held; a hello that
			// does not take it ends at once. A second is a generous bound
			// for that, and no bound on the correct code's run.
			var early bool
			select {
			case err := <-done:
				early = true
				t.Errorf("the hello made rank 1's names while another agent held rank 1's names lock (err %v)", err)
			case <-time.After(time.Second):
			}
			close(release)
			if err := <-names; err != nil {
				t.Fatal(err)
			}
			if !early {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
