//go:build !race

package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// slurmRank is the ranks' program here: it prints the job id and its
// host's address, then waits until the file $0 exists.
const slurmRank = `echo "job $GORUN_JOB_ID"; echo "slurm task ${SLURM_PROCID:-none} of ${SLURM_STEP_NUM_TASKS:-none} in job ${SLURM_JOB_ID:-none}"; echo "up on $(hostname -I | cut -d' ' -f1)"; while [ ! -e "$0" ]; do sleep 0.05; done`

var slurmUpRE = regexp.MustCompile(`(?m)^\[(\d+)\] up on (\S+)$`)

// checkSlurmTasks checks what the n ranks of slurmRank printed of Slurm:
// they are not tasks of a step (a rank taking SLURM_PROCID or
// SLURM_STEP_NUM_TASKS for its own would be wrong), but they are in the job.
func checkSlurmTasks(t *testing.T, out string, n int) {
	t.Helper()
	task := regexp.MustCompile(`(?m)^\[\d+\] slurm task (\S+) of (\S+) in job (\S+)$`)
	tasks := task.FindAllStringSubmatch(out, -1)
	if len(tasks) != n {
		t.Fatalf("%d ranks printed their Slurm task, want %d\n%s", len(tasks), n, out)
	}
	for _, m := range tasks {
		if m[1] != "none" || m[2] != "none" || m[3] == "none" {
			t.Errorf("a rank sees %q: a step's task and task count leaked to it, or the job id did not", m[0])
		}
	}
}

