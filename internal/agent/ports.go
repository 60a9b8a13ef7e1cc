package agent

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/gorun/gorun/internal/wire"
)

// masterPorts is how many MASTER_PORT candidates an agent registers
// (wire.Register.MasterPorts): the epochs whose rank 0 is on its host
// take them in turn.
const masterPorts = 4

// portPool is an agent's MASTER_PORT pool. Its ports stay bound, by
// sockets the agent owns that never listen, so that no outgoing
// connection on the host takes one as its local port before the epoch
// that uses it, and a rank connecting early to one is refused (a
// TCPStore client retries a refused connection; one a listener had
// accepted and then reset, it does not). Each is released just before
// the ranks of the epoch that uses it start, and the rest when the agent
// stops. Only the agent's main goroutine uses it.
type portPool struct {
	ports []int       // distinct, in registration order
	held  map[int]int // port → the bound socket's descriptor
}

// holdPorts binds up to n distinct TCP ports on addr (an IP address; the
// unspecified one when addr is not), all at once, so the kernel gives
// distinct ones.
func holdPorts(addr string, n int) *portPool {
	p := &portPool{held: make(map[int]int, n)}
	for range n {
		fd, port, err := bindPort(addr)
		if err != nil {
			break
		}
		p.ports = append(p.ports, port)
		p.held[port] = fd
	}
	return p
}

// bindPort binds a TCP socket to a free port of addr, without listening
// and without SO_REUSEADDR (so that nothing else binds the port, even with
// it), and returns its descriptor and port.
func bindPort(addr string) (fd, port int, err error) {
	family := syscall.AF_INET
	var sa syscall.Sockaddr = &syscall.SockaddrInet4{}
	if ip := net.ParseIP(addr); ip != nil {
		if ip4 := ip.To4(); ip4 != nil {
			sa4 := &syscall.SockaddrInet4{}
			copy(sa4.Addr[:], ip4)
			sa = sa4
		} else {
			family = syscall.AF_INET6
			sa6 := &syscall.SockaddrInet6{}
			copy(sa6.Addr[:], ip.To16())
			sa = sa6
		}
	}
	fd, err = syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("socket: %w", err)
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("bind: %w", err)
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return -1, 0, fmt.Errorf("getsockname: %w", err)
	}
	switch a := got.(type) {
	case *syscall.SockaddrInet4:
		port = a.Port
	case *syscall.SockaddrInet6:
		port = a.Port
	}
	if port == 0 {
		syscall.Close(fd)
		return -1, 0, errors.New("bind gave no port")
	}
	return fd, port, nil
}

// release closes port's socket, if the pool holds it.
func (p *portPool) release(port int) {
	if fd, ok := p.held[port]; ok {
		syscall.Close(fd)
		delete(p.held, port)
	}
}

// close releases every port still held.
func (p *portPool) close() {
	for port := range p.held {
		p.release(port)
	}
}

// releaseMasterPort releases table t's MASTER_PORT, one of this host's
// pool, when t places rank 0 here: its ranks start next.
func (a *agent) releaseMasterPort(t *wire.EpochTable) {
	if a.mports == nil {
		return
	}
	for _, pl := range a.hostPlaces(t) {
		if pl.Rank == 0 {
			a.mports.release(t.MasterPort)
			return
		}
	}
}
