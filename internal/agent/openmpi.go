package agent

// Open MPI 4 ranks bootstrap through gorun's PMI-1 server too: Open MPI
// 4.1's flux pmix component (mca_pmix_flux.so, selected by
// OMPI_MCA_pmix=flux with FLUX_JOB_ID set) dlopens the PMI-1 client
// library FLUX_PMI_LIBRARY_PATH names, and gorun ships one,
// libgorun-pmi.so (libpmi/), which speaks the simple protocol over PMI_FD
// as MPICH's client does. The agent gives every rank those variables,
// unless the program is known to be built with MPICH or the ranks get no
// PMI connection (--pmi=false).

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// The variables Open MPI 4's flux bootstrap reads.
const (
	envOMPIPMIx       = "OMPI_MCA_pmix"
	envFluxJobID      = "FLUX_JOB_ID"
	envFluxPMILibrary = "FLUX_PMI_LIBRARY_PATH"
	envOMPIVaderDir   = "OMPI_MCA_btl_vader_backing_directory"
	envOMPITmpdirBase = "OMPI_MCA_orte_tmpdir_base"
	// envOMPIOversubscribe is what mpirun sets for the ranks of a node
	// with more ranks than slots; Open MPI then defaults
	// mpi_yield_when_idle to 1: a rank waiting for another (in a barrier,
	// polling shared memory) yields its CPU instead of spinning for its
	// whole time slice while the ranks it waits for are runnable.
	envOMPIOversubscribe = "OMPI_MCA_mpi_oversubscribe"
)

// findPMILibrary returns the first of paths that is a regular file.
func findPMILibrary(paths []string) (string, error) {
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return filepath.Abs(p)
		}
	}
	return "", fmt.Errorf("the PMI-1 client library Open MPI programs load is not at %s (make build puts it beside gorun): %w", strings.Join(paths, " or "), fs.ErrNotExist)
}

// openMPI is an agent's part of the Open MPI bootstrap: the library, found
// once.
type openMPI struct {
	once sync.Once
	lib  string // the library's absolute path, or where it was expected
	err  error  // not found: why (it names the paths searched)

	warned sync.Once

	dir     string   // the directory ompiEnv made last ("": none); the agent's goroutine only
	held    *os.File // dir, open with a shared flock while this agent owns it (sweepShm)
	shmOnce sync.Once
	shm     bool // /dev/shm is a tmpfs
}

// library returns the library's absolute path, or, with the error saying
// why, the path where it was expected (the first one searched): its
// ranks still get the flux bootstrap, so that an Open MPI program fails
// in MPI_Init (PMI_Init fails) instead of running as singletons.
func (o *openMPI) library(a *agent) (string, error) {
	o.once.Do(func() {
		exe, err := os.Executable()
		if err != nil && a.spec.PMILibrary == "" {
			o.lib = wire.PMILibraryName
			o.err = fmt.Errorf("the PMI-1 client library Open MPI programs load cannot be looked for beside this agent's executable: %w", err)
			return
		}
		paths := wire.PMILibraryPaths(a.spec.PMILibrary, exe)
		if o.lib, o.err = findPMILibrary(paths); o.err != nil {
			o.lib = paths[0]
			a.log.Debug("Open MPI programs would not bootstrap here", "err", o.err)
		}
	})
	return o.lib, o.err
}

// rankFailed is told of a rank that failed without ever opening its PMI
// connection: with the library missing, that is what an Open MPI rank
// does (its MPI_Init fails), so the agent says, once, where the library
// was looked for.
func (o *openMPI) rankFailed(a *agent, rank int) {
	if a.spec == nil || !wantsOpenMPI(a.spec) {
		return
	}
	if _, err := o.library(a); err != nil {
		o.warned.Do(func() {
			a.log.Warn("a rank failed before it used PMI: if it is an Open MPI program, it could not bootstrap", "rank", rank, "err", err)
		})
	}
}

// wantsOpenMPI says whether the ranks get Open MPI's bootstrap: they get a
// PMI connection and the program is not known to be an MPICH one.
func wantsOpenMPI(spec *wire.JobSpec) bool {
	return !spec.NoPMI && spec.MPI != "mpich"
}

// fluxJobID is the FLUX_JOB_ID of job's restart generation gen: the
// integer Open MPI takes for its job id (a 16-bit job family above a
// 16-bit local job id) and names its keys and shared-memory segments
// with; a new one per generation, so that a restarted job's names never
// meet the old ones. Bit 15 of the local id stays clear: with it set,
// Open MPI 4.1's ranks name their peers with the bit cleared and cannot
// reach them (-np 8 failed in MPI_Allreduce, "unable to reach each
// other"); bit 31 too (an int32 elsewhere).
func fluxJobID(job string, gen uint64) string {
	h := fnv.New32a()
	h.Write([]byte(job))
	sum := uint64(h.Sum32())
	local := (sum ^ gen) & 0x7fff
	if local == 0 {
		local = 1
	}
	return strconv.FormatUint(sum&0x7fff0000|local, 10)
}

