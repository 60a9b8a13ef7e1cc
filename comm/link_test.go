package comm

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// linkPair dials from identity me to identity to through a listener that
// accepts with la2, and returns both ends' results.
func linkPair(t *testing.T, dial, accept LinkAuth, me, to, size int) (net.Conn, net.Conn, int, error, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c    net.Conn
		from int
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- res{err: err}
			return
		}
		from, err := AcceptLink(c, accept, to, size)
		if err != nil {
			c.Close()
			c = nil
		}
		ch <- res{c, from, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dc, derr := DialLink(ctx, ln.Addr().String(), dial, me, to)
	r := <-ch
	if dc != nil {
		t.Cleanup(func() { dc.Close() })
	}
	if r.c != nil {
		t.Cleanup(func() { r.c.Close() })
	}
	return dc, r.c, r.from, derr, r.err
}

func TestLink(t *testing.T) {
	s := testKey(t)
	la := LinkAuth{Job: "job1", Key: s, Purpose: "replica"}
	// Any identity may dial any other, lower or higher.
	for _, c := range []struct{ me, to int }{{0, 1}, {1, 0}, {5, 2}} {
		dc, ac, from, derr, aerr := linkPair(t, la, la, c.me, c.to, 8)
		if derr != nil || aerr != nil {
			t.Fatalf("%d→%d: dial %v, accept %v", c.me, c.to, derr, aerr)
		}
		if from != c.me {
			t.Fatalf("accepted from %d, want %d", from, c.me)
		}
		go dc.Write([]byte("ping"))
		b := make([]byte, 4)
		if _, err := io.ReadFull(ac, b); err != nil || string(b) != "ping" {
			t.Fatalf("read %q, %v", b, err)
		}
	}
}

func TestLinkRefused(t *testing.T) {
	s := testKey(t)
	other := testKey(t)
	la := LinkAuth{Job: "job1", Key: s, Purpose: "replica"}
	cases := []struct {
		name   string
		dial   LinkAuth
		me, to int
		size   int
	}{
		{"other secret", LinkAuth{Job: "job1", Key: other, Purpose: "replica"}, 1, 0, 4},
		{"other job", LinkAuth{Job: "job2", Key: s, Purpose: "replica"}, 1, 0, 4},
		{"other purpose", LinkAuth{Job: "job1", Key: s, Purpose: "parity"}, 1, 0, 4},
		{"itself", la, 0, 0, 4},
		{"out of range", la, 4, 0, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, _, derr, aerr := linkPair(t, c.dial, la, c.me, c.to, c.size)
			if derr == nil || aerr == nil {
				t.Fatalf("dial %v, accept %v: want both refused", derr, aerr)
			}
			if !errors.Is(aerr, ErrAuth) {
				t.Errorf("accept error %v does not wrap ErrAuth", aerr)
			}
		})
	}
}

// TestLinkNotComm: a Comm refuses a link's handshake and a link refuses a
// Comm's, even with the same job and secret.
func TestLinkNotComm(t *testing.T) {
	s := testKey(t)
	la := LinkAuth{Job: "job1", Key: s}
	ws := newWorld(t, 2, worldOpts{job: "job1", secret: s})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c, err := DialLink(ctx, ws[0].addrs[0], la, 1, 0); err == nil {
		c.Close()
		t.Fatal("a Comm accepted a link")
	}
	// A rank's handshake (channel 0, same job and secret) into a link
	// acceptor.
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		auth := newAuthenticator(s, "job1", 0)
		auth.dial(a, chanP2P, 1, 0)
		a.Close()
	}()
	b.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := AcceptLink(b, la, 0, 2); !errors.Is(err, ErrAuth) {
		t.Fatalf("a link accepted a rank's handshake: %v", err)
	}
}
