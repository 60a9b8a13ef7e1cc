package launcher

import (
	"bytes"
	"crypto/ecdh"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/ctlserver"
	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/topology"
)

// srun2205Help is what srun 22.05's --help lists of the options gorun uses.
const srun2205Help = `Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]
  -i, --input=in              location of stdin redirection
  -k, --no-kill               do not kill job on node failure
  -K, --kill-on-bad-exit      kill the job if any task terminates with a
  -l, --label                 prepend task number to lines of stdout/err
      --mpi=type              type of MPI being used
      --overlap               Allow other steps to overlap this step
  -W, --wait=sec              seconds to wait after first task exits
      --cpu-bind=             control process and thread binding
`

func TestSrunProbe(t *testing.T) {
	for _, tc := range []struct {
		name, version, help string
		ok                  bool
	}{
		{"22.05", "slurm-wlm 22.05.8\n", srun2205Help, true},
		{"20.11", "slurm 20.11.9\n", srun2205Help, true},
		{"20.02", "slurm 20.02.7\n", srun2205Help, false},
		{"19.05", "slurm 19.05.5\n", srun2205Help, false},
		{"no --overlap", "slurm 21.08.1\n", strings.ReplaceAll(srun2205Help, "--overlap", "--other"), false},
		{"no version", "srun: what?\n", srun2205Help, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseSrunProbe("/usr/bin/srun", tc.version, tc.help)
			if _, isConfig := errors.AsType[*ConfigError](err); (err == nil) != tc.ok || err != nil && !isConfig {
				t.Fatalf("parseSrunProbe: %v, %v (want ok %v, or a ConfigError)", o, err, tc.ok)
			}
		})
	}
}

func TestSrunArgs(t *testing.T) {
	o, err := parseSrunProbe("srun", "slurm-wlm 22.05.8", srun2205Help)
	if err != nil {
		t.Fatal(err)
	}
	got := o.args("j1", []string{"gr1", "gr2"}, []string{"/bin/gorun", "agent", "--slurm"})
	want := []string{"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=gr1,gr2", "--distribution=arbitrary", "--overlap", "--no-kill",
		"--kill-on-bad-exit=0", "--wait=0", "--cpu-bind=none", "--mpi=none", "--input=all", "--label", "--job-name=gorun-j1",
		"/bin/gorun", "agent", "--slurm"}
	if !slices.Equal(got, want) {
		t.Errorf("srun args\n%q, want\n%q", got, want)
	}
	// An option this srun does not list is left out.
	o.has["cpu-bind"] = false
	if got := o.args("j1", []string{"gr1"}, nil); slices.Contains(got, "--cpu-bind=none") {
		t.Errorf("srun without --cpu-bind got it: %q", got)
	}
}

