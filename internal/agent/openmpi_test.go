package agent

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

func TestOpenMPIEnvPerKind(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec wire.JobSpec
		want bool // the ranks get Open MPI's variables
	}{
		{"openmpi", wire.JobSpec{MPI: "openmpi"}, true},
		{"unknown", wire.JobSpec{}, true},
		{"mpich", wire.JobSpec{MPI: "mpich"}, false},
		{"pmi=false", wire.JobSpec{MPI: "openmpi", NoPMI: true}, false},
		{"pmi=false unknown", wire.JobSpec{NoPMI: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := wantsOpenMPI(&tc.spec); got != tc.want {
				t.Errorf("wantsOpenMPI = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOpenMPIEnvValues(t *testing.T) {
	for _, tc := range []struct {
		name           string
		user           []string // -x
		oversubscribed bool
		want           map[string]string
	}{
		{"all set", nil, false, map[string]string{
			envOMPIPMIx: "flux", envFluxPMILibrary: "/opt/gorun/libgorun-pmi.so",
			envOMPIVaderDir: "/tmp/job/ompi-2", envOMPITmpdirBase: "/tmp/job/ompi-2", wire.EnvPMIClique: "0-1,4",
		}},
		{"the user's -x wins", []string{"OMPI_MCA_pmix=s1", "OMPI_MCA_btl_vader_backing_directory=/dev/shm"}, false, map[string]string{
			envFluxPMILibrary: "/opt/gorun/libgorun-pmi.so", envOMPITmpdirBase: "/tmp/job/ompi-2", wire.EnvPMIClique: "0-1,4",
		}},
		// More ranks than CPUs: as under mpirun, so that they yield when idle.
		{"oversubscribed", nil, true, map[string]string{
			envOMPIPMIx: "flux", envFluxPMILibrary: "/opt/gorun/libgorun-pmi.so",
			envOMPIVaderDir: "/tmp/job/ompi-2", envOMPITmpdirBase: "/tmp/job/ompi-2", wire.EnvPMIClique: "0-1,4",
			envOMPIOversubscribe: "1",
		}},
		{"oversubscribed, the user's -x wins", []string{"OMPI_MCA_mpi_oversubscribe=0"}, true, map[string]string{
			envOMPIPMIx: "flux", envFluxPMILibrary: "/opt/gorun/libgorun-pmi.so",
			envOMPIVaderDir: "/tmp/job/ompi-2", envOMPITmpdirBase: "/tmp/job/ompi-2", wire.EnvPMIClique: "0-1,4",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := envMap(t, openMPIEnv(tc.user, "j1", 2, "/opt/gorun/libgorun-pmi.so", "/tmp/job/ompi-2", []int{4, 0, 1}, tc.oversubscribed))
			id := got[envFluxJobID]
			delete(got, envFluxJobID)
			if hasVar(tc.user, envFluxJobID) != (id == "") {
				t.Errorf("FLUX_JOB_ID %q with -x %q", id, tc.user)
			}
			if len(got) != len(tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// TestFluxJobID: an integer Open MPI can take (bit 15 clear: see
// fluxJobID), the same on every host for a generation, another for the
// next.
func TestFluxJobID(t *testing.T) {
	seen := map[string]bool{}
	for _, job := range []string{"j1", "abcdefghij", "z32t2qrn2zjyqdom", "5t4vn7dqyshmmdmm"} {
		for gen := range uint64(4) {
			id := fluxJobID(job, gen)
			n, err := strconv.ParseUint(id, 10, 32)
			if err != nil || n == 0 || n&0x8000 != 0 || n&0x80000000 != 0 {
				t.Errorf("fluxJobID(%s, %d) = %q: want a positive integer with bits 15 and 31 clear", job, gen, id)
			}
			if fluxJobID(job, gen) != id {
				t.Errorf("fluxJobID(%s, %d) changes", job, gen)
			}
			if seen[id] {
				t.Errorf("fluxJobID(%s, %d) = %s again", job, gen, id)
			}
			seen[id] = true
		}
	}
}

func TestCliqueString(t *testing.T) {
	for _, tc := range []struct {
		ranks []int
		want  string
	}{
		{[]int{0}, "0"},
		{[]int{0, 1, 2, 3}, "0-3"},
		{[]int{0, 1, 4}, "0-1,4"},
		{[]int{11, 8, 9, 10, 3, 2, 1, 0}, "0-3,8-11"},
		{[]int{5, 7, 9}, "5,7,9"},
		{nil, ""},
	} {
		if got := cliqueString(tc.ranks); got != tc.want {
			t.Errorf("cliqueString(%v) = %q, want %q", tc.ranks, got, tc.want)
		}
	}
}

func TestPMILibraryLookupOrder(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	installed := filepath.Join(root, "lib", "gorun")
	for _, d := range []string{bin, installed} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(bin, "gorun")
	put := func(p string) {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := findPMILibrary(wire.PMILibraryPaths("", exe)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no library: err %v", err)
	}
	put(filepath.Join(installed, wire.PMILibraryName))
	if got, _ := findPMILibrary(wire.PMILibraryPaths("", exe)); got != filepath.Join(installed, wire.PMILibraryName) {
		t.Errorf("only ../lib/gorun has it: got %q", got)
	}
	put(filepath.Join(bin, wire.PMILibraryName))
	if got, _ := findPMILibrary(wire.PMILibraryPaths("", exe)); got != filepath.Join(bin, wire.PMILibraryName) {
		t.Errorf("beside the executable first: got %q", got)
	}
	mine := filepath.Join(root, "mine.so")
	if _, err := findPMILibrary(wire.PMILibraryPaths(mine, exe)); err == nil {
		t.Errorf("a configured library that is missing was not reported")
	}
	put(mine)
	if got, _ := findPMILibrary(wire.PMILibraryPaths(mine, exe)); got != mine {
		t.Errorf("the configured library first: got %q", got)
	}
}

// TestBaseEnvStripsMpirunVariables: what mpirun (and a PMIx server) set
// for a job gorun runs inside is not passed on.
func TestBaseEnvStripsMpirunVariables(t *testing.T) {
	got := envMap(t, baseEnv([]string{
		"OMPI_MCA_orte_hnp_uri=1234.0;tcp://10.0.0.1:4000", "OMPI_MCA_ess=pmi", "OMPI_MCA_orte_ess_num_procs=4",
		"PMIX_SERVER_URI41=x", "PMIX_ID=y", "FLUX_URI=local:///run", "OMPI_MCA_btl=self,vader", "PATH=/bin",
		"OMPI_MCA_ess_base_jobid=1", "OMPI_MCA_ess_base_vpid=0", "OMPI_MCA_orte_jobfam_session_dir=/tmp/x",
		"OMPI_MCA_orte_top_session_dir=/tmp", "OMPI_MCA_orte_local_daemon_uri=1.0;tcp://x", "OMPI_MCA_orte_launch=1",
		"OMPI_MCA_orte_precondition_transports=a-b", "OMPI_MCA_orte_tmpdir_base=/inherited",
	}, []string{"OMPI_MCA_orte_tmpdir_base=/mine"})) // -x wins over the rule
	want := map[string]string{"OMPI_MCA_btl": "self,vader", "PATH": "/bin", "OMPI_MCA_orte_tmpdir_base": "/mine"}
	if len(got) != len(want) || got["OMPI_MCA_btl"] != want["OMPI_MCA_btl"] || got["PATH"] != "/bin" || got["OMPI_MCA_orte_tmpdir_base"] != "/mine" {
		t.Errorf("baseEnv kept %q, want %q", got, want)
	}
}

// TestOpenMPIEnvLibraryMissing: without the library the ranks still get
// the flux bootstrap, naming where the library was expected, so that an
// Open MPI program fails in MPI_Init (they once got nothing and ran as
// singletons, exit 0); a failed rank that never used PMI makes the agent
// say once where the library was looked for.
func TestOpenMPIEnvLibraryMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "gone", wire.PMILibraryName)
	var logs strings.Builder
	a := &agent{
		spec: &wire.JobSpec{PMILibrary: missing},
		cfg:  Config{Job: "testlibmissing" + strconv.Itoa(os.Getpid())},
		dir:  t.TempDir(),
		log:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	t.Cleanup(func() { a.ompi.removeDir(a) })
	env, err := a.ompiEnv(&wire.EpochTable{})
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(t, env)
	if got[envOMPIPMIx] != "flux" || got[envFluxPMILibrary] != missing || got[envFluxJobID] == "" {
		t.Fatalf("library missing: the ranks get %q, want the flux bootstrap naming %s", got, missing)
	}
	a.ompi.rankFailed(a, 1)
	a.ompi.rankFailed(a, 2)
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), missing) {
		t.Errorf("two failed ranks: %d warnings, want 1 naming %s:\n%s", n, missing, logs.String())
	}
}

// TestOpenMPIDirPerGeneration: Open MPI's files go to a directory of the
// host and generation, in /dev/shm when it is a tmpfs (not the job
// directory on disk); a new generation's start removes the previous
// one's, and the agent's cleanup the last.
func TestOpenMPIDirPerGeneration(t *testing.T) {
	job := "testompidir" + strconv.Itoa(os.Getpid())
	a := &agent{spec: &wire.JobSpec{}, cfg: Config{Job: job, Host: 3}, dir: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	t.Cleanup(func() {
		for _, g := range []uint64{0, 1} {
			os.RemoveAll(a.ompiDir(g))
		}
	})
	var st syscall.Statfs_t
	onShm := syscall.Statfs("/dev/shm", &st) == nil && st.Type == tmpfsMagic
	var dirs []string
	for gen := range uint64(2) {
		a.gen = gen
		env, err := a.ompiEnv(&wire.EpochTable{})
		if err != nil {
			t.Fatal(err)
		}
		dir := envMap(t, env)[envOMPIVaderDir]
		want := filepath.Join(a.dir, "ompi-"+strconv.FormatUint(gen, 10))
		if onShm {
			want = filepath.Join("/dev/shm", "gorun-"+job+"-h3-g"+strconv.FormatUint(gen, 10))
		}
		if dir != want {
			t.Fatalf("generation %d: Open MPI's directory %q, want %q", gen, dir, want)
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Fatalf("generation %d: %s not made: %v", gen, dir, err)
		}
		dirs = append(dirs, dir)
	}
	if _, err := os.Stat(dirs[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("generation 0's %s left once generation 1 started (stat: %v)", dirs[0], err)
	}
	a.ompi.removeDir(a)
	if _, err := os.Stat(dirs[1]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("generation 1's %s left after the cleanup (stat: %v)", dirs[1], err)
	}
}

// TestOpenMPIAgentWithoutLibrary: given an Open MPI program's job
// (MPI "openmpi") and no library, an agent fails the job as it
// registers, naming where it looked, before it starts a rank.
func TestOpenMPIAgentWithoutLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), wire.PMILibraryName)
	spec := func(s *wire.JobSpec) { s.MPI, s.PMILibrary = "openmpi", missing }
	f := startFakeLauncherSpec(t, "ompinolib", []int{0}, func(*Config) {}, spec, "sleep", "3600")
	for done := false; !done; {
		select {
		case e := <-f.events:
			switch e.Kind {
			case wire.EventStarted:
				t.Fatal("the agent started a rank")
			case wire.EventAgentError:
				if !strings.Contains(e.Msg, missing) {
					t.Errorf("agent error event says %q, want it to name %s", e.Msg, missing)
				}
				done = true
			}
		case <-f.ctx.Done():
			t.Fatal("no agent error event")
		}
	}
	select {
	case err := <-f.agentErr:
		f.agentErr <- err // for the cleanup
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("agent's error %v, want one wrapping fs.ErrNotExist", err)
		}
	case <-f.ctx.Done():
		t.Fatal("the agent did not exit")
	}
}

// TestOpenMPIOversubscribed: a host with more ranks than CPUs tells its
// Open MPI ranks so (OMPI_MCA_mpi_oversubscribe=1, as mpirun does), and
// they yield when idle; a host with at most one rank per CPU does not.
func TestOpenMPIOversubscribed(t *testing.T) {
	cpus := runtime.NumCPU()
	for _, tc := range []struct {
		ranks int
		want  string
	}{
		{1, ""},
		{cpus, ""},
		{cpus + 1, "1"},
		{4*cpus + 3, "1"},
	} {
		t.Run(strconv.Itoa(tc.ranks)+" ranks", func(t *testing.T) {
			a := &agent{spec: &wire.JobSpec{}, cfg: Config{Job: "testompioversub" + strconv.Itoa(os.Getpid())}, dir: t.TempDir(), log: slog.New(slog.DiscardHandler)}
			t.Cleanup(func() { a.ompi.removeDir(a) })
			table := &wire.EpochTable{World: tc.ranks, Hosts: []wire.TableHost{{Name: "h", Ranks: wire.RankSet{{First: 0, Count: tc.ranks, Stride: 1}}}}}
			env, err := a.ompiEnv(table)
			if err != nil {
				t.Fatal(err)
			}
			if got := envMap(t, env)[envOMPIOversubscribe]; got != tc.want {
				t.Errorf("%d ranks on %d CPUs: %s=%q, want %q", tc.ranks, cpus, envOMPIOversubscribe, got, tc.want)
			}
		})
	}
}
