package agent

// An agent's socket directory, /dev/shm/gorun-<job>-<n>.sock, holds its
// ranks' sockets (rankSocket) and the data-plane sockets comm makes beside
// them (comm/init.go). Binding a Unix socket creates a file: on a disk
// file system (ext4 mounted with discard) that cost 17% of a 64-rank
// launch's samples, on a tmpfs a fraction of it. The ranks' TMPDIR stays
// in the job directory, on TMPDIR's file system: ranks may write large
// files there.
//
// The directory follows the job directory's rules (jobdir.go): made 0700
// and held with an exclusive flock for the agent's whole life, removed at
// its end (cleanup), swept when nobody holds it by agents starting and
// ending on the host and by gorun clean; the ".sock" suffix makes the
// name the agent's alone, as ".agent" does the job directory's. It is made
// only where /dev/shm is a tmpfs (a local file system: its locks are
// host-wide) that nobody else can rename entries in (safeParent);
// elsewhere, or when it cannot be made there, the sockets go in the job
// directory, as before. The sockets are never abstract ones (any local
// user could take such a name first), and serve still checks each peer's
// uid.

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"
)

// makeSockDir makes job's socket directory in shm (the agent's shmDir)
// when shm is a tmpfs that only its owner (root or this user) can
// rename entries of (safeParent). It returns nil when shm is not one or
// the directory cannot be made there (why is logged at debug level): the
// sockets then go in the job directory.
func makeSockDir(shm, job string, sys *jobDirSys, log *slog.Logger) *heldJobDir {
	var statfs statfsFunc
	if sys != nil {
		statfs = sys.statfs
	}
	if !isTmpfs(shm, statfs) {
		log.Debug("rank sockets go in the job directory: not a tmpfs", "dir", shm)
		return nil
	}
	if err := safeParent(shm); err != nil {
		log.Debug("rank sockets go in the job directory", "err", err)
		return nil
	}
	d, err := makeNamedDir(shm, job, sockDirSuffix, "socket directory", sys)
	if err != nil {
		log.Debug("rank sockets go in the job directory", "err", err)
		return nil
	}
	return d
}

// safeParent returns an error unless no other user can rename or
// remove the entries of dir: it is owned by root or the effective user,
// and either sticky or not writable by group and others. In a
// world-writable directory without the sticky bit (a Kubernetes Memory
// emptyDir at /dev/shm), another user could swap the socket directory
// for one of theirs while it is made, or later.
func safeParent(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return fmt.Errorf("%s: no owner known", dir)
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s is owned by uid %d, neither root nor uid %d", dir, st.Uid, os.Geteuid())
	case fi.Mode()&os.ModeSticky == 0 && fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s has mode %v: writable by others, not sticky", dir, fi.Mode())
	}
	return nil
}

// isTmpfs reports whether dir is on a tmpfs; statfs nil is syscall.Statfs.
func isTmpfs(dir string, statfs statfsFunc) bool {
	if statfs == nil {
		statfs = syscall.Statfs
	}
	var st syscall.Statfs_t
	return statfs(dir, &st) == nil && int64(st.Type) == tmpfsMagic
}

// sockDirJob returns the job whose socket directory name is:
// gorun-<job>-<n>.sock (jobDirJob's rule).
func sockDirJob(name string) (string, bool) { return heldDirJob(name, sockDirSuffix) }

// sweepSockDirsLog sweeps the socket directories in shm (of job only,
// unless it is "") that no agent holds, and logs what it removed, if shm
// is a tmpfs: elsewhere agents make none.
func sweepSockDirsLog(shm, job string, log *slog.Logger) {
	if !isTmpfs(shm, nil) {
		return
	}
	swept, err := sweepDirs(shm, sockDirJob, job, false)
	if err != nil {
		log.Warn("sweeping leftover socket directories", "err", err)
	}
	if len(swept) > 0 {
		log.Info("removed the socket directories of ended agents", "dirs", swept)
	}
}
