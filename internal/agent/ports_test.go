package agent

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
)

// bindable says whether port can be listened on at 127.0.0.1 now.
func bindable(t *testing.T, port int) bool {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if errors.Is(err, syscall.EADDRINUSE) {
		return false
	}
	if err != nil {
		t.Fatalf("listen on %d: %v", port, err)
	}
	l.Close()
	return true
}

// TestMasterPortPool: the MASTER_PORT pool's ports stay bound by the
// agent (no outgoing connection or other listener can take one) until
// the table of the epoch that uses one places rank 0 on this host; a
// table with rank 0 elsewhere releases nothing; close releases the rest.
func TestMasterPortPool(t *testing.T) {
	p := holdPorts("127.0.0.1", masterPorts)
	defer p.close()
	if len(p.ports) != masterPorts {
		t.Fatalf("pool %v, want %d ports", p.ports, masterPorts)
	}
	seen := map[int]bool{}
	for _, port := range p.ports {
		if seen[port] {
			t.Fatalf("pool %v: port %d twice", p.ports, port)
		}
		seen[port] = true
		if bindable(t, port) {
			t.Errorf("port %d of the pool is free before its epoch", port)
		}
		// A rank that connects before its agent released the port is
		// refused (a TCPStore client retries), not accepted by the kernel
		// into a backlog nobody reads and reset later (it does not).
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			c.Close()
			t.Errorf("a connection to port %d of the pool was accepted before its epoch", port)
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("a connection to port %d of the pool: %v, want it refused", port, err)
		}
	}

	tab := testTable() // rank 0 on host 0, none on host 1
	tests := []struct {
		name    string
		host    int
		port    int
		release bool
	}{
		{"rank 0 elsewhere", 2, p.ports[1], false},
		{"a spare", 1, p.ports[1], false},
		{"rank 0 here", 0, p.ports[1], true},
		{"rank 0 here again", 0, p.ports[1], true},
		{"rank 0 here, another port", 0, p.ports[2], true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &agent{cfg: Config{Host: tt.host}, mports: p}
			tab.MasterPort = tt.port
			a.releaseMasterPort(tab)
			if got := bindable(t, tt.port); got != tt.release {
				t.Errorf("port %d bindable %v after a table with host %d, want %v", tt.port, got, tt.host, tt.release)
			}
		})
	}
	for _, port := range []int{p.ports[0], p.ports[3]} {
		if bindable(t, port) {
			t.Errorf("port %d released by another epoch's table", port)
		}
	}
	p.close()
	for _, port := range p.ports {
		if !bindable(t, port) {
			t.Errorf("port %d still held after close", port)
		}
	}
	(&agent{cfg: Config{Host: 0}}).releaseMasterPort(tab) // no pool: nothing
}
