package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostAgentPid returns the pid of the gorun agent in namespace host h.
func hostAgentPid(t *testing.T, c *hsCluster, h int) int {
	t.Helper()
	pids, err := c.hosts.Pids(h)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		argv := bytes.Split(b, []byte{0})
		if err == nil && len(argv) >= 2 && filepath.Base(string(argv[0])) == "gorun" && string(argv[1]) == "agent" {
			return pid
		}
	}
	t.Fatalf("no gorun agent in host %s", c.hosts.Names[h])
	return 0
}

// flipHeldReplicas has host h's agent flip every replica it holds
// (GORUN_DEBUG_FLIP_REPLICAS=file, SIGUSR2) and waits for its done line.
func flipHeldReplicas(t *testing.T, c *hsCluster, h int, file string) string {
	t.Helper()
	if err := syscall.Kill(hostAgentPid(t, c, h), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	done := fmt.Sprintf("done %d ", h)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(file); strings.Contains(string(b), done) {
			return string(b)
		}
	}
	b, _ := os.ReadFile(file)
	t.Fatalf("host %s's agent wrote no done line to %s:\n%s", c.hosts.Names[h], file, b)
	return ""
}

// corruptRE matches the launcher's line about the copies a restore found
// corrupt.
var corruptRE = regexp.MustCompile(`rank (\d+)'s restore: the copy of step (\d+) at holder rank (\d+) failed its CRC32C; marked invalid`)

// TestRollbackCorruptCopies: 4 ranks on 2 hosts, a replica each on the
// other host (--replicas 1), a spare. Host 0 is frozen, every replica
// host 1 holds (those of host 0's ranks) gets a byte flipped, and host 0
// is killed: the spare's restore of ranks 0 and 1 finds their only copies
// failing their CRC32C. With --ckpt-dir and a committed version the job
// rolls back to it and ends with the hashes of a run without failure
// (before, it restarted from G until its crash loop stopped it); without
// --ckpt-dir it stops at once, naming the rank and the CRC32C cause.
func TestRollbackCorruptCopies(t *testing.T) {
	c := newHSCluster(t, 2, 1)
	wantP, wantO := hsReference(t, c)
	const every, flipAfter = 4, 14
	run := func(t *testing.T, flags []string, want int) result {
		file := filepath.Join(t.TempDir(), "flips")
		r := c.startEnv(t, []string{"GORUN_DEBUG_FLIP_REPLICAS=" + file}, append(flags, "--replicas", "1"), "--protect")
		r.waitStep(t, flipAfter)
		if err := c.hosts.StopAll(0); err != nil {
			t.Fatal(err)
		}
		lines := flipHeldReplicas(t, c, 1, file)
		if err := c.hosts.KillAll(0); err != nil {
			t.Fatal(err)
		}
		t.Logf("flipped:\n%s", lines)
		res := r.finish(t, want)
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		}
		return res
	}
	t.Run("ckpt-dir", func(t *testing.T) {
		dir := t.TempDir()
		res := run(t, []string{"--ckpt-dir", dir, "--ckpt-every", strconv.Itoa(every)}, 0)
		checkHashes(t, res, wantP, wantO)
		if !corruptRE.MatchString(res.stderr) {
			t.Errorf("no line about the corrupt copies\nstderr:\n%s", res.stderr)
		}
		if !strings.Contains(res.stderr, "(no valid replica left: the copy of step") || !strings.Contains(res.stderr, "from --ckpt-dir (") {
			t.Errorf("no roll-back to --ckpt-dir for the corrupt copies\nstderr:\n%s", res.stderr)
		}
	})
	t.Run("no ckpt-dir", func(t *testing.T) {
		// Restarts allowed: without the corrupt copies counted as
		// lost, the ranks would restart from G until the crash-loop
		// rule stopped them.
		res := run(t, []string{"--max-restarts", "3"}, 1)
		if !corruptRE.MatchString(res.stderr) || !strings.Contains(res.stderr, "has no valid copy left in memory") {
			t.Errorf("the stop does not name the rank and its corrupt copies\nstderr:\n%s", res.stderr)
		}
		if strings.Contains(res.stderr, "times in a row without progress") || strings.Contains(res.stderr, "rolling the job back") {
			t.Errorf("restarted in a loop, or rolled back without --ckpt-dir\nstderr:\n%s", res.stderr)
		}
	})
}
