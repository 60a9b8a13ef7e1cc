package testcluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// maxHosts is how many hosts fit in a /24 next to the bridge's .1.
const maxHosts = 253

// requireEnv names the environment variable that turns NetnsHosts' skips
// into failures.
const requireEnv = "GORUN_TESTCLUSTER_REQUIRE"

// Hosts is a set of network-namespace hosts joined by veth pairs to a bridge
// in the root namespace. Its fields are set by [NetnsHosts] and must not be
// changed; its methods are safe for concurrent use.
type Hosts struct {
	Names      []string // namespace names, also the host names used in hostfiles, e.g. "grt02x4k07-h0"
	Addrs      []string // IPv4 address of each host, e.g. "10.77.N.2"
	BridgeAddr string   // root-namespace address on the bridge (the launcher binds its control plane here)
	Bridge     string   // the bridge's interface name in the root namespace
	Veths      []string // root-namespace end of each host's veth pair (LinkDown takes it down)

	tag string
}

// NetnsHosts creates n namespace hosts and registers t.Cleanup to remove
// them: every process in each namespace is killed, then the namespaces, the
// veths and the bridge are deleted. It first removes leftovers of crashed
// earlier runs ([CleanupStale]). It skips the test when not running as root
// or when ip netns is unavailable (see the package doc for
// GORUN_TESTCLUSTER_REQUIRE), and fails it on any other error.
func NetnsHosts(t testing.TB, n int) *Hosts {
	t.Helper()
	if n < 1 || n > maxHosts {
		t.Fatalf("testcluster: NetnsHosts(%d): want 1..%d hosts", n, maxHosts)
	}
	if reason := unavailable(); reason != "" {
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("testcluster: %s (and %s=1)", reason, requireEnv)
		}
		t.Skipf("testcluster: skipping multi-host test: %s", reason)
	}
	if err := CleanupStale(); err != nil {
		t.Logf("testcluster: removing leftovers of earlier runs: %v", err)
	}
	tag, err := newTag()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Release even on failure: a later CleanupStale in this process then
		// sees the tag as stale and retries.
		defer releaseTag(tag)
		if err := removeCluster(tag); err != nil {
			t.Error(err)
		}
	})
	h, err := create(tag, n)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// unavailable says why namespace hosts cannot run here, or "" if they can.
func unavailable() string {
	if euid := os.Geteuid(); euid != 0 {
		return fmt.Sprintf("network-namespace hosts need root (euid is %d); run as root with iproute2", euid)
	}
	if _, err := ipPath(); err != nil {
		return strings.TrimPrefix(err.Error(), "testcluster: ")
	}
	if _, err := ip("netns", "list"); err != nil {
		return "ip netns does not work: " + strings.TrimPrefix(err.Error(), "testcluster: ")
	}
	return ""
}

// create builds the bridge and n hosts named from tag. On error, what was
// built is left for the caller's removeCluster.
func create(tag string, n int) (*Hosts, error) {
	ctr, err := strconv.ParseInt(tag[len(prefix)+pidDigits:], 36, 64)
	if err != nil {
		return nil, fmt.Errorf("testcluster: bad tag %q: %w", tag, err)
	}
	br := bridgeName(tag)
	if _, err := ip("link", "add", "name", br, "type", "bridge"); err != nil {
		return nil, err
	}
	// Nothing that arrives on the bridge is routed anywhere else, whatever
	// the global ip_forward says. Set before the bridge has an address.
	fwd := filepath.Join("/proc/sys/net/ipv4/conf", br, "forwarding")
	if err := os.WriteFile(fwd, []byte("0\n"), 0o644); err != nil {
		return nil, fmt.Errorf("testcluster: disabling forwarding on %s: %w", br, err)
	}
	noIPv6("", br)
	x, err := assignSubnet(br, os.Getpid(), int(ctr))
	if err != nil {
		return nil, err
	}
	if _, err := ip("link", "set", "dev", br, "up"); err != nil {
		return nil, err
	}
	h := &Hosts{
		BridgeAddr: hostAddr(x, 1).String(),
		Bridge:     br,
		tag:        tag,
	}
	for i := range n {
		ns, veth, addr := nsName(tag, i), vethName(tag, i), hostAddr(x, i+2)
		cidr := netip.PrefixFrom(addr, 24).String()
		if _, err := ip("netns", "add", ns); err != nil {
			return nil, err
		}
		if _, err := ip("link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", ns); err != nil {
			return nil, err
		}
		noIPv6("", veth)
		noIPv6(ns, "eth0")
		for _, args := range [][]string{
			{"link", "set", "dev", veth, "master", br},
			{"link", "set", "dev", veth, "up"},
			{"-n", ns, "link", "set", "dev", "lo", "up"},
			{"-n", ns, "addr", "add", cidr, "dev", "eth0"},
			{"-n", ns, "link", "set", "dev", "eth0", "up"},
			{"-n", ns, "route", "add", "default", "via", h.BridgeAddr, "dev", "eth0"},
		} {
			if _, err := ip(args...); err != nil {
				return nil, err
			}
		}
		h.Names = append(h.Names, ns)
		h.Addrs = append(h.Addrs, addr.String())
		h.Veths = append(h.Veths, veth)
	}
	return h, nil
}

