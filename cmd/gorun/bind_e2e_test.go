//go:build !race

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	// bridge is the bridge address each host's route leaves by.
	bridge := map[string]string{a.Names[0]: a.BridgeAddr, a.Names[1]: a.BridgeAddr, b.Names[0]: b.BridgeAddr}

	// checkURLs checks that every agent was given the URL of the address
	// routing to its host, at the port -v named.
	checkURLs := func(t *testing.T, log, port string, hosts ...string) {
		t.Helper()
		got := agentURLs(t, log)
		for _, h := range hosts {
			if want := "tls://" + bridge[h] + ":" + port; got[h] != want {
				t.Errorf("agent on %s dialed %q, want %q", h, got[h], want)
			}
		}
		if len(got) != len(hosts) {
			t.Errorf("agents started: %v, want %d", got, len(hosts))
		}
	}

	// The README's first command, with remote hosts and no --bind.
	t.Run("readme first command", func(t *testing.T) {
		rsh, log := loggingRsh(t)
		hf := a.WriteHostfile(t, t.TempDir(), 2)
		res := startJobUnder(t, wrap, nil, "ring", nil, "-np", "4", "--hostfile", hf, "--rsh", rsh, "-v", "--", os.Args[0]).wait(90 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		if n := strings.Count(res.stdout, "token from"); n != 4 {
			t.Errorf("%d ranks passed the token, want 4\nstdout:\n%s", n, res.stdout)
		}
		re := regexp.MustCompile(`gorun: control plane on ` + regexp.QuoteMeta(a.BridgeAddr) + `:(\d+) \(the address routing to ` +
			regexp.QuoteMeta(a.Names[0]+" and "+a.Names[1]) + `; --bind to choose\)`)
		m := re.FindStringSubmatch(res.stderr)
		if m == nil {
			t.Fatalf("-v does not say %v\nstderr:\n%s", re, res.stderr)
		}
		checkURLs(t, log, m[1], a.Names...)
	})

	// Hosts on two fabrics: the server listens on the wildcard and each
	// agent dials the address routing to its host.
	t.Run("two fabrics", func(t *testing.T) {
		rsh, log := loggingRsh(t)
		hf := filepath.Join(t.TempDir(), "hosts")
		os.WriteFile(hf, []byte(a.Names[0]+"\n"+a.Names[1]+"\n"+b.Names[0]+"\n"), 0o644)
		res := startJobUnder(t, wrap, nil, "", nil, "-np", "3", "--hostfile", hf, "--rsh", rsh, "-v", "--", "true").wait(90 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		re := regexp.MustCompile(`gorun: control plane on 0\.0\.0\.0:(\d+) \(reached at ` +
			regexp.QuoteMeta(fmt.Sprintf("%s by %s and %s, %s by %s", a.BridgeAddr, a.Names[0], a.Names[1], b.BridgeAddr, b.Names[0])) +
			`: the addresses routing to them; --bind to choose\)`)
		m := re.FindStringSubmatch(res.stderr)
		if m == nil {
			t.Fatalf("-v does not say %v\nstderr:\n%s", re, res.stderr)
		}
		checkURLs(t, log, m[1], a.Names[0], a.Names[1], b.Names[0])
	})

	// --bind 0.0.0.0 listens everywhere; each agent still dials an address
	// of the launcher's, the one routing to its host, and the launcher's
	// own host, rank 0's, registers that address (MASTER_ADDR), not
	// loopback.
	t.Run("bind wildcard", func(t *testing.T) {
		rsh, log := loggingRsh(t)
		hf := filepath.Join(t.TempDir(), "hosts")
		os.WriteFile(hf, []byte("localhost\n"+a.Names[0]+"\n"+a.Names[1]+"\n"), 0o644)
		res := startJobUnder(t, wrap, nil, "ring", nil, "-np", "3", "--hostfile", hf, "--rsh", rsh, "--bind", "0.0.0.0", "-v", "--", os.Args[0]).wait(90 * time.Second)
		if res.code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
		}
		if want := "[1] token from 0 at " + a.BridgeAddr + " to "; !strings.Contains(res.stdout, want) {
			t.Errorf("stdout lacks %q\nstdout:\n%s", want, res.stdout)
		}
		m := regexp.MustCompile(`gorun: control plane on 0\.0\.0\.0:(\d+) \(reached at `).FindStringSubmatch(res.stderr)
		if m == nil {
			t.Fatalf("-v does not name the port\nstderr:\n%s", res.stderr)
		}
		checkURLs(t, log, m[1], a.Names...)
	})
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
