package agent

// An agent's job directory, $TMPDIR/gorun-<job>-<n>.agent, holds its
// ranks' TMPDIR (and their sockets where the socket directory, sockdir.go,
// cannot be made); the agent removes it when it ends. An agent
// killed before it could (SIGKILL, a lost host whose /tmp stays, hosts
// emulated by network namespaces sharing one) leaves it behind: the
// agent holds an exclusive flock(2) on the directory for its whole life,
// the kernel drops it when the agent dies, however it dies, and
// sweepJobDirs removes the directories nobody holds. It runs when an
// agent starts (any ended job's leftovers on the host) and when it ends
// (its own job's: a crashed agent of the job on the same file system is
// cleaned when the job ends, not at the next job); the start's sweep
// runs beside the launch (agent.startSweep). Slot files (ckpt.Sweep;
// ckpt.SweepJob at the end, sweepJobSlots) and
// Open MPI's directories (sweepShm) are swept the same way, as are the
// socket directories (sockdir.go), and gorun clean sweeps all four by
// hand (clean.go). sweepShm's pass over
// /dev/shm also removes MPICH's segment files nobody uses (mpichshm.go).
//
// All this only where os.TempDir() is on a local file system (localfs.go):
// elsewhere a lock may not be seen from another host, and directories
// are neither held nor swept.
//
// The ".agent" suffix makes the name the agent's alone: without it,
// other programs' temporary directories named gorun-<word>-<digits>
// (gorun's own tests make gorun-e2e-bin-<n>) would be job directories of
// job <word>, and swept while in use.

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gorun/gorun/internal/wire"
)

const (
	jobDirPrefix = "gorun-"
	jobDirSuffix = ".agent"
	// sockDirSuffix ends the names of the agents' socket directories
	// (sockdir.go), which follow the job directories' rules.
	sockDirSuffix = ".sock"
	// jobDirTries is how many directories makeJobDir makes before it
	// gives up: each lost one was taken by a sweeper between its
	// creation and its lock, which needs a sweep at that very moment.
	jobDirTries = 5
)

// jobDirSys is how makeJobDir reaches the system; the zero value is the
// real one. Tests replace parts.
type jobDirSys struct {
	statfs statfsFunc              // the parent's file system (tmpPolicyFor)
	flock  func(fd, how int) error // syscall.Flock
	made   func(path string)       // called between a directory's creation and its opening
	opened func(path string)       // called between a directory's opening and its lock
}

