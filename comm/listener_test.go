package comm

import (
	"errors"
	"net"
	"path/filepath"
	"testing"
)

func TestMultiListener(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "l.sock")
	unix, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMultiListener(tcp, unix)
	if m.Addr().String() != tcp.Addr().String() {
		t.Errorf("Addr %v, want the first listener's %v", m.Addr(), tcp.Addr())
	}
	for _, d := range [][2]string{{"tcp", tcp.Addr().String()}, {"unix", path}} {
		c, err := net.Dial(d[0], d[1])
		if err != nil {
			t.Fatal(err)
		}
		a, err := m.Accept()
		if err != nil {
			t.Fatalf("accept %s: %v", d[0], err)
		}
		if a.LocalAddr().Network() != d[0] {
			t.Errorf("accepted a %s connection for a %s dial", a.LocalAddr().Network(), d[0])
		}
		a.Close()
		c.Close()
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Accept(); err == nil {
		t.Fatal("Accept after Close succeeded")
	} else if !errors.Is(err, net.ErrClosed) {
		t.Logf("Accept after Close: %v", err)
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Error("the Unix socket still accepts after Close")
	}
}
