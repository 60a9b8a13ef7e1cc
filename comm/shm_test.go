package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func requireShm(t *testing.T) {
	t.Helper()
	if !shmAvailable() {
		t.Skip("this system cannot create sealed memfd rings (the data plane falls back to sockets)")
	}
}

// TestShmRingsBetweenNeighbours: ranks of one host get rings on the
// collective links to their ring neighbours, and only there; TCP links get
// none.
func TestShmRingsBetweenNeighbours(t *testing.T) {
	requireShm(t)
	for _, tc := range []struct {
		n    int
		unix bool
	}{{2, true}, {3, true}, {5, true}, {4, false}} {
		comms := newWorld(t, tc.n, worldOpts{unix: tc.unix})
		for _, c := range comms {
			for r, p := range c.peers {
				if p == nil {
					continue
				}
				d := (r - c.rank + tc.n) % tc.n
				want := tc.unix && (d == 1 || d == tc.n-1)
				if got := p.shm != nil; got != want {
					t.Errorf("n=%d unix=%v: rank %d's link to rank %d has rings: %v, want %v", tc.n, tc.unix, c.rank, r, got, want)
				}
			}
		}
	}
}

// TestShmFallback: when one side, or both, cannot create a ring, the link
// stays a plain socket on both ends, and Allreduce gives the same bits.
func TestShmFallback(t *testing.T) {
	requireShm(t)
	in := convert(inputs(3, 2, 5000), func(v float64) float32 { return float32(v) })
	bits := func(v float32) uint64 { return uint64(math.Float32bits(v)) }
	for _, tc := range []struct {
		name  string
		fails int // ring creations that fail
		rings bool
	}{
		{"both create", 0, true},
		{"one side fails", 1, false},
		{"both fail", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var left atomic.Int32
			left.Store(int32(tc.fails))
			shmCreateHook = func() error {
				if left.Add(-1) >= 0 {
					return errors.New("refused by the test")
				}
				return nil
			}
			t.Cleanup(func() { shmCreateHook = nil })
			comms := newWorld(t, 2, worldOpts{segment: testSegment, unix: true})
			for _, c := range comms {
				if got := c.peers[1-c.rank].shm != nil; got != tc.rings {
					t.Fatalf("rank %d has rings: %v, want %v", c.rank, got, tc.rings)
				}
			}
			checkAllreduce(t, comms, in, (*Comm).AllreduceFloat32, bits)
		})
	}
}

