package agent

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// pipe returns a pipe whose read end the test closes at cleanup.
func pipe(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

type writeResult struct {
	ok  bool
	err error
}

func writeAsync(s *stdinRelay, b string) <-chan writeResult {
	c := make(chan writeResult, 1)
	go func() {
		ok, err := s.write([]byte(b))
		c <- writeResult{ok, err}
	}()
	return c
}

func waitWrite(t *testing.T, c <-chan writeResult) writeResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the write did not return")
		return writeResult{}
	}
}

func TestStdinRelay(t *testing.T) {
	t.Run("no reader here", func(t *testing.T) {
		s := newStdinRelay()
		s.set(nil)
		if ok, err := s.write([]byte("x")); ok || err != nil {
			t.Fatalf("write = %v, %v; want not ok", ok, err)
		}
	})
	t.Run("a chunk waits for the next generation's reader", func(t *testing.T) {
		s := newStdinRelay()
		r1, w1 := pipe(t)
		s.set(w1)
		r1.Close() // generation 0's reader died
		c := writeAsync(s, "two\n")
		select {
		case r := <-c:
			t.Fatalf("the write returned %+v with no reader to take it", r)
		case <-time.After(50 * time.Millisecond):
		}
		r2, w2 := pipe(t)
		s.set(w2)
		if r := waitWrite(t, c); !r.ok || r.err != nil {
			t.Fatalf("write = %+v, want ok", r)
		}
		s.set(nil) // closes w2: the reader sees the chunk, then EOF
		b, _ := io.ReadAll(r2)
		if string(b) != "two\n" {
			t.Fatalf("generation 1 read %q, want %q", b, "two\n")
		}
	})
	t.Run("the end of stdin reaches later generations", func(t *testing.T) {
		s := newStdinRelay()
		_, w1 := pipe(t)
		s.set(w1)
		if ok, err := s.write(nil); !ok || err != nil {
			t.Fatalf("end of stdin: %v, %v", ok, err)
		}
		r2, w2 := pipe(t)
		s.set(w2)
		done := make(chan []byte, 1)
		go func() { b, _ := io.ReadAll(r2); done <- b }()
		select {
		case b := <-done:
			if len(b) != 0 {
				t.Fatalf("generation 1 read %q after the end of stdin", b)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("generation 1's reader did not see the end of stdin")
		}
	})
	t.Run("a waiting chunk is refused when the agent ends", func(t *testing.T) {
		s := newStdinRelay()
		r1, w1 := pipe(t)
		s.set(w1)
		r1.Close()
		c := writeAsync(s, "x")
		s.close()
		if r := waitWrite(t, c); !r.ok || !errors.Is(r.err, errStdinClosed) {
			t.Fatalf("write = %+v, want %v", r, errStdinClosed)
		}
	})
}
