//go:build !race

package main

// Open MPI 4 programs (Debian's openmpi-bin, libopenmpi-dev and
// python3-mpi4py) run under gorun through its PMI-1 client library
// (libpmi/, built here with gcc beside the test's gorun, where its agents
// look for it) and print what they print under mpirun.openmpi. No Go code
// of the ranks runs: the file is left out of the race pass. Without
// mpicc.openmpi the test skips, unless GORUN_TESTCLUSTER_REQUIRE=1.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/testcluster"
)

var (
	ompiOnce sync.Once
	ompiDir  string
	ompiErr  error

	ompiRefMu sync.Mutex
	ompiRefs  = map[string][]string{} // mpirun.openmpi's sorted output, by "n argv"
)

// ompiPrograms builds testdata/mpi's Open MPI programs with mpicc.openmpi
// and libgorun-pmi.so beside gorunBin (once per test process), and
// returns their directory.
func ompiPrograms(t *testing.T) string {
	t.Helper()
	cc := gortest.Tool(t, "mpicc.openmpi", "apt-get install openmpi-bin libopenmpi-dev")
	gcc := gortest.Tool(t, "gcc", "apt-get install gcc")
	ompiOnce.Do(func() {
		ompiDir = filepath.Join(filepath.Dir(gorunBin), "ompi")
		if ompiErr = os.MkdirAll(ompiDir, 0o755); ompiErr != nil {
			return
		}
		lib := filepath.Join(filepath.Dir(gorunBin), "libgorun-pmi.so")
		srcs, err := filepath.Glob(filepath.Join("..", "..", "libpmi", "*.c"))
		if err != nil || len(srcs) == 0 {
			ompiErr = fmt.Errorf("libpmi sources: %v (%d found)", err, len(srcs))
			return
		}
		args := append([]string{"-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Werror", "-o", lib}, srcs...)
		if out, err := exec.Command(gcc, append(args, "-lpthread")...).CombinedOutput(); err != nil {
			ompiErr = fmt.Errorf("building libgorun-pmi.so: %v\n%s", err, out)
			return
		}
		for _, p := range []string{"hello", "allreduce", "abort", "restart", "spare"} {
			if out, err := exec.Command(cc, "-O1", "-o", filepath.Join(ompiDir, p), filepath.Join("testdata", "mpi", p+".c")).CombinedOutput(); err != nil {
				ompiErr = fmt.Errorf("mpicc.openmpi %s.c: %v\n%s", p, err, out)
				return
			}
		}
	})
	if ompiErr != nil {
		t.Fatal(ompiErr)
	}
	return ompiDir
}

