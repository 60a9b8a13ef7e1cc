//go:build !race

package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testcluster"
)

// TestBindChosen: without --bind, the control plane listens at the address
// the kernel routes to the hosts by, and the job runs. The hosts are
// namespace hosts on two bridges, two fabrics of the launcher's host; their
// names resolve through /etc/hosts, as a site's would, in a mount namespace
// of gorun's own. The rsh command records the URL each agent is given.
// (No Go code of gorun's runs in the ranks but the helper: not in the race
// pass.)
func TestBindChosen(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test on namespace hosts")
	}
	a := testcluster.NetnsHosts(t, 2)
	b := testcluster.NetnsHosts(t, 1)
	wrap := underEtcHosts(t, a, b)
	a0, a1, b0 := a.Names[0], a.Names[1], b.Names[0]
	// bridge is the bridge address each host's route leaves by.
	bridge := map[string]string{a0: a.BridgeAddr, a1: a.BridgeAddr, b0: b.BridgeAddr}
	tests := []struct {
		name   string
		hosts  []string // the hostfile's lines
		np     int
		args   []string // gorun's flags but -np, --hostfile, --rsh and -v
		prog   string   // "": the ring helper (each rank's host reaches rank 0's)
		said   string   // what -v says after "control plane on ADDR:PORT ("
		listen string
		stdout string // in the ring's output
	}{
		// The README's first command, with remote hosts and no --bind.
		{name: "readme first command", hosts: []string{a0 + " slots=2", a1 + " slots=2"}, np: 4,
			listen: a.BridgeAddr, said: "the address routing to " + a0 + " and " + a1 + "; --bind to choose)"},
		// Hosts on two fabrics: the server listens on the wildcard and
		// each agent dials the address routing to its host.
		{name: "two fabrics", hosts: []string{a0, a1, b0}, np: 3, prog: "true",
			listen: "0.0.0.0", said: fmt.Sprintf("reached at %s by %s and %s, %s by %s: the addresses routing to them; --bind to choose)", a.BridgeAddr, a0, a1, b.BridgeAddr, b0)},
		// --bind 0.0.0.0 listens everywhere; each agent still dials the
		// address routing to its host, and the launcher's own host, rank
		// 0's, registers that address (MASTER_ADDR), not loopback.
		{name: "bind wildcard", hosts: []string{"localhost", a0, a1}, np: 3, args: []string{"--bind", "0.0.0.0"},
			listen: "0.0.0.0", said: fmt.Sprintf("reached at %s by %s and %s: the address routing to them)", a.BridgeAddr, a0, a1),
			stdout: "[1] token from 0 at " + a.BridgeAddr + " to "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rsh, log := loggingRsh(t)
			hf := filepath.Join(t.TempDir(), "hosts")
			if err := os.WriteFile(hf, []byte(strings.Join(tt.hosts, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			helper, prog := "ring", tt.prog
			if prog == "" {
				prog = os.Args[0]
			} else {
				helper = ""
			}
			args := append(append([]string{"-np", strconv.Itoa(tt.np), "--hostfile", hf, "--rsh", rsh, "-v"}, tt.args...), "--", prog)
			res := startJobUnder(t, wrap, nil, nil, helper, nil, args...).wait(90 * time.Second)
			if res.code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
			}
			if n := strings.Count(res.stdout, "token from"); helper != "" && n != tt.np {
				t.Errorf("%d ranks passed the token, want %d\nstdout:\n%s", n, tt.np, res.stdout)
			}
			if !strings.Contains(res.stdout, tt.stdout) {
				t.Errorf("stdout lacks %q\nstdout:\n%s", tt.stdout, res.stdout)
			}
			re := regexp.MustCompile(`gorun: control plane on ` + regexp.QuoteMeta(tt.listen) + `:(\d+) \(` + regexp.QuoteMeta(tt.said))
			m := re.FindStringSubmatch(res.stderr)
			if m == nil {
				t.Fatalf("-v does not say %v\nstderr:\n%s", re, res.stderr)
			}
			// Every remote host's agent was given the URL of the address
			// routing to it.
			got := agentURLs(t, log)
			want := map[string]string{}
			for _, h := range tt.hosts {
				if name, _, _ := strings.Cut(h, " "); name != "localhost" {
					want[name] = "tls://" + bridge[name] + ":" + m[1]
				}
			}
			if !maps.Equal(got, want) {
				t.Errorf("agents dialed %v, want %v", got, want)
			}
		})
	}
}

// underEtcHosts returns the command that runs gorun in a mount namespace of
// its own where /etc/hosts also names the hosts of clusters. It needs
// unshare and mount (util-linux), as root like the namespace hosts: the test
// skips without them, unless GORUN_TESTCLUSTER_REQUIRE=1.
func underEtcHosts(t *testing.T, clusters ...*testcluster.Hosts) []string {
	t.Helper()
	for _, tool := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("GORUN_TESTCLUSTER_REQUIRE") == "1" {
				t.Fatalf("%s not found (util-linux)", tool)
			}
			t.Skipf("no %s (util-linux)", tool)
		}
	}
	etc, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.Write(etc)
	b.WriteString("\n# gorun's namespace hosts\n")
	for _, c := range clusters {
		for i, name := range c.Names {
			fmt.Fprintf(&b, "%s %s\n", c.Addrs[i], name)
		}
	}
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// unshare makes the new namespace's mounts private: the bind mount
	// stays there, and goes with its last process.
	return []string{"unshare", "--mount", "--", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, path}
}

// loggingRsh returns an rsh command for namespace hosts ("ip netns exec")
// that first appends its arguments to the file log.
func loggingRsh(t *testing.T) (rsh, log string) {
	t.Helper()
	dir := t.TempDir()
	rsh, log = filepath.Join(dir, "rsh"), filepath.Join(dir, "rsh.log")
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %q\nexec ip netns exec \"$@\"\n", log)
	if err := os.WriteFile(rsh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return rsh, log
}

// agentURLs reads a loggingRsh log: each host's --control URL.
func agentURLs(t *testing.T, log string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		var host, url string
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "--host-name":
				host = f[i+1]
			case "--control":
				url = f[i+1]
			}
		}
		urls[host] = url
	}
	return urls
}