// TestShmBadOffer: what a peer sends in the ring exchange is checked; a
// bad offer means no rings (or, when it is not an offer at all, no link),
// never a crash, a mapping that can fault, or a leaked descriptor.
func TestShmBadOffer(t *testing.T) {
	requireShm(t)
	const slot = 1 << 16
	offer := func(ok byte, slots, slotBytes uint32) []byte {
		b := make([]byte, shmOfferSize)
		copy(b, shmMagic)
		b[4], b[5] = shmVersion, ok
		binary.BigEndian.PutUint32(b[8:], slots)
		binary.BigEndian.PutUint32(b[12:], slotBytes)
		return b
	}
	memfd := func(t *testing.T, size int, seal bool) int {
		fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Fatal(err)
		}
		if seal {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	file := func(t *testing.T, _ int, _ bool) int {
		f, err := os.CreateTemp(t.TempDir(), "ring")
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(shmSlots * slot)
		fd, err := syscall.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		return fd
	}
	tests := []struct {
		name    string
		offer   []byte
		fd      func(t *testing.T, size int, seal bool) int // nil: no descriptor
		size    int
		seal    bool
		answer  byte
		linkErr bool // the exchange fails (no link), rather than giving no rings
	}{
		{"not an offer", []byte("GET / HTTP/1.1\r\n"), nil, 0, false, 1, true},
		{"other version", append([]byte(shmMagic), 9, 1, 0, 0, 0, 0, 0, 4, 0, 1, 0, 0), nil, 0, false, 1, true},
		{"announced without a descriptor", offer(1, shmSlots, slot), nil, 0, false, 1, false},
		{"descriptor not announced", offer(0, shmSlots, slot), memfd, shmSlots * slot, true, 1, false},
		{"unsealed", offer(1, shmSlots, slot), memfd, shmSlots * slot, false, 1, false},
		{"smaller than announced", offer(1, shmSlots, slot), memfd, slot, true, 1, false},
		{"a regular file", offer(1, shmSlots, slot), file, 0, false, 1, false},
		{"other slot size", offer(1, 2*shmSlots, slot/2), memfd, shmSlots * slot, true, 1, false},
		{"absurd size", offer(1, math.MaxUint32, math.MaxUint32), memfd, slot, true, 1, false},
		{"peer could not map", offer(1, shmSlots, slot), memfd, shmSlots * slot, true, 0, false},
		{"good", offer(1, shmSlots, slot), memfd, shmSlots * slot, true, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fdsBefore := openFDs(t)
			a, b := unixPair(t)
			type result struct {
				link *shmLink
				err  error
			}
			done := make(chan result, 1)
			go func() {
				l, err := setupShm(a, slot)
				done <- result{l, err}
			}()
			// The fake peer: its offer, then (unless the exchange is
			// over) it reads ours and answers.
			var oob []byte
			fd := -1
			if tc.fd != nil {
				fd = tc.fd(t, tc.size, tc.seal)
				oob = syscall.UnixRights(fd)
			}
			_, _, err := b.WriteMsgUnix(tc.offer, oob, nil)
			if fd >= 0 {
				syscall.Close(fd) // the message holds its own reference
			}
			if err != nil {
				t.Fatal(err)
			}
			theirs, err := readOffer(b)
			if err != nil {
				t.Fatalf("reading setupShm's offer: %v", err)
			}
			if theirs == nil {
				t.Fatal("setupShm offered no ring")
			}
			(&shmLink{in: theirs}).unmap()
			if !tc.linkErr {
				if _, err := b.Write([]byte{tc.answer}); err != nil {
					t.Fatal(err)
				}
				var ans [1]byte
				if _, err := io.ReadFull(b, ans[:]); err != nil {
					t.Fatal(err)
				}
				wantAns := byte(0)
				if tc.name == "good" || tc.name == "peer could not map" {
					wantAns = 1
				}
				if ans[0] != wantAns {
					t.Errorf("setupShm answered %d, want %d", ans[0], wantAns)
				}
			}
			r := <-done
			switch {
			case tc.name == "good":
				if r.err != nil || r.link == nil {
					t.Fatalf("good offer: link %v, err %v", r.link, r.err)
				}
				r.link.unmap()
			case tc.linkErr:
				if r.err == nil || errors.As(r.err, new(*noShmError)) {
					t.Fatalf("got %v, want an error that fails the link", r.err)
				}
				t.Log(r.err)
			default:
				if r.link != nil || !errors.As(r.err, new(*noShmError)) {
					t.Fatalf("got link %v, err %v; want no rings", r.link, r.err)
				}
				t.Log(r.err)
			}
			a.Close()
			b.Close()
			if after := openFDs(t); after != fdsBefore {
				t.Errorf("%d descriptors open before, %d after", fdsBefore, after)
			}
		})
	}
}

// TestShmCloseDuringAllreduce: a rank that closes its Comm while its
// Allreduce moves data through the rings returns ErrClosed (its peer
// ErrPeerLost) and unmaps the rings only after the collective stopped.
func TestShmCloseDuringAllreduce(t *testing.T) {
	requireShm(t)
	for _, delay := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond} {
		comms := newWorld(t, 2, worldOpts{log: io.Discard, unix: true})
		x := [][]float32{make([]float32, 4<<20), make([]float32, 4<<20)}
		result := make(chan []error, 1)
		go func() {
			result <- onAll(comms, func(c *Comm) error {
				for {
					if err := c.AllreduceFloat32(context.Background(), x[c.Rank()]); err != nil {
						return err
					}
				}
			})
		}()
		time.Sleep(delay)
		comms[0].Close()
		var errs []error
		select {
		case errs = <-result:
		case <-time.After(10 * time.Second):
			t.Fatal("no return within 10 s of Close")
		}
		if !errors.Is(errs[0], ErrClosed) || !errors.Is(errs[1], ErrPeerLost) {
			t.Errorf("delay %v: errors %v; want ErrClosed, ErrPeerLost", delay, errs)
		}
		comms[1].Close()
	}
	if n := ringMappings(t); n != 0 {
		t.Errorf("%d ring mappings left after Close", n)
	}
}