// noIPv6 turns off IPv6 address generation on link dev, still down, in
// namespace ns ("" for the root namespace), so that it gets no link-local
// address and sends no IPv6 traffic. Best effort: a kernel without IPv6 has
// nothing to turn off.
func noIPv6(ns, dev string) {
	args := []string{"link", "set", "dev", dev, "addrgenmode", "none"}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	_, _ = ip(args...)
}

// WriteHostfile writes an Open MPI style hostfile naming every host, one
// line "name slots=S" each, to dir/hostfile (dir "" means t.TempDir()) and
// returns its path. extra[i], when given and not empty, is appended to host
// i's line, e.g. "rack=r1" or "spare".
func (h *Hosts) WriteHostfile(t testing.TB, dir string, slots int, extra ...string) string {
	t.Helper()
	if len(extra) > len(h.Names) {
		t.Fatalf("testcluster: WriteHostfile: %d extras for %d hosts", len(extra), len(h.Names))
	}
	if dir == "" {
		dir = t.TempDir()
	}
	var b strings.Builder
	for i, name := range h.Names {
		fmt.Fprintf(&b, "%s slots=%d", name, slots)
		if i < len(extra) && extra[i] != "" {
			b.WriteString(" " + extra[i])
		}
		b.WriteByte('\n')
	}
	path := filepath.Join(dir, "hostfile")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	return path
}

func (h *Hosts) check(host int) error {
	if host < 0 || host >= len(h.Names) {
		return fmt.Errorf("testcluster: host %d out of range [0, %d)", host, len(h.Names))
	}
	return nil
}

// Pids returns the pids of the processes in host's namespace (ip netns
// pids: the processes whose network namespace is the host's).
func (h *Hosts) Pids(host int) ([]int, error) {
	if err := h.check(host); err != nil {
		return nil, err
	}
	return nsPids(h.Names[host])
}

// KillAll sends SIGKILL to every process in the namespaces of host and of
// the more hosts, repeatedly until none is left (a simulated crash of
// those hosts). Several hosts die together: each pass signals all their
// processes before it waits for any. The namespaces and their networks
// stay; processes can be started in them again.
func (h *Hosts) KillAll(host int, more ...int) error {
	names := make([]string, 0, 1+len(more))
	for _, x := range append([]int{host}, more...) {
		if err := h.check(x); err != nil {
			return err
		}
		names = append(names, h.Names[x])
	}
	return killNetns(names...)
}

// StopAll sends SIGSTOP to every process in host's namespace (a frozen
// host: sockets stay open, nothing answers) and returns once they are all
// stopped; KillAll still ends them, ContAll resumes them.
func (h *Hosts) StopAll(host int) error {
	if err := h.check(host); err != nil {
		return err
	}
	return stopNetns(h.Names[host])
}

// ContAll sends SIGCONT to every process in host's namespace: a host
// StopAll froze goes on.
func (h *Hosts) ContAll(host int) error {
	if err := h.check(host); err != nil {
		return err
	}
	return contNetns(h.Names[host])
}

// LinkDown takes host's veth down at the root-namespace end: the host is cut
// off from the bridge and every other host (a partition), its processes keep
// running, and nothing inside the host can undo it.
func (h *Hosts) LinkDown(host int) error {
	if err := h.check(host); err != nil {
		return err
	}
	_, err := ip("link", "set", "dev", h.Veths[host], "down")
	return err
}

// LinkUp undoes LinkDown.
func (h *Hosts) LinkUp(host int) error {
	if err := h.check(host); err != nil {
		return err
	}
	_, err := ip("link", "set", "dev", h.Veths[host], "up")
	return err
}

// Exec returns a command that runs name with args inside host's namespace,
// as "ip netns exec NAME name args...". ip execs name in place, so the
// command's process is the program itself and ctx's cancellation kills it.
// WaitDelay is 5s; callers may change any field before starting it. A bad
// host index or a missing ip binary is reported by Start. ctx must not be nil.
func (h *Hosts) Exec(ctx context.Context, host int, name string, args ...string) *exec.Cmd {
	path, err := ipPath()
	if err == nil {
		err = h.check(host)
	}
	if err != nil {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Err = err
		return cmd
	}
	cmd := exec.CommandContext(ctx, path, append([]string{"netns", "exec", h.Names[host], name}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}