// TestSlurm runs gorun inside salloc on a Slurm cluster of three namespace
// hosts (slurmctld in the root namespace, a slurmd in each host), with no
// hostfile: -np 4 --spares 1 takes two nodes of two CPUs for the ranks
// and leaves the third a spare, every agent started by one srun.
func TestSlurm(t *testing.T) {
	if testing.Short() {
		t.Skip("Slurm cluster: not with -short")
	}
	hosts := testcluster.NetnsHosts(t, 3)
	sl := testcluster.StartSlurm(t, hosts)
	salloc := []string{"salloc", "-N", "3", "--exclusive", "--no-kill"}
	// No --bind, as the README's Slurm example: the control plane listens
	// at the address routing to the nodes' NodeAddr (scontrol).
	start := func(t *testing.T, gate string) *job {
		return startJobUnder(t, salloc, sl.Env, nil, "", nil, "-np", "4", "--spares", "1",
			"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5", "--kill-grace", "1", "--", "sh", "-c", slurmRank, gate)
	}
	// ranksOn returns where each rank said it started, in order.
	ranksOn := func(j *job) [][]string {
		var out [][]string
		for _, m := range slurmUpRE.FindAllStringSubmatch(j.stdout.String(), -1) {
			out = append(out, m[1:])
		}
		return out
	}
	squeueEmpty := func(t *testing.T) {
		t.Helper()
		var out string
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			var err error
			if out, err = sl.Output("squeue", "-h"); err == nil && strings.TrimSpace(out) == "" {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("squeue still lists jobs:\n%s", out)
	}

	t.Run("no hostfile", func(t *testing.T) {
		gate := filepath.Join(t.TempDir(), "go")
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		j := start(t, gate)
		res := j.wait(60 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		checkNoJobFiles(t, j.jobID())
		// By slot: ranks 0 and 1 on the first node, 2 and 3 on the second.
		got := ranksOn(j)
		if len(got) != 4 {
			t.Fatalf("%d ranks started, want 4\nstdout:\n%s", len(got), res.stdout)
		}
		for _, r := range got {
			rank := int(r[0][0] - '0')
			if want := hosts.Addrs[rank/2]; r[1] != want {
				t.Errorf("rank %s on %s, want %s", r[0], r[1], want)
			}
		}
		checkSlurmTasks(t, res.stdout, 4)
		squeueEmpty(t)
	})

	// --launcher slurm with a hostfile: srun starts the hostfile's hosts.
	t.Run("hostfile", func(t *testing.T) {
		dir := t.TempDir()
		gate := filepath.Join(dir, "go")
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		hf := filepath.Join(dir, "hostfile")
		if err := os.WriteFile(hf, []byte(hosts.Names[2]+" slots=1\n"+hosts.Names[1]+" slots=1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		j := startJobUnder(t, salloc, sl.Env, nil, "", nil, "--launcher", "slurm", "--hostfile", hf, "--bind", hosts.BridgeAddr, // the names resolve only in Slurm
			"--", "sh", "-c", slurmRank, gate)
		res := j.wait(60 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		got := ranksOn(j)
		if len(got) != 2 {
			t.Fatalf("%d ranks started, want 2\nstdout:\n%s", len(got), res.stdout)
		}
		for _, r := range got {
			if want := hosts.Addrs[2-int(r[0][0]-'0')]; r[1] != want {
				t.Errorf("rank %s on %s, want %s (the hostfile's order)", r[0], r[1], want)
			}
		}
		squeueEmpty(t)
	})

	// gorun in a step of the allocation (as in srun --pty bash): the
	// step's SLURM_NTASKS and SLURM_TASKS_PER_NODE (1, on 1 node) are not
	// the allocation's; its slots are the nodes' CPUs, 2 each.
	t.Run("in a step", func(t *testing.T) {
		gate := filepath.Join(t.TempDir(), "go")
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		j := startJobUnder(t, append(slices.Clone(salloc), "srun", "-N1", "-n1"), sl.Env, nil, "", nil, "-np", "6", "--", "sh", "-c", slurmRank, gate)
		res := j.wait(60 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		got := ranksOn(j)
		if len(got) != 6 {
			t.Fatalf("%d ranks started, want 6\nstdout:\n%s", len(got), res.stdout)
		}
		for _, r := range got {
			if want := hosts.Addrs[int(r[0][0]-'0')/2]; r[1] != want {
				t.Errorf("rank %s on %s, want %s", r[0], r[1], want)
			}
		}
		checkSlurmTasks(t, res.stdout, 6)
		squeueEmpty(t)
	})

	// In a batch job gorun runs on the first node: its agent runs in
	// gorun's process and srun starts the other two.
	t.Run("sbatch", func(t *testing.T) {
		dir := t.TempDir()
		gate, out := filepath.Join(dir, "go"), filepath.Join(dir, "out")
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		mark := newMark()
		cmd := []string{gorunBin, "-v", "-x", "GORUNTEST_MARK=" + mark, "--bind", hosts.Addrs[0], "-np", "4", "--spares", "1", "--", "sh", "-c", slurmRank, gate}
		for i, a := range cmd {
			cmd[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		// Not --wait: sbatch polls the job's state every few seconds.
		sb := sl.Command(ctx, "sbatch", "-N", "3", "--exclusive", "--no-kill", "--output", out, "--wrap", strings.Join(cmd, " "))
		sb.Env = append(sb.Env, "GORUNTEST_MARK="+mark)
		if b, err := sb.CombinedOutput(); err != nil {
			log, _ := os.ReadFile(out)
			t.Fatalf("sbatch: %v\n%s\n%s", err, b, log)
		}
		squeueEmpty(t)
		log, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var got [][]string
		for _, m := range slurmUpRE.FindAllStringSubmatch(string(log), -1) {
			got = append(got, m[1:])
		}
		if len(got) != 4 {
			t.Fatalf("%d ranks started, want 4\n%s", len(got), log)
		}
		for _, r := range got {
			if want := hosts.Addrs[int(r[0][0]-'0')/2]; r[1] != want {
				t.Errorf("rank %s on %s, want %s", r[0], r[1], want)
			}
		}
		checkSlurmTasks(t, string(log), 4)
		if want := "--nodelist=" + hosts.Names[1] + "," + hosts.Names[2] + " "; !strings.Contains(string(log), want) {
			t.Errorf("srun was not started for the other nodes only (%s):\n%s", want, log)
		}
		if left := markedProcs(mark); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	})

	t.Run("scancel", func(t *testing.T) {
		gate := filepath.Join(t.TempDir(), "go") // never created
		j := start(t, gate)
		j.waitFor(slurmUpRE, 4, 60*time.Second)
		id, err := sl.Output("squeue", "-h", "-o", "%i")
		if err != nil || strings.TrimSpace(id) == "" {
			t.Fatalf("squeue: %q, %v", id, err)
		}
		if _, err := sl.Output("scancel", strings.TrimSpace(id)); err != nil {
			t.Fatal(err)
		}
		// salloc's exit code is its own; what counts is what is left.
		j.wait(60 * time.Second) // and no process of the job left
		checkNoJobFiles(t, j.jobID())
		checkNoSlotFiles(t, j.jobID())
		squeueEmpty(t)
	})

	// Last: the killed node stays down (its slurmd is gone too).
	t.Run("spare", func(t *testing.T) {
		gate := filepath.Join(t.TempDir(), "go")
		j := start(t, gate)
		j.waitFor(slurmUpRE, 4, 60*time.Second)
		if err := hosts.KillAll(0); err != nil {
			t.Fatal(err)
		}
		// Ranks 0 and 1 start again on the spare.
		onSpare := regexp.MustCompile(`(?m)^\[\d+\] up on ` + regexp.QuoteMeta(hosts.Addrs[2]) + `$`)
		j.waitFor(onSpare, 2, 60*time.Second)
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		res := j.wait(60 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		// The killed node's agent could not remove its job directory
		// (the others sweep it as they end: a loose bound here).
		left, _ := filepath.Glob(filepath.Join(os.TempDir(), "gorun-"+j.jobID()+"-*"))
		if len(left) > 1 {
			t.Errorf("job directories left: %v, want at most the killed node's", left)
		}
		for _, d := range left {
			os.RemoveAll(d)
		}
		if !strings.Contains(res.stderr, hosts.Names[0]) {
			t.Errorf("the report does not name the lost node %s:\n%s", hosts.Names[0], res.stderr)
		}
		// (The allocation stays listed, completing, until Slurm marks the
		// dead node down.)
	})
}
