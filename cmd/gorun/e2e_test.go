package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var tagged = regexp.MustCompile(`(?m)^\[(\d+)\] (.*)$`)

func TestRanksGetTheirContract(t *testing.T) {
	for _, np := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			os.Setenv("GORUNTEST_Y", "from-launcher")
			defer os.Unsetenv("GORUNTEST_Y")
			// A layout: 1 × 1 × np, or with 16 ranks TP 4 × PP 2 × DP 2.
			tp, pp := 1, 1
			if np == 16 {
				tp, pp = 4, 2
			}
			res := runJob(t, "env", []string{"GORUNTEST_X=a=b c", "GORUNTEST_Y"},
				"-np", strconv.Itoa(np), "--tp", strconv.Itoa(tp), "--pp", strconv.Itoa(pp), "--oversubscribe", os.Args[0])
			if res.code != 0 {
				t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
			}
			seen := map[int]map[string]string{}
			for _, m := range tagged.FindAllStringSubmatch(res.stdout, -1) {
				tag, _ := strconv.Atoi(m[1])
				var env map[string]string
				if err := json.Unmarshal([]byte(m[2]), &env); err != nil {
					t.Fatalf("rank %d printed %q: %v", tag, m[2], err)
				}
				if _, dup := seen[tag]; dup {
					t.Fatalf("rank %d ran twice", tag)
				}
				seen[tag] = env
			}
			if len(seen) != np {
				t.Fatalf("%d ranks reported, want %d\nstdout:\n%s", len(seen), np, res.stdout)
			}
			var job, port string
			for r := range np {
				env, ok := seen[r]
				if !ok {
					t.Fatalf("rank %d missing", r)
				}
				want := map[string]string{
					"GORUN_RANK": strconv.Itoa(r), "RANK": strconv.Itoa(r), "OMPI_COMM_WORLD_RANK": strconv.Itoa(r), "PMI_RANK": strconv.Itoa(r), "ROLE_RANK": strconv.Itoa(r),
					"GORUN_WORLD_SIZE": strconv.Itoa(np), "WORLD_SIZE": strconv.Itoa(np), "OMPI_COMM_WORLD_SIZE": strconv.Itoa(np), "PMI_SIZE": strconv.Itoa(np), "ROLE_WORLD_SIZE": strconv.Itoa(np),
					"GORUN_LOCAL_RANK": strconv.Itoa(r), "LOCAL_RANK": strconv.Itoa(r), "OMPI_COMM_WORLD_LOCAL_RANK": strconv.Itoa(r),
					"GORUN_LOCAL_SIZE": strconv.Itoa(np), "LOCAL_WORLD_SIZE": strconv.Itoa(np), "OMPI_COMM_WORLD_LOCAL_SIZE": strconv.Itoa(np),
					"GORUN_NODE_RANK": "0", "GROUP_RANK": "0", "OMPI_COMM_WORLD_NODE_RANK": "0", "GROUP_WORLD_SIZE": "1",
					"GORUN_EPOCH": "0", "GORUN_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": "0",
					"MASTER_ADDR": "127.0.0.1", "ROLE_NAME": "default",
					"GORUNTEST_X": "a=b c", "GORUNTEST_Y": "from-launcher",
					"GORUN_TP_SIZE": strconv.Itoa(tp), "GORUN_PP_SIZE": strconv.Itoa(pp), "GORUN_DP_SIZE": strconv.Itoa(np / (tp * pp)),
				}
				for k, v := range want {
					if env[k] != v {
						t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
					}
				}
				for _, k := range []string{"GORUN_JOB_ID", "GORUN_SOCKET", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TMPDIR"} {
					if env[k] == "" {
						t.Errorf("rank %d: %s not set", r, k)
					}
				}
				if job == "" {
					job, port = env["GORUN_JOB_ID"], env["MASTER_PORT"]
				}
				if env["GORUN_JOB_ID"] != job || env["MASTER_PORT"] != port || env["TORCHELASTIC_RUN_ID"] != job {
					t.Errorf("rank %d: job %s port %s, rank 0 had %s %s", r, env["GORUN_JOB_ID"], env["MASTER_PORT"], job, port)
				}
				if p, err := strconv.Atoi(env["MASTER_PORT"]); err != nil || p <= 0 || p > 65535 {
					t.Errorf("rank %d: MASTER_PORT=%q", r, env["MASTER_PORT"])
				}
				if omp := env["OMP_NUM_THREADS"]; (np > 1) != (omp == "1") {
					t.Errorf("rank %d of %d: OMP_NUM_THREADS=%q", r, np, omp)
				}
				wd, _ := os.Getwd()
				if env["cwd"] != wd {
					t.Errorf("rank %d: cwd %q, want %q", r, env["cwd"], wd)
				}
				if !strings.HasPrefix(env["tmpfile"], env["TMPDIR"]) {
					t.Errorf("rank %d: temp file %s not under TMPDIR %s", r, env["tmpfile"], env["TMPDIR"])
				}
				if _, err := os.Stat(env["tmpfile"]); !os.IsNotExist(err) {
					t.Errorf("rank %d: temp file %s left behind (%v)", r, env["tmpfile"], err)
				}
				// TMPDIR is in the agent's job directory, and holds no
				// socket of the agent's.
				if !inJobDir(env["TMPDIR"], job) {
					t.Errorf("rank %d: TMPDIR %s not in a job directory of job %s in %s", r, env["TMPDIR"], job, os.TempDir())
				}
				if filepath.Dir(env["GORUN_SOCKET"]) == filepath.Clean(env["TMPDIR"]) {
					t.Errorf("rank %d: GORUN_SOCKET %s in TMPDIR %s", r, env["GORUN_SOCKET"], env["TMPDIR"])
				}
			}
			// The sockets are in the agent's socket directory in
			// /dev/shm where it is a tmpfs (internal/agent/sockdir.go).
			var st syscall.Statfs_t
			if syscall.Statfs("/dev/shm", &st) == nil && st.Type == 0x01021994 {
				for r, env := range seen {
					if dir := filepath.Dir(env["GORUN_SOCKET"]); !strings.HasPrefix(dir, "/dev/shm/gorun-"+job+"-") || !strings.HasSuffix(dir, ".sock") {
						t.Errorf("rank %d: GORUN_SOCKET %s not in a socket directory in /dev/shm", r, env["GORUN_SOCKET"])
					}
				}
			}
			// Neither the job directory nor the socket directory is left.
			checkNoJobFiles(t, job)
		})
	}
}

