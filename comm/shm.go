package comm

// Shared-memory rings between ranks of one host.
//
// Ranks of one host link through Unix sockets. On the collective link
// between ring neighbours (ranks r and r±1), each side also creates an
// outbound ring in shared memory: an anonymous memfd of shmSlots slots of
// segBytes each, sealed against shrinking and growing (so a peer can never
// make this process fault on a truncated mapping), and passes its
// descriptor to the peer over the socket (SCM_RIGHTS). The peer maps it
// read-only. Nothing is created in /dev/shm or any file system: the memory
// goes away with the last mapping, even if a rank is killed.
//
// The ring Allreduce then moves its segments through the rings instead of
// the socket: the sender copies a segment into its next slot and writes a
// one-byte doorbell on the socket; the receiver reduces straight out of
// the slot (or copies it, in the allgather phase) and writes a one-byte
// credit back, after which the sender may reuse the slot. The socket keeps
// carrying the collective headers, and its doorbells and credits keep
// every failure path of the socket transport: a lost peer is an EOF, and
// an interrupted collective is a socket deadline. This saves the kernel's
// two copies per segment (sender into the socket, socket into the
// receiver's buffer) for one user-space copy, which about doubles the bus
// bandwidth of four ranks on one host.
//
// The exchange after the data-plane handshake, on such links only:
//
//	both → peer   offer: "GRSM" version ok 0 0 slots(u32) slotBytes(u32), with the memfd iff ok
//	both → peer   answer: 1 if the peer's ring is mapped, else 0
//
// Both sides use the rings only if both answered 1; otherwise the link
// stays a plain socket (as on a system without memfd), decided alike on
// both ends.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	// shmSlots is the number of segments in flight on a ring.
	shmSlots      = 4
	shmMagic      = "GRSM"
	shmVersion    = 1
	shmOfferSize  = 16
	shmDoorbell   = 'D' // receiver ← sender: the next slot holds a segment
	shmCredit     = 'C' // sender ← receiver: the oldest slot is free again
	shmMaxRingLen = 1 << 30
)

// shmCreateHook, when set, runs before a ring is created; its error stands
// for a failed creation (for tests of the fallback).
var shmCreateHook func() error

// shmRing is one direction's ring: slots of slotBytes in a shared mapping.
type shmRing struct {
	mem       []byte
	slots     int
	slotBytes int
}

// slot returns slot i's first n bytes.
func (r *shmRing) slot(i, n int) []byte {
	off := (i % r.slots) * r.slotBytes
	return r.mem[off : off+n : off+n]
}

// shmLink is the pair of rings on one collective link.
type shmLink struct {
	out *shmRing // written by this rank
	in  *shmRing // written by the peer, mapped read-only
}

func (l *shmLink) unmap() {
	if l == nil {
		return
	}
	for _, r := range []*shmRing{l.out, l.in} {
		if r != nil && r.mem != nil {
			unix.Munmap(r.mem)
			r.mem = nil
		}
	}
}