// cliqueString lists ranks (sorted here) as ranges: "0-3,8-11".
func cliqueString(ranks []int) string {
	rs := slices.Sorted(slices.Values(ranks))
	var b strings.Builder
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(rs[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(rs[j]))
		}
		i = j + 1
	}
	return b.String()
}

// openMPIEnv is what a rank needs for Open MPI's bootstrap: the flux
// component, the job id of generation gen, the library lib, Open MPI's
// session and shared-memory files in dir (the host's and generation's
// own: ranks of hosts that share a /dev/shm, network namespaces, never
// meet), and the host's ranks; oversubscribed says the host has more
// ranks than CPUs. A variable the user set with -x (userVars) is kept.
func openMPIEnv(userVars []string, job string, gen uint64, lib, dir string, clique []int, oversubscribed bool) []string {
	set := []string{
		envOMPIPMIx + "=flux",
		envFluxJobID + "=" + fluxJobID(job, gen),
		envFluxPMILibrary + "=" + lib,
		envOMPIVaderDir + "=" + dir,
		envOMPITmpdirBase + "=" + dir,
		wire.EnvPMIClique + "=" + cliqueString(clique),
	}
	if oversubscribed {
		set = append(set, envOMPIOversubscribe+"=1")
	}
	return slices.DeleteFunc(set, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return hasVar(userVars, k)
	})
}

// ompiEnv returns the Open MPI variables of the ranks of this host in
// table t, restart generation a.gen (none if they do not want them; with
// the library missing, they name where it was expected). Their directory
// (ompiDir) is created here; the previous generation's, whose ranks have
// all ended when a new generation starts, is removed.
func (a *agent) ompiEnv(t *wire.EpochTable) ([]string, error) {
	if !wantsOpenMPI(a.spec) {
		return nil, nil
	}
	lib, _ := a.ompi.library(a)
	dir := a.ompiDir(a.gen)
	if old := a.ompi.dir; old != "" && old != dir {
		a.ompi.removeDir(a)
	}
	if a.ompi.dir != dir {
		held, err := makeHeldDir(dir)
		if err != nil {
			return nil, fmt.Errorf("creating Open MPI's directory: %w", err)
		}
		a.ompi.dir, a.ompi.held = dir, held
	}
	var ranks []int
	for _, pl := range a.hostPlaces(t) {
		ranks = append(ranks, pl.Rank)
	}
	return openMPIEnv(a.spec.Env, a.cfg.Job, a.gen, lib, dir, ranks, len(ranks) > runtime.NumCPU()), nil
}

// defaultShmDir is where Open MPI's shared-memory segments go: /dev/shm
// when it is a tmpfs (a directory on disk would put them there).
const defaultShmDir = "/dev/shm"

// shmDir is the agent's /dev/shm (Config.shmDir in tests).
func (a *agent) shmDir() string {
	if a.cfg.shmDir != "" {
		return a.cfg.shmDir
	}
	return defaultShmDir
}

// ompiDir is the directory of generation gen's Open MPI files (session
// directory and shared-memory segments): gorun-<job>-h<host>-g<gen> in
// /dev/shm if it is a tmpfs (the host's index keeps apart the hosts that
// share one, network namespaces), else ompi-<gen> in the job directory.
func (a *agent) ompiDir(gen uint64) string {
	a.ompi.shmOnce.Do(func() {
		var st syscall.Statfs_t
		a.ompi.shm = syscall.Statfs(a.shmDir(), &st) == nil && st.Type == tmpfsMagic
	})
	if a.ompi.shm {
		return filepath.Join(a.shmDir(), "gorun-"+a.cfg.Job+"-h"+strconv.Itoa(a.cfg.Host)+"-g"+strconv.FormatUint(gen, 10))
	}
	return filepath.Join(a.dir, "ompi-"+strconv.FormatUint(gen, 10))
}

// removeDir removes the Open MPI directory made last, once its ranks have
// ended (a new generation's start, the agent's cleanup).
func (o *openMPI) removeDir(a *agent) {
	if o.dir == "" {
		return
	}
	if err := os.RemoveAll(o.dir); err != nil {
		a.log.Warn("cannot remove Open MPI's directory", "dir", o.dir, "err", err)
	}
	if o.held != nil {
		o.held.Close()
	}
	o.dir, o.held = "", nil
}

