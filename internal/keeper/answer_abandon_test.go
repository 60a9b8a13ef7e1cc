package keeper

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
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

// TestAnswerWriteBuffers: writeBuffers sends every buffer, in order,
// whether it groups them into one run, cuts the runs at maxECRange, or
// writes a buffer longer than that alone.
func TestAnswerWriteBuffers(t *testing.T) {
	fill := func(n int, seed byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = seed + byte(i*7)
		}
		return b
	}
	bufs := net.Buffers{fill(10, 1), fill(maxECRange-5, 2), fill(3, 3), fill(maxECRange+7, 4), fill(1, 5), fill(6, 6)}
	var want []byte
	for _, b := range bufs {
		want = append(want, b...)
	}
	server, client := net.Pipe()
	defer client.Close()
	defer server.Close()
	done := make(chan error, 1)
	go func() { done <- writeAnswerBuffers(server, nil, bufs) }()
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
}
