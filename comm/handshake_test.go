package comm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/jobkey"
)

// bogusDial completes the dialer's half of the handshake with a (possibly
// wrong) authenticator, then reports every byte the acceptor sends after.
func bogusDial(t *testing.T, addr string, a authenticator, ch byte, me, to int, mac []byte) (payload int) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	var hello [helloSize]byte
	if _, err := io.ReadFull(conn, hello[:]); err != nil {
		t.Fatalf("reading the challenge: %v", err)
	}
	nonceD := make([]byte, nonceSize)
	rand.Read(nonceD)
	if mac == nil {
		mac = a.mac(roleDialer, ch, me, to, hello[5:], nonceD)
	}
	ans := append([]byte(hsMagic), hsVersion, ch, flags())
	ans = binary.BigEndian.AppendUint32(ans, uint32(me))
	ans = binary.BigEndian.AppendUint32(ans, uint32(to))
	ans = append(ans, nonceD...)
	ans = append(ans, mac...)
	if _, err := conn.Write(ans); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(conn) // EOF or reset: either way, count what came
	return len(rest)
}

func TestAuthRefused(t *testing.T) {
	secret := testKey(t)
	var logs syncBuffer
	l0, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addrs := []string{l0.Addr().String(), l1.Addr().String()}
	const job, epoch = "job7", 3
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		c   *Comm
		err error
	}
	r0 := make(chan result, 1)
	go func() {
		c, err := NewComm(ctx, CommConfig{Rank: 0, Size: 2, Epoch: epoch, Job: job, Key: secret, Listener: l0, Addrs: addrs, Logger: logger})
		r0 <- result{c, err}
	}()

	// Impostors knock at rank 0 while it waits for rank 1: each completes
	// a handshake that must fail, and must read nothing after it.
	tests := []struct {
		name string
		auth authenticator
		me   int
		mac  []byte
	}{
		{"wrong secret", newAuthenticator(testKey(t), job, epoch), 1, nil},
		{"wrong epoch", newAuthenticator(secret, job, epoch+1), 1, nil},
		{"earlier epoch", newAuthenticator(secret, job, epoch-1), 1, nil},
		{"wrong job", newAuthenticator(secret, "job8", epoch), 1, nil},
		{"right secret, rank out of range", newAuthenticator(secret, job, epoch), 2, nil},
		{"garbage MAC", newAuthenticator(secret, job, epoch), 1, bytes.Repeat([]byte{0xAA}, macSize)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for ch := range byte(numChans) {
				if n := bogusDial(t, addrs[0], tt.auth, ch, tt.me, 0, tt.mac); n != 0 {
					t.Fatalf("channel %d: the impostor read %d bytes after the handshake", ch, n)
				}
			}
		})
	}
	// The impostors took no slot: the real rank 1 joins, and data flows.
	c1, err := NewComm(ctx, CommConfig{Rank: 1, Size: 2, Epoch: epoch, Job: job, Key: secret, Listener: l1, Addrs: addrs, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	res := <-r0
	if res.err != nil {
		t.Fatal(res.err)
	}
	c0 := res.c
	defer c0.Close()
	if err := c1.Send(ctx, 0, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if b, err := c0.Recv(ctx, 1); err != nil || string(b) != "hi" {
		t.Fatalf("Recv = %q, %v", b, err)
	}
	// Even with the right credentials, a second link for a pair is refused.
	if n := bogusDial(t, addrs[0], newAuthenticator(secret, job, epoch), chanP2P, 1, 0, nil); n != 0 {
		t.Fatalf("duplicate link: read %d bytes after the answer", n)
	}
	out := logs.String()
	if got := strings.Count(out, "refused data-plane connection"); got < numChans*len(tests)+1 {
		t.Errorf("%d refusals logged, want %d:\n%s", got, numChans*len(tests)+1, out)
	}
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, ErrAuth.Error()) {
		t.Errorf("refusals not logged as warnings naming ErrAuth:\n%s", out)
	}
}

// TestDialerChecksAcceptor: a process at a peer's address that does not
// hold the secret gets no ack and no data, and the dialer gives up.
func TestDialerChecksAcceptor(t *testing.T) {
	fake, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	var (
		mu       sync.Mutex
		answered int // connections that answered the challenge
		leaked   int // bytes they sent after the bogus proof
	)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for {
			conn, err := fake.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				hello := append([]byte(hsMagic), hsVersion)
				hello = append(hello, make([]byte, nonceSize)...)
				conn.Write(hello)
				var ans [answerSize]byte
				if _, err := io.ReadFull(conn, ans[:]); err != nil {
					return
				}
				conn.Write(bytes.Repeat([]byte{1}, macSize)) // a proof it cannot make
				rest, _ := io.ReadAll(conn)
				mu.Lock()
				answered++
				leaked += len(rest)
				mu.Unlock()
			})
		}
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = NewComm(ctx, CommConfig{Rank: 1, Size: 2, Job: "j", Key: testKey(t), Listener: l,
		Addrs: []string{fake.Addr().String(), l.Addr().String()}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if !errors.Is(err, ErrPeerLost) {
		t.Fatalf("NewComm = %v, want ErrPeerLost", err)
	}
	fake.Close()
	wg.Wait()
	if answered == 0 || leaked != 0 {
		t.Fatalf("%d connections answered the fake acceptor, which read %d bytes after its bogus proof", answered, leaked)
	}
	if !strings.Contains(logs.String(), "failed to prove the job's key") {
		t.Errorf("the refusal was not logged:\n%s", logs.String())
	}
}

func TestHandshakeTimeout(t *testing.T) {
	handshakeTimeoutOverride.Store(int64(200 * time.Millisecond))
	t.Cleanup(func() { handshakeTimeoutOverride.Store(0) })
	comms := newWorld(t, 2, worldOpts{log: io.Discard})
	conn, err := net.Dial("tcp", comms[0].ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	rest, err := io.ReadAll(conn) // the challenge, then EOF when the acceptor gives up
	if err != nil {
		t.Fatalf("a silent client was not dropped: %v", err)
	}
	if len(rest) != helloSize {
		t.Fatalf("a silent client read %d bytes, want the %d-byte challenge only", len(rest), helloSize)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("dropped after %v", d)
	}
}

// FuzzAcceptHandshake feeds the acceptor arbitrary answers to its
// challenge: none may be accepted, and nothing may be written back.
func FuzzAcceptHandshake(f *testing.F) {
	a := newAuthenticator(jobkey.Key{1}, "job", 1)
	good := append([]byte(hsMagic), hsVersion, chanColl, flags())
	good = binary.BigEndian.AppendUint32(good, 2)
	good = binary.BigEndian.AppendUint32(good, 0)
	good = append(good, make([]byte, nonceSize+macSize)...)
	f.Add(good)
	f.Add(make([]byte, answerSize))
	f.Add([]byte("GRDP"))
	f.Fuzz(func(t *testing.T, in []byte) {
		in = append(in, make([]byte, answerSize)...)[:answerSize]
		client, server := net.Pipe()
		leaked := make(chan int, 1)
		go func() {
			defer client.Close()
			var hello [helloSize]byte
			if _, err := io.ReadFull(client, hello[:]); err != nil {
				leaked <- -1
				return
			}
			client.Write(in)
			rest, _ := io.ReadAll(client)
			leaked <- len(rest)
		}()
		server.SetDeadline(time.Now().Add(5 * time.Second))
		_, _, err := a.accept(server, 0, 4, func(int, byte) error { return nil })
		server.Close()
		if err == nil {
			t.Fatalf("answer %x accepted", in)
		}
		if n := <-leaked; n != 0 {
			t.Fatalf("answer %x: %d bytes written back after the challenge", in, n)
		}
	})
}