// inJobDir reports whether dir is a job directory of job in the
// temporary directory (gorun-<job>-<n>.agent), or inside one.
func inJobDir(dir, job string) bool {
	rel, err := filepath.Rel(os.TempDir(), dir)
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(rel, string(filepath.Separator))
	return regexp.MustCompile(`^gorun-` + regexp.QuoteMeta(job) + `-\d+\.agent$`).MatchString(first)
}

func TestOutputIsTaggedWholeLines(t *testing.T) {
	const np, lines = 8, 400
	res := runJob(t, "lines", []string{"GORUNTEST_LINES=" + strconv.Itoa(lines)}, "-np", strconv.Itoa(np), "--oversubscribe", os.Args[0])
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	lineRE := regexp.MustCompile(`^\[(\d+)\] rank-(\d+)-line-(\d+)-(x*)$|^\[(\d+)\] no-newline-at-end-(\d+)$`)
	counts := map[string]int{}
	for _, stream := range []struct {
		name, text string
	}{{"stdout", res.stdout}, {"stderr", res.stderr}} {
		for _, l := range strings.Split(strings.TrimSuffix(stream.text, "\n"), "\n") {
			m := lineRE.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%s line not whole or not tagged: %q", stream.name, l)
			}
			if m[1] != "" {
				i, _ := strconv.Atoi(m[3])
				if m[1] != m[2] || len(m[4]) != i%97 {
					t.Fatalf("%s line mangled: %q", stream.name, l)
				}
				if (i%5 == 4) != (stream.name == "stderr") {
					t.Fatalf("line on the wrong stream (%s): %q", stream.name, l)
				}
			}
			counts[stream.name]++
		}
	}
	if counts["stdout"] != np*(lines-lines/5+1) || counts["stderr"] != np*lines/5 {
		t.Fatalf("line counts %v, want stdout %d stderr %d", counts, np*(lines-lines/5+1), np*lines/5)
	}
}