// TestShmNothingLeftBehind: a world of one host maps rings while it lives
// and leaves no mapping, descriptor or file once closed.
func TestShmNothingLeftBehind(t *testing.T) {
	requireShm(t)
	shmBefore := shmEntries()
	fds := openFDs(t)
	maps := ringMappings(t)
	comms := newWorld(t, 4, worldOpts{unix: true})
	x := make([][]float32, 4)
	for r := range x {
		x[r] = make([]float32, 1<<20)
	}
	mustAll(t, onAll(comms, func(c *Comm) error { return c.AllreduceFloat32(context.Background(), x[c.Rank()]) }))
	// Four ranks, each with two neighbours, each link with two rings.
	if n := ringMappings(t) - maps; n != 4*2*2 {
		t.Errorf("%d ring mappings while the world lives, want 16", n)
	}
	for _, c := range comms {
		c.Close()
	}
	if n := ringMappings(t) - maps; n != 0 {
		t.Errorf("%d ring mappings left after Close", n)
	}
	if after := openFDs(t); after > fds {
		t.Errorf("%d descriptors open before the world, %d after", fds, after)
	}
	if shmAfter := shmEntries(); len(shmAfter) != len(shmBefore) {
		t.Errorf("/dev/shm had %d entries, has %d", len(shmBefore), len(shmAfter))
	}
}

// shmEntries lists /dev/shm but for the files of gorun jobs (protected
// state, which tests of other packages running meanwhile create).
func shmEntries() []string {
	ents, _ := os.ReadDir("/dev/shm")
	var out []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "gorun-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// unixPair returns the two ends of a Unix stream connection.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// ringMappings counts this process's mappings of ring memfds.
func ringMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip("no /proc/self/maps")
	}
	return strings.Count(string(b), "memfd:gorun-comm")
}

// TestTCPLinksTimeOut: TCP links bound how long a write to a silent peer
// may wait for acknowledgement (TCP_USER_TIMEOUT), as keepalives bound a
// read.
func TestTCPLinksTimeOut(t *testing.T) {
	comms := newWorld(t, 2, worldOpts{})
	for _, c := range comms {
		for ch, l := range c.peers[1-c.rank].links {
			rc, err := l.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var got int
			var gerr error
			rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) })
			if gerr != nil || time.Duration(got)*time.Millisecond != userTimeout {
				t.Errorf("rank %d channel %d: TCP_USER_TIMEOUT %d ms (%v), want %v", c.rank, ch, got, gerr, userTimeout)
			}
		}
	}
}

// FuzzShmOffer: any 16 bytes as an offer (without a descriptor) give an
// error or no ring, never a panic or a mapping.
func FuzzShmOffer(f *testing.F) {
	f.Add([]byte("GRSM\x01\x01\x00\x00\x00\x00\x00\x04\x00\x10\x00\x00"))
	f.Add([]byte("GRSM\x01\x00\x00\x00\x00\x00\x00\x04\x00\x10\x00\x00"))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, offer []byte) {
		if len(offer) != shmOfferSize {
			return
		}
		a, b := unixPair(t)
		defer a.Close()
		defer b.Close()
		if _, err := b.Write(offer); err != nil {
			t.Fatal(err)
		}
		ring, err := readOffer(a)
		if ring != nil {
			(&shmLink{in: ring}).unmap()
			t.Fatalf("offer %q without a descriptor mapped a ring", offer)
		}
		_ = err
	})
}

// TestMixedLinksFailPromptly: in a ring where some neighbour links have
// shared-memory rings and some are plain sockets (one side could not
// create its ring), losing a rank mid-Allreduce fails every other rank
// promptly, whichever rank is lost. (A rank that fails while its credit
// reader waits on a live right neighbour must fail the op before waiting
// for the reader; with Close the whole ring fails at once anyway, so this
// covers the mixed paths, not that ordering, which needs a one-link
// partition.)
func TestMixedLinksFailPromptly(t *testing.T) {
	requireShm(t)
	const n = 3
	for victim := range n {
		var left atomic.Int32
		left.Store(1)
		shmCreateHook = func() error {
			if left.Add(-1) >= 0 {
				return errors.New("refused by the test")
			}
			return nil
		}
		comms := newWorld(t, n, worldOpts{segment: 16 << 10, log: io.Discard, unix: true})
		shmCreateHook = nil
		mixed := 0
		for _, c := range comms {
			for _, p := range c.peers {
				if p != nil && p.shm == nil {
					mixed++
				}
			}
		}
		if mixed == 0 {
			t.Fatal("every link has rings; the test wants a mixed ring")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var done atomic.Int64
		result := make(chan []error, 1)
		go func() { result <- loopAllreduce(ctx, comms, 200_000, &done) }()
		waitFor(t, 10*time.Second, func() bool { return done.Load() >= 2*n })
		comms[victim].Close()
		select {
		case errs := <-result:
			for r, err := range errs {
				if r != victim && !errors.Is(err, ErrPeerLost) {
					t.Errorf("victim %d: rank %d returned %v, want ErrPeerLost", victim, r, err)
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("victim %d: the others did not return within 5 s", victim)
		}
		cancel()
	}
}
