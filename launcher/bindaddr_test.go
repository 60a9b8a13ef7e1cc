package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorun/gorun/topology"
)

// fakeNet is a resolver and a routing table: names to addresses, and
// destination prefixes to the local address the route leaves by.
type fakeNet struct {
	names  map[string][]string
	routes map[string]string // prefix → local address
	mu     sync.Mutex        // guards asked
	asked  []string          // the names resolved
}

func (f *fakeNet) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	f.mu.Lock()
	f.asked = append(f.asked, name)
	f.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		return nil, errors.New("resolved without a deadline")
	}
	as, ok := f.names[name]
	if !ok {
		return nil, errors.New("lookup " + name + ": no such host")
	}
	var out []netip.Addr
	for _, a := range as {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

// route is the kernel's answer: to a zoned (link-local) destination, the
// local address in that zone.
func (f *fakeNet) route(dst netip.Addr) (netip.Addr, error) {
	best, via := -1, ""
	for p, local := range f.routes {
		if pf := netip.MustParsePrefix(p); pf.Contains(dst.WithZone("")) && pf.Bits() > best {
			best, via = pf.Bits(), local
		}
	}
	if best < 0 {
		return netip.Addr{}, errors.New("network is unreachable")
	}
	a := netip.MustParseAddr(via)
	if a.Zone() == "" {
		a = a.WithZone(dst.Zone())
	}
	return a, nil
}

// testNet is the launcher of the tests: eth0 10.9.0.1/24, ib0
// 10.20.0.1/16 and fd00::1/64, lo; no default route. Its hosts' names
// resolve as the site's DNS would.
func testNet() *fakeNet {
	return &fakeNet{
		routes: map[string]string{
			"10.9.0.0/24":  "10.9.0.1",
			"10.20.0.0/16": "10.20.0.1",
			"fd00::/64":    "fd00::1",
			"fe80::/64":    "fe80::2",
			"fd01::/64":    "fe80::2%eth0", // by a link-local address alone
			"127.0.0.0/8":  "127.0.0.1",
			"::1/128":      "::1",
		},
		names: map[string][]string{
			"node01": {"10.9.0.11"}, "node02": {"10.9.0.12"},
			"gpu01":  {"10.20.3.1"},
			"dual":   {"fd00::7", "10.9.0.13"}, // the resolver's order: IPv6 first
			"v6":     {"fd00::8"},
			"v6v4":   {"fd00::9", "192.168.7.7"}, // the IPv4 one has no route
			"debian": {"127.0.1.1"},
			"empty":  {},
			"ll":     {"fe80::1%eth0"},
			"llv4":   {"fe80::3%eth0", "10.9.0.14"},
		},
	}
}

func TestChooseBind(t *testing.T) {
	host := func(name string) bindHost { return bindHost{name: name} }
	tests := []struct {
		name   string
		hosts  []bindHost
		listen string
		via    map[string]string // host name → local address
		err    string            // the message, when refused
		asked  []string          // the names resolved (sorted); nil = not checked
		agent  string            // the address the launcher's own agent registers; "" = listen
	}{
		{name: "one address for every host", hosts: []bindHost{host("node01"), host("node02")},
			listen: "10.9.0.1", via: map[string]string{"node01": "10.9.0.1", "node02": "10.9.0.1"}},
		{name: "two interfaces, one route each", hosts: []bindHost{host("node01"), host("gpu01"), host("node02")},
			listen: "0.0.0.0", via: map[string]string{"node01": "10.9.0.1", "gpu01": "10.20.0.1", "node02": "10.9.0.1"},
			agent: "10.9.0.1"},
		{name: "two interfaces, most hosts on the second", hosts: []bindHost{host("gpu01"), host("node01"), host("node02")},
			listen: "0.0.0.0", via: map[string]string{"gpu01": "10.20.0.1", "node01": "10.9.0.1", "node02": "10.9.0.1"},
			agent: "10.9.0.1"},
		{name: "two interfaces, as many hosts on each", hosts: []bindHost{host("gpu01"), host("node01"), host("10.20.3.2"), host("node02")},
			listen: "0.0.0.0", via: map[string]string{"gpu01": "10.20.0.1", "node01": "10.9.0.1", "10.20.3.2": "10.20.0.1", "node02": "10.9.0.1"},
			agent: "10.20.0.1"},
		{name: "IPv4 before IPv6 when both route", hosts: []bindHost{host("dual")},
			listen: "10.9.0.1", via: map[string]string{"dual": "10.9.0.1"}},
		{name: "IPv6 when only it routes", hosts: []bindHost{host("v6v4")},
			listen: "fd00::1", via: map[string]string{"v6v4": "fd00::1"}},
		{name: "IPv4 and IPv6 hosts", hosts: []bindHost{host("node01"), host("v6")},
			listen: "::", via: map[string]string{"node01": "10.9.0.1", "v6": "fd00::1"}, agent: "10.9.0.1"},
		{name: "IP literals are not resolved", hosts: []bindHost{host("10.9.0.40"), host("fd00::40"), host("node01")},
			listen: "::", via: map[string]string{"10.9.0.40": "10.9.0.1", "fd00::40": "fd00::1", "node01": "10.9.0.1"},
			asked: []string{"node01"}, agent: "10.9.0.1"},
		{name: "an address known apart from the name", hosts: []bindHost{{name: "sl01", addr: "10.20.1.1"}, {name: "sl02", addr: "gpu01"}},
			listen: "10.20.0.1", via: map[string]string{"sl01": "10.20.0.1", "sl02": "10.20.0.1"},
			asked: []string{"gpu01"}},
		{name: "local hosts skipped", hosts: []bindHost{{name: "launcher", local: true}, {name: "debian", local: true}, host("node02")},
			listen: "10.9.0.1", via: map[string]string{"node02": "10.9.0.1"}, asked: []string{"node02"}},
		{name: "no remote host", hosts: []bindHost{{name: "localhost", local: true}},
			listen: "", via: map[string]string{}, asked: []string{}, agent: "127.0.0.1"},
		{name: "unresolvable", hosts: []bindHost{host("node01"), host("node99")},
			err: "cannot choose the control plane's address: host node99: cannot resolve its name: lookup node99: no such host; pass --bind with an address the hosts can reach"},
		{name: "resolves to nothing", hosts: []bindHost{host("empty")},
			err: "cannot choose the control plane's address: host empty: cannot resolve its name: no address; pass --bind with an address the hosts can reach"},
		{name: "loopback-routed", hosts: []bindHost{host("node01"), host("debian")},
			err: "cannot choose the control plane's address: host debian: resolves to loopback (127.0.1.1) but is not a name gorun recognises as this host; pass --bind with an address the hosts can reach"},
		{name: "no route", hosts: []bindHost{host("192.168.7.7")},
			err: "cannot choose the control plane's address: host 192.168.7.7: no route to 192.168.7.7: network is unreachable; pass --bind with an address the hosts can reach"},
		{name: "link-local address literal", hosts: []bindHost{host("fe80::1%eth0")},
			err: "cannot choose the control plane's address: host fe80::1%eth0: its address fe80::1%eth0 is IPv6 link-local, which the control plane does not support; pass --bind with an address the hosts can reach"},
		{name: "link-local without a zone", hosts: []bindHost{host("fe80::1")},
			err: "cannot choose the control plane's address: host fe80::1: its address fe80::1 is IPv6 link-local, which the control plane does not support; pass --bind with an address the hosts can reach"},
		{name: "resolves to link-local", hosts: []bindHost{host("node01"), host("ll")},
			err: "cannot choose the control plane's address: host ll: its address fe80::1%eth0 is IPv6 link-local, which the control plane does not support; pass --bind with an address the hosts can reach"},
		{name: "link-local route", hosts: []bindHost{host("fd01::5")},
			err: "cannot choose the control plane's address: host fd01::5: the route to fd01::5 leaves by the IPv6 link-local address fe80::2%eth0, which the control plane does not support; pass --bind with an address the hosts can reach"},
		{name: "link-local and a routed IPv4 address", hosts: []bindHost{host("llv4")},
			listen: "10.9.0.1", via: map[string]string{"llv4": "10.9.0.1"}},
		{name: "several refused", hosts: []bindHost{host("n1"), host("node01"), host("n2"), host("n3"), host("n4"), host("n5")},
			err: "cannot choose the control plane's address: host n1: cannot resolve its name: lookup n1: no such host (also n2, n3, n4 and 1 more); pass --bind with an address the hosts can reach"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.hosts {
				tt.hosts[i].index = 10 + i
			}
			f := testNet()
			b, err := chooseBind(t.Context(), tt.hosts, f.resolve, f.route)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v\nwant %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.listen != tt.listen {
				t.Errorf("listen %q, want %q", b.listen, tt.listen)
			}
			got := map[string]string{}
			for _, h := range tt.hosts {
				if a, ok := b.via[h.index]; ok {
					got[h.name] = a.String()
				}
			}
			if !maps.Equal(got, tt.via) {
				t.Errorf("via %v, want %v", got, tt.via)
			}
			// The certificate's addresses: every one chosen, once, in host order.
			var want []netip.Addr
			for _, h := range tt.hosts {
				if a, ok := b.via[h.index]; ok && !slices.Contains(want, a) {
					want = append(want, a)
				}
			}
			if !slices.Equal(b.addrs, want) {
				t.Errorf("addrs %v, want %v", b.addrs, want)
			}
			if b.wildcard() != (len(want) > 1) {
				t.Errorf("wildcard %v with %d addresses", b.wildcard(), len(want))
			}
			agent := tt.agent
			if agent == "" {
				agent = tt.listen
			}
			if got := b.localAgentAddr(); got != agent {
				t.Errorf("the launcher's agent registers %s, want %s", got, agent)
			}
			if tt.asked != nil {
				slices.Sort(f.asked)
				if !slices.Equal(f.asked, tt.asked) {
					t.Errorf("resolved %q, want %q", f.asked, tt.asked)
				}
			}
		})
	}
}