// newShmRing creates a sealed memfd of slots×slotBytes, maps it read-write
// and returns the ring and the descriptor (to pass to the peer, then
// close).
func newShmRing(slots, slotBytes int) (*shmRing, int, error) {
	fd, err := unix.MemfdCreate("gorun-comm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create: %w", err)
	}
	size := slots * slotBytes
	fail := func(what string, err error) (*shmRing, int, error) {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("sealing", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return &shmRing{mem: mem, slots: slots, slotBytes: slotBytes}, fd, nil
}

// mapPeerRing maps the peer's ring read-only after checking that its size
// is what the peer announced and that it can no longer shrink.
func mapPeerRing(fd, slots, slotBytes int) (*shmRing, error) {
	if slots < 1 || slotBytes < 1 || slots > shmMaxRingLen/slotBytes {
		return nil, fmt.Errorf("ring of %d slots of %d bytes", slots, slotBytes)
	}
	size := slots * slotBytes
	// The seals first: once sealed against shrinking, the size read next
	// is the size for good (the other order would let a peer shrink the
	// file between the two, then seal it).
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("reading seals: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, errors.New("ring is not sealed against shrinking")
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("ring is %d bytes, announced %d", st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &shmRing{mem: mem, slots: slots, slotBytes: slotBytes}, nil
}

// wantsShm says whether the collective link between ranks a and b of a
// world of size ranks, over conn, gets shared-memory rings: it does
// between ring neighbours on one host. Both ends compute the same answer.
func wantsShm(conn net.Conn, a, b, size int) bool {
	if _, ok := conn.(*net.UnixConn); !ok {
		return false
	}
	d := (a - b + size) % size
	return d == 1 || d == size-1
}

// setupShm runs the ring exchange on conn (under the caller's deadline)
// and returns the link's rings, or nil when the link stays a plain socket.
// An error is an I/O failure of conn; a ring that cannot be created or
// mapped only means no rings.
func setupShm(conn net.Conn, slotBytes int) (*shmLink, error) {
	uc := conn.(*net.UnixConn)
	var (
		out *shmRing
		fd  = -1
		err error
	)
	if shmCreateHook != nil {
		err = shmCreateHook()
	}
	if err == nil {
		out, fd, err = newShmRing(shmSlots, slotBytes)
	}
	var reason error
	if err != nil {
		reason = fmt.Errorf("creating the ring: %w", err)
	}
	offer := make([]byte, shmOfferSize)
	copy(offer, shmMagic)
	offer[4] = shmVersion
	binary.BigEndian.PutUint32(offer[8:], shmSlots)
	binary.BigEndian.PutUint32(offer[12:], uint32(slotBytes))
	var oob []byte
	if out != nil {
		offer[5] = 1
		oob = syscall.UnixRights(fd)
	}
	_, _, werr := uc.WriteMsgUnix(offer, oob, nil)
	if fd >= 0 {
		syscall.Close(fd)
	}
	link := &shmLink{out: out}
	fail := func(err error) (*shmLink, error) {
		link.unmap()
		return nil, err
	}
	if werr != nil {
		return fail(fmt.Errorf("sending the shared-memory offer: %w", werr))
	}

	in, err := readOffer(uc)
	if err != nil {
		var ioe *ioError
		if errors.As(err, &ioe) {
			return fail(err)
		}
		reason = errors.Join(reason, err)
	}
	if in != nil && (in.slotBytes != slotBytes || in.slots != shmSlots) {
		reason = errors.Join(reason, fmt.Errorf("the peer's ring has %d slots of %d bytes, this rank's %d of %d", in.slots, in.slotBytes, shmSlots, slotBytes))
		(&shmLink{in: in}).unmap()
		in = nil
	}
	link.in = in
	var answer, peer [1]byte
	if in != nil {
		answer[0] = 1
	}
	if _, err := conn.Write(answer[:]); err != nil {
		return fail(fmt.Errorf("answering the shared-memory offer: %w", err))
	}
	if _, err := io.ReadFull(conn, peer[:]); err != nil {
		return fail(fmt.Errorf("reading the shared-memory answer: %w", err))
	}
	if answer[0] == 1 && peer[0] == 1 && link.out != nil {
		return link, nil
	}
	if reason == nil {
		reason = errors.New("the peer could not share memory")
	}
	link.unmap()
	return nil, &noShmError{reason}
}

// ioError marks a failure of the socket itself during the exchange.
type ioError struct{ err error }

func (e *ioError) Error() string { return e.err.Error() }
func (e *ioError) Unwrap() error { return e.err }

// noShmError says why a link stays a plain socket.
type noShmError struct{ err error }

func (e *noShmError) Error() string { return "no shared-memory rings: " + e.err.Error() }
func (e *noShmError) Unwrap() error { return e.err }

// readOffer reads the peer's offer and maps its ring. Descriptors that
// arrive with it are closed, whatever happens. A nil ring with a nil error
// means the peer offered none.
func readOffer(uc *net.UnixConn) (*shmRing, error) {
	b := make([]byte, shmOfferSize)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, &ioError{fmt.Errorf("reading the shared-memory offer: %w", err)}
	}
	var fds []int
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err == nil {
			for _, m := range msgs {
				if f, err := syscall.ParseUnixRights(&m); err == nil {
					fds = append(fds, f...)
				}
			}
		}
	}
	defer func() {
		for _, f := range fds {
			syscall.Close(f)
		}
	}()
	if n < shmOfferSize {
		if _, err := io.ReadFull(uc, b[n:]); err != nil {
			return nil, &ioError{fmt.Errorf("reading the shared-memory offer: %w", err)}
		}
	}
	if string(b[:4]) != shmMagic || b[4] != shmVersion {
		return nil, &ioError{fmt.Errorf("bad shared-memory offer %q", b)}
	}
	if flags&syscall.MSG_CTRUNC != 0 {
		return nil, errors.New("the offer carried more descriptors than one")
	}
	if b[5] == 0 {
		if len(fds) > 0 {
			return nil, errors.New("the offer carried a descriptor it did not announce")
		}
		return nil, nil
	}
	if len(fds) != 1 {
		return nil, fmt.Errorf("the offer carried %d descriptors, not one", len(fds))
	}
	return mapPeerRing(fds[0], int(binary.BigEndian.Uint32(b[8:])), int(binary.BigEndian.Uint32(b[12:])))
}

// shmPipe drives the rings of one collective: readers demultiplex the
// doorbells and credits arriving on the links to left and right into
// channels.
type shmPipe struct {
	doorbells chan struct{} // from left: a segment waits in left's ring
	credits   chan struct{} // from right: a slot of this rank's ring is free
}

// shmReader reads want[shmDoorbell] doorbells and want[shmCredit] credits
// from conn (no more: the next collective's bytes may follow them) into
// the pipe's channels. Its channels never fill: a peer has at most
// shmSlots doorbells and shmSlots credits outstanding.
func shmReader(ctx context.Context, conn net.Conn, p *shmPipe, doorbells, credits int) error {
	var buf [2 * shmSlots]byte
	for doorbells+credits > 0 {
		n, err := conn.Read(buf[:min(len(buf), doorbells+credits)])
		for _, b := range buf[:n] {
			var ch chan struct{}
			switch {
			case b == shmDoorbell && doorbells > 0:
				doorbells--
				ch = p.doorbells
			case b == shmCredit && credits > 0:
				credits--
				ch = p.credits
			default:
				return fmt.Errorf("unexpected byte %#x on a shared-memory link (%d doorbells and %d credits to come)", b, doorbells, credits)
			}
			select {
			case ch <- struct{}{}:
			case <-ctx.Done():
				return nil // the collective reports why
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// shmAvailable reports whether this system can create the rings (for
// tests that insist on them).
func shmAvailable() bool {
	r, fd, err := newShmRing(1, os.Getpagesize())
	if err != nil {
		return false
	}
	syscall.Close(fd)
	(&shmLink{out: r}).unmap()
	return true
}
