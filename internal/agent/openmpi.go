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
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/gorun/gorun/internal/wire"
)

// The variables Open MPI 4's flux bootstrap reads.
const (
	envOMPIPMIx       = "OMPI_MCA_pmix"
	envFluxJobID      = "FLUX_JOB_ID"
	envFluxPMILibrary = "FLUX_PMI_LIBRARY_PATH"
	envOMPIVaderDir   = "OMPI_MCA_btl_vader_backing_directory"
	envOMPITmpdirBase = "OMPI_MCA_orte_tmpdir_base"
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
	lib  string // "" if not found
}

// library returns the library's absolute path, or "" (and says why once).
func (o *openMPI) library(a *agent) string {
	o.once.Do(func() {
		exe, err := os.Executable()
		if err != nil && a.spec.PMILibrary == "" {
			a.log.Warn("Open MPI programs cannot start: this agent's executable is unknown", "err", err)
			return
		}
		lib, err := findPMILibrary(wire.PMILibraryPaths(a.spec.PMILibrary, exe))
		switch {
		case err == nil:
			o.lib = lib
		case a.spec.MPI == "openmpi":
			a.log.Warn("Open MPI ranks cannot bootstrap", "err", err)
		default:
			a.log.Debug("Open MPI programs would not bootstrap here", "err", errors.Unwrap(err))
		}
	})
	return o.lib
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
// session and shared-memory files in dir (the host's job directory: ranks
// of hosts that share a /dev/shm, network namespaces, never meet), and the
// host's ranks. A variable the user set with -x (userVars) is kept.
func openMPIEnv(userVars []string, job string, gen uint64, lib, dir string, clique []int) []string {
	set := []string{
		envOMPIPMIx + "=flux",
		envFluxJobID + "=" + fluxJobID(job, gen),
		envFluxPMILibrary + "=" + lib,
		envOMPIVaderDir + "=" + dir,
		envOMPITmpdirBase + "=" + dir,
		wire.EnvPMIClique + "=" + cliqueString(clique),
	}
	return slices.DeleteFunc(set, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return hasVar(userVars, k)
	})
}

// ompiEnv returns the Open MPI variables of the ranks of this host in
// table t, restart generation a.gen (none if they do not want them or the
// library is missing). Their directory, ompi-<gen> in the job directory,
// is created here (and removed with it).
func (a *agent) ompiEnv(t *wire.EpochTable) ([]string, error) {
	if !wantsOpenMPI(a.spec) {
		return nil, nil
	}
	lib := a.ompi.library(a)
	if lib == "" {
		return nil, nil
	}
	dir := filepath.Join(a.dir, "ompi-"+strconv.FormatUint(a.gen, 10))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("creating Open MPI's directory: %w", err)
	}
	var ranks []int
	for _, pl := range a.hostPlaces(t) {
		ranks = append(ranks, pl.Rank)
	}
	return openMPIEnv(a.spec.Env, a.cfg.Job, a.gen, lib, dir, ranks), nil
}
