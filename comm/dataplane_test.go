package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/gortest"
	"github.com/gorun/gorun/internal/jobkey"
)

// worldOpts shape a test world.
type worldOpts struct {
	job     string
	epoch   uint64
	secret  jobkey.Key
	segment int       // Comm.segBytes; 0 keeps the default
	log     io.Writer // nil: the test's output
	unix    bool      // link through Unix sockets (ranks of one host), not TCP
}

// newWorld starts n ranks as goroutines over loopback, each on its own
// listener, and returns their communicators; they are closed at cleanup.
func newWorld(t testing.TB, n int, o worldOpts) []*Comm {
	t.Helper()
	if o.job == "" {
		o.job = "testjob"
	}
	if o.secret == (jobkey.Key{}) {
		o.secret = testKey(t)
	}
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	dir := t.TempDir()
	for i := range lns {
		if o.unix {
			path := filepath.Join(dir, fmt.Sprintf("r%d.sock", i))
			l, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			lns[i], addrs[i] = l, UnixAddrPrefix+path
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], addrs[i] = l, l.Addr().String()
	}
	w := o.log
	if w == nil {
		w = t.Output()
	}
	logger := slog.New(slog.NewTextHandler(w, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			comms[r], errs[r] = NewComm(ctx, CommConfig{
				Rank: r, Size: n, Epoch: o.epoch, Job: o.job, Key: o.secret,
				Listener: lns[r], Addrs: addrs, Logger: logger,
			})
		})
	}
	wg.Wait()
	for r, c := range comms {
		if c != nil {
			t.Cleanup(func() { c.Close() })
			if o.segment > 0 {
				c.segBytes = o.segment
			}
		}
		if errs[r] != nil {
			t.Fatalf("NewComm rank %d: %v", r, errs[r])
		}
	}
	return comms
}

// testKey is a fresh job's data-plane key.
func testKey(t testing.TB) jobkey.Key {
	s, err := jobkey.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s.DataKey()
}

// onAll runs f on every rank concurrently and returns each rank's error.
func onAll(comms []*Comm, f func(c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(c) })
	}
	wg.Wait()
	return errs
}

func mustAll(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// within fails the test if f does not return in d.
func within[T any](t testing.TB, d time.Duration, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("no return within %v", d)
		panic("unreachable")
	}
}

// syncBuffer is safe for concurrent use.
type syncBuffer = gortest.SyncBuffer

func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i>>9)
	}
	return b
}

