package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gorun/gorun/hotswap"
)

// The control plane's address, when --bind is not given, is the one the
// kernel routes to the remote hosts by: for each remote host, the local
// address a packet to it would leave from. One such address for every
// host (the usual case) is where the server listens; several (a launcher
// on two fabrics) make it listen on the wildcard and hand each agent the
// URL with the address that routes to its host. The server's certificate
// names every chosen address; agents pin its fingerprint in any case.

// Bounds of the hosts' name resolution: a DNS server that does not answer
// holds gorun up for resolveTimeout, however many hosts there are.
const (
	resolveTimeout  = 5 * time.Second // every name, in all
	resolveParallel = 64              // names resolved at once
)

// bindHost is a host of the job as the address choice sees it.
type bindHost struct {
	index int    // its index in the job
	name  string // its name: in messages, and resolved when addr is ""
	// addr is the address the host is reached at when it is known apart
	// from its name (topology.Host.Addr: Slurm's NodeAddr), an IP address
	// or a name; "" = name.
	addr  string
	local bool // the launcher's own host: its agent runs in-process, nothing to route
}

// resolveFunc returns the addresses of a host name (an IP literal never
// reaches it).
type resolveFunc func(ctx context.Context, name string) ([]netip.Addr, error)

// routeFunc returns the local address the kernel sends from to reach dst.
type routeFunc func(dst netip.Addr) (netip.Addr, error)

// bindChoice is where the control plane listens and what each remote
// host's agent dials.
type bindChoice struct {
	// listen is the listen address: "" when no host is remote (the
	// server does not listen), the one chosen address, or the wildcard
	// ("0.0.0.0", or "::" when an IPv6 address is among them).
	listen string
	// via is, by host index, the local address routing to each remote
	// host.
	via map[int]netip.Addr
	// addrs are via's distinct addresses, in host order: the
	// certificate's IP addresses.
	addrs []netip.Addr
}

// wildcard reports whether the server listens on every address, each
// agent dialing its own (via).
func (b bindChoice) wildcard() bool { return isWildcard(b.listen) }

// isWildcard reports whether addr is the unspecified address, however it
// is written (0.0.0.0, ::, ::0, 0:0:0:0:0:0:0:0).
func isWildcard(addr string) bool {
	a, err := netip.ParseAddr(addr)
	return err == nil && a.IsUnspecified()
}

// localAgentAddr is the address the launcher's own agent registers (its
// replica listener, MASTER_ADDR, GLOO_SOCKET_IFNAME follow it): where the
// server listens; on a wildcard, the chosen address that routes to the
// most remote hosts (of as many, the first), which the others must reach
// too; loopback when none was chosen.
func (b bindChoice) localAgentAddr() string {
	switch {
	case b.wildcard() && len(b.addrs) > 0:
		n := make(map[netip.Addr]int, len(b.addrs))
		for _, a := range b.via {
			n[a]++
		}
		best := b.addrs[0]
		for _, a := range b.addrs[1:] {
			if n[a] > n[best] {
				best = a
			}
		}
		return best.String()
	case b.listen == "" || b.wildcard():
		return "127.0.0.1"
	}
	return b.listen
}

