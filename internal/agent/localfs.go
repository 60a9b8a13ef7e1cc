package agent

// Whether the file system holding the job directories (os.TempDir()) is
// local to the host. The job directory sweep trusts flock(2): a directory
// an agent holds is never removed. That holds only where every process
// that sees the directory sees its lock, a local file system. On a
// network one (TMPDIR=$SCRATCH/tmp) locks may be local to each client
// (BeeGFS without global file locks, Lustre with localflock, NFS with
// local_lock=flock): another host's agent would take a live agent's
// directory for a dead one's. Or locks may be refused (NFS's EBADF on a
// directory, Lustre's ENOSYS without flock). So agents sweep only on a
// file system known to be local, and where locks are refused they keep
// their directory unheld, as before the sweep existed.

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
)

// tmpfsMagic is a tmpfs's statfs f_type.
const tmpfsMagic = 0x01021994

// localFSTypes names the statfs f_types (linux/magic.h) of the local
// file systems: a flock there is seen by every process of the host, and
// by nobody else.
var localFSTypes = map[int64]string{
	tmpfsMagic: "tmpfs",
	0x858458f6: "ramfs",
	0xef53:     "ext2/3/4",
	0x58465342: "xfs",
	0x9123683e: "btrfs",
	0x794c7630: "overlayfs",
	0xf2f52010: "f2fs",
	0x2fc12fc1: "zfs",
	0xca451a4e: "bcachefs",
	0x52654973: "reiserfs",
	0x3153464a: "jfs",
	0x4d44:     "vfat",
}

// tmpPolicy is how an agent treats the job directories of a parent
// directory, from the parent's file system.
type tmpPolicy struct {
	fs    string // the file system's name, or its f_type in hex, or why statfs failed
	local bool   // a local file system: job directories are held, and swept
}

// tmpPolicyOf is the policy for a parent whose statfs gave fsType, or
// failed with err (then nothing is swept).
func tmpPolicyOf(fsType int64, err error) tmpPolicy {
	if err != nil {
		return tmpPolicy{fs: fmt.Sprintf("statfs: %v", err)}
	}
	if name, ok := localFSTypes[fsType]; ok {
		return tmpPolicy{fs: name, local: true}
	}
	return tmpPolicy{fs: fmt.Sprintf("f_type %#x", fsType)}
}

// statfsFunc is syscall.Statfs's type; tests give their own.
type statfsFunc func(path string, st *syscall.Statfs_t) error

// tmpPolicyFor is the policy for the job directories in parent.
func tmpPolicyFor(parent string, statfs statfsFunc) tmpPolicy {
	if statfs == nil {
		statfs = syscall.Statfs
	}
	var st syscall.Statfs_t
	err := statfs(parent, &st)
	return tmpPolicyOf(int64(st.Type), err)
}

// lockUnsupported reports whether a flock error means the file system
// does not do flock on this directory (rather than that another process
// holds it): the directory is then kept unheld.
func lockUnsupported(err error) bool {
	for _, e := range []syscall.Errno{syscall.EBADF, syscall.ENOSYS, syscall.ENOLCK, syscall.EOPNOTSUPP, syscall.EINVAL} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// notLocalLogged makes the agent say once that it does not sweep.
var notLocalLogged sync.Once

// logNotLocal says, once per process, at debug level, that the job
// directories in parent are not swept.
func logNotLocal(parent string, p tmpPolicy, log *slog.Logger) {
	notLocalLogged.Do(func() {
		log.Debug("job directories are not swept: their file system is not known to be local (flock may not be host-wide)", "dir", parent, "fs", p.fs)
	})
}