// The names are resolved at once, not one after the other: a resolver
// that answers only when every name is being resolved does not stall.
func TestChooseBindResolvesInParallel(t *testing.T) {
	const n = 8
	var hosts []bindHost
	for i := range n {
		hosts = append(hosts, bindHost{index: i, name: "node" + strings.Repeat("x", i)})
	}
	var wg sync.WaitGroup
	wg.Add(n)
	resolve := func(ctx context.Context, name string) ([]netip.Addr, error) {
		wg.Done()
		wg.Wait()
		return []netip.Addr{netip.MustParseAddr("10.9.0.11")}, nil
	}
	route := func(netip.Addr) (netip.Addr, error) { return netip.MustParseAddr("10.9.0.1"), nil }
	b, err := chooseBind(t.Context(), hosts, resolve, route)
	if err != nil || b.listen != "10.9.0.1" {
		t.Fatalf("chooseBind = %q, %v", b.listen, err)
	}
}

// setBind: an address given with --bind is where the server listens; a
// wildcard, however it is written, listens everywhere with each agent
// dialing the address routing to its host, which needs every host's route
// as without --bind (and says so when one is missing).
func TestSetBind(t *testing.T) {
	tests := []struct {
		name   string
		bind   string
		hosts  []string // the job's hosts, remote
		listen string
		via    map[string]string // host name → the address its agent dials; nil = none
		err    string
	}{
		{name: "chosen", hosts: []string{"node01", "gpu01"},
			listen: "0.0.0.0", via: map[string]string{"node01": "10.9.0.1", "gpu01": "10.20.0.1"}},
		{name: "given", bind: "10.9.0.1", hosts: []string{"node01", "nowhere"}, listen: "10.9.0.1"},
		{name: "IPv4 wildcard", bind: "0.0.0.0", hosts: []string{"node01"},
			listen: "0.0.0.0", via: map[string]string{"node01": "10.9.0.1"}},
		{name: "IPv6 wildcard", bind: "::", hosts: []string{"node01", "v6"},
			listen: "::", via: map[string]string{"node01": "10.9.0.1", "v6": "fd00::1"}},
		{name: "IPv6 wildcard as ::0", bind: "::0", hosts: []string{"node01"},
			listen: "::0", via: map[string]string{"node01": "10.9.0.1"}},
		{name: "IPv6 wildcard in full", bind: "0:0:0:0:0:0:0:0", hosts: []string{"gpu01"},
			listen: "0:0:0:0:0:0:0:0", via: map[string]string{"gpu01": "10.20.0.1"}},
		{name: "not chosen", hosts: []string{"node01", "nowhere"},
			err: "cannot choose the control plane's address: host nowhere: cannot resolve its name: lookup nowhere: no such host; pass --bind with an address the hosts can reach"},
		{name: "wildcard without a route", bind: "0.0.0.0", hosts: []string{"node01", "nowhere"},
			err: "cannot choose the control plane's address: host nowhere: cannot resolve its name: lookup nowhere: no such host; --bind 0.0.0.0 gives each agent the address routing to its host, so every host needs one: pass --bind with one address the hosts can reach instead"},
		{name: "IPv6 wildcard without a route", bind: "::", hosts: []string{"debian"},
			err: "cannot choose the control plane's address: host debian: resolves to loopback (127.0.1.1) but is not a name gorun recognises as this host; --bind :: gives each agent the address routing to its host, so every host needs one: pass --bind with one address the hosts can reach instead"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := testNet()
			j := &job{cfg: Config{Bind: tt.bind, resolve: f.resolve, route: f.route}}
			for i, name := range tt.hosts {
				j.hosts = append(j.hosts, &hostAgent{index: i, name: name, topo: topology.Host{Name: name}})
			}
			err := j.setBind(t.Context())
			if tt.err != "" {
				if !errors.Is(err, ErrConfig) || err.Error() != tt.err {
					t.Fatalf("error %v\nwant %s (a ConfigError)", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if j.bind.listen != tt.listen {
				t.Errorf("listen %q, want %q", j.bind.listen, tt.listen)
			}
			var got map[string]string
			if j.bind.wildcard() {
				got = map[string]string{}
				for _, h := range j.hosts {
					got[h.name] = j.bind.via[h.index].String()
				}
			}
			if !maps.Equal(got, tt.via) {
				t.Errorf("agents dial %v, want %v", got, tt.via)
			}
		})
	}
}

func TestIsWildcard(t *testing.T) {
	for _, tt := range []struct {
		addr string
		want bool
	}{
		{"0.0.0.0", true}, {"::", true}, {"::0", true}, {"0:0:0:0:0:0:0:0", true}, {"0::0", true},
		{"", false}, {"10.9.0.1", false}, {"127.0.0.1", false}, {"::1", false}, {"localhost", false}, {"0", false},
	} {
		if got := isWildcard(tt.addr); got != tt.want {
			t.Errorf("isWildcard(%q) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

// The names' resolution has one deadline, however many names there are
// (a resolver that never answers holds up the choice once, not once per
// resolveParallel names), and the caller's context ends it: its cause is
// the error, not a refusal of the hosts. In a bubble, whose clock moves
// only when every goroutine waits: that the choice returns at all is the
// point, not when.
func TestChooseBindResolutionBounded(t *testing.T) {
	tests := []struct {
		name   string
		cancel bool // the caller's context is cancelled once resolving starts
	}{
		{name: "the deadline"},
		{name: "the caller's cancel", cancel: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := 3*resolveParallel + 1
				hosts := make([]bindHost, n)
				for i := range hosts {
					hosts[i] = bindHost{index: i, name: fmt.Sprintf("node%03d", i)}
				}
				started := make(chan struct{})
				var once sync.Once
				var mu sync.Mutex
				deadlines := map[time.Time]int{} // each resolution's deadline, and how many had it
				resolve := func(ctx context.Context, name string) ([]netip.Addr, error) {
					once.Do(func() { close(started) })
					d, ok := ctx.Deadline()
					mu.Lock()
					deadlines[d]++
					mu.Unlock()
					if !ok {
						return nil, errors.New("resolved without a deadline")
					}
					<-ctx.Done() // the DNS server does not answer
					return nil, ctx.Err()
				}
				route := func(netip.Addr) (netip.Addr, error) { return netip.MustParseAddr("10.9.0.1"), nil }
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				stop := errors.New("stopped by the test")
				if tt.cancel {
					go func() {
						<-started
						cancel(stop)
					}()
				}
				_, err := chooseBind(ctx, hosts, resolve, route)
				if tt.cancel {
					if !errors.Is(err, stop) {
						t.Fatalf("error %v, want the cancel's cause (%v)", err, stop)
					}
					if _, ok := errors.AsType[*bindError](err); ok {
						t.Fatalf("error %v: a refusal of the hosts, not the cancel", err)
					}
					return
				}
				if len(deadlines) != 1 {
					t.Errorf("%d deadlines for %d names, want one for all: %v", len(deadlines), n, deadlines)
				}
				want := fmt.Sprintf("cannot choose the control plane's address: host node000: cannot resolve its name: no answer within 5s: context deadline exceeded (also node001, node002, node003 and %d more); pass --bind with an address the hosts can reach", n-4)
				if err == nil || err.Error() != want || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("error %v\nwant %s", err, want)
				}
			})
		})
	}
}

// A signal that stops gorun (SIGINT, SIGTERM, SIGHUP) arriving while the
// hosts' names are resolved stops it then, with the signal's exit code;
// SIGUSR1 and SIGUSR2 do not. A cancelled context stops it with an error
// that is not a usage error.
func TestRunStoppedWhileResolving(t *testing.T) {
	tests := []struct {
		name    string
		signals []os.Signal
		cancel  bool
		code    int
		stderr  string
	}{
		{name: "SIGINT", signals: []os.Signal{syscall.SIGINT}, code: 128 + int(syscall.SIGINT),
			stderr: "gorun: SIGINT while resolving the hosts' names; no rank started\n"},
		{name: "SIGHUP", signals: []os.Signal{syscall.SIGHUP}, code: 128 + int(syscall.SIGHUP),
			stderr: "gorun: SIGHUP while resolving the hosts' names; no rank started\n"},
		{name: "SIGUSR1 then SIGTERM", signals: []os.Signal{syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM}, code: 128 + int(syscall.SIGTERM),
			stderr: "gorun: SIGTERM while resolving the hosts' names; no rank started\n"},
		{name: "cancelled", cancel: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started := make(chan struct{})
			var once sync.Once
			resolve := func(ctx context.Context, name string) ([]netip.Addr, error) {
				once.Do(func() { close(started) })
				<-ctx.Done() // the DNS server does not answer
				return nil, ctx.Err()
			}
			sigs := make(chan os.Signal, len(tt.signals))
			var stderr bytes.Buffer
			c := Config{Hosts: []topology.Host{{Name: "node01", Slots: 1}, {Name: "node02", Slots: 1}}, NP: 2, Prog: "true",
				resolve: resolve, Signals: sigs, Stderr: &stderr}
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)
			stop := errors.New("stopped by the test")
			go func() {
				<-started
				for _, s := range tt.signals {
					sigs <- s
				}
				if tt.cancel {
					cancel(stop)
				}
			}()
			code, err := Run(ctx, c)
			if tt.cancel {
				if !errors.Is(err, stop) || errors.Is(err, ErrConfig) {
					t.Fatalf("Run = %d, %v; want the cancel's cause, not a usage error", code, err)
				}
				return
			}
			if err != nil || code != tt.code {
				t.Fatalf("Run = %d, %v; want %d", code, err, tt.code)
			}
			if stderr.String() != tt.stderr {
				t.Errorf("stderr %q, want %q", stderr.String(), tt.stderr)
			}
		})
	}
}

// The kernel's answer for loopback: the route to 127.0.0.1 leaves by it.
func TestSystemRoute(t *testing.T) {
	a, err := systemRoute(netip.MustParseAddr("127.0.0.1"))
	if err != nil || a != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("systemRoute(127.0.0.1) = %v, %v", a, err)
	}
}