func TestOutputOptions(t *testing.T) {
	t.Run("no-tag", func(t *testing.T) {
		res := runJob(t, "", nil, "-np", "2", "--oversubscribe", "--tag-output=false", "echo", "plain")
		if res.code != 0 || res.stdout != "plain\nplain\n" {
			t.Fatalf("exit %d, stdout %q", res.code, res.stdout)
		}
	})
	t.Run("timestamp", func(t *testing.T) {
		res := runJob(t, "", nil, "-np", "2", "--oversubscribe", "--timestamp-output", "echo", "hi")
		re := regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6} \[[01]\] hi$`)
		if res.code != 0 || len(re.FindAllString(res.stdout, -1)) != 2 {
			t.Fatalf("exit %d, stdout %q", res.code, res.stdout)
		}
	})
	t.Run("output-filename", func(t *testing.T) {
		dir := t.TempDir()
		res := runJob(t, "", nil, "-np", "3", "--oversubscribe", "--output-filename", dir, "sh", "-c", "echo out $RANK; echo err $RANK >&2")
		if res.code != 0 || res.stdout != "" {
			t.Fatalf("exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
		}
		for r := range 3 {
			for _, s := range []string{"out", "err"} {
				b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank.%d", r), "std"+s))
				if err != nil || string(b) != fmt.Sprintf("%s %d\n", s, r) {
					t.Errorf("rank %d std%s: %q, %v", r, s, b, err)
				}
			}
		}
	})
}

func TestExitCodeOfFirstFailure(t *testing.T) {
	res := runJob(t, "exit", []string{"GORUNTEST_RANK=2", "GORUNTEST_CODE=3"}, "-np", "4", "--oversubscribe", os.Args[0])
	if res.code != 3 {
		t.Fatalf("exit %d, want 3\nstderr:\n%s", res.code, res.stderr)
	}
	if !strings.Contains(res.stderr, "rank 2 on host localhost") || !strings.Contains(res.stderr, "exited with code 3") {
		t.Errorf("report does not name the rank, host and cause:\n%s", res.stderr)
	}
	if n := strings.Count(res.stderr, "exited with code"); n != 1 {
		t.Errorf("%d failure reports; the ranks gorun stopped must not count:\n%s", n, res.stderr)
	}
}

func TestSignalledRankGives128PlusSignal(t *testing.T) {
	res := runJob(t, "", nil, "-np", "2", "--oversubscribe", "sh", "-c", `if [ "$RANK" = 1 ]; then kill -SEGV $$; fi; sleep 30`)
	if res.code != 128+int(syscall.SIGSEGV) {
		t.Fatalf("exit %d, want %d\nstderr:\n%s", res.code, 128+int(syscall.SIGSEGV), res.stderr)
	}
	if !strings.Contains(res.stderr, "rank 1") || !strings.Contains(res.stderr, "SIGSEGV") {
		t.Errorf("report: %s", res.stderr)
	}
}

func TestSignalsReachEveryRank(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			const np = 4
			j := startJob(t, "trap", nil, "-np", strconv.Itoa(np), "--oversubscribe", os.Args[0])
			j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), np, 30*time.Second)
			j.cmd.Process.Signal(sig)
			res := j.wait(30 * time.Second)
			if res.code != 128+int(sig) {
				t.Fatalf("exit %d, want %d\nstderr:\n%s", res.code, 128+int(sig), res.stderr)
			}
			got := regexp.MustCompile(`(?m)^\[(\d)\] got `+regexp.QuoteMeta(sig.String())+`$`).FindAllStringSubmatch(res.stdout, -1)
			if len(got) != np {
				t.Fatalf("%d ranks saw %v, want %d\nstdout:\n%s", len(got), sig, np, res.stdout)
			}
		})
	}
	t.Run("SIGUSR1 forwarded", func(t *testing.T) {
		const np = 3
		j := startJob(t, "trap", []string{"GORUNTEST_EXIT_ON_USR=1"}, "-np", strconv.Itoa(np), "--oversubscribe", os.Args[0])
		j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), np, 30*time.Second)
		j.cmd.Process.Signal(syscall.SIGUSR1)
		res := j.wait(30 * time.Second)
		if res.code != 0 || strings.Count(res.stdout, "got user defined signal 1") != np {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
	})
}

func TestSecondInterruptKillsAtOnce(t *testing.T) {
	j := startJob(t, "ignore", nil, "-np", "2", "--oversubscribe", "--kill-grace", "600", os.Args[0])
	j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), 2, 30*time.Second)
	j.cmd.Process.Signal(syscall.SIGINT)
	j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), 2, time.Second) // still running: SIGINT is ignored
	select {
	case <-j.done:
		t.Fatalf("gorun exited after one SIGINT though the ranks ignore it and the grace is 600 s")
	case <-time.After(200 * time.Millisecond):
	}
	j.cmd.Process.Signal(syscall.SIGINT)
	res := j.wait(30 * time.Second)
	if res.code != 130 {
		t.Fatalf("exit %d, want 130\nstderr:\n%s", res.code, res.stderr)
	}
}

func TestKillGraceEndsWithSIGKILL(t *testing.T) {
	// Rank 0 fails; rank 1 ignores SIGTERM and must be killed after the grace.
	j := startJob(t, "", nil, "-np", "2", "--oversubscribe", "--kill-grace", "0.5", "sh", "-c",
		`if [ "$RANK" = 0 ]; then sleep 0.2; exit 5; fi; trap "" TERM; echo ready; while :; do sleep 0.05; done`)
	res := j.wait(30 * time.Second)
	if res.code != 5 {
		t.Fatalf("exit %d, want 5\nstderr:\n%s", res.code, res.stderr)
	}
}

func TestTimeout(t *testing.T) {
	j := startJob(t, "spawn", nil, "-np", "2", "--oversubscribe", "--timeout", "1", "--kill-grace", "1", os.Args[0])
	res := j.wait(30 * time.Second)
	if res.code != 124 {
		t.Fatalf("exit %d, want 124\nstderr:\n%s", res.code, res.stderr)
	}
	if !strings.Contains(res.stderr, "time limit") {
		t.Errorf("no timeout report:\n%s", res.stderr)
	}
}

func TestNothingLeftBehind(t *testing.T) {
	// Each rank leaves a sleeping child in its process group and exits 0;
	// the job ends when the ranks do, and the children must go with it.
	res := runJob(t, "spawn", []string{"GORUNTEST_CODE=0"}, "-np", "3", "--oversubscribe", os.Args[0])
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
}

func TestDaemonizedChildrenDoNotSurvive(t *testing.T) {
	res := runJob(t, "daemon", nil, "-np", "2", "--oversubscribe", os.Args[0])
	if res.code != 0 || strings.Count(res.stdout, "started") != 2 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
}

func TestProgramThatCannotStart(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "not-executable")
	os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o644)
	res := runJob(t, "", nil, "-np", "1", "--wdir", dir, "./not-executable")
	if res.code != 2 || !strings.Contains(res.stderr, "not executable") {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.hosts")
	os.WriteFile(bad, []byte("node1 slots=4\nnode2 slots=many\n"), 0o644)
	unreadable := filepath.Join(dir, "unreadable.hosts")
	os.WriteFile(unreadable, []byte("node1\n"), 0o000)
	two := filepath.Join(dir, "two.hosts")
	os.WriteFile(two, []byte("localhost slots=2\n"), 0o644)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--frobnicate", "true"}, "flag provided but not defined: -frobnicate"},
		{"np zero", []string{"-np", "0", "true"}, "-np must be at least 1"},
		{"np negative", []string{"-n", "-3", "true"}, "-np must be at least 1"},
		{"np not a number", []string{"-np", "four", "true"}, `invalid value "four" for flag -np`},
		{"too many ranks", []string{"-np", "5", "--hostfile", two, "true"}, "5 ranks requested but only 2 slots"},
		{"no program", []string{"-np", "2"}, "no program to run"},
		{"program not found", []string{"-np", "1", "no-such-program-gorun"}, `program "no-such-program-gorun" not found`},
		{"missing hostfile", []string{"--hostfile", filepath.Join(dir, "nope"), "true"}, "nope"},
		{"malformed hostfile", []string{"--hostfile", bad, "true"}, "bad.hosts:2"},
		{"hostfile is a directory", []string{"--hostfile", dir, "true"}, dir},
		{"missing --wdir", []string{"--wdir", filepath.Join(dir, "nope"), "true"}, "--wdir " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{"bad map-by", []string{"--map-by", "socket", "true"}, "socket"},
		{"bad -x", []string{"-x", "1BAD=x", "true"}, "not a valid variable name"},
		{"unset -x", []string{"-x", "GORUNTEST_SURELY_UNSET", "true"}, "not set"},
		{"bad timeout", []string{"--timeout", "soon", "true"}, "not a number of seconds"},
		{"hostfile and -H", []string{"--hostfile", two, "-H", "localhost", "true"}, "not both"},
		{"remote without bind", []string{"-H", "far-away-host", "true"}, "--bind"},
		{"link-local host", []string{"-H", "[fe80::1%eth0]", "true"}, "host fe80::1%eth0: its address fe80::1%eth0 is IPv6 link-local"},
		{"layout does not divide", []string{"-np", "4", "--tp", "3", "true"}, "--tp 3 --pp 1: 4 ranks are not a multiple of tensor-parallel 3 × pipeline-parallel 1 = 3"},
		{"layout too large", []string{"-np", "4", "--tp", "2", "--pp", "4", "true"}, "tensor-parallel 2 × pipeline-parallel 4 is more than the 4 ranks"},
		{"tp zero", []string{"-np", "4", "--tp", "0", "true"}, "--tp and --pp must be at least 1"},
	}
	if os.Geteuid() != 0 { // root reads any file
		tests = append(tests, struct {
			name string
			args []string
			want string
		}{"unreadable hostfile", []string{"--hostfile", unreadable, "true"}, "unreadable.hosts"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runJob(t, "", nil, tt.args...)
			if res.code != 2 {
				t.Errorf("exit %d, want 2\nstderr:\n%s", res.code, res.stderr)
			}
			if !strings.Contains(res.stderr, tt.want) {
				t.Errorf("stderr does not say %q:\n%s", tt.want, res.stderr)
			}
			if strings.Contains(res.stderr, "panic") || strings.Contains(res.stderr, "goroutine ") {
				t.Errorf("panic:\n%s", res.stderr)
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	res := runJob(t, "", nil, "--help")
	if res.code != 0 || !strings.Contains(res.stdout, "Usage: gorun") {
		t.Errorf("--help: exit %d, stdout %q", res.code, res.stdout)
	}
	res = runJob(t, "", nil, "--version")
	if res.code != 0 || !strings.HasPrefix(res.stdout, "gorun ") {
		t.Errorf("--version: exit %d, stdout %q", res.code, res.stdout)
	}
}

var _ = context.Background
var _ = io.Discard

func TestClosedOutputStopsTheJob(t *testing.T) {
	mark := newMark()
	cmd := exec.Command(gorunBin, "-x", "GORUNTEST_MARK="+mark, "-np", "2", "--oversubscribe", "sh", "-c", "while :; do echo tick; sleep 0.01; done")
	cmd.Env = append(os.Environ(), "GORUNTEST_MARK="+mark)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasSuffix(line, "tick\n") {
		t.Fatalf("first line %q, %v", line, err)
	}
	out.Close() // like `gorun ... | head -1`
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("gorun did not stop after its stdout closed")
	}
	if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGPIPE) {
		t.Fatalf("exit %d, want %d\nstderr:\n%s", code, 128+int(syscall.SIGPIPE), stderr.String())
	}
	(&job{t: t, mark: mark}).checkNoOrphans()
}
