package launcher

// --mpi auto: which MPI a program is built with, from the libmpi it links
// (its ELF dynamic section; no cgo, nothing loaded).

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gorun/gorun/internal/wire"
)

// mpiOpenMPI5 is what detection calls an Open MPI whose libmpi does not
// link ORTE: Open MPI 5, which bootstraps through PMIx only.
const mpiOpenMPI5 MPIKind = "openmpi5"

// The sonames that tell the MPIs apart.
const (
	sonameOpenMPI = "libmpi.so.40"      // Open MPI 3, 4 and 5
	sonameORTE    = "libopen-rte.so.40" // Open MPI 4's runtime (gone in 5)
	sonameMPICH   = "libmpi.so.12"      // the MPICH ABI (MPICH, Intel MPI, MVAPICH)
	sonameMPICH2  = "libmpich.so.12"
)

// libDirs are the directories the dynamic loader searches last.
var libDirs = []string{"/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// detectMPI returns the MPI prog is built with: MPIOpenMPI (4.x),
// mpiOpenMPI5, MPIMPICH, or MPIAuto when it cannot tell (a script, an
// interpreter such as python3 with mpi4py, a static program, a program
// not found here). env is the environment the loader would see
// (LD_LIBRARY_PATH); ldcache lists the loader's cache (ldconfig -p).
func detectMPI(prog string, env []string, ldcache func() map[string]string) MPIKind {
	path := prog
	if !strings.Contains(prog, "/") {
		p, err := exec.LookPath(prog)
		if err != nil {
			return MPIAuto
		}
		path = p
	}
	needed, rpath, runpath, err := dynamicDeps(path)
	if err != nil {
		return MPIAuto
	}
	switch {
	case slices.Contains(needed, sonameMPICH), slices.Contains(needed, sonameMPICH2):
		return MPIMPICH
	case !slices.Contains(needed, sonameOpenMPI):
		return MPIAuto
	}
	lib := resolveLib(sonameOpenMPI, rpath, runpath, env, ldcache)
	if lib == "" {
		return MPIAuto
	}
	libNeeded, _, _, err := dynamicDeps(lib)
	if err != nil {
		return MPIAuto
	}
	if slices.Contains(libNeeded, sonameORTE) {
		return MPIOpenMPI
	}
	return mpiOpenMPI5
}

// dynamicDeps returns path's DT_NEEDED entries and its run path: its
// DT_RUNPATH directories, or, only without any, its DT_RPATH ones, as the
// loader takes them ($ORIGIN expanded).
func dynamicDeps(path string) (needed, rpath, runpath []string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("launcher: %s: %w", path, err)
	}
	defer f.Close()
	if needed, err = f.DynString(elf.DT_NEEDED); err != nil {
		return nil, nil, nil, fmt.Errorf("launcher: %s: %w", path, err)
	}
	origin := filepath.Dir(path)
	dirs := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			for d := range strings.SplitSeq(p, ":") {
				d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", origin), "$ORIGIN", origin)
				if d != "" {
					out = append(out, d)
				}
			}
		}
		return out
	}
	runs, _ := f.DynString(elf.DT_RUNPATH)
	if runpath = dirs(runs); len(runs) == 0 {
		rps, _ := f.DynString(elf.DT_RPATH)
		rpath = dirs(rps)
	}
	return needed, rpath, runpath, nil
}

// resolveLib finds soname as the loader would: in rpath (DT_RPATH, which
// the loader reads only without a DT_RUNPATH), env's LD_LIBRARY_PATH (its
// last), runpath (DT_RUNPATH), the loader's cache, the default
// directories.
func resolveLib(soname string, rpath, runpath, env []string, ldcache func() map[string]string) string {
	var ldpath []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			ldpath = filepath.SplitList(v)
		}
	}
	for _, d := range slices.Concat(rpath, ldpath, runpath) {
		if p := filepath.Join(d, soname); isFile(p) {
			return p
		}
	}
	if p := ldcache()[soname]; p != "" && isFile(p) {
		return p
	}
	for _, d := range libDirs {
		if p := filepath.Join(d, soname); isFile(p) {
			return p
		}
	}
	return ""
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// ldconfigCache reads the loader's cache through ldconfig -p: soname →
// path (the first, for this machine's architecture as ldconfig orders it).
func ldconfigCache() map[string]string {
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		ldconfig = "/sbin/ldconfig"
	}
	out, err := exec.Command(ldconfig, "-p").Output()
	if err != nil {
		return nil
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(string(out), "\n") {
		// "\tlibmpi.so.40 (libc6,x86-64) => /lib/x86_64-linux-gnu/libmpi.so.40"
		name, rest, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if _, p, ok := strings.Cut(rest, "=> "); ok {
			if _, dup := m[name]; !dup {
				m[name] = strings.TrimSpace(p)
			}
		}
	}
	return m
}

// errNoPMILibrary: an Open MPI program, and no client library.
var errNoPMILibrary = errors.New("launcher: no PMI-1 client library")

// resolveMPI is the job's MPI for its agents ("" when unknown): --mpi, or
// what the program links. An Open MPI 5 program is refused, and so is an
// Open MPI program when this host has no client library to give its
// ranks (the agents look for it beside themselves, as here).
func (c *Config) resolveMPI(exe string) (MPIKind, error) {
	if c.NoPMI {
		return c.MPI, nil
	}
	kind := c.MPI
	if kind == MPIAuto {
		// The ranks' environment: this one and -x's (the last of a name wins).
		kind = detectMPI(c.Prog, slices.Concat(os.Environ(), c.Env), ldconfigCache)
	}
	switch kind {
	case mpiOpenMPI5:
		return "", &ConfigError{Msg: fmt.Sprintf("%s is an Open MPI 5 program: Open MPI 5 needs a PMIx server, which gorun does not have yet (gorun runs Open MPI 4 and MPICH programs; see README, MPI programs)", c.Prog)}
	case MPIOpenMPI:
		paths := wire.PMILibraryPaths(c.PMILibrary, exe)
		if !slices.ContainsFunc(paths, isFile) {
			return "", &ConfigError{Msg: fmt.Sprintf("Open MPI programs need gorun's PMI-1 client library, %s, which is not at %s: make build builds it (with gcc)", wire.PMILibraryName, strings.Join(paths, " or ")), Err: errNoPMILibrary}
		}
	}
	return kind, nil
}
