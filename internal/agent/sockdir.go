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
// host-wide); elsewhere, or when it cannot be made there, the sockets go
// in the job directory, as before. The sockets are never abstract ones
// (any local user could take such a name first), and serve still checks
// each peer's uid.

import (
	"log/slog"
	"syscall"
)

// makeSockDir makes job's socket directory in shm (the agent's shmDir)
// when shm is a tmpfs. It returns nil when shm is not one or the
// directory cannot be made there (why is logged at debug level): the
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
	d, err := makeNamedDir(shm, job, sockDirSuffix, "socket directory", sys)
	if err != nil {
		log.Debug("rank sockets go in the job directory", "err", err)
		return nil
	}
	return d
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