// makeHeldDir creates dir (it may exist) and returns it open with a shared
// flock, which this process holds until it closes it: an agent killed
// before it removes its Open MPI directory (SIGKILL, a lost host) leaves
// it unlocked, and sweepShm on the next agent of the host removes it.
// A sweeper that took the directory between its creation and the lock
// removed it: then it is made again.
func makeHeldDir(dir string) (*os.File, error) {
	for range 3 {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
			f.Close()
			return nil, err
		}
		if sameFile(f, dir) {
			return f, nil
		}
		f.Close() // swept meanwhile: make it again
	}
	return nil, fmt.Errorf("%s was removed three times while it was being made", dir)
}

// sameFile reports whether the open f is still what path names.
func sameFile(f *os.File, path string) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	pi, err := os.Lstat(path)
	return err == nil && os.SameFile(fi, pi)
}

// ompiDirJob returns the job of an Open MPI directory agents make in
// /dev/shm, by its name: gorun-<job>-h<host>-g<gen>.
func ompiDirJob(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "gorun-")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, "-h")
	if i <= 0 {
		return "", false
	}
	host, gen, ok := strings.Cut(rest[i+2:], "-g")
	if !ok {
		return "", false
	}
	_, herr := strconv.ParseUint(host, 10, 31)
	_, gerr := strconv.ParseUint(gen, 10, 64)
	if herr != nil || gerr != nil || !wire.ValidJobID(rest[:i]) {
		return "", false
	}
	return rest[:i], true
}

// ompiDirName matches the Open MPI directories agents make in /dev/shm.
func ompiDirName(name string) bool {
	_, ok := ompiDirJob(name)
	return ok
}

// shmSwept is what sweepShm removed from a /dev/shm, or with dry would
// remove (names).
type shmSwept struct {
	OMPIDirs   []string // Open MPI directories nobody holds
	MPICHFiles []string // MPICH segment files nobody uses (mpichshm.go)
	// young, when not zero, is when the youngest MPICH file kept only
	// for its age (mpichMinAge) becomes old enough to be judged: at most
	// mpichMinAge after the sweep began.
	young time.Time
}

// sweepShm sweeps dir, a /dev/shm, in one pass over its names: the Open
// MPI directories nobody holds (makeHeldDir: those of agents killed
// before they cleaned up; of job only, unless it is ""), and, judged by
// m (mpichshm.go), MPICH's segment files nobody can still use, whatever
// their job (their names do not say). With dry it removes nothing and
// returns what it would remove.
func sweepShm(dir, job string, dry bool, m mpichSweep) (shmSwept, error) {
	start := m.clock() // before the names: a file made after it is young
	names, err := readNames(dir)
	if err != nil {
		return shmSwept{}, err
	}
	var s shmSwept
	var errs []error
	var cands []mpichCandidate
	for _, name := range names {
		if j, ok := ompiDirJob(name); ok && (job == "" || j == job) {
			if ok, err := sweepDir(dir, name, dry); err != nil {
				errs = append(errs, err)
			} else if ok {
				s.OMPIDirs = append(s.OMPIDirs, name)
			}
			continue
		}
		if m.on() && MPICHShmName(name) {
			if c, ok := m.candidate(dir, name); ok {
				cands = append(cands, c)
			}
		}
	}
	s.MPICHFiles, s.young, err = m.sweep(dir, cands, start, dry)
	return s, errors.Join(append(errs, err)...)
}

// sweepShmLog sweeps the agent's shmDir dir (Open MPI directories of job
// only, unless it is "") and logs what it removed. With waitYoung, MPICH
// files kept only for their age are judged once more when they are old
// enough (the agent's end: its ranks are gone, and a file one of them
// left just before must not stay); the wait is at most mpichMinAge
// (shmSwept.young).
func sweepShmLog(dir, job string, m mpichSweep, waitYoung bool, log *slog.Logger) {
	s, err := sweepShm(dir, job, false, m)
	if waitYoung && !s.young.IsZero() {
		time.Sleep(time.Until(s.young)) // the age is the rule: nothing else to wait on
		var again shmSwept
		again, err = sweepShm(dir, job, false, m)
		s.OMPIDirs = append(s.OMPIDirs, again.OMPIDirs...)
		s.MPICHFiles = append(s.MPICHFiles, again.MPICHFiles...)
	}
	switch {
	case errors.Is(err, errLeasesOff):
		// Not a failure: a host may have leases off for good
		// (mpichshm.go); the files stay.
		log.Info("MPICH's unused shared-memory files not judged", "dir", dir, "err", err)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		log.Warn("sweeping leftover shared-memory files", "dir", dir, "err", err)
	}
	if len(s.OMPIDirs) > 0 {
		log.Info("removed the Open MPI directories of ended agents", "dirs", len(s.OMPIDirs))
	}
	if len(s.MPICHFiles) > 0 {
		log.Info("removed MPICH shared-memory files no process uses", "files", s.MPICHFiles)
	}
}
