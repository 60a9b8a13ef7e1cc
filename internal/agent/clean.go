package agent

// gorun clean: what agents of this user's ended jobs left on this host,
// removed by hand (as Open MPI's orte-clean). Agents sweep the same
// leftovers when they start and end (jobdir.go); what no later agent
// comes to sweep (every agent of a job killed at once, the last agent on
// a host killed) stays until gorun clean. Only what nobody holds goes:
// a running job's files are locked by its agents. MPICH's shared-memory
// segment files (mpichshm.go) are judged by their use instead.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gorun/gorun/ckpt"
)

// CleanOptions says where Clean looks; the zero value is the host's.
type CleanOptions struct {
	// DryRun lists what would be removed, removing nothing.
	DryRun bool
	// TempDir holds the job directories; "" means os.TempDir(), as for
	// agents.
	TempDir string
	// ShmDir holds the slot files and Open MPI directories; "" means
	// /dev/shm.
	ShmDir string

	// statfs is TempDir's and ShmDir's; nil: syscall.Statfs (tests:
	// another file system).
	statfs statfsFunc
}

// Cleaned is what Clean removed, or with DryRun would remove.
type Cleaned struct {
	JobDirs  []string // job directories (paths)
	SockDirs []string // socket directories in ShmDir (paths; sockdir.go)
	SlotJobs []string // jobs whose slot files went
	OMPIDirs []string // Open MPI directories (paths)
	// MPICHFiles are MPICH's shared-memory segment files (paths) no
	// process uses (mpichshm.go): any job's, even one not gorun's.
	MPICHFiles []string
	ShmDir     string // where the slot files were
	// NotSwept, when not empty, says why the job directories were not
	// looked at: their file system is not known to be local, so a lock
	// there may be another host's agent's without it showing here.
	NotSwept string
}

// Clean removes this user's leftovers of ended jobs on this host: the
// job directories, socket directories (where ShmDir is a tmpfs), slot
// files and Open MPI directories nobody holds, and MPICH's segment files
// in ShmDir nobody uses (old enough: mpichMinAge).
func Clean(o CleanOptions) (Cleaned, error) {
	tmp, shm := o.TempDir, o.ShmDir
	if tmp == "" {
		tmp = os.TempDir()
	}
	if shm == "" {
		shm = defaultShmDir
	}
	c := Cleaned{ShmDir: shm}
	var errs []error
	if p := tmpPolicyFor(tmp, o.statfs); p.local {
		names, err := sweepDirs(tmp, jobDirJob, "", o.DryRun)
		for _, n := range names {
			c.JobDirs = append(c.JobDirs, filepath.Join(tmp, n))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("the job directories in %s: %w", tmp, err))
		}
	} else {
		c.NotSwept = fmt.Sprintf("%s is not on a local file system (%s): a lock there may not be seen from here", tmp, p.fs)
	}
	if isTmpfs(shm, o.statfs) {
		names, err := sweepDirs(shm, sockDirJob, "", o.DryRun)
		for _, n := range names {
			c.SockDirs = append(c.SockDirs, filepath.Join(shm, n))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("the socket directories in %s: %w", shm, err))
		}
	}
	sweep := ckpt.Sweep
	if o.DryRun {
		sweep = ckpt.Unclaimed
	}
	jobs, err := sweep(ckpt.Options{Dir: shm})
	c.SlotJobs = jobs
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("the slot files in %s: %w", shm, err))
	}
	sw, err := sweepShm(shm, "", o.DryRun, hostMPICHSweep())
	for _, n := range sw.OMPIDirs {
		c.OMPIDirs = append(c.OMPIDirs, filepath.Join(shm, n))
	}
	for _, n := range sw.MPICHFiles {
		c.MPICHFiles = append(c.MPICHFiles, filepath.Join(shm, n))
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("the Open MPI directories and MPICH files in %s: %w", shm, err))
	}
	return c, errors.Join(errs...)
}
