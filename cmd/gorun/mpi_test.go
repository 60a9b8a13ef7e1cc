package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// MPI programs built with MPICH (Debian's mpich and libmpich-dev) run
// under gorun through its PMI-1 server, as under mpiexec.hydra. Without
// mpicc.mpich the tests skip, unless GORUN_TESTCLUSTER_REQUIRE=1 (CI, which
// installs MPICH).

var (
	mpiOnce sync.Once
	mpiDir  string
	mpiErr  error
)

// mpiProgram returns the path of testdata/mpi/<name>.c built with
// mpicc.mpich (once per test process).
func mpiProgram(t *testing.T, name string) string {
	t.Helper()
	cc, err := exec.LookPath("mpicc.mpich")
	if err != nil {
		if os.Getenv("GORUN_TESTCLUSTER_REQUIRE") == "1" {
			t.Fatal("mpicc.mpich not found (apt-get install mpich libmpich-dev)")
		}
		t.Skip("no mpicc.mpich (apt-get install mpich libmpich-dev)")
	}
	mpiOnce.Do(func() {
		mpiDir = filepath.Join(filepath.Dir(gorunBin), "mpi")
		if mpiErr = os.MkdirAll(mpiDir, 0o755); mpiErr != nil {
			return
		}
		for _, p := range []string{"hello", "allreduce", "abort", "abort0", "die", "spare"} {
			out, err := exec.Command(cc, "-O1", "-o", filepath.Join(mpiDir, p), filepath.Join("testdata", "mpi", p+".c")).CombinedOutput()
			if err != nil {
				mpiErr = fmt.Errorf("mpicc.mpich %s.c: %v\n%s", p, err, out)
				return
			}
		}
	})
	if mpiErr != nil {
		t.Fatal(mpiErr)
	}
	return filepath.Join(mpiDir, name)
}

// hydra runs prog under mpiexec.hydra with n ranks on this host.
func hydra(t *testing.T, n int, prog string, want int) result {
	t.Helper()
	mpiexec, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Skip("no mpiexec.hydra")
	}
	// Hydra is the reference here, not what is under test: on a loaded
	// machine it has been seen to exit 15 with no output (once in eight
	// runs of the MPI tests under -race), and an aborting program's run
	// to exit 1 instead of the MPI_Abort code. A run that does not exit
	// with want is retried, twice at most, and logged.
	var res result
	for try := 1; try <= 3; try++ {
		cmd := exec.Command(mpiexec, "-n", fmt.Sprint(n), prog)
		var out, errb syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err = cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("mpiexec.hydra: %v", err)
		}
		res = result{stdout: out.String(), stderr: errb.String(), code: code}
		if code == want {
			break
		}
		t.Logf("mpiexec.hydra -n %d %s (try %d): exit %d, want %d\nstderr:\n%s", n, prog, try, code, want, res.stderr)
	}
	return res
}

// untagged returns the lines of gorun's tagged output without their
// tags, sorted (ranks print in any order).
func untagged(stdout string) []string {
	var lines []string
	for _, m := range tagged.FindAllStringSubmatch(stdout, -1) {
		lines = append(lines, m[2])
	}
	sort.Strings(lines)
	return lines
}

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return lines
}

func TestMPIOneHost(t *testing.T) {
	for _, n := range []int{1, 4, 8} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			for _, prog := range []string{"hello", "allreduce"} {
				res := startJob(t, "", nil, "-np", fmt.Sprint(n), "--oversubscribe", "--", mpiProgram(t, prog)).wait(90 * time.Second)
				if res.code != 0 {
					t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", prog, res.code, res.stdout, res.stderr)
				}
				got := untagged(res.stdout)
				if len(got) != n {
					t.Fatalf("%s: %d lines from %d ranks\nstdout:\n%s\nstderr:\n%s", prog, len(got), n, res.stdout, res.stderr)
				}
				// The same program under mpiexec.hydra prints the same.
				h := hydra(t, n, mpiProgram(t, prog), 0)
				if h.code != 0 || fmt.Sprint(sortedLines(h.stdout)) != fmt.Sprint(got) {
					t.Errorf("%s: gorun printed %q, mpiexec.hydra (exit %d) %q", prog, got, h.code, sortedLines(h.stdout))
				}
				if prog == "allreduce" {
					for _, l := range got {
						if !strings.HasSuffix(l, " ok") {
							t.Errorf("allreduce: %s", l)
						}
					}
				}
			}
		})
	}
}