// TestSrunKeyExchange runs startSrun with a fake srun that records its
// arguments and plays three tasks, task i on host i (srun's arbitrary
// distribution of the node list): task 2 first claims n0 with a key of
// its own (an intruder on n2), then n0 and n2 show their keys, task 3 (no
// task of the step) claims a node that is not the job's, n1 never shows
// one. The launcher must write on the shared stdin one line per real key
// that only that key opens, for that host, nothing for the intruder's
// claims, and report each end: n0's and n2's from their done lines, n1's
// from srun's exit.
func TestSrunKeyExchange(t *testing.T) {
	dir := t.TempDir()
	keys := map[string]*ecdh.PrivateKey{}
	for _, n := range []string{"n0", "n2", "intruder"} {
		k, err := jobkey.NewSealKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[n] = k
	}
	pub := func(n string) string { return base64.StdEncoding.EncodeToString(keys[n].PublicKey().Bytes()) }
	script := "#!/bin/sh\n" +
		"printf '%s\\n' \"$@\" > " + dir + "/argv\n" +
		"echo \"hostfile=$SLURM_HOSTFILE\" > " + dir + "/env\n" +
		"echo ' 2: gorun-agent-key n0 " + pub("intruder") + " 7.3'\n" +
		"echo ' 0: gorun-agent-key n0 " + pub("n0") + " 7.3'\n" +
		"echo ' 2: gorun-agent-key n2 " + pub("n2") + " 7.3'\n" +
		"echo ' 3: gorun-agent-key intruder " + pub("intruder") + " 7.3'\n" +
		// (a bound on the read only so that a launcher writing too few
		// lines fails the test rather than hanging it)
		"timeout 20 head -n 2 > " + dir + "/stdin\n" +
		"echo ' 0: agent n0 says hello' >&2\n" +
		"echo 'srun: error: something of srun' >&2\n" +
		"echo ' 0: gorun-agent-done 0'\n" +
		"echo ' 2: gorun-agent-done 3'\n"
	srun := filepath.Join(dir, "srun")
	t.Setenv("SLURM_HOSTFILE", filepath.Join(dir, "users-hostfile")) // would override the layout
	if err := os.WriteFile(srun, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	secret, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ctlserver.Start(ctlserver.Config{Job: "jobx", LocalPassword: secret.InProcessPassword()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	var stderr bytes.Buffer
	c := Config{NP: 1, Prog: "true", AgentPath: "/opt/gorun", Hosts: []topology.Host{{Name: "x", Slots: 1}}}
	cfg, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	j := &job{cfg: cfg, log: cfg.Logger, id: "jobx", secret: secret, srv: srv, agentExits: make(chan agentExit, 16),
		out: newOutputMux(&bytes.Buffer{}, &stderr, 1, false, false, "")}
	for i, n := range []string{"n0", "n1", "n2"} {
		j.hosts = append(j.hosts, &hostAgent{index: i, name: n, tail: &tail{}})
	}
	j.srun = newSrunStep(j, &srunOptions{path: srun, has: map[string]bool{"label": true, "overlap": true}})
	j.startSrun()

	ends := map[int]string{}
	timeout := time.After(time.Minute)
	for len(ends) < 3 {
		select {
		case x := <-j.agentExits:
			ends[x.host] = "nil"
			if x.err != nil {
				ends[x.host] = x.err.Error()
			}
		case <-timeout:
			t.Fatalf("ends so far: %v", ends)
		}
	}
	// Task 2 is n2: its done line says 3. n1 showed no key: srun's end is its.
	if ends[0] != "nil" || ends[2] != "exit status 3" || !strings.HasPrefix(ends[1], "srun ended") {
		t.Errorf("agent ends %v", ends)
	}
	j.wg.Wait()
	j.out.close()

	argv, err := os.ReadFile(filepath.Join(dir, "argv"))
	if err != nil {
		t.Fatal(err)
	}
	wantArgv := "--nodes=3\n--ntasks=3\n--ntasks-per-node=1\n--nodelist=n0,n1,n2\n--distribution=arbitrary\n--overlap\n--label\n--job-name=gorun-jobx\n" +
		"/opt/gorun\nagent\n--slurm\n--job\njobx\n--control\n" + srv.URL() + "\n"
	if string(argv) != wantArgv {
		t.Errorf("srun argv\n%s\nwant\n%s", argv, wantArgv)
	}
	in, err := os.ReadFile(filepath.Join(dir, "stdin"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(in)), "\n")
	if env, err := os.ReadFile(filepath.Join(dir, "env")); err != nil || string(env) != "hostfile=\n" {
		t.Errorf("srun's environment: %q, %v; want no SLURM_HOSTFILE", env, err)
	}
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "0 ") || !strings.HasPrefix(lines[1], "2 ") {
		t.Fatalf("stdin lines %q, want host 0's then host 2's", lines)
	}
	for _, tc := range []struct {
		line, key string
		host      int
		ok        bool
	}{
		{lines[0], "n0", 0, true},
		{lines[1], "n2", 2, true},
		{lines[1], "n0", 2, false},       // another host's line
		{lines[0], "intruder", 0, false}, // not sealed to the intruder
		{lines[1], "intruder", 2, false},
		{lines[1], "n2", 0, false}, // its own line read as another host's
	} {
		c, err := jobkey.OpenHostCredentials(strings.Fields(tc.line)[1], "jobx", tc.host, keys[tc.key])
		if (err == nil) != tc.ok || tc.ok && c.Host != tc.host {
			t.Errorf("opening %.12s… with %s's key as host %d: %v, %v; want ok %v", tc.line, tc.key, tc.host, c, err, tc.ok)
		}
	}
	for _, want := range []string{"gorun agent n0: agent n0 says hello\n", "gorun: srun: error: something of srun\n",
		"srun task 2, node n0: task 2 is node n2", "srun task 3, node intruder: not a task of the step"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}
