package launcher

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
)

func TestLocalHostMatcher(t *testing.T) {
	isLocal := LocalHostMatcher()
	hn, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	short, _, _ := strings.Cut(hn, ".")
	local := []string{"localhost", "LocalHost", "127.0.0.1", "::1", "127.0.0.2", "::ffff:127.0.0.1", hn, short, strings.ToUpper(hn), short + ".cluster.example"}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
			local = append(local, n.IP.String())
		}
	}
	for _, name := range local {
		if !isLocal(name) {
			t.Errorf("%q is not local, want local", name)
		}
	}
	// Addresses from the documentation ranges (RFC 5737, RFC 3849) are
	// nobody's, unless this machine has one.
	remote := []string{"far-away-host.invalid", "192.0.2.1", "2001:db8::1", hn + "x", "x" + short, "", "LOCALHOST.invalid"}
	for _, name := range remote {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.String() == name {
				t.Fatalf("this machine has the documentation address %s; pick another", name)
			}
		}
		if isLocal(name) {
			t.Errorf("%q is local, want remote", name)
		}
	}
}

func TestTailKeepsLastLines(t *testing.T) {
	var tl tail
	if s := tl.String(); s != "" {
		t.Errorf("empty tail = %q", s)
	}
	tl.add("only")
	if s := tl.String(); s != "only" {
		t.Errorf("one line: %q", s)
	}
	for i := range 45 {
		tl.add(fmt.Sprintf("line %d", i))
	}
	var want []string
	for i := 45 - tailLines; i < 45; i++ {
		want = append(want, fmt.Sprintf("line %d", i))
	}
	if got := tl.String(); got != strings.Join(want, "\n") {
		t.Errorf("tail =\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if tailLines != 20 {
		t.Errorf("tailLines = %d, want 20", tailLines)
	}
}

func TestTailExactlyFull(t *testing.T) {
	var tl tail
	for i := range tailLines {
		tl.add(fmt.Sprint(i))
	}
	if got := strings.Split(tl.String(), "\n"); len(got) != tailLines || got[0] != "0" || got[tailLines-1] != fmt.Sprint(tailLines-1) {
		t.Errorf("tail of exactly %d lines: %q", tailLines, got)
	}
	tl.add("next")
	if got := strings.Split(tl.String(), "\n"); len(got) != tailLines || got[0] != "1" || got[tailLines-1] != "next" {
		t.Errorf("after one more: %q", got)
	}
}

func TestTailConcurrent(t *testing.T) {
	var tl tail
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			_ = tl.String()
		}
	}()
	for i := range 1000 {
		tl.add(fmt.Sprint(i))
	}
	<-done
	if got := strings.Split(tl.String(), "\n"); len(got) != tailLines || got[tailLines-1] != "999" {
		t.Errorf("tail %q", got)
	}
}

// TestLocalMatcherReadsOnlyWhatItNeeds: localhost and loopback addresses
// are told without this host's name or its interfaces (the default
// host's launch reads neither); a name reads the host name only, an
// address the interfaces only.
func TestLocalMatcherReadsOnlyWhatItNeeds(t *testing.T) {
	m := newLocalMatcher()
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "127.0.0.2"} {
		if !m.match(name) {
			t.Errorf("%s is not local", name)
		}
	}
	if m.hostname != "" || m.addrs != nil {
		t.Fatalf("matching localhost and loopback read the host name %q and the interfaces %v", m.hostname, m.addrs)
	}
	m = newLocalMatcher()
	m.match("192.0.2.1")
	if m.hostname != "" {
		t.Errorf("matching an address read the host name %q", m.hostname)
	}
	hn, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	switch strings.ToLower(hn) {
	case "localhost", "localhost.localdomain":
		t.Skipf("this host's name %q is a loopback name, matched without reading it", hn)
	}
	if net.ParseIP(hn) != nil {
		t.Skipf("this host's name %q is an address, matched without reading it", hn)
	}
	m = newLocalMatcher()
	if !m.match(hn) {
		t.Errorf("%s is not local", hn)
	}
	if m.hostname == "" || m.addrs != nil {
		t.Errorf("matching the host name: host name %q, interfaces %v; want the name only", m.hostname, m.addrs)
	}
}
