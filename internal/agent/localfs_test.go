package agent

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// TestJobDirPolicy: an agent holds its job directory, and sweeps, only
// on a local file system; on another, or one refusing flock, its
// directory is made unheld as before the sweep (the agent still
// starts), and any other lock error fails the start.
func TestJobDirPolicy(t *testing.T) {
	statErr := errors.New("statfs failed")
	for _, tc := range []struct {
		name      string
		fsType    int64
		statErr   error
		lockErr   error
		wantLock  bool // flock is tried
		wantHeld  bool
		wantSweep bool
		wantErr   bool
	}{
		{"tmpfs", tmpfsMagic, nil, nil, true, true, true, false},
		{"ext4", 0xef53, nil, nil, true, true, true, false},
		{"xfs", 0x58465342, nil, nil, true, true, true, false},
		{"btrfs", 0x9123683e, nil, nil, true, true, true, false},
		{"overlayfs", 0x794c7630, nil, nil, true, true, true, false},
		{"nfs", 0x6969, nil, nil, false, false, false, false},
		{"lustre", 0x0bd00bd0, nil, nil, false, false, false, false},
		{"beegfs", 0x19830326, nil, nil, false, false, false, false},
		{"gpfs", 0x47504653, nil, nil, false, false, false, false},
		{"unknown", 0x12345678, nil, nil, false, false, false, false},
		{"statfs fails", 0, statErr, nil, false, false, false, false},
		{"ext4, EBADF", 0xef53, nil, syscall.EBADF, true, false, true, false},
		{"ext4, ENOSYS", 0xef53, nil, syscall.ENOSYS, true, false, true, false},
		{"ext4, ENOLCK", 0xef53, nil, syscall.ENOLCK, true, false, true, false},
		{"ext4, EOPNOTSUPP", 0xef53, nil, syscall.EOPNOTSUPP, true, false, true, false},
		{"ext4, EINVAL", 0xef53, nil, syscall.EINVAL, true, false, true, false},
		{"ext4, EIO", 0xef53, nil, syscall.EIO, true, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			statfs := func(path string, st *syscall.Statfs_t) error {
				if path != parent {
					t.Errorf("statfs(%q), want the parent %q", path, parent)
				}
				st.Type = tc.fsType
				return tc.statErr
			}
			locked := false
			flock := func(fd, how int) error {
				locked = true
				if tc.lockErr != nil {
					return tc.lockErr
				}
				return syscall.Flock(fd, how)
			}
			if p := tmpPolicyFor(parent, statfs); p.local != tc.wantSweep {
				t.Errorf("tmpPolicyFor: %+v, want sweeping %v", p, tc.wantSweep)
			}
			d, err := makeJobDir(parent, "jobpolicy", &jobDirSys{statfs: statfs, flock: flock})
			if locked != tc.wantLock {
				t.Errorf("flock tried: %v, want %v", locked, tc.wantLock)
			}
			if tc.wantErr {
				if err == nil || !errors.Is(err, tc.lockErr) {
					t.Errorf("makeJobDir: %v, want an error wrapping %v", err, tc.lockErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("makeJobDir: %v", err)
			}
			if d.held() != tc.wantHeld {
				t.Errorf("held: %v, want %v", d.held(), tc.wantHeld)
			}
			if fi, err := os.Stat(d.path); err != nil || !fi.IsDir() {
				t.Errorf("the job directory: %v", err)
			}
			if err := d.remove(); err != nil {
				t.Error(err)
			}
			if left, _ := os.ReadDir(parent); len(left) != 0 {
				t.Errorf("left in the parent: %v", left)
			}
		})
	}
}