// chooseBind chooses the control plane's address from the routes to the
// remote hosts (local ones are skipped). Each host's address is its addr,
// else its name when that is an IP literal, else what resolve gives for
// its name (every name at once, at most resolveParallel in flight, all
// within resolveTimeout). Of a host's addresses, the first IPv4 one whose
// route (route) leaves by a non-loopback address wins, else the first
// such IPv6 one. A host none of whose addresses qualifies is an error
// naming it and --bind: its name resolves to nothing, there is no route
// to it, it or its route is loopback (a name that /etc/hosts maps to
// 127.0.1.1 while it is not this host), or it or its route is IPv6
// link-local (which the server's address and the agents' URLs cannot
// carry: a zone).
func chooseBind(ctx context.Context, hosts []bindHost, resolve resolveFunc, route routeFunc) (bindChoice, error) {
	var remote []bindHost
	for _, h := range hosts {
		if !h.local {
			remote = append(remote, h)
		}
	}
	b := bindChoice{via: make(map[int]netip.Addr, len(remote))}
	if len(remote) == 0 {
		return b, nil
	}
	dst := make([][]netip.Addr, len(remote))
	errs := make([]error, len(remote))
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	var g errgroup.Group
	g.SetLimit(resolveParallel)
	for i, h := range remote {
		name := h.name
		if h.addr != "" {
			name = h.addr
		}
		if a, err := netip.ParseAddr(name); err == nil {
			dst[i] = []netip.Addr{a}
			continue
		}
		g.Go(func() error {
			if errs[i] = rctx.Err(); errs[i] == nil {
				dst[i], errs[i] = resolve(rctx, name)
			}
			switch {
			case errs[i] == nil && len(dst[i]) == 0:
				errs[i] = errors.New("no address")
			case errs[i] != nil && rctx.Err() != nil:
				errs[i] = fmt.Errorf("no answer within %v: %w", resolveTimeout, errs[i])
			}
			return nil
		})
	}
	_ = g.Wait() // the goroutines report through errs
	if ctx.Err() != nil {
		return bindChoice{}, fmt.Errorf("resolving the hosts' names: %w", context.Cause(ctx))
	}
	var first error
	var bad []string
	for i, h := range remote {
		var a netip.Addr
		err := errs[i]
		if err == nil {
			a, err = routeOf(dst[i], route)
		} else {
			err = fmt.Errorf("cannot resolve its name: %w", err)
		}
		if err != nil {
			if first == nil {
				first = fmt.Errorf("host %s: %w", h.name, err)
			}
			bad = append(bad, h.name)
			continue
		}
		b.via[h.index] = a
		if !slices.Contains(b.addrs, a) {
			b.addrs = append(b.addrs, a)
		}
	}
	if first != nil {
		e := &bindError{err: first}
		if len(bad) > 1 {
			e.others = nameList(bad[1:], 3)
		}
		return bindChoice{}, e
	}
	switch {
	case len(b.addrs) == 1:
		b.listen = b.addrs[0].String()
	case slices.ContainsFunc(b.addrs, netip.Addr.Is6):
		b.listen = "::"
	default:
		b.listen = "0.0.0.0"
	}
	return b, nil
}

// bindError says why the control plane's address could not be chosen: a
// host's name does not resolve, or no route to it leaves by a non-loopback
// address.
type bindError struct {
	err    error  // the first such host's, naming it
	others string // the other such hosts, "" if none
	// wildcard is the --bind given when it is a wildcard (which needs
	// every host's route as much as no --bind does), else "".
	wildcard string
}

func (e *bindError) Error() string {
	msg := "cannot choose the control plane's address: " + e.err.Error()
	if e.others != "" {
		msg += " (also " + e.others + ")"
	}
	if e.wildcard != "" {
		return msg + "; --bind " + e.wildcard + " gives each agent the address routing to its host, so every host needs one: pass --bind with one address the hosts can reach instead"
	}
	return msg + "; pass --bind with an address the hosts can reach"
}

func (e *bindError) Unwrap() error { return e.err }

