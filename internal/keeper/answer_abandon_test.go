package keeper

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/replay"
)

// abandonedAnswer runs serve (an answer's writer) on one end of a
// net.Pipe whose other end reads nothing (a reader on a host that died:
// its socket stays open until TCP gives up), with ecAnswerWait short, and
// returns serve's error.
func abandonedAnswer(t *testing.T, serve func(c net.Conn) error) error {
	t.Helper()
	old := ecAnswerWait
	ecAnswerWait = 50 * time.Millisecond
	t.Cleanup(func() { ecAnswerWait = old })
	server, client := net.Pipe() // synchronous: nothing is written until read
	defer client.Close()
	defer server.Close()
	done := make(chan error, 1)
	go func() { done <- serve(server) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("an answer nobody reads still being written after a minute")
		return nil
	}
}

// TestAnswersAbandoned: a getRange answer (its buffer reserved) and a
// lossy diff-mode get's answer (the copy it restored whole reserved,
// getDiffWhole) whose reader does not take them are abandoned after
// ecAnswerWait (writeAnswer), and the reserve holds what it held
// before, rather than the bytes staying reserved until TCP gives up.
// (A review found only ecGet's answers bounded.)
func TestAnswersAbandoned(t *testing.T) {
	t.Run("getRange", func(t *testing.T) {
		j := newECJob(t, 2, 2, 1, true)
		for _, er := range j.rs {
			er.protect(0, 0)
		}
		j.waitReplicated(0)
		const r = 0
		hk := j.c.hosts[r]
		n := int64(len(ecShard(r, 0, 0)))
		before := storeBytes(hk)
		err := abandonedAnswer(t, func(c net.Conn) error {
			return hk.parity.getRange(c, linkHdr{kind: kindGetRange, owner: r, holder: r, step: 0}, ecHdr{n: n, hb: noStep})
		})
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a getRange answer to a reader that reads nothing: %v, want a deadline error", err)
		}
		if got := storeBytes(hk); got != before {
			t.Fatalf("the reserve holds %d bytes after the abandoned answer, %d before", got, before)
		}
	})
	t.Run("getDiffWhole", func(t *testing.T) {
		h := lossyHolder(t)
		before := storeBytes(h)
		err := abandonedAnswer(t, func(conn net.Conn) error {
			return h.store.getDiff(conn, linkHdr{kind: kindGet, owner: 0, holder: 1, step: 1})
		})
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a lossy diff-mode get's answer to a reader that reads nothing: %v, want a deadline error", err)
		}
		if got := storeBytes(h); got != before {
			t.Fatalf("the reserve holds %d bytes after the abandoned answer, %d before", got, before)
		}
	})
	// An exact step is streamed while the store's fold lock is held: an
	// answer nobody reads must not hold it (nor the folds waiting on it).
	t.Run("getDiff pieces", func(t *testing.T) {
		h := diffHolder(t, replay.Options{Lossless: true})
		err := abandonedAnswer(t, func(conn net.Conn) error {
			return h.store.getDiff(conn, linkHdr{kind: kindGet, owner: 0, holder: 1, step: 1})
		})
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a diff-mode get's streamed answer to a reader that reads nothing: %v, want a deadline error", err)
		}
	})
}

// deadlineConn is a link that records the write deadlines set on it
// and counts the Write calls made on it.
type deadlineConn struct {
	net.Conn
	mu     sync.Mutex
	sets   []time.Time
	writes int
}

func (d *deadlineConn) SetWriteDeadline(t time.Time) error {
	d.mu.Lock()
	d.sets = append(d.sets, t)
	d.mu.Unlock()
	return d.Conn.SetWriteDeadline(t)
}

func (d *deadlineConn) Write(p []byte) (int, error) {
	d.mu.Lock()
	d.writes++
	d.mu.Unlock()
	return d.Conn.Write(p)
}

// checkCleared fails t unless an answer was written to d under write
// deadlines (one set at least) and the last deadline set is the zero
// time (cleared: a next answer on the link is not cut by this one's).
func (d *deadlineConn) checkCleared(t *testing.T, what string) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.sets) < 2 {
		t.Fatalf("%s: %d write deadlines set, want an answer under deadlines and the reset", what, len(d.sets))
	}
	if last := d.sets[len(d.sets)-1]; !last.IsZero() {
		t.Fatalf("%s: the link's write deadline is left at %v after the answer, want it cleared", what, last)
	}
}

