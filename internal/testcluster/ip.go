package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ipTimeout bounds every run of the ip binary.
const ipTimeout = 15 * time.Second

// ipPath finds the ip binary once: $PATH first, then the usual sbin
// directories, which a test's $PATH often lacks.
var ipPath = sync.OnceValues(func() (string, error) {
	if p, err := exec.LookPath("ip"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("testcluster: ip (iproute2) not found in $PATH or /usr/sbin, /sbin, /usr/bin, /bin")
})

// ip runs the ip binary with args and returns its standard output. The error
// names the command and carries its standard error.
func ip(args ...string) (string, error) {
	path, err := ipPath()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("timed out after %v: %w", ipTimeout, ctx.Err())
		}
		return stdout.String(), fmt.Errorf("testcluster: ip %s: %w (stderr: %q)",
			strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// listNetns returns the names of all named network namespaces.
func listNetns() ([]string, error) {
	out, err := ip("netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for line := range strings.Lines(out) {
		// "name" or "name (id: 3)"
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// listLinks returns the names of all links in the root namespace.
func listLinks() ([]string, error) {
	out, err := ip("-o", "link", "show")
	if err != nil {
		return nil, err
	}
	var names []string
	for line := range strings.Lines(out) {
		// "7: name@if6: <BROADCAST,...> ..."
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		name, _, _ = strings.Cut(name, "@")
		names = append(names, name)
	}
	return names, nil
}

// ifaddr is one IPv4 address of a root-namespace interface.
type ifaddr struct {
	dev  string
	addr netip.Addr
}

// listAddrs returns the IPv4 addresses of the root namespace.
func listAddrs() ([]ifaddr, error) {
	out, err := ip("-4", "-o", "addr", "show")
	if err != nil {
		return nil, err
	}
	var addrs []ifaddr
	for line := range strings.Lines(out) {
		// "4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\ ..."
		f := strings.Fields(line)
		if len(f) < 4 || f[2] != "inet" {
			continue
		}
		p, err := netip.ParsePrefix(f[3])
		if err != nil {
			return nil, fmt.Errorf("testcluster: parsing %q from ip addr: %w", f[3], err)
		}
		dev, _, _ := strings.Cut(f[1], "@")
		addrs = append(addrs, ifaddr{dev: dev, addr: p.Addr()})
	}
	return addrs, nil
}

// routeTypes are the words ip route may print before a destination.
var routeTypes = map[string]bool{
	"unicast": true, "local": true, "broadcast": true, "multicast": true, "anycast": true,
	"unreachable": true, "blackhole": true, "prohibit": true, "throw": true, "nat": true,
}

// route is one route of the root namespace's main IPv4 table.
type route struct {
	dst netip.Prefix
	dev string // "" when the route names no device (blackhole, say)
}

// listRoutes returns the routes of the root namespace's main IPv4 routing
// table, leaving out the default route.
func listRoutes() ([]route, error) {
	out, err := ip("-4", "route", "show")
	if err != nil {
		return nil, err
	}
	var routes []route
	for line := range strings.Lines(out) {
		// "10.77.5.0/24 dev br proto kernel scope link src 10.77.5.1"
		f := strings.Fields(line)
		if len(f) > 1 && routeTypes[f[0]] {
			f = f[1:]
		}
		if len(f) == 0 || f[0] == "default" {
			continue
		}
		s := f[0]
		if !strings.Contains(s, "/") {
			s += "/32"
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("testcluster: parsing %q from ip route: %w", f[0], err)
		}
		r := route{dst: p}
		if i := slices.Index(f, "dev"); i >= 0 && i+1 < len(f) {
			r.dev = f[i+1]
		}
		routes = append(routes, r)
	}
	return routes, nil
}

// nsPids returns the pids of the processes in network namespace ns.
func nsPids(ns string) ([]int, error) {
	out, err := ip("netns", "pids", ns)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, s := range strings.Fields(out) {
		pid, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("testcluster: parsing pid %q from ip netns pids %s: %w", s, ns, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
