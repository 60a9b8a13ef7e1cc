package ckpt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A Claim says that a job's slot files in a directory are in use: every
// process that owns some of them (the job's agents on this machine; hosts
// emulated by network namespaces share one /dev/shm) holds a shared
// flock(2) on the job's lock file, gorun-<job>.lock, for as long as it
// runs. The kernel drops the lock when the process dies, however it dies,
// so the files of a job whose every owner is gone can be recognised, and
// removed, by the next agent that sweeps the directory.
type Claim struct {
	mu   sync.RWMutex // Release holds it to close f; Names, to use it
	f    *os.File
	path string
	job  string
	dir  string

	noLock atomic.Pointer[error]                             // why Names cannot lock: it no longer tries
	wait   time.Duration                                     // Names's wait for the lock; 0 is NamesWait
	lockFn func(fd uintptr, cmd int, lk *unix.Flock_t) error // tests: fcntl(2) in its place
}

func lockName(job string) string { return filePrefix + job + ".lock" }

// ClaimJob takes a shared claim on job's files in opt's directory.
func ClaimJob(job string, opt Options) (*Claim, error) {
	if err := checkIDs(job, 0); err != nil {
		return nil, err
	}
	dir := opt.dir()
	path := filepath.Join(dir, lockName(job))
	for try := range 200 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("ckpt: claiming job %s: %w", job, err)
		}
		// /dev/shm is shared by every user: a lock file another user made
		// (or made writable) is not ours to trust.
		if err := ours(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("ckpt: claiming job %s: %s: %w", job, path, err)
		}
		// Without waiting: only a sweeper holds the lock exclusively, and
		// only for a moment.
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) && try < 199 {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return nil, fmt.Errorf("ckpt: claiming job %s: %w", job, err)
		}
		// A sweeper may have removed the file between our open and our
		// lock: the claim holds only if the name still leads to it.
		if same(f, path) {
			return &Claim{f: f, path: path, job: job, dir: dir}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("ckpt: claiming job %s: its lock file keeps being replaced", job)
}

// ours checks that f is a regular file of this user that nobody else may
// write.
func ours(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return errors.New("not a regular file")
	case ok && int(st.Uid) != os.Getuid():
		return fmt.Errorf("owned by uid %d, not this user", st.Uid)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("writable by others (mode %v)", fi.Mode().Perm())
	}
	return nil
}

func same(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Lstat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// NamesWait is how long Names waits for a rank's names lock before it
// gives up (ErrNamesBusy): the lock is held only around making or
// removing a rank's files, so a longer wait is a holder stopped
// (SIGSTOP) or stuck, and a caller that waited on would hang with it.
const NamesWait = 30 * time.Second

// Names runs fn holding rank's names lock: an exclusive OFD lock
// (fcntl(2), independent of the claim's flock) on byte rank of the job's
// lock file, which every process that makes or removes rank's files in
// the directory takes around it (Create, RemoveOwned), so that no
// process makes a name again between another's check of it and its
// removal. A nil Claim, or a released one, runs fn alone.
//
// It waits for the lock up to NamesWait; then it returns an error
// wrapping ErrNamesBusy without running fn. Where the kernel or the file
// system cannot take the lock (EINVAL before Linux 3.15 and on some file
// systems, ENOLCK, ENOSYS, EOPNOTSUPP), it runs fn without it, as
// ClaimJob's callers go on without a claim, and returns fn's error
// joined with one wrapping ErrNoNamesLock, for the caller to log.
//
// Calls do not nest: OFD locks are not counted, so an inner Names's
// unlock releases the outer's lock. Nor do they exclude each other
// within one process (the process holds the lock on one descriptor):
// its callers of one rank exclude each other otherwise (in package internal/keeper,
// a rank's service mutex, and Preload coming before the rank's
// ProtectHello).
func (c *Claim) Names(rank int, fn func() error) error {
	if c == nil {
		return fn()
	}
	// Release waits for the calls in flight: it closes the descriptor.
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.f == nil {
		return fn()
	}
	if rank < 0 || rank > maxRank {
		return fmt.Errorf("ckpt: invalid rank %d", rank)
	}
	if err := c.noLock.Load(); err != nil {
		return errors.Join(fn(), *err)
	}
	fd := c.f.Fd()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(rank), Len: 1}
	wait := c.wait
	if wait == 0 {
		wait = NamesWait
	}
	deadline := time.Now().Add(wait)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		err := c.lock(fd, unix.F_OFD_SETLK, &lk)
		if err == nil {
			break
		}
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EACCES):
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: rank %d of job %s, for %v", ErrNamesBusy, rank, c.job, wait)
			}
			time.Sleep(pause)
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOLCK), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
			nerr := fmt.Errorf("%w: rank %d of job %s: %w", ErrNoNamesLock, rank, c.job, err)
			c.noLock.CompareAndSwap(nil, &nerr)
			return errors.Join(fn(), nerr)
		}
		return fmt.Errorf("ckpt: locking the names of rank %d of job %s: %w", rank, c.job, err)
	}
	defer func() {
		ul := lk
		ul.Type = unix.F_UNLCK
		_ = c.lock(fd, unix.F_OFD_SETLK, &ul)
	}()
	return fn()
}

