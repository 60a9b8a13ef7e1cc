package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeRsh writes an rsh command that runs its command on this host, as
// ssh would on another: agents then run as separate processes reached
// over TCP, exactly as on remote hosts.
func fakeRsh(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rsh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nhost=$1; shift\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRemoteAgentsThroughRsh(t *testing.T) {
	rsh := fakeRsh(t, `exec "$@"`)
	res := runJob(t, "env", nil, "-H", "fakehost1:2,fakehost2:2", "--bind", "127.0.0.1", "--rsh", rsh, os.Args[0])
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	n := 0
	for _, m := range tagged.FindAllStringSubmatch(res.stdout, -1) {
		var env map[string]string
		if err := json.Unmarshal([]byte(m[2]), &env); err != nil {
			t.Fatal(err)
		}
		r, _ := strconv.Atoi(m[1])
		want := map[string]string{
			"RANK": m[1], "LOCAL_RANK": strconv.Itoa(r % 2), "LOCAL_WORLD_SIZE": "2",
			"GROUP_RANK": strconv.Itoa(r / 2), "GORUN_NODE_RANK": strconv.Itoa(r / 2), "GROUP_WORLD_SIZE": "2",
			"OMPI_COMM_WORLD_NODE_RANK": strconv.Itoa(r / 2), "WORLD_SIZE": "4",
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", r, k, env[k], v)
			}
		}
		n++
	}
	if n != 4 {
		t.Fatalf("%d ranks, want 4\n%s", n, res.stdout)
	}
}

var hex64 = regexp.MustCompile(`[0-9a-fA-F]{64}`)

func TestSecretNeverInArgvOrEnv(t *testing.T) {
	rsh := fakeRsh(t, `exec "$@"`)
	j := startJob(t, "trap", nil, "-H", "fakehost1:2", "--bind", "127.0.0.1", "--rsh", rsh, os.Args[0])
	j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), 2, 30*time.Second)
	procs := 0
	for _, pid := range markedPids(j.mark) {
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), f))
			if err != nil {
				continue
			}
			if s := hex64.Find(b); s != nil {
				t.Errorf("pid %d has a secret-like string in its %s: %s", pid, f, bytesReplaceNUL(b))
			}
		}
		procs++
	}
	if procs < 3 { // gorun's agent and two ranks at least
		t.Errorf("only %d processes of the job found", procs)
	}
	j.cmd.Process.Signal(syscall.SIGTERM)
	j.wait(30 * time.Second)
}

func bytesReplaceNUL(b []byte) string { return strings.ReplaceAll(string(b), "\x00", " ") }

func markedPids(mark string) []int {
	var out []int
	for _, l := range markedProcs(mark) {
		f := strings.Fields(l)
		pid, _ := strconv.Atoi(f[1])
		out = append(out, pid)
	}
	return out
}

func TestAgentThatCannotStart(t *testing.T) {
	tests := []struct {
		name  string
		rsh   string
		extra []string
		want  []string
	}{
		{"ssh refused", `echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255`, nil,
			[]string{`cannot start agent on host fakehost[12]: exit status 255`, `fakehost[12] port 22: Connection refused`}},
		{"binary missing", `exec "$@"`, []string{"--launch-agent", "/nonexistent/gorun"},
			[]string{`cannot start agent on host fakehost[12]: exit status 127\n.*/nonexistent/gorun: not found`}},
		{"agent hangs", `exec sleep 3600`, []string{"--agent-start-timeout", "1"},
			[]string{`cannot start agent on host fakehost[12]: not registered after 1s`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rsh := fakeRsh(t, tt.rsh)
			args := append([]string{"-H", "fakehost1,fakehost2", "--bind", "127.0.0.1", "--rsh", rsh}, tt.extra...)
			res := runJob(t, "trap", nil, append(args, os.Args[0])...)
			if res.code != 1 {
				t.Fatalf("exit %d, want 1\nstderr:\n%s", res.code, res.stderr)
			}
			for _, w := range tt.want {
				if !regexp.MustCompile(w).MatchString(res.stderr) {
					t.Errorf("stderr does not say %q:\n%s", w, res.stderr)
				}
			}
		})
	}
}

func TestAgentsStopRanksWhenLauncherDies(t *testing.T) {
	rsh := fakeRsh(t, `exec "$@"`)
	j := startJob(t, "ignore", nil, "-H", "fakehost1:2,fakehost2:2", "--bind", "127.0.0.1", "--rsh", rsh, "--kill-grace", "0.5", os.Args[0])
	j.waitFor(regexp.MustCompile(`(?m)^\[\d\] ready$`), 4, 30*time.Second)
	j.cmd.Process.Kill()
	<-j.done
	var left []string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if left = markedProcs(j.mark); len(left) == 0 {
			checkNoJobFiles(t, j.jobID())
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("processes left after the launcher was killed:\n%s", strings.Join(left, "\n"))
}

// At most --rsh-concurrent agents are being started at once: counted from
// the rsh command's start to the agent's registration.
func TestAgentStartsAreBounded(t *testing.T) {
	state := t.TempDir()
	for _, f := range []string{"cur", "max"} {
		os.WriteFile(filepath.Join(state, f), []byte("0\n"), 0o644)
	}
	rsh := fakeRsh(t, `d=`+state+`
( flock 9; n=$(($(cat $d/cur)+1)); echo $n > $d/cur; [ $n -gt $(cat $d/max) ] && echo $n > $d/max ) 9>$d/lock
sleep 0.3
( flock 9; echo $(($(cat $d/cur)-1)) > $d/cur ) 9>$d/lock
exec "$@"`)
	res := runJob(t, "", nil, "-H", "h1,h2,h3,h4,h5,h6", "--bind", "127.0.0.1", "--rsh", rsh, "--rsh-concurrent", "2", "true")
	if res.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	b, _ := os.ReadFile(filepath.Join(state, "max"))
	if got := strings.TrimSpace(string(b)); got != "2" {
		t.Fatalf("%s agents were starting at once, want 2 (the bound, reached)", got)
	}
}