func (s *jobDirSys) lock(f *os.File) error {
	if s != nil && s.flock != nil {
		return s.flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

// heldJobDir is an agent's job directory, held (when its file system
// lets it): its exclusive flock stays until remove.
type heldJobDir struct {
	path string
	f    *os.File // the directory, open and locked; nil when unheld or removed
}

// held reports whether the directory's lock is held.
func (d *heldJobDir) held() bool { return d.f != nil }

// makeJobDir creates job's directory in parent (os.TempDir() for an
// agent) and, on a local file system, locks it before anything goes in.
// Elsewhere, or where the file system refuses the lock (lockUnsupported),
// the directory is made unheld: no agent sweeps it there, and one that
// tried could not lock it either.
//
// The directory gets its final name at once and is locked afterwards;
// a sweeper may come in between. It cannot take a directory in use:
// a sweeper removes a directory only while it holds the exclusive lock
// on it, after checking that the name still leads to what it locked,
// and lets go only once it removed it; makeJobDir takes the same lock
// without waiting, then checks that the name still leads to what it
// locked. The two locks exclude each other, so either makeJobDir's
// comes first, and every sweep fails to lock the directory while the
// agent lives, or a sweeper's does, and makeJobDir either fails to
// lock (the sweeper is at work) or finds the name gone (it is done):
// both times it lets the directory go and makes another. Creating under
// another name, locking and renaming would not do better: an agent
// killed before the rename would leave a name no sweep recognises. Here
// an agent killed before its lock leaves an unlocked directory of the
// right name, which the next sweep removes. The names compared are
// those of inodes the comparer holds open, whose numbers cannot be
// reused meanwhile.
//
// In a parent that others may write and that is not sticky (a
// Kubernetes Memory emptyDir at /dev/shm is 0777), another user can
// rename the fresh directory away and put one of theirs under its name
// before it is opened: what was opened and locked must be this user's
// and 0700 (checkOwnDir), else makeJobDir lets it go, and fails.
func makeJobDir(parent, job string, sys *jobDirSys) (*heldJobDir, error) {
	return makeNamedDir(parent, job, jobDirSuffix, "job directory", sys)
}

// makeNamedDir is makeJobDir for a directory named
// gorun-<job>-<n><suffix>, which errors call what.
func makeNamedDir(parent, job, suffix, what string, sys *jobDirSys) (*heldJobDir, error) {
	if !wire.ValidJobID(job) {
		return nil, fmt.Errorf("%s: invalid job id %q", what, job)
	}
	if sys == nil {
		sys = &jobDirSys{}
	}
	hold := tmpPolicyFor(parent, sys.statfs).local
	for range jobDirTries {
		path, err := os.MkdirTemp(parent, jobDirPrefix+job+"-*"+suffix)
		if err != nil {
			return nil, fmt.Errorf("creating the %s: %w", what, err)
		}
		if !hold {
			return &heldJobDir{path: path}, nil
		}
		if sys.made != nil {
			sys.made(path)
		}
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue // swept already
		}
		if err != nil {
			return nil, fmt.Errorf("opening the %s: %w", what, err)
		}
		if sys.opened != nil {
			sys.opened(path)
		}
		err = sys.lock(f)
		// No flock here: the directory stays, unheld, as no sweep can
		// lock it either.
		unheld := lockUnsupported(err)
		if unheld || err == nil && sameFile(f, path) {
			if err := checkOwnDir(f, path); err != nil {
				f.Close() // not ours to remove
				return nil, fmt.Errorf("the %s: %w", what, err)
			}
			if !unheld {
				return &heldJobDir{path: path, f: f}, nil
			}
			f.Close()
			return &heldJobDir{path: path}, nil
		}
		f.Close()
		if err != nil && !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking the %s: %w", what, err)
		}
		// A sweeper holds it, or removed it: it goes, make another.
	}
	return nil, fmt.Errorf("creating the %s: swept %d times while it was being made", what, jobDirTries)
}

// errNotOwnDir is checkOwnDir's refusal.
var errNotOwnDir = errors.New("not a private directory of this user")

// checkOwnDir returns an error wrapping errNotOwnDir, naming path, its
// owner and mode, unless the open directory f (found at path) is owned
// by the effective user and has no group or other permission.
func checkOwnDir(f *os.File, path string) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if mode := st.Mode & 0o7777; int(st.Uid) != os.Geteuid() || mode&0o077 != 0 {
		return fmt.Errorf("%w: %s is owned by uid %d with mode %#o (want uid %d, mode 0700)", errNotOwnDir, path, st.Uid, mode, os.Geteuid())
	}
	return nil
}

// remove removes the directory, then lets go of its lock: a sweeper
// never sees it unlocked.
func (d *heldJobDir) remove() error {
	if d == nil || d.path == "" {
		return nil
	}
	err := removeTree(d.path)
	if d.f != nil {
		d.f.Close()
		d.f = nil
	}
	d.path = ""
	return err
}

// removeTree removes path and everything below it. A tree it cannot
// remove for want of permission (a rank made a directory read-only) is
// made writable by its owner and removed once more: else every later
// sweep would fail on it again.
func removeTree(path string) error {
	err := os.RemoveAll(path)
	if !errors.Is(err, fs.ErrPermission) {
		return err
	}
	// WalkDir calls fn on a directory before it reads it: the chmod
	// comes first.
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if fi, ierr := d.Info(); ierr == nil {
				_ = os.Chmod(p, fi.Mode().Perm()|0o700)
			}
		}
		return nil
	})
	return os.RemoveAll(path)
}