// lock is fcntl(2)'s F_OFD_SETLK, or the one a test put in its place.
func (c *Claim) lock(fd uintptr, cmd int, lk *unix.Flock_t) error {
	if c.lockFn != nil {
		return c.lockFn(fd, cmd, lk)
	}
	return unix.FcntlFlock(fd, cmd, lk)
}

// Release drops the claim. If no other process holds one, the job's
// remaining files and its lock file are removed, and last is true.
func (c *Claim) Release() (last bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		return false, nil
	}
	defer func() { c.f.Close(); c.f = nil }()
	fd := int(c.f.Fd())
	// Converting the shared lock to an exclusive one, without waiting,
	// succeeds only when no other process holds the job's lock.
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("ckpt: releasing job %s: %w", c.job, err)
	}
	err = RemoveJob(c.job, Options{Dir: c.dir})
	if rerr := os.Remove(c.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return true, err
}

// Sweep removes the files of every job in opt's directory whose lock file
// nobody holds (its agents died without cleaning up, killed with SIGKILL,
// say), and returns those jobs. Files of jobs without a lock file are
// left alone.
func Sweep(opt Options) ([]string, error) {
	return sweep(opt, "", false)
}

// Unclaimed returns the jobs whose files Sweep would remove, removing
// nothing (gorun clean --dry-run).
func Unclaimed(opt Options) ([]string, error) {
	return sweep(opt, "", true)
}

// SweepJob is Sweep for job's files only: an agent ending, after
// releasing its own claim, removes what the job's agents killed on this
// machine left, when nobody holds the job's lock any more (a spare that
// never made files, say, outliving the hosts whose ranks it was given).
// It reports whether it removed them.
//
// Files in use are never removed: an agent claims the job (a shared
// flock on the lock file, ClaimJob) before making the first of its
// files, and holds the claim until it has removed its own, so the
// sweep's exclusive lock, taken without waiting, fails while any
// agent's files exist. An agent about to claim either gets its shared
// lock first, and the sweep removes nothing, or opens the lock file the
// sweep holds and then removes: its claim then finds the name no longer
// leads to the file it locked (same), and it claims a new lock file
// before making any file.
func SweepJob(job string, opt Options) (bool, error) {
	if err := checkIDs(job, 0); err != nil {
		return false, err
	}
	swept, err := sweep(opt, job, false)
	return len(swept) > 0, err
}

// sweep removes (with dry, only lists) the unclaimed jobs' files in
// opt's directory: job's only, unless job is "".
func sweep(opt Options, only string, dry bool) ([]string, error) {
	dir := opt.dir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	var swept []string
	var errs []error
	for _, e := range entries {
		job, ok := strings.CutSuffix(strings.TrimPrefix(e.Name(), filePrefix), ".lock")
		if !ok || !strings.HasPrefix(e.Name(), filePrefix) || !validJob(job) || !e.Type().IsRegular() || only != "" && job != only {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue // gone meanwhile, or not ours
		}
		if ours(f) != nil { // another user's: its files are not ours to judge
			f.Close()
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil && same(f, path) {
			if !dry {
				if err := RemoveJob(job, Options{Dir: dir}); err != nil {
					errs = append(errs, err)
				}
				if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
			swept = append(swept, job)
		}
		f.Close()
	}
	return swept, errors.Join(errs...)
}