func TestSendRecv(t *testing.T) {
	const n = 3
	comms := newWorld(t, n, worldOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sizes := []int{0, 1, 17, 4096, 100_000, 3<<20 + 5, 0, 1}
	// Every rank sends the same sequence to every other rank, all at once,
	// and checks what it receives: content and per-pair order.
	mustAll(t, onAll(comms, func(c *Comm) error {
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		for to := range n {
			if to == c.Rank() {
				continue
			}
			wg.Go(func() {
				for i, sz := range sizes {
					if err := c.Send(ctx, to, pattern(c.Rank()*100+i, sz)); err != nil {
						errs <- err
						return
					}
				}
			})
			wg.Go(func() {
				from := to
				for i, sz := range sizes {
					b, err := c.Recv(ctx, from)
					if err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(b, pattern(from*100+i, sz)) {
						errs <- fmt.Errorf("message %d from rank %d: got %d bytes, wrong content or order", i, from, len(b))
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return <-errs
	}))
}

func TestSendRecvErrors(t *testing.T) {
	comms := newWorld(t, 2, worldOpts{})
	ctx := context.Background()
	c := comms[0]
	for _, to := range []int{-1, 0, 2} {
		if err := c.Send(ctx, to, nil); err == nil {
			t.Errorf("Send to %d succeeded", to)
		}
		if _, err := c.Recv(ctx, to); err == nil {
			t.Errorf("Recv from %d succeeded", to)
		}
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := within(t, 5*time.Second, func() error { _, err := c.Recv(tctx, 1); return err })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv past the deadline: %v", err)
	}
	// A message that was sent before the peer closed is still delivered,
	// then the loss is reported.
	if err := comms[1].Send(ctx, 0, []byte("last words")); err != nil {
		t.Fatal(err)
	}
	comms[1].Close()
	if b, err := c.Recv(ctx, 1); err != nil || string(b) != "last words" {
		t.Fatalf("Recv = %q, %v", b, err)
	}
	err = within(t, 5*time.Second, func() error { _, err := c.Recv(ctx, 1); return err })
	if pl, ok := errors.AsType[*PeerLostError](err); !ok || pl.Rank != 1 || pl.Op != "Recv" || !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("Recv from a closed peer: %v", err)
	}
	err = within(t, 5*time.Second, func() error { return c.Send(ctx, 1, []byte("x")) })
	if !errors.Is(err, ErrPeerLost) {
		t.Fatalf("Send to a closed peer: %v", err)
	}
	if err := comms[1].Send(ctx, 0, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	if err := comms[1].Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestSendContext: a Send blocked by a peer that does not read returns when
// its context ends; the partial message is never delivered, the ones
// before it are, and the peer then learns the link is gone. A context that
// ends between two Sends (the write before it just finished, as a loaded
// machine may have it) interrupts nothing: the link stays, and the test
// sends a marker and blocks again until a Send is cut mid-message.
func TestSendContext(t *testing.T) {
	comms := newWorld(t, 2, worldOpts{log: io.Discard})
	msg := make([]byte, 1<<20)
	var lens []int // what the peer must receive, in order
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := within(t, 10*time.Second, func() error {
			for {
				if err := comms[0].Send(ctx, 1, msg); err != nil {
					return err
				}
				lens = append(lens, len(msg))
			}
		})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send to a peer that does not read: %v", err)
		}
		err = comms[0].Send(context.Background(), 1, []byte("x"))
		if errors.Is(err, ErrPeerLost) {
			break
		}
		if err != nil {
			t.Fatalf("Send after an interrupted one: %v, want ErrPeerLost (or nil if it had written nothing)", err)
		}
		// The interrupted Send had written nothing: "x" follows the
		// messages before it.
		lens = append(lens, 1)
		if attempt == 3 {
			t.Fatalf("no Send was cut mid-message in %d attempts", attempt+1)
		}
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	got := 0
	for {
		b, err := comms[1].Recv(rctx, 0)
		if err != nil {
			if !errors.Is(err, ErrPeerLost) {
				t.Fatalf("Recv after %d messages: %v, want ErrPeerLost", got, err)
			}
			break
		}
		if got >= len(lens) || len(b) != lens[got] {
			t.Fatalf("message %d of %d bytes was delivered (%d sent: %v)", got, len(b), len(lens), lens)
		}
		got++
	}
	if got != len(lens) {
		t.Fatalf("%d messages sent, %d delivered", len(lens), got)
	}
}

func TestNewCommPeerNeverCame(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Rank 1's address: a port nobody listens on any more.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	for _, rank := range []int{0, 1} { // rank 0 waits to be dialed, rank 1 dials
		t.Run(fmt.Sprint("rank", rank), func(t *testing.T) {
			l := l
			if rank == 1 {
				var err error
				if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
			}
			addrs := []string{gone.Addr().String(), gone.Addr().String()}
			addrs[rank] = l.Addr().String()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			c, err := NewComm(ctx, CommConfig{Rank: rank, Size: 2, Job: "j", Key: testKey(t), Listener: l, Addrs: addrs})
			if c != nil || !errors.Is(err, ErrPeerLost) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("NewComm = %v, %v; want ErrPeerLost and DeadlineExceeded", c, err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("NewComm took %v past its deadline", d)
			}
			if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
				t.Fatal("a failed NewComm left its listener open")
			}
		})
	}
}

// commGoroutines lists the goroutines running the data plane's code.
func commGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "gorun/comm.(*Comm)") || strings.Contains(g, "gorun/comm.(*authenticator)") {
			out = append(out, g)
		}
	}
	return out
}

func TestNoGoroutineLeak(t *testing.T) {
	run := func(t *testing.T, unix bool) {
		comms := newWorld(t, 4, worldOpts{segment: 4096, log: io.Discard, unix: unix})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		x := make([][]float32, len(comms))
		for r := range x {
			x[r] = make([]float32, 10_000)
		}
		mustAll(t, onAll(comms, func(c *Comm) error {
			if err := c.AllreduceFloat32(ctx, x[c.Rank()]); err != nil {
				return err
			}
			return c.Send(ctx, (c.Rank()+1)%len(comms), []byte("x"))
		}))
		// A silent client in the middle of a handshake, and a failing
		// collective: neither may leave a goroutine behind.
		silent, err := net.Dial(comms[0].ln.Addr().Network(), comms[0].ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer silent.Close()
		comms[3].Close()
		onAll(comms[:3], func(c *Comm) error { return c.Barrier(ctx) })
		for _, c := range comms {
			c.Close()
		}
	}
	forLinks(t, run)
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := commGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after Close:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{{}, {kind: kindAllreduce, sub: typeInt64, seq: 1<<32 - 1, n: 1<<64 - 1}, {kind: kindMsg, seq: 7, n: maxMessage}} {
		var b [headerSize]byte
		h.put(b[:])
		if got := parseHeader(b[:]); got != h {
			t.Errorf("%+v → %+v", h, got)
		}
	}
}