func TestMPIAbort(t *testing.T) {
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			res := startJob(t, "", nil, "-np", fmt.Sprint(n), "--oversubscribe", "--", mpiProgram(t, "abort")).wait(90 * time.Second)
			if res.code != 7 {
				t.Fatalf("exit %d, want 7 (the MPI_Abort code)\nstderr:\n%s", res.code, res.stderr)
			}
			r := 1
			if n == 1 {
				r = 0
			}
			// Alone, MPICH's MPI_Abort may exit without telling PMI.
			what := "called MPI_Abort with exit code 7"
			if n == 1 {
				what = "(called MPI_Abort with exit code 7|exited with code 7)"
			}
			if !regexp.MustCompile(fmt.Sprintf(`gorun: rank %d on host \S+ \(pid \d+\) %s; stopping the job`, r, what)).MatchString(res.stderr) {
				t.Errorf("the report does not name rank %d's MPI_Abort:\n%s", r, res.stderr)
			}
			if h := hydra(t, n, mpiProgram(t, "abort"), 7); h.code != 7 {
				t.Errorf("mpiexec.hydra exited %d, want 7", h.code)
			}
		})
	}
}

// TestMPIRankDiesInBarrier: a rank that dies while the others wait in a
// barrier fails the job at once, with its status.
func TestMPIRankDiesInBarrier(t *testing.T) {
	res := startJob(t, "", nil, "-np", "4", "--oversubscribe", "--", mpiProgram(t, "die")).wait(90 * time.Second)
	if res.code != 3 {
		t.Fatalf("exit %d, want 3 (rank 1's)\nstderr:\n%s", res.code, res.stderr)
	}
	if !regexp.MustCompile(`gorun: rank 1 on host \S+ \(pid \d+\) exited with code 3; stopping the job`).MatchString(res.stderr) {
		t.Errorf("the report does not name rank 1:\n%s", res.stderr)
	}
}

// TestMPIAbortZero: MPI_Abort with code 0 stops the job too (its status
// is 0, as under Hydra).
func TestMPIAbortZero(t *testing.T) {
	res := startJob(t, "", nil, "-np", "3", "--oversubscribe", "--", mpiProgram(t, "abort0")).wait(90 * time.Second)
	if res.code != 0 || !strings.Contains(res.stderr, "called MPI_Abort with exit code 0; stopping the job") {
		t.Fatalf("exit %d, want 0 with a report of rank 1's MPI_Abort\nstderr:\n%s", res.code, res.stderr)
	}
}

// TestMPIPeerNeverEntersBarrier: a rank that exits 0 without ever using
// PMI, while the MPI ranks wait for it in a barrier, fails the job instead
// of leaving it hanging.
func TestMPIPeerNeverEntersBarrier(t *testing.T) {
	hello := mpiProgram(t, "hello")
	res := startJob(t, "", nil, "-np", "2", "--oversubscribe", "--", "sh", "-c", `if [ "$PMI_RANK" = 0 ]; then exec "$0"; fi; exit 0`, hello).wait(90 * time.Second)
	if res.code != 1 || !strings.Contains(res.stderr, "rank 1 ended without entering this fence") {
		t.Fatalf("exit %d, want 1 with rank 0's failed barrier reported\nstderr:\n%s", res.code, res.stderr)
	}
}