// servePipe runs serve on one end of a net.Pipe wrapped in a
// deadlineConn, with the other end given first to request (nil: none:
// what the server reads before answering), then read to its end, and
// returns serve's error and the wrapper.
func servePipe(t *testing.T, request []byte, serve func(c net.Conn) error) (*deadlineConn, error) {
	t.Helper()
	server, client := net.Pipe()
	defer client.Close()
	read := make(chan int64, 1)
	go func() {
		if len(request) > 0 { // a Pipe's empty Write waits for a Read
			if _, err := client.Write(request); err != nil {
				read <- -1
				return
			}
		}
		n, _ := io.Copy(io.Discard, client)
		read <- n
	}()
	d := &deadlineConn{Conn: server}
	err := serve(d)
	server.Close()
	if n := <-read; n <= 0 && err == nil {
		t.Fatalf("the answer carried %d bytes", n)
	}
	return d, err
}

// TestAnswerDeadlineCleared: a diff-mode get's streamed pieces answer
// (getDiff) and a getLog's frames are written under writeAnswer's
// deadlines and leave the link's write deadline cleared, as every answer
// through writeAnswer does: the link goes back to the pool and its next
// answer must not fail on this one's deadline.
func TestAnswerDeadlineCleared(t *testing.T) {
	t.Run("getDiff pieces", func(t *testing.T) {
		h := diffHolder(t, replay.Options{Lossless: true})
		d, err := servePipe(t, nil, func(c net.Conn) error {
			return h.store.getDiff(c, linkHdr{kind: kindGet, owner: 0, holder: 1, step: 1})
		})
		if err != nil {
			t.Fatal(err)
		}
		d.checkCleared(t, "getDiff")
	})
	t.Run("getLog", func(t *testing.T) {
		c, _ := twoHostDiff(t, 100, 1000) // no fold, no refresh: host 1 keeps rank 0's steps 0 to 6
		rs := startDiffRanks(t, c, 2, 43)
		runSteps(t, c, rs, 0, 6)
		lb := restorerLabel(c.hosts[0])
		e := ecHdr{n: 4, epoch: lb.epoch, hb: lb.g, off: lb.resumed + 1}
		req := make([]byte, ecHdrSize)
		e.put(req)
		d, err := servePipe(t, req, func(conn net.Conn) error {
			return c.hosts[1].store.getLog(conn, linkHdr{kind: kindGetLog, owner: 0, holder: 1, step: 2, gen: lb.gen}, nil)
		})
		if err != nil {
			t.Fatal(err)
		}
		d.checkCleared(t, "getLog")
	})
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.DialTCP("tcp", nil, l.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.AcceptTCP()
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// tcpCountConn is a TCP link that counts its Write calls and records its
// write deadlines. It embeds the *net.TCPConn, so net.Buffers.WriteTo
// finds the connection's writev (the unexported writeBuffers, promoted)
// and writes a run without a Write call: a buffer written on its own
// goes through Write and is counted.
type tcpCountConn struct {
	*net.TCPConn
	d *deadlineConn
}

func (c tcpCountConn) Write(p []byte) (int, error)        { return c.d.Write(p) }
func (c tcpCountConn) SetWriteDeadline(t time.Time) error { return c.d.SetWriteDeadline(t) }

// TestAnswerWriteBuffers: writeBuffers sends every buffer, in order,
// whether it groups them into one run, cuts the runs at maxAnswerRun, or
// writes a buffer longer than that alone; each run goes out in one writev
// (no Write call: only the buffer written alone is, in its maxECRange
// pieces), and the link's write deadline is cleared after.
func TestAnswerWriteBuffers(t *testing.T) {
	fill := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = seed + byte(i*7)
		}
		return b
	}
	// Runs: {10, maxECRange-5, 3}, {maxECRange-2}, then the buffer
	// longer than maxAnswerRun alone, then {1, 6}.
	bufs := net.Buffers{fill(10, 1), fill(maxECRange-5, 2), fill(3, 3), fill(maxECRange-2, 7), fill(maxAnswerRun+7, 4), fill(1, 5), fill(6, 6)}
	const alonePieces = 2 // maxAnswerRun+7 bytes in pieces of maxECRange
	var want []byte
	for _, b := range bufs {
		want = append(want, b...)
	}
	server, client := tcpPair(t)
	d := &deadlineConn{Conn: server}
	done := make(chan error, 1)
	go func() { done <- writeAnswerBuffers(tcpCountConn{TCPConn: server, d: d}, nil, bufs) }()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read are not the buffers' in order")
	}
	if d.writes != alonePieces {
		t.Fatalf("%d Write calls on the link, want %d (the buffer longer than a run, in pieces): the runs' buffers were written one by one, not in a writev each", d.writes, alonePieces)
	}
	d.checkCleared(t, "writeAnswerBuffers")
}