// mpirunRef is what mpirun.openmpi prints for argv at n ranks on this host,
// its lines sorted (computed once per process).
func mpirunRef(t *testing.T, n int, argv ...string) []string {
	t.Helper()
	key := fmt.Sprint(n, argv)
	ompiRefMu.Lock()
	defer ompiRefMu.Unlock()
	if ref, ok := ompiRefs[key]; ok {
		return ref
	}
	mpirun := gortest.Tool(t, "mpirun.openmpi", "apt-get install openmpi-bin")
	// Tagged: untagged, mpirun's lines of several ranks can run together.
	cmd := exec.Command(mpirun, append([]string{"--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", fmt.Sprint(n)}, argv...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("mpirun.openmpi -np %d %s: %v\n%s", n, argv, err, out)
	}
	ref := sortedLines(regexp.MustCompile(`(?m)^\[\d+,\d+\]<stdout>:`).ReplaceAllString(string(out), ""))
	ompiRefs[key] = ref
	return ref
}

func TestOpenMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("Open MPI end to end: not with -short")
	}
	dir := ompiPrograms(t)
	prog := func(name string) string { return filepath.Join(dir, name) }
	programs := [][]string{{prog("hello")}, {prog("allreduce")}}
	if err := exec.Command("/usr/bin/python3", "-c", "import mpi4py.MPI").Run(); err == nil {
		programs = append(programs, []string{"/usr/bin/python3", filepath.Join("testdata", "mpi", "allreduce.py")})
	} else if os.Getenv("GORUN_TESTCLUSTER_REQUIRE") == "1" {
		t.Fatalf("no mpi4py for /usr/bin/python3 (apt-get install python3-mpi4py): %v", err)
	} else {
		t.Logf("no mpi4py for /usr/bin/python3: its program is left out (apt-get install python3-mpi4py)")
	}
	// same runs argv under gorun with flags and n ranks and compares its
	// sorted output with mpirun.openmpi's on this host.
	same := func(t *testing.T, n int, flags []string, argv []string) {
		t.Helper()
		args := append(append([]string{"-np", fmt.Sprint(n)}, flags...), "--")
		res := startJob(t, "", nil, append(args, argv...)...).wait(90 * time.Second)
		if res.code != 0 {
			t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", argv, res.code, res.stdout, res.stderr)
		}
		if got, want := untagged(res.stdout), mpirunRef(t, n, argv...); !slices.Equal(got, want) {
			t.Errorf("%s: gorun printed %q, mpirun.openmpi %q\nstderr:\n%s", argv, got, want, res.stderr)
		}
	}
	// At -np 1 a singleton prints what a bootstrapped rank does; at 4 and
	// 8, singletons would each say "of 1" (hello) or sum 1 (allreduce).
	for _, n := range []int{1, 4, 8} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			for _, argv := range programs {
				same(t, n, []string{"--oversubscribe"}, argv)
			}
		})
	}
	t.Run("library missing", func(t *testing.T) {
		// gorun alone in a directory, as built without gcc: an Open MPI
		// program fails, naming the library, instead of running as
		// singletons (mpi4py's once printed rank 0 twice and exit 0).
		alone := filepath.Join(t.TempDir(), "gorun")
		if out, err := exec.Command("cp", gorunBin, alone).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		wrap := []string{"sh", "-c", `exec "` + alone + `" "$@"`} // $0 is gorunBin
		for _, argv := range programs {
			res := startJobUnder(t, wrap, nil, nil, "", nil, append([]string{"-np", "2", "--oversubscribe", "--"}, argv...)...).wait(90 * time.Second)
			if res.code == 0 || !strings.Contains(res.stderr, filepath.Join(filepath.Dir(alone), "libgorun-pmi.so")) {
				t.Errorf("%s without the library: exit %d, want a failure naming %s\nstdout:\n%s\nstderr:\n%s",
					argv, res.code, filepath.Join(filepath.Dir(alone), "libgorun-pmi.so"), res.stdout, res.stderr)
			}
		}
	})
	t.Run("abort", func(t *testing.T) {
		res := startJob(t, "", nil, "-np", "4", "--oversubscribe", "--", prog("abort")).wait(90 * time.Second)
		if res.code != 7 {
			t.Fatalf("exit %d, want 7 (the MPI_Abort code)\nstderr:\n%s", res.code, res.stderr)
		}
		if !regexp.MustCompile(`gorun: rank 1 on host \S+ \(pid \d+\) called MPI_Abort with exit code 7`).MatchString(res.stderr) {
			t.Errorf("the report does not name rank 1's MPI_Abort:\n%s", res.stderr)
		}
	})
	t.Run("max-restarts", func(t *testing.T) {
		j := startJob(t, "", nil, "-np", "4", "--oversubscribe", "--max-restarts", "1", "--", "sh", "-c", printJobID, prog("restart"))
		res := j.wait(90 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		// Both generations' Open MPI directories (in /dev/shm) are gone.
		checkNoJobFiles(t, j.jobID())
		for r := range 4 {
			if want := fmt.Sprintf("[%d] generation 1: hello from %d of 4\n", r, r); !strings.Contains(res.stdout, want) {
				t.Errorf("no %q\nstdout:\n%s\nstderr:\n%s", want, res.stdout, res.stderr)
			}
		}
	})
	t.Run("namespace hosts", func(t *testing.T) {
		// Four hosts of two slots and a spare: one hostname and one
		// /dev/shm for all, as the shared-memory collisions need.
		hosts := testcluster.NetnsHosts(t, 5)
		hf := hosts.WriteHostfile(t, t.TempDir(), 2)
		flags := []string{"--hostfile", hf, "--spares", "1", "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr, "--kill-grace", "2"}
		for _, argv := range programs {
			same(t, 8, flags, argv)
		}
		abort := startJob(t, "", nil, append(append([]string{"-np", "8"}, flags...), "--", prog("abort"))...).wait(90 * time.Second)
		if abort.code != 7 {
			t.Fatalf("abort across hosts: exit %d, want 7\nstderr:\n%s", abort.code, abort.stderr)
		}
		if !regexp.MustCompile(`gorun: rank 1 on host \S+ \(pid \d+\) called MPI_Abort with exit code 7`).MatchString(abort.stderr) {
			t.Errorf("abort across hosts: the report does not name rank 1's MPI_Abort:\n%s", abort.stderr)
		}
		// The spare replaces a killed host: every rank restarts, Open MPI's
		// included, and the job finishes.
		j := startJob(t, "", nil, append(append([]string{"-np", "8", "--recovery", "restart"}, flags...), "--", "sh", "-c", printJobID, prog("spare"))...)
		j.waitFor(regexp.MustCompile(`(?m)^\[\d\] generation 0: rank \d of 8 up, sum 8$`), 8, 60*time.Second)
		if err := hosts.KillAll(1); err != nil {
			t.Fatal(err)
		}
		res := j.wait(120 * time.Second)
		// The killed host's agent could not remove its job directory (a
		// real host's /tmp goes with it).
		if m := regexp.MustCompile(`(?m)^\[\d\] job (\S+)$`).FindStringSubmatch(res.stdout); m != nil {
			left, _ := filepath.Glob(filepath.Join(os.TempDir(), "gorun-"+m[1]+"-*"))
			if len(left) > 1 {
				t.Errorf("job directories left: %v, want at most the killed host's", left)
			}
			// And of Open MPI's directories in the /dev/shm the hosts
			// share, at most the killed host's (h1).
			shm, _ := filepath.Glob(filepath.Join("/dev/shm", "gorun-"+m[1]+"-*"))
			for _, d := range shm {
				if !strings.HasPrefix(filepath.Base(d), "gorun-"+m[1]+"-h1-") {
					t.Errorf("Open MPI directory %s left, want at most the killed host's", d)
				}
			}
			left = append(left, shm...)
			for _, d := range left {
				os.RemoveAll(d)
			}
		}
		if res.code != 0 {
			t.Fatalf("after host 1's loss: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		if n := len(regexp.MustCompile(`(?m)^\[\d\] generation 1: rank \d of 8 up, sum 8$`).FindAllString(res.stdout, -1)); n != 8 {
			t.Errorf("%d ranks up in generation 1, want 8\nstdout:\n%s\nstderr:\n%s", n, res.stdout, res.stderr)
		}
	})
}
