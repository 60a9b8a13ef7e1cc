package launcher

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/wire"
)

// mpiStubs builds, with gcc, stand-ins for the MPIs' libraries and
// programs linking them: only their dynamic sections matter.
func mpiStubs(t *testing.T) string {
	t.Helper()
	gcc := gortest.Tool(t, "gcc", "apt-get install gcc: it builds the ELF stubs")
	dir := t.TempDir()
	src := filepath.Join(dir, "stub.c")
	if err := os.WriteFile(src, []byte("int stub(void) { return 0; }\nint main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(gcc, append([]string{"-Wl,--no-as-needed"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	shared := func(out, soname string, needs ...string) {
		run(append([]string{"-shared", "-fPIC", "-o", out, "-Wl,-soname," + soname, src}, needs...)...)
	}
	for _, d := range []string{"ompi4", "ompi5", "mpich", "bare"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	shared(filepath.Join(dir, "ompi4", "libopen-rte.so.40"), "libopen-rte.so.40")
	shared(filepath.Join(dir, "ompi4", "libmpi.so.40"), "libmpi.so.40", filepath.Join(dir, "ompi4", "libopen-rte.so.40"))
	shared(filepath.Join(dir, "ompi5", "libmpi.so.40"), "libmpi.so.40")
	shared(filepath.Join(dir, "mpich", "libmpi.so.12"), "libmpi.so.12")
	// Programs: Open MPI 4 and 5 found through their run paths ($ORIGIN),
	// Open MPI 4 through LD_LIBRARY_PATH only, MPICH, none.
	run("-o", filepath.Join(dir, "prog-ompi4"), src, filepath.Join(dir, "ompi4", "libmpi.so.40"), "-Wl,-rpath,$ORIGIN/ompi4")
	run("-o", filepath.Join(dir, "prog-ompi5"), src, filepath.Join(dir, "ompi5", "libmpi.so.40"), "-Wl,-rpath,$ORIGIN/ompi5")
	run("-o", filepath.Join(dir, "prog-ompi-ldpath"), src, filepath.Join(dir, "ompi4", "libmpi.so.40"))
	// Open MPI 5 in a DT_RUNPATH (LD_LIBRARY_PATH comes first) and in a
	// DT_RPATH (it comes before LD_LIBRARY_PATH).
	run("-o", filepath.Join(dir, "prog-ompi5-runpath"), src, filepath.Join(dir, "ompi5", "libmpi.so.40"), "-Wl,--enable-new-dtags,-rpath,$ORIGIN/ompi5")
	run("-o", filepath.Join(dir, "prog-ompi5-rpath"), src, filepath.Join(dir, "ompi5", "libmpi.so.40"), "-Wl,--disable-new-dtags,-rpath,$ORIGIN/ompi5")
	run("-o", filepath.Join(dir, "prog-mpich"), src, filepath.Join(dir, "mpich", "libmpi.so.12"))
	run("-o", filepath.Join(dir, "prog-plain"), src)
	if err := os.WriteFile(filepath.Join(dir, "script"), []byte("#!/bin/sh\nexec ./prog-ompi4\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-static", "-o", filepath.Join(dir, "prog-static"), src).CombinedOutput(); err != nil {
		t.Logf("no static program (gcc -static: %v: %s)", err, out)
	}
	return dir
}

func TestDetectMPI(t *testing.T) {
	dir := mpiStubs(t)
	noCache := func() map[string]string { return nil }
	for _, tc := range []struct {
		prog string
		env  []string
		want MPIKind
	}{
		{"prog-ompi4", nil, MPIOpenMPI},
		{"prog-ompi5", nil, mpiOpenMPI5},
		{"prog-ompi-ldpath", []string{"LD_LIBRARY_PATH=" + filepath.Join(dir, "ompi4")}, MPIOpenMPI},
		{"prog-ompi-ldpath", []string{"LD_LIBRARY_PATH=" + filepath.Join(dir, "ompi5")}, mpiOpenMPI5},
		{"prog-ompi-ldpath", nil, MPIAuto}, // its libmpi is not found here
		// The loader's order: DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH.
		{"prog-ompi5-runpath", nil, mpiOpenMPI5},
		{"prog-ompi5-runpath", []string{"LD_LIBRARY_PATH=" + filepath.Join(dir, "ompi4")}, MPIOpenMPI},
		{"prog-ompi5-rpath", []string{"LD_LIBRARY_PATH=" + filepath.Join(dir, "ompi4")}, mpiOpenMPI5},
		{"prog-ompi-ldpath", []string{"LD_LIBRARY_PATH=" + filepath.Join(dir, "ompi5"), "LD_LIBRARY_PATH=" + filepath.Join(dir, "ompi4")}, MPIOpenMPI}, // the last wins
		{"prog-mpich", nil, MPIMPICH},
		{"prog-plain", nil, MPIAuto},
		{"script", nil, MPIAuto},
		{"prog-static", nil, MPIAuto},
		{"no-such-program", nil, MPIAuto},
	} {
		t.Run(tc.prog, func(t *testing.T) {
			prog := filepath.Join(dir, tc.prog)
			if got := detectMPI(prog, tc.env, noCache); got != tc.want {
				t.Errorf("detectMPI(%s, %q) = %q, want %q", tc.prog, tc.env, got, tc.want)
			}
		})
	}
	t.Run("loader cache", func(t *testing.T) {
		cache := func() map[string]string {
			return map[string]string{"libmpi.so.40": filepath.Join(dir, "ompi4", "libmpi.so.40")}
		}
		if got := detectMPI(filepath.Join(dir, "prog-ompi-ldpath"), nil, cache); got != MPIOpenMPI {
			t.Errorf("with libmpi in the loader's cache: %q, want %q", got, MPIOpenMPI)
		}
	})
}

func TestResolveMPI(t *testing.T) {
	dir := mpiStubs(t)
	bin := t.TempDir()
	exe := filepath.Join(bin, "gorun")
	for _, tc := range []struct {
		name    string
		cfg     Config
		lib     bool // libgorun-pmi.so beside exe
		want    MPIKind
		wantErr error
	}{
		{"open mpi 4", Config{Prog: filepath.Join(dir, "prog-ompi4")}, true, MPIOpenMPI, nil},
		{"open mpi 4 without the library", Config{Prog: filepath.Join(dir, "prog-ompi4")}, false, "", errNoPMILibrary},
		{"open mpi 4, library configured", Config{Prog: filepath.Join(dir, "prog-ompi4"), PMILibrary: filepath.Join(dir, "ompi4", "libmpi.so.40")}, false, MPIOpenMPI, nil},
		{"open mpi 5", Config{Prog: filepath.Join(dir, "prog-ompi5")}, true, "", ErrConfig},
		{"mpich", Config{Prog: filepath.Join(dir, "prog-mpich")}, false, MPIMPICH, nil},
		{"unknown", Config{Prog: filepath.Join(dir, "script")}, false, MPIAuto, nil},
		// The ranks' LD_LIBRARY_PATH (-x) finds their libmpi.
		{"open mpi 5 through -x LD_LIBRARY_PATH", Config{Prog: filepath.Join(dir, "prog-ompi-ldpath"), Env: []string{"LD_LIBRARY_PATH=" + filepath.Join(dir, "ompi5")}}, true, "", ErrConfig},
		{"forced mpich", Config{Prog: filepath.Join(dir, "prog-ompi5"), MPI: MPIMPICH}, false, MPIMPICH, nil},
		{"--pmi=false", Config{Prog: filepath.Join(dir, "prog-ompi5"), NoPMI: true}, false, MPIAuto, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib := filepath.Join(bin, wire.PMILibraryName)
			os.Remove(lib)
			if tc.lib {
				if err := os.WriteFile(lib, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := tc.cfg.resolveMPI(exe)
			if got != tc.want || !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("resolveMPI = %q, %v; want %q, %v", got, err, tc.want, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrConfig) {
				t.Errorf("%v is not a configuration error (exit 2)", err)
			}
		})
	}
}
