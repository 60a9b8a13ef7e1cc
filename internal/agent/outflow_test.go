package agent

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// waitClosed fails the test unless ch is closed within limit.
func waitClosed(t *testing.T, ch <-chan struct{}, limit time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(limit):
		t.Fatalf("%s: not within %v", what, limit)
	}
}

// TestBatcherWindow: a stream takes no more output while the frames sent
// and not acknowledged reach the window (its rank is then held back), and
// goes on once an ack brings them below it; acks never count more than
// was sent.
func TestBatcherWindow(t *testing.T) {
	line := []byte(strings.Repeat("y", 99) + "\n")
	tests := []struct {
		name   string
		window uint64
		acks   []uint64 // acks sent while the third add waits (0: everything sent)
	}{
		{"one ack of everything", 150, []uint64{0}},
		{"partial then full", 200, []uint64{10, 0}},
		{"ack beyond sent is clamped", 150, []uint64{1 << 40}},
	}
	s := newOutputSink(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := s.batcher(0, 0) // every add is sent at once
			defer b.Close()
			b.window = tt.window
			ro := newRankOutput()
			st := b.openStream(1, wire.Stdout, 0, ro)
			st.add(line, false)
			st.add(line, false) // sent: 2 frames, beyond every window here
			added := make(chan struct{})
			go func() { defer close(added); st.add(line, false) }()
			waitClosed(t, ro.settled(), 30*time.Second, "the stream was not held back by a full window")
			for _, a := range tt.acks {
				b.mu.Lock()
				sent := b.sent
				b.mu.Unlock()
				if a == 0 {
					a = sent
				}
				b.ack(a)
				b.mu.Lock()
				if b.acked > b.sent {
					t.Errorf("acked %d of %d sent", b.acked, b.sent)
				}
				b.mu.Unlock()
			}
			waitClosed(t, added, 30*time.Second, "the ack did not let the stream go on")
			b.Flush()
			if got := len(records(s.drain())); got != 3 {
				t.Errorf("%d records sent, want 3", got)
			}
		})
	}
}

// TestBatcherGenerationsInOrder: a restarted rank's stream takes output
// only after the previous generation's stream of that rank has ended,
// and OutputDone for a generation comes after all its output (and that
// of earlier generations).
func TestBatcherGenerationsInOrder(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(4, 0)
	defer b.Close()
	ro0, ro1 := newRankOutput(), newRankOutput()
	old := b.openStream(2, wire.Stderr, 0, ro0)
	b.endGen(0) // its rank ended; its stream is still open
	cur := b.openStream(2, wire.Stderr, 1, ro1)
	added := make(chan struct{})
	go func() { defer close(added); cur.add([]byte("new\n"), false); cur.close() }()
	waitClosed(t, ro1.settled(), 30*time.Second, "the new generation's stream did not wait for the old one")
	b.endGen(1)
	old.add([]byte("old\n"), false)
	old.close()
	waitClosed(t, added, 30*time.Second, "the new generation's stream did not go on")

	var got []string
	var dones []wire.OutputDone
	deadline := time.After(30 * time.Second)
	for len(dones) < 2 {
		select {
		case m := <-s.msgs:
			switch m.Subject {
			case sinkSubject:
				for _, r := range s.decode(m.Data).records {
					got = append(got, string(r.Data))
				}
			case sinkOutputDone:
				d, err := wire.DecodeOutputDone(m.Data)
				if err != nil {
					t.Fatal(err)
				}
				dones = append(dones, *d)
			}
		case <-deadline:
			t.Fatalf("got %q and end markers %+v", got, dones)
		}
	}
	if strings.Join(got, "") != "old\nnew\n" {
		t.Errorf("output %q, want the old generation's first", got)
	}
	b.mu.Lock()
	sent := b.sent
	b.mu.Unlock()
	if dones[0].Gen != 0 || dones[1].Gen != 1 || dones[1].Bytes != sent || dones[0].Host != 4 {
		t.Errorf("end markers %+v, want generations 0 then 1, host 4, the last after all %d bytes", dones, sent)
	}
}

