package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// multiHostJob starts a job on namespace hosts, agents through "ip netns exec".
func multiHostJob(t *testing.T, hosts *testcluster.Hosts, slots int, helper string, extra ...string) *job {
	t.Helper()
	hf := hosts.WriteHostfile(t, t.TempDir(), slots)
	args := append([]string{"--hostfile", hf, "--rsh", "ip netns exec", "--bind", hosts.BridgeAddr}, extra...)
	return startJob(t, helper, nil, append(args, os.Args[0])...)
}

func TestMultiHostRanksReachEachOther(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 4)
	res := multiHostJob(t, hosts, 2, "ring").wait(90 * time.Second)
	if res.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	re := regexp.MustCompile(`(?m)^\[(\d+)\] token from (\d+) at ([\d.]+) to ([\d.]+)$`)
	got := re.FindAllStringSubmatch(res.stdout, -1)
	if len(got) != 8 {
		t.Fatalf("%d ranks passed the token, want 8\nstdout:\n%s\nstderr:\n%s", len(got), res.stdout, res.stderr)
	}
	for _, m := range got {
		r, _ := strconv.Atoi(m[1])
		from, _ := strconv.Atoi(m[2])
		if from != (r+7)%8 {
			t.Errorf("rank %d got the token from %d", r, from)
		}
		// Map by slot: ranks 2h and 2h+1 on host h.
		if want := hosts.Addrs[r/2]; m[4] != want {
			t.Errorf("rank %d listened on %s, want its host's address %s", r, m[4], want)
		}
		if want := hosts.Addrs[from/2]; m[3] != want {
			t.Errorf("rank %d got the token from %s, want %s (host of rank %d)", r, m[3], want, from)
		}
	}
}

func TestMultiHostMapByNode(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 4)
	res := multiHostJob(t, hosts, 2, "ring", "--map-by", "node").wait(90 * time.Second)
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	re := regexp.MustCompile(`(?m)^\[(\d+)\] token from \d+ at [\d.]+ to ([\d.]+)$`)
	for _, m := range re.FindAllStringSubmatch(res.stdout, -1) {
		r, _ := strconv.Atoi(m[1])
		if want := hosts.Addrs[r%4]; m[2] != want {
			t.Errorf("rank %d on %s, want %s (round-robin by node)", r, m[2], want)
		}
	}
}

func TestMultiHostCrashStopsTheJob(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 3)
	j := multiHostJob(t, hosts, 2, "trap", "--kill-grace", "2")
	j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), 6, 60*time.Second)
	if err := hosts.KillAll(1); err != nil {
		t.Fatal(err)
	}
	res := j.wait(60 * time.Second)
	// The crashed host's agent could not remove its job directory nor
	// its socket directory; the other hosts' agents, which share this
	// /tmp and /dev/shm, removed theirs and, as they ended, swept the
	// crashed one's (nobody held its locks).
	id := j.jobID()
	checkNoJobFiles(t, id)
	for _, dir := range []string{os.TempDir(), "/dev/shm"} {
		left, _ := filepath.Glob(filepath.Join(dir, "gorun-"+id+"-*"))
		for _, d := range left {
			os.RemoveAll(d)
		}
	}
	if res.code != 1 {
		t.Fatalf("exit %d, want 1\nstderr:\n%s", res.code, res.stderr)
	}
	if !strings.Contains(res.stderr, "host "+hosts.Names[1]) {
		t.Errorf("report does not name the crashed host %s:\n%s", hosts.Names[1], res.stderr)
	}
	// The survivors were stopped with SIGTERM, which the helper reports.
	for _, r := range []int{0, 1, 4, 5} {
		if !strings.Contains(res.stdout, fmt.Sprintf("[%d] got terminated", r)) {
			t.Errorf("rank %d was not stopped with SIGTERM:\n%s", r, res.stdout)
		}
	}
}

func TestMultiHostPartitionIsDetected(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	j := multiHostJob(t, hosts, 1, "trap", "--kill-grace", "1", "--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5")
	j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), 2, 60*time.Second)
	if err := hosts.LinkDown(1); err != nil {
		t.Fatal(err)
	}
	// wait also checks that the cut-off agent, which loses its launcher, stops its rank.
	res := j.wait(60 * time.Second)
	checkNoJobFiles(t, j.jobID())
	if res.code != 1 || !strings.Contains(res.stderr, "host "+hosts.Names[1]+" lost: no heartbeat") {
		t.Fatalf("exit %d, want 1 and a lost-host report\nstderr:\n%s", res.code, res.stderr)
	}
}

func TestMultiHostLauncherKilled(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	j := multiHostJob(t, hosts, 2, "ignore", "--kill-grace", "0.5")
	j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), 4, 60*time.Second)
	j.cmd.Process.Kill()
	<-j.done
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if len(markedProcs(j.mark)) == 0 {
			checkNoJobFiles(t, j.jobID())
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("processes left after the launcher was killed:\n%s", strings.Join(markedProcs(j.mark), "\n"))
}

// TestSpareRegisteringAfterTheJobEnded: a spare's agent that comes up only
// after the ranks have ended and the launcher has told the agents to exit
// (too late to hear it) is told at its registration that the job ended,
// and exits: gorun neither waits for it nor kills it.
//
// The ordering is the rsh wrapper's: it runs the working host's agent
// and marks its end (an agent ends only on the launcher's exit, after its
// ranks), and starts the spare's agent only once that mark is there.
func TestSpareRegisteringAfterTheJobEnded(t *testing.T) {
	hosts := testcluster.NetnsHosts(t, 2)
	dir := t.TempDir()
	hf := hosts.WriteHostfile(t, dir, 2, "", "spare")
	mark := filepath.Join(dir, "agent-ended")
	rsh := filepath.Join(dir, "rsh")
	script := fmt.Sprintf(`#!/bin/sh
if [ "$1" = %q ]; then
	while [ ! -e %q ]; do sleep 0.05; done
	exec ip netns exec "$@"
fi
ip netns exec "$@"
status=$?
touch %q
exit $status
`, hosts.Names[1], mark, mark)
	if err := os.WriteFile(rsh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	j := startJob(t, "", nil, "--hostfile", hf, "-np", "2", "--rsh", rsh, "--bind", hosts.BridgeAddr, "sh", "-c", "echo job $GORUN_JOB_ID")
	res := j.wait(60 * time.Second)
	checkNoJobFiles(t, j.jobID())
	if res.code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", res.code, res.stderr)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the working host's agent did not end first: %v", err)
	}
	if strings.Contains(res.stderr, "did not exit") {
		t.Errorf("the late spare's agent was killed, not told the job ended:\n%s", res.stderr)
	}
}