// TestMPIPeerOnOtherHostNeverEntersBarrier: the same, with the rank that
// never comes alone on another host: its agent fails the fence job-wide.
func TestMPIPeerOnOtherHostNeverEntersBarrier(t *testing.T) {
	hello := mpiProgram(t, "hello")
	hosts := testcluster.NetnsHosts(t, 2)
	hf := hosts.WriteHostfile(t, t.TempDir(), 1)
	res := startJob(t, "", nil, "-np", "2", "--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr,
		"--", "sh", "-c", `if [ "$PMI_RANK" = 0 ]; then exec "$0"; fi; exit 0`, hello).wait(90 * time.Second)
	if res.code != 1 || !strings.Contains(res.stderr, "rank 1 ended without entering this fence") {
		t.Fatalf("exit %d, want 1 with rank 0's failed barrier reported\nstderr:\n%s", res.code, res.stderr)
	}
}

// TestMPIMultiHost: ranks on two namespace hosts find each other through
// the PMI key-value space, which a barrier publishes across the agents.
func TestMPIMultiHost(t *testing.T) {
	prog := mpiProgram(t, "allreduce")
	hosts := testcluster.NetnsHosts(t, 2)
	for _, n := range []int{4, 8} {
		t.Run(fmt.Sprintf("np%d", n), func(t *testing.T) {
			hf := hosts.WriteHostfile(t, t.TempDir(), n/2)
			args := []string{"-np", fmt.Sprint(n), "--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr, "--"}
			res := startJob(t, "", nil, append(args, prog)...).wait(90 * time.Second)
			if res.code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
			}
			var want []string
			for r := range n {
				want = append(want, fmt.Sprintf("rank %d: sum %d max %d ok", r, n*(n+1)/2, n-1))
			}
			sort.Strings(want)
			if got := untagged(res.stdout); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got %q, want %q\nstderr:\n%s", got, want, res.stderr)
			}
			abort := startJob(t, "", nil, append(args, mpiProgram(t, "abort"))...).wait(90 * time.Second)
			if abort.code != 7 {
				t.Fatalf("abort across hosts: exit %d, want 7\nstderr:\n%s", abort.code, abort.stderr)
			}
		})
	}
}

// TestNoPMI: with --pmi=false no rank gets a PMI connection (an MPICH
// program then runs as a singleton, each rank alone).
func TestNoPMI(t *testing.T) {
	res := startJob(t, "", nil, "-np", "2", "--oversubscribe", "--pmi=false", "--", mpiProgram(t, "hello")).wait(90 * time.Second)
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	if got := untagged(res.stdout); fmt.Sprint(got) != fmt.Sprint([]string{"hello from 0 of 1", "hello from 0 of 1"}) {
		t.Fatalf("with --pmi=false: %q, want two singletons", got)
	}
}

// TestMPISparesReplaceEveryHost: two spares take the ranks of both hosts
// of an MPICH job, one loss after the other, and every generation's ranks
// start MPI (restarted from the start). The last generation runs on hosts
// 2 and 3 of four only: MPICH must be told two nodes, not nodes 2 and 3
// (which it counted as four, one per rank, and then skipped the PMI
// barrier of its shared memory setup: MPI_Init failed, "unable to
// allocate shared memory"; issue 21, chaos seed 2026 run 98).
func TestMPISparesReplaceEveryHost(t *testing.T) {
	prog := mpiProgram(t, "spare")
	hosts := testcluster.NetnsHosts(t, 4)
	hf := hosts.WriteHostfile(t, t.TempDir(), 2)
	j := startJob(t, "", nil, "-np", "4", "--hostfile", hf, "--spares", "2", "--recovery", "restart",
		"--rsh", "ip netns exec", "--bind", hosts.BridgeAddr, "--kill-grace", "2", "--", prog, "2")
	up := func(gen int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^\[\d\] generation %d: rank \d of 4 up, sum 4$`, gen))
	}
	for gen := range 2 {
		j.waitFor(up(gen), 4, 60*time.Second)
		if err := hosts.KillAll(gen); err != nil {
			t.Fatal(err)
		}
	}
	res := j.wait(120 * time.Second)
	if res.code != 0 {
		t.Fatalf("after the loss of hosts 0 and 1: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	if n := len(up(2).FindAllString(res.stdout, -1)); n != 4 {
		t.Errorf("%d ranks up in generation 2, want 4\nstdout:\n%s\nstderr:\n%s", n, res.stdout, res.stderr)
	}
}