// jobDirJob returns the job whose directory name is: gorun-<job>-<n>.agent
// with job a valid job id and n the decimal number os.MkdirTemp puts
// there. Job ids may hold '-', n never does: the last '-' ends the job's.
func jobDirJob(name string) (string, bool) { return heldDirJob(name, jobDirSuffix) }

// heldDirJob is jobDirJob for names ending in suffix.
func heldDirJob(name, suffix string) (string, bool) {
	rest, ok := strings.CutPrefix(name, jobDirPrefix)
	if !ok {
		return "", false
	}
	if rest, ok = strings.CutSuffix(rest, suffix); !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return "", false
	}
	job, n := rest[:i], rest[i+1:]
	if n == "" || strings.TrimLeft(n, "0123456789") != "" || !wire.ValidJobID(job) {
		return "", false
	}
	if _, err := strconv.ParseUint(n, 10, 32); err != nil {
		return "", false
	}
	return job, true
}

// sweepJobDirs removes the job directories in parent that no agent holds,
// those of job only unless job is "", and returns their names. Only
// directories are judged, never followed through a symbolic link, and
// only this user's. The caller checks that parent's file system is a
// local one (tmpPolicyFor).
func sweepJobDirs(parent, job string) ([]string, error) {
	swept, err := sweepDirs(parent, jobDirJob, job, false)
	if err != nil {
		return swept, fmt.Errorf("sweeping job directories: %w", err)
	}
	return swept, nil
}

// sweepDirs removes the directories in parent whose name match gives a
// job (job's only, unless job is "") and that nobody holds a flock on,
// and returns their names; with dry, it removes nothing and returns the
// names it would have removed. Only this user's directories are judged,
// never through a symbolic link. The names are read unsorted, as they
// come: a /tmp may hold many.
func sweepDirs(parent string, match func(name string) (string, bool), job string, dry bool) ([]string, error) {
	names, err := readNames(parent)
	if err != nil {
		return nil, err
	}
	var swept []string
	var errs []error
	for _, name := range names {
		j, ok := match(name)
		if !ok || job != "" && j != job {
			continue
		}
		if ok, err := sweepDir(parent, name, dry); err != nil {
			errs = append(errs, err)
		} else if ok {
			swept = append(swept, name)
		}
	}
	return swept, errors.Join(errs...)
}

// readNames returns the names in dir, unsorted.
func readNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

// sweepDir removes (dry: does not) the directory name in parent if it is
// this user's and nobody holds a flock on it, and says whether it did.
// Anything but a directory (a file, a FIFO, a link) is passed over.
func sweepDir(parent, name string, dry bool) (bool, error) {
	path := filepath.Join(parent, name)
	// O_DIRECTORY and O_NOFOLLOW: anything but a directory (a file,
	// a FIFO, a link) fails here.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, nil // gone meanwhile, replaced by a link, not a directory, or not ours to open
	}
	defer f.Close()
	var st syscall.Stat_t
	if syscall.Fstat(int(f.Fd()), &st) != nil || st.Uid != uint32(os.Getuid()) {
		return false, nil // another user's: not ours to judge
	}
	// Only the sweeper's own lock is left when the directory goes
	// (makeJobDir). In a sticky /tmp nobody else can rename the
	// name away between the check and the removal.
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil || !sameFile(f, path) {
		return false, nil
	}
	if err := removeUnlessDry(path, dry); err != nil {
		return false, err
	}
	return true, nil
}

func removeUnlessDry(path string, dry bool) error {
	if dry {
		return nil
	}
	return removeTree(path)
}

// sweepJobDirsLog sweeps the job directories in os.TempDir() (of job
// only, unless it is "") and logs what it removed, if the file system is
// a local one.
func sweepJobDirsLog(job string, log *slog.Logger) {
	parent := os.TempDir()
	if p := tmpPolicyFor(parent, nil); !p.local {
		logNotLocal(parent, p, log)
		return
	}
	swept, err := sweepJobDirs(parent, job)
	if err != nil {
		log.Warn("sweeping leftover job directories", "err", err)
	}
	if len(swept) > 0 {
		log.Info("removed the job directories of ended agents", "dirs", swept)
	}
}