// nameList is names for a message: "a", "a and b", "a, b and c", or the
// first n and how many more.
func nameList(names []string, n int) string {
	switch {
	case len(names) <= 1:
		return strings.Join(names, "")
	case len(names) <= n:
		return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// routeOf returns the local address routing to the first of dst that
// routes by a non-loopback address, IPv4 ones first.
func routeOf(dst []netip.Addr, route routeFunc) (netip.Addr, error) {
	var first error
	for _, v4 := range []bool{true, false} {
		for _, d := range dst {
			d = d.Unmap()
			if d.Is4() != v4 {
				continue
			}
			a, err := routeVia(d, route)
			if err == nil {
				return a, nil
			}
			if first == nil {
				first = err
			}
		}
	}
	return netip.Addr{}, first
}

// routeVia returns the local address routing to d, or why the control
// plane cannot be reached by it: d or that address is loopback, or IPv6
// link-local (the server does not listen on, nor agents dial, an address
// with a zone).
func routeVia(d netip.Addr, route routeFunc) (netip.Addr, error) {
	switch {
	case d.IsLoopback():
		return netip.Addr{}, fmt.Errorf("resolves to loopback (%s) but is not a name gorun recognises as this host", d)
	case linkLocal(d):
		return netip.Addr{}, fmt.Errorf("its address %s is IPv6 link-local, which the control plane does not support", d)
	}
	a, err := route(d)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %s: %w", d, err)
	}
	switch a = a.Unmap(); {
	case a.IsLoopback():
		return netip.Addr{}, fmt.Errorf("the route to %s leaves by loopback (%s)", d, a)
	case linkLocal(a):
		return netip.Addr{}, fmt.Errorf("the route to %s leaves by the IPv6 link-local address %s, which the control plane does not support", d, a)
	}
	return a, nil
}

// linkLocal reports whether a is an IPv6 link-local address, or has a
// zone.
func linkLocal(a netip.Addr) bool {
	return a.Zone() != "" || a.Is6() && a.IsLinkLocalUnicast()
}

// systemResolve resolves a host name as the system does (/etc/hosts,
// then DNS, as nsswitch.conf says).
func systemResolve(ctx context.Context, name string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", name)
}

// systemRoute asks the kernel which local address it would send from to
// reach dst: a UDP socket connected to dst's discard port. Connecting a
// UDP socket sends nothing and needs no privilege.
func systemRoute(dst netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr(), nil
}

// setBind sets where the job's control plane listens (j.bind): at
// Config.Bind when it names an address, else at the address chosen from
// the routes to the remote hosts (chooseBind). A wildcard Bind (0.0.0.0,
// ::, however written) listens on every address, each agent dialing the
// one routing to its host: it needs every host's route, as no Bind does.
// An address that cannot be chosen is a ConfigError.
func (j *job) setBind(ctx context.Context) error {
	if j.cfg.Bind != "" && !isWildcard(j.cfg.Bind) {
		j.bind = bindChoice{listen: j.cfg.Bind}
		return nil
	}
	hosts := make([]bindHost, len(j.hosts))
	for i, h := range j.hosts {
		hosts[i] = bindHost{index: h.index, name: h.name, addr: h.topo.Addr, local: h.local}
	}
	resolve, route := j.cfg.resolve, j.cfg.route
	if resolve == nil {
		resolve = systemResolve
	}
	if route == nil {
		route = systemRoute
	}
	// A signal that stops the job stops the resolution: there is no
	// rank yet, nor one to forward SIGUSR1 or SIGUSR2 to.
	ctx, interrupt := context.WithCancelCause(ctx)
	defer interrupt(nil)
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case sig := <-j.cfg.Signals:
				if s, _ := sig.(syscall.Signal); s != syscall.SIGUSR1 && s != syscall.SIGUSR2 {
					interrupt(&interruptedError{sig: s})
					return
				}
			case <-done:
				return
			}
		}
	}()
	b, err := chooseBind(ctx, hosts, resolve, route)
	close(done)
	<-watched
	if ie, ok := errors.AsType[*interruptedError](context.Cause(ctx)); ok {
		return ie // even when the choice was made as the signal came
	}
	if be, ok := errors.AsType[*bindError](err); ok {
		be.wildcard = j.cfg.Bind
		return &ConfigError{Msg: err.Error(), Err: err}
	}
	if err != nil {
		return fmt.Errorf("launcher: %w", err)
	}
	if j.cfg.Bind != "" {
		b.listen = j.cfg.Bind
	}
	j.bind = b
	return nil
}

// interruptedError is a signal that stopped gorun before the job started.
type interruptedError struct{ sig syscall.Signal }

func (e *interruptedError) Error() string { return "interrupted by " + hotswap.SignalName(e.sig) }

// controlURL is the control plane's URL for h's agent.
func (j *job) controlURL(h *hostAgent) string {
	if a, ok := j.bind.via[h.index]; ok && j.bind.wildcard() {
		return j.srv.URLAt(a)
	}
	return j.srv.URL()
}

// reportBind says, with -v, where the control plane listens when its
// address was chosen from the routes: "control plane on 10.9.0.1:4222 (the
// address routing to node01, node02 and node03; --bind to choose)", or on
// a wildcard "(reached at 10.9.0.1 by node01, 10.20.0.1 by gpu01: the
// addresses routing to them)".
func (j *job) reportBind() {
	if !j.verbose || len(j.bind.via) == 0 {
		return
	}
	_, at, _ := strings.Cut(j.srv.URL(), "://")
	var msg string
	if j.bind.wildcard() {
		var parts []string
		for _, a := range j.bind.addrs {
			parts = append(parts, fmt.Sprintf("%s by %s", a, nameList(j.routedBy(a), 3)))
		}
		what := "the address routing to them"
		if len(parts) > 1 {
			what = "the addresses routing to them"
		}
		msg = "reached at " + strings.Join(parts, ", ") + ": " + what
	} else {
		msg = "the address routing to " + nameList(j.routedBy(j.bind.addrs[0]), 3)
	}
	if j.cfg.Bind == "" {
		msg += "; --bind to choose"
	}
	j.out.report("control plane on %s (%s)", at, msg)
}

// routedBy names the hosts whose route leaves by a, in host order.
func (j *job) routedBy(a netip.Addr) []string {
	var names []string
	for _, h := range j.hosts {
		if x, ok := j.bind.via[h.index]; ok && x == a {
			names = append(names, h.name)
		}
	}
	return names
}