// TestExitNotHeldByOutput: a rank that ends while its output waits for
// the window is reported ended at once; its output is all sent once
// acknowledged, then the end marker.
func TestExitNotHeldByOutput(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(0, 0)
	defer b.Close()
	b.window = 1000
	// Another rank's output fills the window first; the rank's 60 kB
	// then fit in its pipe and the reader's buffer: its writes end, its
	// output waits.
	b.Add(9, wire.Stdout, bytes.Repeat([]byte("z"), 2000), true)
	exits := make(chan *rankProc, 1)
	done := make(chan struct{})
	defer close(done)
	p := &rankProc{place: wire.Placement{Rank: 0}}
	spec := &wire.JobSpec{Prog: "sh", Args: []string{"-c", "head -c 59400 /dev/zero | tr '\\0' x | fold -w 99; exit 3"}, Dir: t.TempDir()}
	if err := p.start(spec, baseEnv(os.Environ(), nil), false, b, exits, done, nil); err != nil {
		t.Fatal(err)
	}
	defer p.signal(syscall.SIGKILL)
	select {
	case <-exits:
	case <-time.After(30 * time.Second):
		t.Fatal("the rank's end was not reported while its output waited for the window")
	}
	if e := p.exitEvent(0); e.Code != 3 {
		t.Fatalf("exit code %d, want 3", e.Code)
	}
	b.endGen(0)
	// Now the acks follow the frames, as the launcher's would.
	var got []byte
	b.ack(2020) // the first frame
	deadline := time.After(30 * time.Second)
	for {
		select {
		case m := <-s.msgs:
			switch m.Subject {
			case sinkSubject:
				for _, r := range s.decode(m.Data).records {
					if r.Rank == 0 {
						got = append(got, r.Data...)
					}
				}
				b.mu.Lock()
				sent := b.sent
				b.mu.Unlock()
				b.ack(sent)
				continue
			case sinkOutputDone:
			default:
				continue
			}
		case <-deadline:
			t.Fatalf("no end marker; %d bytes of output", len(got))
		}
		break
	}
	want := bytes.Repeat([]byte(strings.Repeat("x", 99)+"\n"), 600)
	if !bytes.Equal(got, want) {
		t.Errorf("got %d bytes of output, want %d, in order", len(got), len(want))
	}
}

// TestPipeHeldOpenAfterExit: a process that escaped the rank's process
// group and holds its stdout does not hold the exit report, nor the end
// of the rank's output, beyond drainTimeout.
func TestPipeHeldOpenAfterExit(t *testing.T) {
	s := newOutputSink(t)
	b := s.batcher(0, 0)
	defer b.Close()
	exits := make(chan *rankProc, 1)
	done := make(chan struct{})
	defer close(done)
	p := &rankProc{place: wire.Placement{Rank: 0}}
	pidFile := t.TempDir() + "/pid"
	spec := &wire.JobSpec{Prog: "sh", Args: []string{"-c", "echo before; setsid sh -c 'echo $$ > " + pidFile + "; exec sleep 600' & while [ ! -s " + pidFile + " ]; do sleep 0.01; done"}, Dir: t.TempDir()}
	if err := p.start(spec, baseEnv(os.Environ(), nil), false, b, exits, done, nil); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if pid, err := os.ReadFile(pidFile); err == nil {
			if n, _ := strconv.Atoi(strings.TrimSpace(string(pid))); n > 0 {
				syscall.Kill(n, syscall.SIGKILL)
			}
		}
	}()
	select {
	case <-exits:
	case <-time.After(30 * time.Second):
		t.Fatal("the rank's end was not reported")
	}
	b.endGen(0)
	deadline := time.After(30 * time.Second)
	var got []byte
	for {
		select {
		case m := <-s.msgs:
			if m.Subject == sinkSubject {
				for _, r := range s.decode(m.Data).records {
					got = append(got, r.Data...)
				}
				continue
			}
			if m.Subject != sinkOutputDone {
				continue
			}
		case <-deadline:
			t.Fatal("no end marker: the pipe held open holds the output's end")
		}
		break
	}
	if string(got) != "before\n" {
		t.Errorf("output %q, want %q", got, "before\n")
	}
}
