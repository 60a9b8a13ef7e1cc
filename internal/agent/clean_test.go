package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCleanNotLocal: gorun clean leaves the job directories alone when
// TMPDIR is not on a local file system (a lock there may be another
// host's agent's), and says why; /dev/shm's leftovers still go.
func TestCleanNotLocal(t *testing.T) {
	tmp, shm := t.TempDir(), t.TempDir()
	dir := filepath.Join(tmp, "gorun-endedjob-1.agent")
	ompi := filepath.Join(shm, "gorun-endedjob-h0-g0")
	for _, d := range []string{dir, ompi} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	nfs := func(path string, st *syscall.Statfs_t) error { st.Type = 0x6969; return nil }
	c, err := Clean(CleanOptions{TempDir: tmp, ShmDir: shm, statfs: nfs})
	if err != nil || len(c.JobDirs) != 0 || !strings.Contains(c.NotSwept, "not on a local file system") {
		t.Errorf("Clean on NFS: %+v, %v; want no job directory and why", c, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the job directory on NFS: %v (must be left)", err)
	}
	if len(c.OMPIDirs) != 1 {
		t.Errorf("Open MPI directories removed: %q, want %s", c.OMPIDirs, ompi)
	}
	// The same on a local file system takes it.
	local := func(path string, st *syscall.Statfs_t) error { st.Type = 0xef53; return nil }
	if c, err := Clean(CleanOptions{TempDir: tmp, ShmDir: shm, statfs: local}); err != nil || len(c.JobDirs) != 1 || c.NotSwept != "" {
		t.Errorf("Clean on ext4: %+v, %v; want the job directory", c, err)
	}
}

// TestCleanSockDirsStatfs: Clean judges ShmDir's file system with its
// options' statfs: a directory it says is a tmpfs has its unheld socket
// directories listed (-n) and removed; one it says is ext4 has them
// left (agents make none there).
func TestCleanSockDirsStatfs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fs    int64
		swept bool
	}{{"tmpfs", tmpfsMagic, true}, {"ext4", 0xef53, false}} {
		t.Run(tc.name, func(t *testing.T) {
			shm := t.TempDir()
			ended := filepath.Join(shm, "gorun-endedjob-7.sock")
			if err := os.Mkdir(ended, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, dry := range []bool{true, false} {
				c, err := Clean(CleanOptions{DryRun: dry, TempDir: t.TempDir(), ShmDir: shm, statfs: fsType(tc.fs)})
				if err != nil {
					t.Fatal(err)
				}
				if got := len(c.SockDirs) == 1 && c.SockDirs[0] == ended; got != tc.swept || len(c.SockDirs) > 1 {
					t.Errorf("dry run %v: socket directories %q; want %s: %v", dry, c.SockDirs, ended, tc.swept)
				}
				_, err = os.Stat(ended)
				if gone := errors.Is(err, os.ErrNotExist); gone != (tc.swept && !dry) {
					t.Errorf("dry run %v: removed: %v (%v)", dry, gone, err)
				}
			}
		})
	}
}
